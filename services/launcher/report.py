"""The `searchr1 demo` report: what a run learned, from the learner's JSONL step log and the two
`searchr1 eval` results (before and after training).

`load_steps`, `curves`, `windowed_mean`, `compare_evals` and `summary_lines` are pure (dicts in, dicts
and strings out) and unit-tested; `write_report` writes `report.md` and, when matplotlib is installed
(the `demo`/`dev` extras), `report.png` with reward, EM and searches per question against step, split
into known- and unknown-entity questions by `data_source`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CURVE_KEYS = ("reward_mean", "em_mean", "searches_per_trajectory")


def load_steps(path: str | Path) -> list[dict[str, Any]]:
    """The learner's JSONL step log (one object per step); unreadable lines are skipped."""
    p = Path(path)
    if not p.is_file():
        return []
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "step" in rec:
            out.append(rec)
    return out


def split_of(data_source: str) -> str:
    """`known` / `unknown` / `other` from a tiny-world data_source (`world_known_single_hop`, …)."""
    if "unknown" in data_source:
        return "unknown"
    if "known" in data_source:
        return "known"
    return "other"


def curves(steps: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Per split (`all`, `known`, `unknown`) and key (`CURVE_KEYS`): (step, value) points. Per-split values
    are trajectory-weighted means over the step's `by_source` rows of that split."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {s: {k: [] for k in CURVE_KEYS}
                                                           for s in ("all", "known", "unknown")}
    for rec in steps:
        step = int(rec["step"])
        for key in CURVE_KEYS:
            if isinstance(rec.get(key), (int, float)):
                out["all"][key].append((step, float(rec[key])))
        by = rec.get("by_source") or {}
        for split in ("known", "unknown"):
            rows = [r for ds, r in by.items() if split_of(ds) == split and isinstance(r, Mapping)]
            for key in CURVE_KEYS:
                pairs = [(r.get("trajectories", 1.0), r[key]) for r in rows if isinstance(r.get(key), (int, float))]
                weight = sum(w for w, _ in pairs)
                if weight > 0:
                    out[split][key].append((step, sum(w * v for w, v in pairs) / weight))
    return out


def windowed_mean(points: Sequence[tuple[int, float]], first: bool, n: int) -> float | None:
    """Mean of the first (or last) `n` points' values; None when there are none."""
    chosen = list(points[:n] if first else points[-n:])
    if not chosen:
        return None
    return math.fsum(v for _, v in chosen) / len(chosen)


def _metric(doc: Mapping[str, Any] | None, mode: str, key: str, split: str | None = None) -> float | None:
    if not doc:
        return None
    block = (doc.get("summary") or {}).get(mode)
    if not block:
        return None
    if split is None:
        return block["overall"].get(key)
    groups = (block.get("by") or {}).get("data_source") or {}
    rows = [(m.get("trajectories", 0), m.get(key)) for ds, m in groups.items() if split_of(ds) == split]
    rows = [(w, v) for w, v in rows if isinstance(v, (int, float)) and w]
    weight = sum(w for w, _ in rows)
    return sum(w * v for w, v in rows) / weight if weight else None


COMPARE_ROWS = (
    ("sampled EM", "sampled", "em", None),
    ("greedy EM", "greedy", "em", None),
    ("sampled format-valid", "sampled", "format_valid", None),
    ("sampled searches/question", "sampled", "searches", None),
    ("sampled EM, unknown entities", "sampled", "em", "unknown"),
    ("sampled EM, known entities", "sampled", "em", "known"),
    ("sampled searched share, unknown", "sampled", "searched", "unknown"),
    ("sampled searches/question, known", "sampled", "searches", "known"),
)


def compare_evals(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Rows `{name, before, after, delta}` for the headline metrics of two eval.json documents."""
    rows = []
    for name, mode, key, split in COMPARE_ROWS:
        b, a = _metric(before, mode, key, split), _metric(after, mode, key, split)
        rows.append({"name": name, "before": b, "after": a,
                     "delta": (a - b) if a is not None and b is not None else None})
    return rows


def _f(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "–"
    return f"{x:+.3f}" if signed else f"{x:.3f}"


def summary_lines(rows: Sequence[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]], window: int = 20) -> list[str]:
    """The one-screen summary: eval before/after and the training curve's first vs last window."""
    lines = [f"{'':34} {'before':>8} {'after':>8} {'delta':>8}"]
    for r in rows:
        lines.append(f"{r['name']:34} {_f(r['before']):>8} {_f(r['after']):>8} {_f(r['delta'], True):>8}")
    c = curves(steps)["all"]
    n = len(c["reward_mean"])
    if n:
        w = min(window, max(1, n // 2))
        first, last = windowed_mean(c["reward_mean"], True, w), windowed_mean(c["reward_mean"], False, w)
        kl = [float(s["kl_loss"]) for s in steps if isinstance(s.get("kl_loss"), (int, float))]
        lines.append(f"training: {n} steps; mean reward first {w} {_f(first)} → last {w} {_f(last)}"
                     + (f"; max KL {max(kl):.4f}" if kl else ""))
    else:
        lines.append("training: no step log found")
    return lines


def markdown(rows: Sequence[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]], meta: Mapping[str, Any],
             plot: str | None) -> str:
    out = ["# searchr1 demo report", ""]
    for k, v in meta.items():
        out.append(f"- **{k}**: {v}")
    out += ["", "## Held-out evaluation (before → after GRPO)", "", "| metric | before | after | delta |",
            "|---|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['name']} | {_f(r['before'])} | {_f(r['after'])} | {_f(r['delta'], True)} |")
    out += ["", "## Training", "", "```", *summary_lines(rows, steps)[-1:], "```", ""]
    if plot:
        out += [f"![reward, EM and searches per question against step]({plot})", ""]
    return "\n".join(out)


SMOOTH_WINDOW = 10
"""Points in the trailing mean the plot draws over each raw curve (per-step figures of 8 questions are noisy)."""


def moving_average(points: Sequence[tuple[int, float]], window: int) -> list[tuple[int, float]]:
    """Trailing mean over the last `window` points (fewer at the start), at each point's step."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out, total = [], 0.0
    for i, (step, value) in enumerate(points):
        total += value
        if i >= window:
            total -= points[i - window][1]
        out.append((step, total / min(i + 1, window)))
    return out


def plot_curves(steps: Sequence[Mapping[str, Any]], path: Path) -> bool:
    """reward / EM / searches per question against step (all, known, unknown); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    c = curves(steps)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    titles = {"reward_mean": "reward (sampled)", "em_mean": "EM (sampled)",
              "searches_per_trajectory": "searches per question"}
    for ax, key in zip(axes, CURVE_KEYS):
        for split, colour in (("all", "k"), ("known", "b"), ("unknown", "r")):
            pts = c[split][key]
            if pts:
                ax.plot([s for s, _ in pts], [v for _, v in pts], color=colour, linewidth=0.6, alpha=0.3)
                smooth = moving_average(pts, SMOOTH_WINDOW)
                ax.plot([s for s, _ in smooth], [v for _, v in smooth], color=colour, linewidth=1.6,
                        label=split)
        if not any(c[split][key] for split in ("all", "known", "unknown")):
            ax.text(0.5, 0.5, "not in this run's reward breakdown", ha="center", va="center",
                    transform=ax.transAxes, color="grey")
        ax.set_title(f"{titles[key]}, {SMOOTH_WINDOW}-step mean")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(run_dir: str | Path, steps_path: str | Path, before: Mapping[str, Any] | None,
                 after: Mapping[str, Any] | None, meta: Mapping[str, Any]) -> tuple[Path, list[str]]:
    """Write RUN_DIR/report.md (+ report.png); returns the report path and the summary lines."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    steps = load_steps(steps_path)
    rows = compare_evals(before, after)
    plot = "report.png" if plot_curves(steps, run / "report.png") else None
    (run / "report.md").write_text(markdown(rows, steps, meta, plot), encoding="utf-8")
    (run / "report.json").write_text(json.dumps({"meta": dict(meta), "compare": rows,
                                                  "curves": curves(steps)}, indent=1) + "\n", encoding="utf-8")
    return run / "report.md", summary_lines(rows, steps)
