"""Making an announced weight snapshot available to a rollout worker (`fetch_snapshot`;
docs/architecture.md, "Weight sync"), on a shared volume or over the learner's HTTP file protocol
(`GET {uri}/files` → JSON list of names, `GET {uri}/files/{name}` → the file's bytes).

What is checked where (the digest is the sha256 of the snapshot's manifest, `manifest.py`):

- volume: the files the manifest lists are hard-linked into a private directory and the manifest is
  checked against the announcement — no pass over the weights. The engine verifies every chunk as it
  reads the weights for loading (`read.py`). A directory without a manifest (a model saved by
  another tool) costs one hashing pass here, and its computed manifest is written into the private copy.
- HTTP: the manifest is downloaded first and checked; each file is then written as it arrives and its
  chunks hashed in parallel beside the write, checked against the manifest as each completes, so a bad
  download is refused at its first bad chunk and never promoted into the download directory.

Everything blocking runs in a worker thread; the caller's event loop is never blocked by it. A download
runs whole in one worker thread with a blocking client (receive, write, feed the hashers each piece).
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any, BinaryIO

from searchr1.core.schemas import WeightVersion
from searchr1.weightsync.manifest import (
    MANIFEST,
    ChunkHasher,
    Manifest,
    ManifestBuilder,
    SnapshotError,
    content_names,
    hash_pool,
    manifest_digest,
    snapshot_digest,
    snapshot_manifest,
)
from searchr1.weightsync.read import read_manifest

_MAX_MANIFEST_BYTES = 64 << 20


def _check(digest: str, expected: str, what: object) -> None:
    if digest != expected:
        raise SnapshotError(f"sha256 mismatch for {what}: got {digest}, announced {expected}")


def _cached(dest: Path, announced: WeightVersion) -> bool:
    """Whether `dest` holds the announced snapshot: its manifest matches and every listed file is there
    at its size (the bytes are verified when they are loaded)."""
    if not dest.is_dir():
        return False
    try:
        manifest = read_manifest(dest, announced.sha256)
    except SnapshotError:
        return False
    return manifest is not None and all(
        (dest / e.name).is_file() and (dest / e.name).stat().st_size == e.size for e in manifest.files)


def _fresh_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _open_target(partial: Path, name: str) -> BinaryIO:
    """Open `partial/name` for writing, refusing names that escape `partial`."""
    target = (partial / name).resolve()
    if partial.resolve() not in target.parents:
        raise SnapshotError(f"refusing file name outside the snapshot: {name!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    return target.open("wb")


def _listing(names: object, base: str) -> list[str]:
    """The served names, sorted; a listing that is not a list of distinct names is refused."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SnapshotError(f"{base}/files did not return a list of file names")
    if len(set(names)) != len(names):
        raise SnapshotError(f"{base}/files lists a file name twice")
    return sorted(names)


def _fetch_file(client: Any, base: str, partial: Path, name: str, hasher: ChunkHasher, stop: threading.Event) -> None:
    with _open_target(partial, name) as f, client.stream("GET", f"{base}/files/{name}") as r:
        r.raise_for_status()
        for piece in r.iter_bytes():
            if stop.is_set():
                raise SnapshotError(f"download of {base} cancelled")
            f.write(piece)
            hasher.feed(piece)


def _fetch_manifest(client: Any, base: str, digest: str) -> bytes:
    resp = client.get(f"{base}/files/{MANIFEST}")
    resp.raise_for_status()
    raw = resp.content
    if len(raw) > _MAX_MANIFEST_BYTES:
        raise SnapshotError(f"{base}: a manifest of {len(raw)} bytes")
    _check(manifest_digest(raw), digest, f"the manifest of {base}")
    return raw


def _download(base: str, partial: Path, timeout_s: float, headers: dict[str, str], stop: threading.Event,
              digest: str) -> None:
    """Download the snapshot at `base` into `partial`, verifying every chunk as it arrives against the
    manifest (fetched first), or against `digest` at the end when the snapshot has no manifest (whose
    computed one is then written into `partial`). Blocking: run it in a thread. Raises `SnapshotError`."""
    import httpx

    try:
        with httpx.Client(timeout=timeout_s, headers=headers) as client, hash_pool() as pool:
            resp = client.get(f"{base}/files")
            resp.raise_for_status()
            names = _listing(resp.json(), base)
            if MANIFEST in names:
                raw = _fetch_manifest(client, base, digest)
                manifest = Manifest.parse(raw)
                for e in manifest.files:
                    hasher = ChunkHasher(pool, manifest.chunk_bytes, name=e.name, expected=list(e.chunks))
                    _fetch_file(client, base, partial, e.name, hasher, stop)
                    hasher.digests()
                    if hasher.size != e.size:
                        raise SnapshotError(f"{e.name}: size mismatch, {hasher.size} bytes, manifest {e.size}")
            else:
                builder = ManifestBuilder(pool)
                for name in names:
                    _fetch_file(client, base, partial, name, builder.file(name), stop)
                raw = builder.encode()
                _check(manifest_digest(raw), digest, base)
            (partial / MANIFEST).write_bytes(raw)
    except (httpx.HTTPError, ValueError) as exc:
        raise SnapshotError(f"cannot download snapshot {base}: {exc}") from exc


def _promote(partial: Path, dest: Path) -> Path:
    """Rename the checked `partial` to `dest`, never over it: a `dest` already there was promoted by
    another worker sharing the directory for the same digest (its name holds it), and is used as it is."""
    try:
        partial.rename(dest)
    except OSError:
        if not dest.is_dir():
            raise
        shutil.rmtree(partial, ignore_errors=True)
    return dest


def _link_all(src: Path, names: list[str], tmp: Path) -> None:
    tmp.mkdir(parents=True)
    for name in names:
        target = tmp / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src / name, target)
        except FileNotFoundError as exc:
            raise SnapshotError(f"{src}: listed file {name!r} is missing") from exc


def _pin_local(path: Path, announced: WeightVersion, dest_root: Path) -> Path:
    """Hard-link the snapshot at `path` into a private directory and return it: the files the engine then
    reads are those inodes, whatever the publisher renames meanwhile (it writes new files and never
    rewrites one in place), and the bytes it loads are verified as it reads them. Only the files the
    manifest lists are linked (a file added beside them never reaches the engine). Where links cannot be
    made (another filesystem), `path` itself is returned once its manifest is checked (or, without one,
    its digest computed)."""
    if not path.is_dir():
        raise SnapshotError(f"snapshot directory {path} does not exist")
    dest = dest_root / _dest_name(announced)
    if _cached(dest, announced):
        return dest
    manifest = read_manifest(path, announced.sha256)
    names = [e.name for e in manifest.files] + [MANIFEST] if manifest is not None else content_names(path)
    tmp = dest_root / f".pin-{_dest_name(announced)}-{uuid.uuid4().hex[:12]}"
    try:
        _link_all(path, names, tmp)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise SnapshotError(f"cannot pin {path}: {exc}") from exc
        if manifest is None:
            _check(snapshot_digest(path), announced.sha256, path)
        return path
    except SnapshotError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        if manifest is None:  # not written by the publisher: one pass now, the manifest kept for the load
            raw = snapshot_manifest(tmp)
            _check(manifest_digest(raw), announced.sha256, path)
            (tmp / MANIFEST).write_bytes(raw)
        elif not _cached(tmp, announced):
            raise SnapshotError(f"{path}: a listed file's size differs from its manifest")
    except SnapshotError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _promote(tmp, dest)


_COPY_NAME = re.compile(r"^v(\d{8})-[0-9a-f]{16}$")


def prune_copies(dest_root: str | Path, loaded_version: int) -> list[Path]:
    """Delete the local copies (`v{version}-{digest}` directories) in `dest_root` older than
    `loaded_version`, once the engine runs it (blocking: run it in a thread); returns what went. Pinned
    local snapshots are hard links: kept, they would hold every version's bytes on disk after the
    publisher pruned its own. Newer copies (another worker sharing the directory, ahead) and anything not
    named like a copy are left alone."""
    root = Path(dest_root)
    if not root.is_dir():
        return []
    gone = []
    for child in root.iterdir():
        m = _COPY_NAME.match(child.name)
        if m and child.is_dir() and int(m.group(1)) < loaded_version:
            shutil.rmtree(child, ignore_errors=True)
            gone.append(child)
    return gone


def _dest_name(announced: WeightVersion) -> str:
    """A local copy's directory: the version and the digest's first 16 hex digits (a version written
    again with other bytes gets another directory)."""
    return f"v{announced.version:08d}-{announced.sha256[:16]}"


async def fetch_snapshot(announced: WeightVersion, dest_root: str | Path, *, timeout_s: float = 300.0,
                         token: str | None = None) -> Path:
    """Make the announced snapshot available locally; returns the directory to load it from (with the
    announced digest: `read.read_verified` checks every byte as the engine reads it).

    A local `uri` (a path or `file://` URL) is hard-linked into `dest_root/v{version}-{digest}`
    (`_pin_local`). An `http(s)://` uri is downloaded into that directory: files are first written under
    a dot-directory of a unique name (workers sharing `dest_root` never write or load one another's
    partial files), every chunk checked as it arrives, then renamed into place. Raises `SnapshotError` on
    any mismatch or failure."""
    uri = announced.uri
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    if not uri.startswith(("http://", "https://")):
        return await asyncio.to_thread(_pin_local, Path(uri), announced, Path(dest_root))

    from searchr1.core.auth import http_headers

    dest = Path(dest_root) / _dest_name(announced)
    if await asyncio.to_thread(_cached, dest, announced):
        return dest
    partial = Path(dest_root) / f".partial-{_dest_name(announced)}-{uuid.uuid4().hex[:12]}"
    await asyncio.to_thread(_fresh_dir, partial)
    base = uri.rstrip("/")
    stop = threading.Event()
    try:
        await asyncio.to_thread(_download, base, partial, timeout_s, http_headers(token), stop, announced.sha256)
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, partial, True)
        raise
    finally:
        stop.set()  # a cancelled fetch stops its download thread at the next piece
    return await asyncio.to_thread(_promote, partial, dest)
