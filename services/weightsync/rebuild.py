"""A published version as one full snapshot, rebuilt from a publisher's directory: the newest full at or
before it and the deltas after it, each read verified against its own manifest and applied with its
checksums checked (`apply.BaseWeights`). What reads a run's weights after the run — the demo's evaluation,
an export, the rehearsal's round trip — takes the newest version whatever form it was published in,
never an older full one.

`materialize(root, version)` writes `root/v{version:08d}/` (the full version's config files, the rebuilt
tensors as `model.safetensors` with the version and checksums in its metadata, a manifest) when it is not
there yet, and returns it; `newest_version(root)` is the newest version on disk in either form. Blocking
file work: call it when the learner has stopped, or from a thread.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from searchr1.weightsync.apply import BaseWeights
from searchr1.weightsync.delta import DELTA_FILE, Delta, DeltaRefused
from searchr1.weightsync.manifest import MANIFEST, SnapshotError, snapshot_digest
from searchr1.weightsync.publish import WEIGHTS_FILE, WeightPublisher
from searchr1.weightsync.read import read_verified
from searchr1.weightsync.safetensors import snapshot_tensors, write_safetensors


def newest_version(root: str | Path) -> int | None:
    """The newest version under `root` in either form (a full `v…` or a delta `d…` directory), or None."""
    pub = WeightPublisher(Path(root), keep=1)  # read only: nothing is pruned
    return max(pub.versions() + pub.deltas(), default=None)


def _read(directory: Path) -> dict[str, memoryview]:
    """The files of a snapshot directory, verified against its own manifest."""
    return read_verified(directory, snapshot_digest(directory))


def version_tensors(root: str | Path, version: int) -> BaseWeights:
    """The tensors of `version` (with their checksums): the newest full at or before it, then every delta
    after it, applied verified. Raises `SnapshotError` when the chain on disk does not reach it."""
    from searchr1.weightsync.vllm_ext import base_of

    pub = WeightPublisher(Path(root), keep=1)  # read only: nothing is pruned
    fulls = [v for v in pub.versions() if v <= version]
    if not fulls:
        raise SnapshotError(f"no full version at or before {version} under {pub.root}")
    start = fulls[-1]
    files = _read(pub.path(start))
    base = base_of(files, [(n, t.clone()) for n, t in snapshot_tensors(files)])
    base.version = start
    for v in range(start + 1, version + 1):
        if not pub.delta_path(v).is_dir():
            raise SnapshotError(f"no delta {v - 1}→{v} under {pub.root}: version {version} cannot be rebuilt")
        delta = _read(pub.delta_path(v))
        if DELTA_FILE not in delta:
            raise DeltaRefused(f"{pub.delta_path(v)}: no {DELTA_FILE}")
        base.apply(Delta.parse(delta[DELTA_FILE]))
    return base


def materialize(root: str | Path, version: int | None = None) -> Path | None:
    """The full snapshot directory of `version` (default: the newest on disk) under `root`, written from
    the chain when only a delta holds it; None when `root` holds no version."""
    import json

    pub = WeightPublisher(Path(root), keep=1)  # read only: nothing is pruned
    version = newest_version(root) if version is None else version
    if version is None:
        return None
    if pub.path(version).is_dir():
        return pub.path(version)
    base = version_tensors(root, version)
    source = pub.path(max(v for v in pub.versions() if v <= version))
    tmp = pub.root / f".materialize-{version:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for src in source.iterdir():
        if src.is_file() and src.name not in (WEIGHTS_FILE, MANIFEST):
            shutil.copy2(src, tmp / src.name)
    meta = {"searchr1_version": str(version),
            "searchr1_checksums": json.dumps(base.sums, sort_keys=True, separators=(",", ":"))}
    with (tmp / WEIGHTS_FILE).open("wb") as f:
        write_safetensors(f, base.tensors, None, meta)
    (tmp / MANIFEST).unlink(missing_ok=True)
    tmp.rename(pub.path(version))
    return pub.path(version)
