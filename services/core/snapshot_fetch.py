"""A rollout worker's side of the snapshot files: make the announced snapshot available on local disk and
verify it against its announcement (`fetch_snapshot`), and delete the local copies older than the version
the engine runs (`prune_copies`). The digest and the HTTP listing are `core.weights`' (the learner's
publisher computes the same digest while writing).

`fetch_snapshot` is async and runs every piece of disk work (hashing gigabytes, `rmtree`, file writes,
renames) in a worker thread, so the event loop of a rollout worker keeps serving while a snapshot is
verified or downloaded. A download runs whole in one worker thread with a blocking client (receive, write
and hash each chunk there), with no hop between the loop and a thread per chunk.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import threading
import uuid
from pathlib import Path
from typing import BinaryIO

from searchr1.core.schemas import WeightVersion
from searchr1.core.weights import DigestBuilder, snapshot_digest, snapshot_files


class SnapshotError(RuntimeError):
    """A snapshot that cannot be fetched or whose digest does not match its announcement."""


def _check(digest: str, announced: WeightVersion, what: object) -> None:
    if digest != announced.sha256:
        raise SnapshotError(f"sha256 mismatch for {what}: got {digest}, announced {announced.sha256}")


def _verify_local(path: Path, announced: WeightVersion) -> None:
    if not path.is_dir():
        raise SnapshotError(f"snapshot directory {path} does not exist")
    _check(snapshot_digest(path), announced, path)


def _cached(dest: Path, announced: WeightVersion) -> bool:
    return dest.is_dir() and snapshot_digest(dest) == announced.sha256


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


def _download(base: str, partial: Path, timeout_s: float, headers: dict[str, str], stop: threading.Event) -> str:
    """Download every listed file of the snapshot at `base` into `partial`, hashing each chunk as it is
    written; returns the digest (blocking: run it in a thread). Raises `SnapshotError`."""
    import httpx

    digest = DigestBuilder()
    try:
        with httpx.Client(timeout=timeout_s, headers=headers) as client:
            resp = client.get(f"{base}/files")
            resp.raise_for_status()
            for name in _listing(resp.json(), base):
                with _open_target(partial, name) as f, client.stream("GET", f"{base}/files/{name}") as r:
                    r.raise_for_status()
                    digest.begin(name)
                    for chunk in r.iter_bytes():
                        if stop.is_set():
                            raise SnapshotError(f"download of {base} cancelled")
                        f.write(chunk)
                        digest.update(chunk)
                    digest.end()
    except (httpx.HTTPError, ValueError) as exc:
        raise SnapshotError(f"cannot download snapshot {base}: {exc}") from exc
    return digest.hexdigest()


def _listing(names: object, base: str) -> list[str]:
    """The served names in digest order; a listing that is not a list of distinct names is refused."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SnapshotError(f"{base}/files did not return a list of file names")
    if len(set(names)) != len(names):
        raise SnapshotError(f"{base}/files lists a file name twice")
    return sorted(names)


def _promote(partial: Path, dest: Path) -> Path:
    """Rename the verified `partial` to `dest`, never over it: a `dest` already there was promoted by
    another worker sharing the directory after verifying the same digest (its name holds it), and is
    used as it is."""
    try:
        partial.rename(dest)
    except OSError:
        if not dest.is_dir():
            raise
        shutil.rmtree(partial, ignore_errors=True)
    return dest


def _pin_local(path: Path, announced: WeightVersion, dest_root: Path) -> Path:
    """Hard-link the snapshot at `path` into a private directory, verify those links and return them: the
    files verified are the files then loaded, whatever the publisher renames meanwhile (it writes new
    files and never rewrites one in place). Where links cannot be made (another filesystem), the
    snapshot is verified in place and `path` returned."""
    if not path.is_dir():
        raise SnapshotError(f"snapshot directory {path} does not exist")
    dest = dest_root / _dest_name(announced)
    if _cached(dest, announced):
        return dest
    tmp = dest_root / f".pin-{_dest_name(announced)}-{uuid.uuid4().hex[:12]}"
    try:
        tmp.mkdir(parents=True)
        for f in snapshot_files(path):
            target = tmp / f.relative_to(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(f, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        _verify_local(path, announced)
        return path
    try:
        _check(snapshot_digest(tmp), announced, path)
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
    """Make the announced snapshot available locally and verify its sha256; the path returned holds the
    bytes verified.

    A local `uri` (a path or `file://` URL) is hard-linked into `dest_root/v{version}-{digest}` and those
    links verified (`_pin_local`). An `http(s)://` uri is downloaded into that directory: files are first
    written under a dot-directory of a unique name (workers sharing `dest_root` never write or load one
    another's partial files), every byte hashed as it is written, so the digest is checked when the last
    file ends without reading the download back, then renamed into place. Raises `SnapshotError` on any
    mismatch or failure. All disk work runs in a thread; the caller's event loop is never blocked by it.
    """
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
        digest = await asyncio.to_thread(_download, base, partial, timeout_s, http_headers(token), stop)
        _check(digest, announced, base)
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, partial, True)
        raise
    finally:
        stop.set()  # a cancelled fetch stops its download thread at the next chunk
    return await asyncio.to_thread(_promote, partial, dest)
