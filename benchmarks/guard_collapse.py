"""The collapse guard on a forced collapse: replay a tiny-world run's trajectory archive through the
learner with a learning rate that collapses it (3e-2, warmed up over the first 30% of 40 steps, against
the tiny world's 1e-4), once without the guard (the baseline) and once with `[learner.guard]` bounding the
KL to the reference at 0.5 (patience 2, learning rate × 0.1 per rollback, at most 2 rollbacks). Prints both
runs' KL and entropy per step with the guard's events, and plots KL against step.

    .venv/bin/python benchmarks/guard_collapse.py --archive RUN_DIR/archive \\
        --model assets/tiny-world/warmstart [--out docs/img/guard-forced-collapse.png]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = """
[learner]
device = "cpu"
threads = 1
seed = 0
log_dir = "{root}/logs"
[learner.redis]
run = "forced"
[learner.model]
path = "{model}"
dtype = "float32"
[learner.algorithm]
advantage = "grpo"
use_kl_loss = true
kl_loss_coef = 0.001
kl_loss_type = "low_var_kl"
max_staleness = 100
[learner.optim]
lr = 3e-2
warmup_ratio = 0.3
total_steps = 40
grad_clip = 1.0
[learner.batch]
groups_per_step = 4
micro_batch_size = 8
max_seq_len = 1024
[learner.weights]
dir = "{root}/weights"
keep = 3
[learner.checkpoint]
dir = "{root}/checkpoints"
keep = 8
[learner.archive]
replay_from = "{archive}"
[learner.guard]
enabled = {guard}
above = {{ kl_loss = 0.5, nonfinite_figures = 0.5 }}
patience = 2
lr_factor = 0.1
max_rollbacks = 2
"""


def run(root: Path, archive: Path, model: Path, guard: bool, steps: int) -> list[dict]:
    root.mkdir(parents=True, exist_ok=True)
    cfg = root / "learner.toml"
    cfg.write_text(CONFIG.format(root=root, model=model.resolve(), archive=archive.resolve(),
                                 guard="true" if guard else "false"))
    subprocess.run([sys.executable, "-m", "searchr1.cli", "train", "--config", str(cfg), "--max-steps", str(steps)],
                   check=True, capture_output=True, text=True)
    return [json.loads(line) for line in (root / "logs" / "forced.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archive", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=13)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = run(Path(tmp) / "baseline", args.archive, args.model, False, args.steps)
        guarded = run(Path(tmp) / "guarded", args.archive, args.model, True, args.steps)
    for name, records in (("baseline (no guard)", base), ("guarded", guarded)):
        print(name)
        for r in records:
            if "event" in r:
                print(f"  step {r['step']:3d}  {r['event']}: {'; '.join(r['reasons'])}"
                      + (f" → {r['checkpoint']}, lr {r['lr']:.3g}" if r["event"] == "guard_rollback" else ""))
            else:
                print(f"  step {r['step']:3d}  KL {r['kl_loss']:.3f}  entropy {r['entropy']:.3f}  lr {r['lr']:.3g}")
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.4))
        for name, records, style in (("no guard", base, "o-"), ("guarded", guarded, "s-")):
            pts = [(r["step"], r["kl_loss"]) for r in records if "kl_loss" in r]
            ax.plot(*zip(*pts), style, label=name, markersize=4)
        ax.set_ylim(-0.3, max(r.get("kl_loss", 0.0) for r in base + guarded) * 1.1 + 0.1)
        for r in guarded:
            if r.get("event") == "guard_rollback":
                ax.axvline(r["step"] + 0.5, color="tab:red", ls="--", lw=1)
                ax.text(r["step"] + 0.6, ax.get_ylim()[1] * 0.9, f"rollback → {r['checkpoint'][-2:].lstrip('0')}\n"
                        f"lr {r['lr']:.0e}", color="tab:red", fontsize=8, va="top")
            if r.get("event") == "guard_stop":
                ax.axvline(r["step"] + 0.5, color="black", ls=":", lw=1)
                ax.text(r["step"] + 0.6, ax.get_ylim()[1] * 0.5, "stop", fontsize=8)
        ax.set_xlim(0.5, max(r["step"] for r in base + guarded) + 1.8)
        ax.axhline(0.5, color="gray", lw=0.8)
        ax.set_xlabel("learner step")
        ax.set_ylabel("KL to the reference")
        ax.set_title("Forced collapse (lr 3e-2), tiny-world archive replayed", fontsize=10)
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        fig.savefig(args.out, dpi=120)
        print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
