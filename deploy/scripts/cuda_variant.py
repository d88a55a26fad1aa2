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

Writes the rewritten constraints and the extra requirements (the vLLM wheel) and prints pip's extra
arguments (the index; words without spaces).
Standard library only: it runs before anything is installed.
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


def main(argv: list[str]) -> None:
    import os

    if len(argv) != 4:
        sys.exit("usage: cuda_variant.py VARIANT CONSTRAINTS OUT_CONSTRAINTS OUT_REQUIREMENTS")
    variant, src, dst, extra = argv
    try:
        with open(src) as f:
            text, args, requirements = variant_inputs(variant, f.read(), os.environ.get("VLLM_WHEEL", ""))
    except ValueError as exc:
        sys.exit(str(exc))
    with open(dst, "w") as f:
        f.write(text)
    with open(extra, "w") as f:
        f.write("".join(r + "\n" for r in requirements))
    print(" ".join(args))


if __name__ == "__main__":
    main(sys.argv[1:])
