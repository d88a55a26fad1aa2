"""The learner's end of the snapshot wire (docs/architecture.md, "Weight sync"): after each update a
snapshot `<dir>/v{version:08d}/` in the layout of an HF `save_pretrained(..., safe_serialization=True)` directory (config.json,
generation_config.json, model.safetensors; no optimizer state; LoRA merged so workers load full
weights), its `snapshot_digest`, and a `WeightVersion` announcement on Redis. Snapshots are written to a
dot-directory and renamed, so a reader never sees half of one; only the newest `keep` are kept. `write`
and `prune` are blocking file work: from the event loop they run in a thread (`announce` does so for
prune, and for the digest when it has to compute one).

The tensors are streamed into model.safetensors one at a time (`safetensors.write_safetensors`), and every
chunk of every file is hashed (BLAKE3) in a pool of threads beside the write; the manifest of those chunk
digests is written last (`manifest.py`) and its sha256 is the snapshot's digest. No
serialised copy of the whole state dict is built in memory (`save_pretrained` builds one) and the digest
costs no second read of the snapshot. `announce` reuses that digest while the files are the ones written
(same names, sizes, mtimes, inodes) and otherwise writes the manifest again from the files. One file at
any size: vLLM and transformers load an unsharded checkpoint.

Snapshots are not fsynced before they are announced. Each can be written again from the learner's
checkpoint (which is fsynced), and is: the learner re-exports and re-announces its current version on
start. A snapshot torn by a crash before the page cache reached the disk is refused by every reader at
its first bad chunk (its manifest digest, or a chunk's), and the restarted learner replaces it. An fsync
would put the disk's write-back rate on the path of every publication (docs/performance.md, "Weight
sync") for a durability nothing needs.

A version may instead (or also) be written as a delta against the version before
(`write_delta`: `d{version:08d}/` holding `model.delta` and its manifest, written and hashed the same
way; its content is `delta.py`'s), announced with `WeightVersion.base`. What is kept on disk (`prune`):
the newest `keep` full versions and every delta after the oldest of them.

The URI is the snapshot's absolute path (shared volume), or `{base_url}/weights/{version}` when the
learner serves snapshots over HTTP with `weights_app` (`GET /weights/{v}/files`,
`GET /weights/{v}/files/{name}` — the protocol `fetch.fetch_snapshot` consumes; deltas under
`/deltas/{v}/…`). How a version reaches
the engines, as a snapshot or a broadcast, is `transport.py`'s.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse

from searchr1.core.auth import BearerAuthMiddleware
from searchr1.core.schemas import WeightVersion
from searchr1.streams import RedisLink, StreamKeys
from searchr1.weightsync.announce import announce
from searchr1.weightsync.delta import DELTA_FILE
from searchr1.weightsync.manifest import (
    MANIFEST,
    ManifestBuilder,
    hash_pool,
    manifest_digest,
    snapshot_files,
    snapshot_listing,
    snapshot_manifest,
)
from searchr1.weightsync.safetensors import write_safetensors

_SNAPSHOT = re.compile(r"^v(\d{8,})$")
_DELTA = re.compile(r"^d(\d{8,})$")
WEIGHTS_FILE = "model.safetensors"


def drop_shared(hf_model: Any, state_dict: dict) -> dict:
    """`state_dict` without the second name of a tensor stored twice (tied embeddings), as
    `save_pretrained` saves it: the name the model declares tied goes, the other stays."""
    tied = getattr(hf_model, "_tied_weights_keys", None) or ()
    tied_names = set(tied.keys() if isinstance(tied, dict) else tied)
    kept: dict[str, Any] = {}
    seen: set[tuple] = set()
    for name in sorted(state_dict, key=lambda n: (n in tied_names, n)):
        t = state_dict[name]
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if key in seen and t.numel():
            continue
        seen.add(key)
        kept[name] = t
    return kept


class SnapshotFile(FileResponse):
    """A snapshot file, read and sent in 4 MiB chunks (Starlette reads 64 KiB at a time, one thread hop
    each: 16,000 per GB)."""

    chunk_size = 4 << 20


def model_class_name(model: Any) -> str:
    """The model's transformers class name, as `config.json`'s `architectures` names it for a loader: FSDP2
    subclasses a sharded module's class as `FSDP<Name>` (`FSDPModule` first in its bases), which no loader
    knows, so the first class of the MRO that is not FSDP's."""
    for cls in type(model).__mro__:
        if not cls.__name__.startswith("FSDP"):
            return cls.__name__
    return type(model).__name__


def _fingerprint(directory: Path) -> tuple:
    """What identifies the files as written: names, sizes, mtimes and inodes."""
    out = []
    for p in snapshot_files(directory):
        st = p.stat()
        out.append((p.relative_to(directory).as_posix(), st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


class WeightPublisher:
    """Writes, announces, serves and prunes weight snapshots under `root`."""

    def __init__(self, root: Path, keep: int, base_url: str | None = None, *, fence: int = 0,
                 guard: Callable[[], None] | None = None) -> None:
        """`root` and `keep`: the learner's `weights.dir` and `weights.keep` (the full versions kept, each with the deltas after it)."""
        self.root = Path(root).resolve()
        self.keep = keep
        self.base_url = base_url.rstrip("/") if base_url else None
        self._digests: dict[int, tuple[str, tuple]] = {}
        self.fence = fence
        """The writer's fencing token (`streams.Lease`): in each snapshot's safetensors metadata
        (`searchr1_fence`) and stored with each announcement."""
        self.guard = guard
        """Called with no argument before every snapshot write and announcement; raises to stop it (the
        learner's lease check)."""

    def path(self, version: int) -> Path:
        return self.root / f"v{version:08d}"

    def delta_path(self, version: int) -> Path:
        """The directory of the delta that turns `version − 1` into `version`."""
        return self.root / f"d{version:08d}"

    def versions(self) -> list[int]:
        """The full versions on disk."""
        return self._listed(_SNAPSHOT)

    def deltas(self) -> list[int]:
        """The versions whose delta (against the version before) is on disk."""
        return self._listed(_DELTA)

    def _listed(self, pattern: re.Pattern[str]) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.root.iterdir() if p.is_dir() and (m := pattern.match(p.name)))

    def uri(self, version: int) -> str:
        return f"{self.base_url}/weights/{version}" if self.base_url else str(self.path(version))

    def delta_uri(self, version: int) -> str:
        return f"{self.base_url}/deltas/{version}" if self.base_url else str(self.delta_path(version))

    def write(self, version: int, hf_model: Any, state_dict: dict, sums: dict[str, str] | None = None) -> Path:
        """Save a full snapshot atomically (replacing an existing one of the same version), digesting it
        as it is written: `hf_model` gives the config files, `state_dict` the tensors; `sums` (each
        tensor's checksum, `delta.checksums`) go into its metadata with the version, so a worker that
        loads it knows what it holds for the deltas that follow."""
        metadata = {"searchr1_fence": str(self.fence), "searchr1_version": str(version)}
        if sums is not None:
            metadata["searchr1_checksums"] = json.dumps(sums, sort_keys=True, separators=(",", ":"))
        return self._atomic(self.path(version), version,
                            lambda tmp: self._write_files(tmp, hf_model, state_dict, metadata))

    def write_delta(self, version: int, tensors: dict[str, Any], metadata: dict[str, str]) -> Path:
        """Save the delta `version − 1` → `version` (`versions.Plan.delta`) atomically, digested as it is
        written, in its own directory (`delta_path`)."""
        return self._atomic(self.delta_path(version), -version - 1,
                            lambda tmp: self._write_delta(tmp, tensors, {"searchr1_fence": str(self.fence), **metadata}))

    def _atomic(self, final: Path, key: int, write: Callable[[Path], str]) -> Path:
        if self.guard is not None:
            self.guard()
        tmp = self.root / f".tmp-{final.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        digest = write(tmp)
        self._digests.pop(key, None)
        if final.exists():
            old = self.root / f".old-{final.name}"
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        self._digests[key] = (digest, _fingerprint(final))
        return final

    @staticmethod
    def _write_delta(directory: Path, tensors: dict[str, Any], metadata: dict[str, str]) -> str:
        with hash_pool() as pool:
            manifest = ManifestBuilder(pool)
            with (directory / DELTA_FILE).open("wb") as f:
                write_safetensors(f, tensors, manifest.file(DELTA_FILE).feed, metadata)
            raw = manifest.encode()
        (directory / MANIFEST).write_bytes(raw)
        return manifest_digest(raw)

    @staticmethod
    def _write_files(directory: Path, hf_model: Any, state_dict: dict, metadata: dict[str, str]) -> str:
        """Config files (as `save_pretrained` writes them), then the tensors; returns the digest."""
        config = hf_model.config
        config.architectures = [model_class_name(hf_model)]
        floating = next((t for t in state_dict.values() if t.is_floating_point()), None)
        if floating is not None:
            config.dtype = str(floating.dtype).removeprefix("torch.")
        config.save_pretrained(directory)
        generation = getattr(hf_model, "generation_config", None)
        if generation is not None and hf_model.can_generate():
            generation.save_pretrained(directory)
        names = sorted(p.relative_to(directory).as_posix() for p in snapshot_files(directory))
        if WEIGHTS_FILE in names or MANIFEST in names:
            raise RuntimeError(f"the config files of {type(hf_model).__name__} include {WEIGHTS_FILE} or {MANIFEST}")
        with hash_pool() as pool:
            manifest = ManifestBuilder(pool)
            for n in names:
                manifest.add_file(n, directory / n)
            with (directory / WEIGHTS_FILE).open("wb") as f:
                write_safetensors(f, drop_shared(hf_model, state_dict), manifest.file(WEIGHTS_FILE).feed, metadata)
            raw = manifest.encode()
        (directory / MANIFEST).write_bytes(raw)
        return manifest_digest(raw)

    def digest(self, version: int, *, delta: bool = False) -> str:
        """The digest of the snapshot of `version` (with `delta`: of its delta): the one computed while
        writing it if its files are unchanged, else its manifest written again from the files as they are
        now (blocking: run it in a thread)."""
        path, key = (self.delta_path(version), -version - 1) if delta else (self.path(version), version)
        cached = self._digests.get(key)
        if cached is not None and cached[1] == _fingerprint(path):
            return cached[0]
        raw = snapshot_manifest(path)
        (path / MANIFEST).write_bytes(raw)
        digest = manifest_digest(raw)
        self._digests[key] = (digest, _fingerprint(path))
        return digest

    def record(self, version: int, *, delta: bool = False) -> WeightVersion:
        """The announcement of the snapshot of `version` (with `delta`: of its delta against `version − 1`).
        Blocking when the digest has to be computed: run it in a thread."""
        if delta:
            return WeightVersion(version=version, uri=self.delta_uri(version),
                                 sha256=self.digest(version, delta=True), base=version - 1)
        return WeightVersion(version=version, uri=self.uri(version), sha256=self.digest(version))

    async def announce(self, redis, keys: StreamKeys, version: int, *, link: RedisLink | None = None,
                       delta: bool = False, full: bool = True) -> WeightVersion:
        """Announce `version` with the fencing token (through `link`: waiting for Redis while it is away),
        then prune (`prune`). With `delta` the announcement names the delta against `version − 1` (a worker
        one version behind applies it), else the full snapshot; with `full` (and a delta) the full
        snapshot written beside it is recorded as the newest full version too. Raises
        `announce.FencedOff` when a learner with a newer token has announced."""
        wv = await asyncio.to_thread(self.record, version, delta=delta)
        full_wv = await asyncio.to_thread(self.record, version) if delta and full else None
        if self.guard is not None:
            self.guard()
        if link is not None:
            await link.call(lambda: announce(redis, keys, wv, fence=self.fence, full=full_wv), "announce weights")
        else:
            await announce(redis, keys, wv, fence=self.fence, full=full_wv)
        await asyncio.to_thread(self.prune, version)
        return wv

    def prune(self, keep_version: int | None = None) -> list[int]:
        """Delete what no worker needs any more; returns the versions whose directories went. Kept: the
        newest `keep` full versions (never `keep_version`) and every delta newer than the oldest of them,
        so a worker starting from any kept full finds each delta after it. Older fulls and deltas go (a
        worker more than one version behind starts from the newest full). On disk, at most `keep` fulls and
        the deltas between them and the latest version."""
        versions = self.versions()
        kept = versions[max(0, len(versions) - self.keep):]
        doomed = [v for v in versions if v not in kept and v != keep_version]
        for v in doomed:
            shutil.rmtree(self.path(v), ignore_errors=True)
            self._digests.pop(v, None)
        oldest = min(kept + ([keep_version] if keep_version is not None and keep_version in versions else []),
                     default=None)
        gone_deltas = [v for v in self.deltas() if oldest is not None and v <= oldest and v != keep_version]
        for v in gone_deltas:
            shutil.rmtree(self.delta_path(v), ignore_errors=True)
            self._digests.pop(-v - 1, None)
        return sorted(set(doomed) | set(gone_deltas))


def weights_app(publisher: WeightPublisher, *, token: str | None = None) -> FastAPI:
    """FastAPI app serving the publisher's snapshots with the HTTP files protocol; with `token`, every
    path but `/healthz` needs `Authorization: Bearer <token>`."""
    app = FastAPI(title="searchr1 learner weights")
    if token:
        app.add_middleware(BearerAuthMiddleware, token=token)

    def _dir(version: int, delta: bool = False) -> Path:
        path = publisher.delta_path(version) if delta else publisher.path(version)
        if version < 0 or not path.is_dir():
            raise HTTPException(status_code=404, detail=f"no {'delta' if delta else 'snapshot'} for version {version}")
        return path

    def _file(root: Path, version: int, name: str) -> SnapshotFile:
        root = root.resolve()
        # the listing first: a name outside it (a NUL byte, `..`) is never turned into a path
        if name not in snapshot_listing(root):
            raise HTTPException(status_code=404, detail=f"no file {name!r} in snapshot {version}")
        target = (root / name).resolve()
        if root not in target.parents or not target.is_file():
            raise HTTPException(status_code=404, detail=f"no file {name!r} in snapshot {version}")
        return SnapshotFile(target)

    @app.get("/weights/{version}/files")
    def list_files(version: int) -> list[str]:
        return snapshot_listing(_dir(version))

    @app.get("/weights/{version}/files/{name:path}")
    def get_file(version: int, name: str) -> SnapshotFile:
        return _file(_dir(version), version, name)

    @app.get("/deltas/{version}/files")
    def list_delta_files(version: int) -> list[str]:
        return snapshot_listing(_dir(version, delta=True))

    @app.get("/deltas/{version}/files/{name:path}")
    def get_delta_file(version: int, name: str) -> SnapshotFile:
        return _file(_dir(version, delta=True), version, name)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "versions": publisher.versions(), "deltas": publisher.deltas()}

    return app
