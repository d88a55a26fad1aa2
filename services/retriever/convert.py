"""`searchr1 index convert`: a Flat index directory (built, or imported from Search-R1's `e5_Flat.index`)
rewritten as IVF-PQ or HNSW, with no re-encoding: the vectors are read back from the memory-mapped Flat
file in blocks.

Which to pick for wiki-18 (21M × 768 float32, 61 GiB as Flat): `ivfpq` stores 96 bytes per passage with
the default PQ96 (about 2 GiB, plus the offsets) and is the kind for hosts that cannot hold the Flat index;
recall falls somewhat, tuned by `ivf_nprobe` at search time. `hnsw` keeps the full vectors (more memory
than Flat, for the graph) and trades build time for fast search; use it for latency, not memory.
Memory-mapping the Flat file (`search.faiss_mmap`) is the third option: exact results, pages read from
disk as queries touch them.

The output directory gets the new `index.faiss`, a copy of `offsets.npy` and a manifest equal to the
source's but for kind, FAISS parameters and time; it names the same corpus file.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from searchr1.retriever.indexes import FaissParams, ivfpq_shape, new_faiss_index
from searchr1.retriever.manifest import FAISS_FILE, MANIFEST, OFFSETS, IndexMismatchError, Manifest

__all__ = ["CONVERT_KINDS", "convert_index", "training_rows"]

CONVERT_KINDS = ("hnsw", "ivfpq")


def training_rows(count: int, want: int) -> np.ndarray:
    """`want` row numbers spread evenly over `count` rows (all of them when `want >= count`)."""
    if count <= 0:
        raise ValueError("no rows to sample")
    if want >= count:
        return np.arange(count, dtype=np.int64)
    return np.linspace(0, count - 1, num=want, dtype=np.int64)


def convert_index(src: str | Path, out: str | Path, kind: str, *, params: FaissParams | None = None,
                  block: int = 100_000, train_size: int = 0,
                  progress: Callable[[str, int, int], None] | None = None) -> Manifest:
    """Rewrite the Flat index in `src` as `kind` in `out` (see module docstring). `train_size`: vectors
    IVF-PQ trains on (0: 64 per cell). Blocking; async callers use a thread."""
    import faiss

    params = params or FaissParams.of()
    if kind not in CONVERT_KINDS:
        raise ValueError(f"convert to one of {CONVERT_KINDS}, not {kind!r}")
    src, out = Path(src), Path(out)
    if src.resolve() == out.resolve():
        raise ValueError("the output directory must differ from the source")
    manifest = Manifest.read(src)
    if manifest.kind != "flat":
        raise IndexMismatchError(f"{src} holds a {manifest.kind} index; only a flat one can be converted")
    flat = faiss.read_index(str(src / FAISS_FILE), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    if flat.ntotal != manifest.count or flat.d != manifest.dim:
        raise IndexMismatchError(f"{src / FAISS_FILE} holds {flat.ntotal}×{flat.d}, the manifest says "
                                 f"{manifest.count}×{manifest.dim}")
    if flat.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise IndexMismatchError(f"{src / FAISS_FILE} is not an inner-product index; only those convert")
    count, dim = int(flat.ntotal), int(flat.d)
    index = new_faiss_index(kind, dim, count, params)  # type: ignore[arg-type]
    if kind == "ivfpq":
        nlist = ivfpq_shape(dim, count, params)[0]
        rows = training_rows(count, train_size or 64 * nlist)
        sample = np.stack([flat.reconstruct(int(r)) for r in rows]).astype(np.float32)
        index.train(sample)
    for start in range(0, count, block):
        n = min(block, count - start)
        index.add(np.ascontiguousarray(flat.reconstruct_n(start, n), dtype=np.float32))
        if progress is not None:
            progress("convert", start + n, count)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    tmp = out / (FAISS_FILE + ".tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, out / FAISS_FILE)
    shutil.copyfile(src / OFFSETS, out / OFFSETS)
    converted = replace(manifest, kind=kind, faiss=asdict(params), created_at=time.time())
    converted.write(out)
    return converted
