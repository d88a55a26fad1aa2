"""The install route of Dockerfile.cuda's build argument CUDA_VARIANT, and FAISS on GPU.

    python deploy/scripts/cuda_variant.py cu130 requirements.txt     # prints deploy/constraints-cu130.txt
    FAISS=gpu python deploy/scripts/cuda_variant.py cu129 requirements.txt

A route is a constraints file, `deploy/constraints-<variant>.txt`, which pins every GPU package to a build
that exists for it (and names the extra index it comes from): `cu130` (default; PyPI's CUDA 13.0 builds of
vLLM 0.32.0 and torch 2.13.0, driver ≥ 580) and `cu129` (vLLM 0.19.1 from PyPI, torch 2.10.0+cu129 from
PyTorch's CUDA 12.9 index; CUDA 12 drivers). No other variant has a vLLM release built for it: `cu126` and
`cu128` are refused, naming `cu129` (CUDA's minor-version compatibility runs its 12.9 builds on any CUDA 12
driver from 525.60 on).

FAISS (environment variable FAISS): `cpu` (default) keeps faiss-cpu; `gpu` replaces it in the
requirements with PyPI's faiss-gpu (pinned by the cu129 route), which is built for the CUDA 12 runtime
12.6 or newer: only the cu129 route has it; PyPI has no CUDA 13 faiss-gpu.

Rewrites the requirements file for FAISS=gpu and prints the route's constraints file; exit 1 with the
reason for a variant or FAISS choice that has no route. Standard library only: it runs before anything is
installed.
"""

from __future__ import annotations

import re
import sys

ROUTES = {"cu130": "deploy/constraints-cu130.txt", "cu129": "deploy/constraints-cu129.txt"}
"""CUDA_VARIANT → its constraints file (relative to the repository root)."""
WHY_NOT = {
    "cu126": "PyTorch 2.13 has a CUDA 12.6 build but vLLM publishes none (its CUDA 12 builds are 12.9)",
    "cu128": "neither PyTorch (from 2.12) nor vLLM publishes CUDA 12.8 builds of the pinned releases",
}
FAISS_GPU_ROUTES = ("cu129",)
"""The routes whose CUDA runtime PyPI's faiss-gpu supports (CUDA 12, 12.6 or newer)."""


def route(variant: str) -> str:
    """The constraints file of `variant`; ValueError naming the routes for one without."""
    if variant in ROUTES:
        return ROUTES[variant]
    why = WHY_NOT.get(variant, "no route is built for it")
    raise ValueError(f"CUDA_VARIANT {variant!r}: {why}; use cu130 (driver ≥ 580) or cu129 (a CUDA 12 driver: "
                     "12.9 builds run on any driver from 525.60 under CUDA's minor-version compatibility)")


def faiss_inputs(variant: str, faiss: str, requirements: list[str]) -> list[str]:
    """The requirements for FAISS `cpu` (unchanged) or `gpu` (faiss-cpu replaced by faiss-gpu, on the
    routes PyPI's wheel supports)."""
    if faiss == "cpu":
        return requirements
    if faiss != "gpu":
        raise ValueError(f"FAISS {faiss!r}: expected cpu or gpu")
    if variant not in FAISS_GPU_ROUTES:
        raise ValueError(f"FAISS=gpu with CUDA_VARIANT {variant}: PyPI's faiss-gpu is built for the CUDA 12 runtime "
                         f"12.6 or newer only (no CUDA 13 wheel); build CUDA_VARIANT={' or '.join(FAISS_GPU_ROUTES)}, "
                         "or keep FAISS=cpu")
    kept = [r for r in requirements if not re.match(r"faiss-cpu\s*(?:[<>=!~;\[]|$)", r)]
    return [*kept, "faiss-gpu"]


def main(argv: list[str]) -> int:
    import os

    if len(argv) != 2:
        print("usage: cuda_variant.py VARIANT REQUIREMENTS", file=sys.stderr)
        return 2
    variant, path = argv
    try:
        constraints = route(variant)
        with open(path) as f:
            requirements = faiss_inputs(variant, os.environ.get("FAISS", "cpu"), f.read().splitlines())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    with open(path, "w") as f:
        f.write("".join(r + "\n" for r in requirements))
    print(constraints)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
