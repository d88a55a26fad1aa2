"""Opening a large trajectory archive in the viewer: a synthetic archive of N trajectories (default 100,000:
250 steps × 50 groups × 8, Search-R1 shaped responses of two searches with three retrieved documents each,
~300 response tokens) written in the learner's layout and schema, then, each in a fresh process:

- baseline: reading the archive whole, every column (`searchr1.learner.tools.archive.read`, what
  `searchr1 archive show` starts with);
- the viewer, cold (empty summary cache) then warm (the per-part summaries it cached on disk): `create_app`
  and the first run page (the per-part summary: scalar columns plus the response text one part at a time,
  for the health features), a second run page (summary in memory), a trajectory page, a filtered page with
  a text search over every question and response.

Prints wall seconds and peak RSS (MiB) per row.

    .venv/bin/python benchmarks/viewer.py [--trajectories 100000] [--dir /tmp/viewer-bench]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

DOCS = ('Doc 1(Title: "{c}") {c} is a country whose capital is {city}; it has a long history and many '
        'regions, rivers and mountains described in this encyclopedia article.\nDoc 2(Title: "{city}") {city} '
        'is the capital and largest city of {c}, home to the government and most of its ministries.\n'
        'Doc 3(Title: "History of {c}") The history of {c} covers settlements, kingdoms and modern times.')


def response_text(i: int) -> str:
    c, city = f"Country{i % 997}", f"City{i % 997}"
    obs = f"\n\n<information>{DOCS.format(c=c, city=city)}</information>\n\n"
    return (f"<think> I need to find the capital of {c}. Let me search. </think>\n<search> capital of {c} </search>"
            f"{obs}<think> The first document says {city}; let me confirm. </think>\n<search> {city} capital </search>"
            f"{obs}<think> Both documents agree. </think>\n<answer> {city} </answer>")


def build(directory: Path, n: int, per_step: int = 400, group: int = 8, every: int = 10) -> None:
    import numpy as np
    import pyarrow as pa

    from searchr1.learner.tools.archive import SCHEMA, write_atomic

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    steps = -(-n // per_step)
    tables, seq = [], 0
    for step in range(1, steps + 1):
        m = min(per_step, n - (step - 1) * per_step)
        lens = rng.integers(250, 350, m)
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        total = int(offsets[-1])
        ids = pa.ListArray.from_arrays(offsets, pa.array(rng.integers(2, 150000, total).astype(np.int32)))
        mask = pa.ListArray.from_arrays(offsets, pa.array((rng.random(total) < 0.7).astype(np.int8)))
        lps = pa.ListArray.from_arrays(offsets, pa.array(-rng.random(total).astype(np.float32) * 3))
        poffs = np.arange(m + 1, dtype=np.int32) * 160
        prompt = pa.ListArray.from_arrays(poffs, pa.array(rng.integers(2, 150000, m * 160).astype(np.int32)))
        k = np.arange(m)
        task = [f"s{step}-t{j // group}" for j in k]
        rewards = (rng.random(m) < 0.4).astype(float)
        cols = {
            "step": [step] * m, "policy_version": [step - 1] * m, "task_id": task,
            "question": [f"what is the capital of Country{(step * 31 + j // group) % 997}?" for j in k],
            "golden_answers": [[f"City{(step * 31 + j // group) % 997}"] for j in k],
            "data_source": ["nq" if j % 16 < 8 else "hotpotqa" for j in k], "epoch": [0] * m,
            "group_size": [group] * m, "worker_id": [f"worker-{j % 4}" for j in k],
            "entry_id": [f"{step}-{j // group}" for j in k], "index": [int(j % group) for j in k],
            "reward": rewards.tolist(), "reward_components": [json.dumps({"em": r}) for r in rewards],
            "finish_reason": ["answer"] * m, "num_turns": [3] * m, "num_searches": [2] * m,
            "sampling_temperature": [1.0] * m, "prompt_ids": prompt, "response_ids": ids, "loss_mask": mask,
            "behavior_logprobs": lps, "response_text": [response_text(step * 31 + j // group) for j in k],
        }
        tables.append(pa.Table.from_pydict(cols, schema=SCHEMA))
        if len(tables) == every or step == steps:
            write_atomic(pa.concat_tables(tables), directory / f"part-{seq:06d}.parquet")
            tables, seq = [], seq + 1


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(kind: str, directory: Path) -> dict:
    """One row, run in this (fresh) process."""
    t0 = time.perf_counter()
    out: dict = {"row": kind}
    if kind == "baseline":
        from searchr1.learner.tools.archive import read

        rows = read(directory).num_rows
        out.update(seconds=time.perf_counter() - t0, rows=rows)
    else:
        from fastapi.testclient import TestClient

        from searchr1.viewer.app import create_app
        from searchr1.viewer.settings import ViewerSettings

        client = TestClient(create_app(directory, ViewerSettings(cache_dir=directory.parent / "cache")))
        r = client.get("/")
        assert r.status_code == 200, r.text[:500]
        out["first_page_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        client.get("/?page=3")
        out["cached_page_s"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        r = client.get("/trajectory?part=7&step=75&task_id=s75-t3&index=2")
        assert r.status_code == 200, r.text[:500]
        out["trajectory_s"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        r = client.get("/?q=City42&min_step=1")
        assert r.status_code == 200
        out["text_search_s"] = time.perf_counter() - t1
    out["peak_rss_mib"] = _peak_mib()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trajectories", type=int, default=100_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/viewer-bench"))
    ap.add_argument("--measure", choices=("baseline", "viewer cold", "viewer warm"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.dir)))
        return
    directory = args.dir / "archive"
    if not any(directory.glob("part-*.parquet")):
        t0 = time.perf_counter()
        build(directory, args.trajectories)
        print(f"built {args.trajectories} trajectories in {time.perf_counter() - t0:.1f} s")
    size = sum(p.stat().st_size for p in directory.glob("part-*.parquet")) / 2**20
    print(f"archive: {len(list(directory.glob('part-*.parquet')))} parts, {size:.0f} MiB on disk")
    shutil.rmtree(args.dir / "cache", ignore_errors=True)
    for kind in ("baseline", "viewer cold", "viewer warm"):
        res = subprocess.run([sys.executable, __file__, "--measure", kind, "--dir", str(directory)],
                             capture_output=True, text=True, check=True)
        print(res.stdout.strip())


if __name__ == "__main__":
    main()
