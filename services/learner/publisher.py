"""Weight publishing (docs/architecture.md, "Weight sync"): after each update a snapshot `<dir>/v{version:08d}/` holding an HF
`save_pretrained(..., safe_serialization=True)` output (config.json + model*.safetensors; no optimizer
state; LoRA merged so workers load full weights), its `snapshot_digest`, and a `WeightVersion`
announcement on Redis. Snapshots are written to a dot-directory and renamed, so a reader never sees half
of one; only the newest `keep` are kept. `write` and `prune` are blocking file work: from the event
loop they run in a thread (`announce` does so for its digest and prune).

The URI is the snapshot's absolute path (shared volume), or `{base_url}/weights/{version}` when the
learner serves snapshots over HTTP with `weights_app` (`GET /weights/{v}/files`,
`GET /weights/{v}/files/{name}` — the protocol `core.weights.fetch_snapshot` consumes).
"""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse

from searchr1.core.auth import BearerAuthMiddleware
from searchr1.core.redis_link import RedisLink
from searchr1.core.schemas import WeightVersion
from searchr1.core.streams import StreamKeys
from searchr1.core.weights import announce, snapshot_digest, snapshot_listing

_SNAPSHOT = re.compile(r"^v(\d{8,})$")


class WeightPublisher:
    """Writes, announces, serves and prunes weight snapshots under `root`."""

    def __init__(self, root: Path, keep: int = 3, base_url: str | None = None) -> None:
        self.root = Path(root).resolve()
        self.keep = keep
        self.base_url = base_url.rstrip("/") if base_url else None

    def path(self, version: int) -> Path:
        return self.root / f"v{version:08d}"

    def versions(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.root.iterdir() if p.is_dir() and (m := _SNAPSHOT.match(p.name)))

    def uri(self, version: int) -> str:
        return f"{self.base_url}/weights/{version}" if self.base_url else str(self.path(version))

    def write(self, version: int, hf_model: Any, state_dict: dict) -> Path:
        """Save a full snapshot atomically (replacing an existing one of the same version)."""
        final = self.path(version)
        tmp = self.root / f".tmp-{final.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        hf_model.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
        if final.exists():
            old = self.root / f".old-{final.name}"
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        return final

    async def announce(self, redis, keys: StreamKeys, version: int, *, link: RedisLink | None = None) -> WeightVersion:
        """Digest the snapshot of `version`, announce it (through `link`: waiting for Redis while it is
        away), then prune older snapshots."""
        digest = await asyncio.to_thread(snapshot_digest, self.path(version))
        wv = WeightVersion(version=version, uri=self.uri(version), sha256=digest)
        if link is not None:
            await link.call(lambda: announce(redis, keys, wv), "announce weights")
        else:
            await announce(redis, keys, wv)
        await asyncio.to_thread(self.prune, version)
        return wv

    def prune(self, keep_version: int | None = None) -> list[int]:
        """Delete all but the newest `keep` snapshots (never `keep_version`); returns deleted versions."""
        versions = self.versions()
        doomed = [v for v in versions[: max(0, len(versions) - self.keep)] if v != keep_version]
        for v in doomed:
            shutil.rmtree(self.path(v), ignore_errors=True)
        return doomed


def weights_app(publisher: WeightPublisher, *, token: str | None = None) -> FastAPI:
    """FastAPI app serving the publisher's snapshots with the HTTP files protocol; with `token`, every
    path but `/healthz` needs `Authorization: Bearer <token>`."""
    app = FastAPI(title="searchr1 learner weights")
    if token:
        app.add_middleware(BearerAuthMiddleware, token=token)

    def _dir(version: int) -> Path:
        path = publisher.path(version)
        if version < 0 or not path.is_dir():
            raise HTTPException(status_code=404, detail=f"no snapshot for version {version}")
        return path

    @app.get("/weights/{version}/files")
    def list_files(version: int) -> list[str]:
        return snapshot_listing(_dir(version))

    @app.get("/weights/{version}/files/{name:path}")
    def get_file(version: int, name: str) -> FileResponse:
        root = _dir(version).resolve()
        target = (root / name).resolve()
        if root not in target.parents or not target.is_file() or name not in snapshot_listing(root):
            raise HTTPException(status_code=404, detail=f"no file {name!r} in snapshot {version}")
        return FileResponse(target)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "versions": publisher.versions()}

    return app
