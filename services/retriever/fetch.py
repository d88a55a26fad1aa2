"""`searchr1 index fetch`: Search-R1's wiki-18 corpus and prebuilt e5 Flat index from the Hugging Face
Hub (the files its `scripts/download.py` fetches), reassembled and checksummed, ready for
`searchr1 index import`.

- The index comes as parts (`part_aa`, `part_ab` of `PeterJinGo/wiki-18-e5-index`) that concatenate, in
  name order, to `e5_Flat.index`; the corpus as `wiki-18.jsonl.gz` (`PeterJinGo/wiki-18-corpus`),
  decompressed to `wiki-18.jsonl`.
- Every file goes through `huggingface_hub.hf_hub_download(..., local_dir=...)`, which resumes an
  interrupted transfer. Each finished part's size and sha256 are recorded in `fetch-state.json` in the
  download directory; a part recorded there with the same size and modification time is complete and
  is not asked for again (a re-run works offline), one changed since is fetched afresh. When the hub gives a file's LFS sha256 (its ETag),
  the local file must match it or it is deleted and the fetch fails.
- The concatenation is written to a temporary file while its sha256 is computed from the parts, then
  read back and hashed again (`verify`); only a match is renamed into place, with `<name>.sha256` beside
  it (`sha256sum` format). An `expected_sha256` given by the caller is checked too.

Departure from Search-R1: its users run `download.py`, then `cat part_* > e5_Flat.index` and `gzip -d`
by hand, with no checksum; a truncated part gives a FAISS index that fails to load, or loads and
answers with the wrong passages. Blocking (network and disk); async callers use a thread.

What this module does not do: write the index directory and manifest (`builder.import_faiss_index`),
or convert the Flat index (`convert`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.core.progress import working

log = logging.getLogger(__name__)

__all__ = [
    "CORPUS_FILE",
    "CORPUS_REPO",
    "INDEX_FILE",
    "INDEX_PARTS",
    "INDEX_REPO",
    "KNOWN_INDEXES",
    "STATE_FILE",
    "FetchError",
    "FetchedFile",
    "KnownIndex",
    "fetch_corpus",
    "fetch_index",
    "file_sha256",
]

INDEX_REPO = "PeterJinGo/wiki-18-e5-index"
"""Hub dataset holding Search-R1's e5-base-v2 Flat index over wiki-18, in parts."""
INDEX_PARTS: tuple[str, ...] = ("part_aa", "part_ab")
INDEX_FILE = "e5_Flat.index"
CORPUS_REPO = "PeterJinGo/wiki-18-corpus"
CORPUS_FILE = "wiki-18.jsonl.gz"
STATE_FILE = "fetch-state.json"
BLOCK = 8 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
FLAT_HEADER_BYTES = 45
"""A FAISS Flat file's header: fourcc, dim, count, two reserved words, trained flag, metric, vector length."""


@dataclass(frozen=True)
class KnownIndex:
    """A prebuilt index this module fetches, as its publisher describes it: what a deployment can size
    from before a byte of it is on disk (the compose project's retriever readiness budget)."""

    repo: str
    """Hub dataset holding its parts."""
    kind: str
    """Its FAISS kind once imported (`flat`)."""
    passages: int
    dim: int
    encoder: str
    """Hub repository of the encoder whose vectors it holds."""

    @property
    def file_bytes(self) -> int:
        """Bytes of the assembled index file (Flat: the header, then passages × dim float32)."""
        return FLAT_HEADER_BYTES + self.passages * self.dim * 4


KNOWN_INDEXES: dict[str, KnownIndex] = {
    INDEX_REPO: KnownIndex(INDEX_REPO, "flat", passages=21_015_324, dim=768, encoder="intfloat/e5-base-v2"),
}
"""By Hub repository: Search-R1's e5-base-v2 Flat index over wiki-18's 21,015,324 passages (64.6 GB)."""


class FetchError(RuntimeError):
    """A download that cannot be completed or does not verify; the message names the file."""


@dataclass(frozen=True)
class FetchedFile:
    """A file assembled by a fetch."""

    path: Path
    size: int
    sha256: str
    reused: bool
    """True when a verified file from an earlier run was kept as it was."""


def file_sha256(path: str | Path, block: int = BLOCK) -> str:
    """sha256 of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


class _State:
    """`fetch-state.json`: what earlier runs finished and verified, by file name."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / STATE_FILE
        self.data: dict[str, dict[str, Any]] = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def complete(self, name: str, path: Path) -> dict[str, Any] | None:
        """The record of `name` if `path` is still the file it describes (size and mtime)."""
        rec = self.data.get(name)
        if rec is None or not path.is_file():
            return None
        st = path.stat()
        return rec if (rec.get("size"), rec.get("mtime_ns")) == (st.st_size, st.st_mtime_ns) else None

    def record(self, name: str, path: Path, sha256: str, **extra: Any) -> dict[str, Any]:
        st = path.stat()
        self.data[name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256, **extra}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True))
        os.replace(tmp, self.path)
        return self.data[name]


def _remote_sha256(repo_id: str, filename: str, revision: str | None, endpoint: str | None) -> str | None:
    """The LFS sha256 the hub reports for a file (its ETag), or None (offline, or not an LFS file)."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    if constants.HF_HUB_OFFLINE:
        return None
    meta = get_hf_file_metadata(hf_hub_url(repo_id, filename, repo_type="dataset", revision=revision,
                                           endpoint=endpoint))
    etag = (meta.etag or "").strip('"').lower()
    return etag if _SHA256.match(etag) else None


def _download(repo_id: str, filename: str, dest: Path, state: _State, *, revision: str | None,
              endpoint: str | None) -> dict[str, Any]:
    """One hub file into `dest` (resumed by huggingface_hub), verified and recorded; a file already
    recorded complete is not asked for again."""
    target = dest / filename
    rec = state.complete(filename, target)
    if rec is not None:
        log.info("%s: complete from an earlier run, not fetched again", target)
        return rec
    if filename in state.data and target.is_file():  # changed since it was verified: fetch it afresh
        log.warning("%s: changed since it was verified, fetching it again", target)
        target.unlink()
    from huggingface_hub import hf_hub_download

    log.info("fetching %s/%s", repo_id, filename)
    path = Path(hf_hub_download(repo_id, filename, repo_type="dataset", revision=revision, local_dir=dest,
                                endpoint=endpoint))
    with working(f"sha256 of {filename} ({path.stat().st_size / 2**30:.2f} GiB)"):
        digest = file_sha256(path)
    remote = _remote_sha256(repo_id, filename, revision, endpoint)
    if remote is not None and remote != digest:
        path.unlink()
        raise FetchError(f"{repo_id}/{filename}: sha256 {digest} does not match the hub's {remote}; "
                         "the file was deleted, run the fetch again")
    return state.record(filename, path, digest, repo=repo_id)


def _concatenate(parts: Sequence[Path], out: Path, *, verify: bool) -> tuple[int, str]:
    """Write the parts, in order, to `out` through a temporary file; returns (size, sha256)."""
    tmp = out.with_name(out.name + ".partial")
    h = hashlib.sha256()
    size = 0
    with open(tmp, "wb") as w:
        for p in parts:
            with open(p, "rb") as r:
                while chunk := r.read(BLOCK):
                    h.update(chunk)
                    size += len(chunk)
                    w.write(chunk)
        w.flush()
        os.fsync(w.fileno())
    digest = h.hexdigest()
    if tmp.stat().st_size != size or (verify and file_sha256(tmp) != digest):
        tmp.unlink()
        raise FetchError(f"{out}: the concatenated file does not read back as the parts ({size} bytes, "
                         f"sha256 {digest}); disk full or failing?")
    os.replace(tmp, out)
    return size, digest


def _write_checksum(path: Path, digest: str) -> None:
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")


def fetch_index(dest: str | Path, *, repo_id: str = INDEX_REPO, parts: Sequence[str] = INDEX_PARTS,
                output: str = INDEX_FILE, revision: str | None = None, endpoint: str | None = None,
                expected_sha256: str | None = None, verify: bool = True, keep_parts: bool = True) -> FetchedFile:
    """Fetch the index parts into `dest` and concatenate them to `dest/output` (see module docstring)."""
    if not parts:
        raise ValueError("no index parts named")
    if expected_sha256 is not None and not _SHA256.match(expected_sha256.lower()):
        raise ValueError(f"expected sha256 must be 64 hex digits, got {expected_sha256!r}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    state = _State(dest)
    out = dest / output
    done = state.complete(output, out)
    if done is not None and (expected_sha256 is None or done["sha256"] == expected_sha256.lower()):
        log.info("%s: verified by an earlier run, kept", out)
        return FetchedFile(out, done["size"], done["sha256"], reused=True)
    records = [_download(repo_id, p, dest, state, revision=revision, endpoint=endpoint) for p in parts]
    how = "concatenating" + (" and reading back" if verify else "")
    with working(f"{how} {len(parts)} part(s) into {out.name} ({sum(r['size'] for r in records) / 2**30:.2f} GiB)"):
        size, digest = _concatenate([dest / p for p in parts], out, verify=verify)
    if size != sum(r["size"] for r in records):
        raise FetchError(f"{out}: {size} bytes, the parts hold {sum(r['size'] for r in records)}")
    if expected_sha256 is not None and digest != expected_sha256.lower():
        out.unlink()
        raise FetchError(f"{out}: sha256 {digest} is not the expected {expected_sha256}")
    state.record(output, out, digest, parts=[r["sha256"] for r in records])
    _write_checksum(out, digest)
    if not keep_parts:
        for p in parts:
            (dest / p).unlink(missing_ok=True)
    return FetchedFile(out, size, digest, reused=False)


def fetch_corpus(dest: str | Path, *, repo_id: str = CORPUS_REPO, filename: str = CORPUS_FILE,
                 revision: str | None = None, endpoint: str | None = None, keep_archive: bool = True) -> FetchedFile:
    """Fetch the corpus into `dest` and decompress a `.gz` to the same name without it (wiki-18.jsonl)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    state = _State(dest)
    out = dest / (filename[:-3] if filename.endswith(".gz") else filename)
    if out.name != filename:
        done = state.complete(out.name, out)
        if done is not None:
            return FetchedFile(out, done["size"], done["sha256"], reused=True)
    _download(repo_id, filename, dest, state, revision=revision, endpoint=endpoint)
    if out.name == filename:
        rec = state.data[filename]
        return FetchedFile(out, rec["size"], rec["sha256"], reused=False)
    tmp = out.with_name(out.name + ".partial")
    h = hashlib.sha256()
    try:
        with working(f"decompressing {filename} into {out.name}"), gzip.open(dest / filename, "rb") as r, \
                open(tmp, "wb") as w:
            while chunk := r.read(BLOCK):
                h.update(chunk)
                w.write(chunk)
    except (OSError, EOFError) as exc:
        tmp.unlink(missing_ok=True)
        raise FetchError(f"{dest / filename}: not a complete gzip file ({exc})") from exc
    os.replace(tmp, out)
    digest = h.hexdigest()
    rec = state.record(out.name, out, digest, source=filename)
    _write_checksum(out, digest)
    if not keep_archive:
        (dest / filename).unlink(missing_ok=True)
    return FetchedFile(out, rec["size"], digest, reused=False)

