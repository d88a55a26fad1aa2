"""The pip inputs of Dockerfile.cuda for one CUDA variant of torch and vLLM (build argument CUDA_VARIANT).

    python deploy/scripts/cuda_variant.py cu130 constraints-cuda.txt constraints.txt extra.txt
    python deploy/scripts/cuda_variant.py cu128 constraints-cuda.txt constraints.txt extra.txt

`cu130` (the default) is PyPI's own build: torch and vLLM from PyPI as pinned, the CUDA 13.0 runtime in
torch's nvidia-*-cu13 wheels (driver ≥ 580). A `cu12x` variant (cu126, cu128, cu129) takes torch,
torchvision and torchaudio from PyTorch's index for that CUDA (`--extra-index-url
https://download.pytorch.org/whl/cu12x`, pins rewritten to `+cu12x`) and vLLM from its release wheel
built for that CUDA (`vllm-<version>+cu12x-…whl` on vLLM's GitHub release, or VLLM_WHEEL), so the image
runs on hosts whose driver supports that CUDA 12 release (docs/deploy.md has the driver matrix).
Which variants exist depends on the pinned releases: PyTorch and vLLM publish a few per release.

FAISS (build argument FAISS): `cpu` (the default) keeps the retriever's faiss-cpu; `gpu` replaces it with
PyPI's `faiss-gpu` (pinned in deploy/constraints-cuda.txt: 1.15.1, the faiss-cpu release of the CPU
image), which is built against the CUDA 12 runtime from 12.6 on (it requires nvidia-cuda-runtime-cu12
≥ 12.6, < 13): the cu126, cu128 and cu129 variants. PyPI has no faiss-gpu wheel for CUDA 13, so `cu130`
with FAISS=gpu is refused.

Writes the rewritten constraints and the extra requirements (the vLLM wheel, faiss-gpu), rewrites the
requirements file when one is given (faiss-cpu dropped for FAISS=gpu), and prints pip's extra arguments
(the index; words without spaces). Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import re
import sys

TORCH_INDEX = "https://download.pytorch.org/whl"
VLLM_RELEASES = "https://github.com/vllm-project/vllm/releases/download"
TORCH_FAMILY = ("torch", "torchvision", "torchaudio")


def variant_inputs(variant: str, constraints: str, vllm_wheel: str = "",
                   torch_index: str = TORCH_INDEX) -> tuple[str, list[str], list[str]]:
    """(constraints text, extra pip arguments, extra requirement lines) for `variant` (`cu130`, or
    `cu12N` for CUDA 12.N)."""
    if not re.fullmatch(r"cu1[23]\d", variant):
        raise ValueError(f"CUDA_VARIANT {variant!r}: expected cu130 or a CUDA 12 variant such as cu126, cu128, cu129")
    if variant == "cu130":
        return constraints, [], []
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", constraints, re.M))
    if "vllm" not in pins:
        raise ValueError("the constraints pin no vllm version")
    out = []
    for line in constraints.splitlines():
        name = line.split("==")[0]
        if name in TORCH_FAMILY and "==" in line:
            line = f"{line}+{variant}"
        elif name == "vllm":
            continue  # a direct wheel below: pip takes no URL as a constraint
        out.append(line)
    version = pins["vllm"]
    wheel = vllm_wheel or f"{VLLM_RELEASES}/v{version}/vllm-{version}+{variant}-cp38-abi3-manylinux_2_35_x86_64.whl"
    return "\n".join(out) + "\n", ["--extra-index-url", f"{torch_index}/{variant}"], [f"vllm @ {wheel}"]


FAISS_GPU_FROM = 6
"""PyPI's faiss-gpu needs the CUDA 12 runtime 12.6 or newer: variants cu126 and up, below cu130."""


def faiss_inputs(variant: str, faiss: str, requirements: list[str]) -> tuple[list[str], list[str]]:
    """(requirements, extra requirement lines) for FAISS `cpu` (unchanged) or `gpu` (faiss-cpu replaced by
    faiss-gpu, for the CUDA 12 variants PyPI's wheel supports)."""
    if faiss == "cpu":
        return requirements, []
    if faiss != "gpu":
        raise ValueError(f"FAISS {faiss!r}: expected cpu or gpu")
    m = re.fullmatch(r"cu12(\d)", variant)
    if m is None or int(m.group(1)) < FAISS_GPU_FROM:
        raise ValueError(f"FAISS=gpu with CUDA_VARIANT {variant}: PyPI's faiss-gpu is built for the CUDA 12 runtime "
                         "12.6 or newer only (no CUDA 13 wheel); build CUDA_VARIANT=cu126, cu128 or cu129, or keep "
                         "FAISS=cpu")
    return [r for r in requirements if not re.match(r"faiss-cpu\s*(?:[<>=!~;\[]|$)", r)], ["faiss-gpu"]


def main(argv: list[str]) -> None:
    import os

    if len(argv) not in (4, 5):
        sys.exit("usage: cuda_variant.py VARIANT CONSTRAINTS OUT_CONSTRAINTS OUT_REQUIREMENTS [REQUIREMENTS]")
    variant, src, dst, extra = argv[:4]
    try:
        with open(src) as f:
            text, args, requirements = variant_inputs(variant, f.read(), os.environ.get("VLLM_WHEEL", ""))
        base: list[str] = []
        if len(argv) == 5:
            with open(argv[4]) as f:
                base = f.read().splitlines()
        base, faiss = faiss_inputs(variant, os.environ.get("FAISS", "cpu"), base)
    except ValueError as exc:
        sys.exit(str(exc))
    with open(dst, "w") as f:
        f.write(text)
    with open(extra, "w") as f:
        f.write("".join(r + "\n" for r in [*requirements, *faiss]))
    if len(argv) == 5:
        with open(argv[4], "w") as f:
            f.write("".join(r + "\n" for r in base))
    print(" ".join(args))


if __name__ == "__main__":
    main(sys.argv[1:])
