"""The baseline of the HTTP flood test: the reward service's app served by uvicorn as it comes — no
connection guard (no head deadline, no connection bound), its default backlog of 2,048 — with the body
limit the product puts in front of every app: `python tests/support/reward_unguarded.py PORT` serves
until killed and prints `ready` once listening."""

from __future__ import annotations

import asyncio
import sys

import uvicorn

from searchr1.core._body_limit import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, BodyLimit
from searchr1.reward.app import build_service, create_app
from searchr1.reward.settings import RewardSettings


async def serve(port: int) -> None:
    app = create_app(build_service(RewardSettings(port=port, auth={"insecure_no_auth": True})))
    config = uvicorn.Config(BodyLimit(app, DEFAULT_MAX_BODY_BYTES, DEFAULT_BODY_TIMEOUT_S), host="127.0.0.1",
                            port=port, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
