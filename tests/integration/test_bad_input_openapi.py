"""Schemathesis against the OpenAPI of the retriever's `/retrieve` and the reward service's `/v1/score`,
real servers on loopback (port 0): bodies that fit the schema and bodies that do not, a bounded number of
each. Every answer is below 500, and every 4xx carries a message in `detail`."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from searchr1.core.servers import HttpServer  # noqa: E402
from searchr1.retriever.builder import build_index  # noqa: E402
from searchr1.retriever.loading import load_index  # noqa: E402
from searchr1.retriever.server import start_retriever  # noqa: E402
from searchr1.retriever.settings import RetrieverSettings  # noqa: E402
from searchr1.reward.app import build_service, create_app  # noqa: E402
from searchr1.reward.settings import RewardSettings  # noqa: E402

EXAMPLES = 40
"""Generated requests per operation and mode (each test stays well under a minute on 2 cores)."""


class LoopThread:
    """An event loop on its own thread, so the servers keep answering while a synchronous test calls them."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[Any], timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture(scope="module")
def retriever_url(loop_thread, tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("retriever")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{t} is a word.'}) + "\n"
                              for i, t in enumerate(["Moon", "Nile", "Chess", "Coffee"])))
    build_index(corpus, root / "bm25", "bm25")
    index = Path(root / "bm25")

    async def start():
        settings = RetrieverSettings(grpc_port=0, http_port=0, index=index,
                                     limits={"max_queries": 64, "max_query_chars": 512})
        return await start_retriever(settings, load_index(index, encoder_factory=None))

    running = loop_thread.run(start())
    yield running.http.url
    loop_thread.run(running.stop())


@pytest.fixture(scope="module")
def reward_url(loop_thread) -> Iterator[str]:
    async def start():
        server = HttpServer(create_app(build_service(RewardSettings(port=0, max_batch_items=64))))
        await server.start()
        return server

    server = loop_thread.run(start())
    yield server.url
    loop_thread.run(server.stop())


def fuzz(base_url: str, path: str, mode: GenerationMode) -> Callable[[], None]:
    """A hypothesis test over one operation of the live server's OpenAPI document."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operation = schema[path]["POST"]

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case) -> None:
        response = case.call(base_url=base_url, timeout=30)
        case.validate_response(response, checks=[not_a_server_error])
        assert response.status_code < 500, (response.status_code, response.text)
        if response.status_code >= 400:
            detail = response.json().get("detail")
            assert isinstance(detail, str) and detail.strip(), (response.status_code, response.text)

    return check


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_retrieve_never_errors_and_explains_every_refusal(retriever_url, mode):
    fuzz(retriever_url, "/retrieve", mode)()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_score_never_errors_and_explains_every_refusal(reward_url, mode):
    fuzz(reward_url, "/v1/score", mode)()
