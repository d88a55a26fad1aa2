"""Figures, tables and the stacked-bar breakdown of the system benchmark (`benchmarks/system.py`), from
the `RunRecord`s of `system_run.py`. Pure bookkeeping: no process is started here.

Windows: every figure counts from the moment the learner answered on `/metrics` and a first worker had
logged `ready` (`t_up`: models and an engine loaded) to the learner's step N, so start-up (vLLM's above
all, slow and noisy on a busy machine) is left out; a second worker still starting then counts as
waiting. Stage seconds, both sides, are the difference of
the processes' stage counters between the first scrape at `t_up` and the last one before step N's log
line (scrapes every 2 s).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from system_run import RunRecord

ROLLOUT_STAGES = ("generation", "search_wait", "scoring", "publish", "weight_reload", "queue_wait")
LEARNER_STAGES = ("forward_backward", "optimizer", "checkpoint", "archive", "weight_publish", "other",
                  "queue_wait")
COLORS = {"generation": "#4c72b0", "search_wait": "#64b5cd", "scoring": "#8172b2", "publish": "#ccb974",
          "weight_reload": "#c44e52", "queue_wait": "#dddddd", "forward_backward": "#55a868",
          "optimizer": "#8c8c3c", "checkpoint": "#dd8452", "archive": "#937860", "weight_publish": "#da8bc3",
          "other": "#aaaaaa"}


@dataclass
class Figures:
    name: str
    label: str
    steps: int
    seconds_to_n: float | None
    seconds_to_level: float | None
    final_reward: float | None
    sampled_em: float | None
    greedy_em: float | None
    rollout_busy: float | None
    learner_busy: float | None
    staleness: float | None
    train_tokens_per_s: float | None
    gen_tokens_per_s: float | None
    load: float | None
    rollout_stages: dict[str, float]
    """Seconds per stage, averaged over the workers."""
    learner_stages: dict[str, float]


def rolling(values: list[float], window: int) -> list[float | None]:
    """Mean of the last `window` values at each position (None before `window` values exist)."""
    out: list[float | None] = []
    for i in range(len(values)):
        out.append(None if i + 1 < window else sum(values[i + 1 - window:i + 1]) / window)
    return out


def time_to_level(rec: RunRecord, level: float, window: int) -> float | None:
    """Seconds from `t_up` to the first step whose rolling mean reward reaches `level`."""
    means = rolling([s["reward_mean"] for s in rec.steps], window)
    for s, m in zip(rec.steps, means):
        if m is not None and m >= level:
            return s["time"] - rec.t_up
    return None


def max_rolling_reward(rec: RunRecord, window: int) -> float | None:
    means = [m for m in rolling([s["reward_mean"] for s in rec.steps], window) if m is not None]
    return max(means) if means else None


def side_stages(rec: RunRecord, t_end: float, side: str) -> dict[str, float]:
    """Per-stage seconds between `t_up` and `t_end` of the learner, or of the workers (their mean)."""
    inside = [s for s in rec.scrapes if s.t <= t_end + 1.0]
    if len(inside) < 2:
        return {}
    first, last = inside[0], inside[-1]
    procs = ["learner"] if side == "learner" else [k for k in last.stages if k != "learner"]
    return {stage: statistics.fmean(last.stages[p].get(stage, 0.0) - first.stages[p].get(stage, 0.0)
                                    for p in procs)
            for stage in (LEARNER_STAGES if side == "learner" else ROLLOUT_STAGES)}


def busy(stages: dict[str, float]) -> float | None:
    total = sum(stages.values())
    return None if total <= 0 else 1.0 - stages.get("queue_wait", 0.0) / total


def figures(rec: RunRecord, level: float, window: int) -> Figures:
    steps = rec.steps
    n = len(steps)
    t_n = steps[-1]["time"] if steps else None
    seconds_to_n = None if t_n is None or rec.t_up is None else t_n - rec.t_up
    ro = side_stages(rec, t_n, "rollout") if t_n is not None else {}
    le = side_stages(rec, t_n, "learner") if t_n is not None else {}
    inside = [s for s in rec.scrapes if t_n is not None and s.t <= t_n + 1.0]
    gen_rate = None
    if len(inside) >= 2 and inside[-1].t > inside[0].t:
        gen_rate = (inside[-1].generated_tokens - inside[0].generated_tokens) / (inside[-1].t - inside[0].t)
    ev = rec.eval or {}
    sampled = (ev.get("sampled") or {}).get("overall") or {}
    greedy = (ev.get("greedy") or {}).get("overall") or {}
    loads = [v for t, v in rec.load if rec.t_up is not None and t >= rec.t_up and (t_n is None or t <= t_n)]
    finals = rolling([s["reward_mean"] for s in steps], min(window, n)) if n else []
    return Figures(
        name=rec.variant.name, label=rec.variant.label, steps=n, seconds_to_n=seconds_to_n,
        seconds_to_level=time_to_level(rec, level, window) if rec.t_up is not None else None,
        final_reward=finals[-1] if finals else None,
        sampled_em=sampled.get("em"), greedy_em=greedy.get("em"),
        rollout_busy=busy(ro), learner_busy=busy(le),
        staleness=statistics.fmean(s.get("staleness_mean", 0.0) for s in steps) if steps else None,
        train_tokens_per_s=sum(s.get("tokens", 0.0) for s in steps) / seconds_to_n if seconds_to_n else None,
        gen_tokens_per_s=gen_rate, load=statistics.fmean(loads) if loads else None,
        rollout_stages=ro, learner_stages=le)


def _f(v: float | None, fmt: str = "{:.1f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def _ratio(base: float | None, v: float | None) -> str:
    """How many times sooner (base / v) — for times."""
    return "n/a" if not base or not v else f"{base / v:.2f}×"


def comparison_table(figs: list[Figures], level: float, window: int) -> list[str]:
    base = figs[0]
    head = ("| variant | steps | s to N steps (× vs first) | s/step | s to reward "
            f"{level:.3f} ({window}-step mean) (×) | final reward | sampled EM (Δ pts) | greedy EM | "
            "rollout busy | learner busy | staleness | train tok/s | gen tok/s | load avg |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for f in figs:
        dem = "" if f.sampled_em is None or base.sampled_em is None else \
            f" ({100 * (f.sampled_em - base.sampled_em):+.1f})"
        lines.append(
            f"| {f.label} | {f.steps} | {_f(f.seconds_to_n, '{:.0f}')} ({_ratio(base.seconds_to_n, f.seconds_to_n)}) "
            f"| {_f(f.seconds_to_n and f.seconds_to_n / f.steps, '{:.1f}')} "
            f"| {_f(f.seconds_to_level, '{:.0f}')} ({_ratio(base.seconds_to_level, f.seconds_to_level)}) "
            f"| {_f(f.final_reward, '{:.3f}')} | {_f(f.sampled_em, '{:.3f}')}{dem} | {_f(f.greedy_em, '{:.3f}')} "
            f"| {_f(f.rollout_busy and 100 * f.rollout_busy, '{:.0f}%')} "
            f"| {_f(f.learner_busy and 100 * f.learner_busy, '{:.0f}%')} | {_f(f.staleness, '{:.2f}')} "
            f"| {_f(f.train_tokens_per_s, '{:.0f}')} | {_f(f.gen_tokens_per_s, '{:.0f}')} | {_f(f.load, '{:.1f}')} |")
    return lines


def breakdown_table(figs: list[Figures], side: str) -> list[str]:
    """Per variant, seconds and share of each of one side's stages (`rollout`: mean over workers)."""
    cols = ROLLOUT_STAGES if side == "rollout" else LEARNER_STAGES
    lines = [f"| {side} | " + " | ".join(cols) + " | wall s |", "|" + "---|" * (len(cols) + 2)]
    for f in figs:
        stages = f.rollout_stages if side == "rollout" else f.learner_stages
        total = sum(stages.values())
        cells = [f"{stages.get(c, 0.0):.0f} s ({100 * stages.get(c, 0.0) / (total or 1.0):.0f}%)" for c in cols]
        lines.append(f"| {f.label} | " + " | ".join(cells) + f" | {total:.0f} |")
    return lines


def plot_breakdown(figs: list[Figures], path: Path, title: str) -> Path:
    """Stacked bars: per variant, the rollout workers' and the learner's wall time by stage (share)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 0.9 * len(figs) + 2.2), sharey=True)
    names = [f.label for f in figs]
    for ax, side, order in ((axes[0], "rollout", ROLLOUT_STAGES), (axes[1], "learner", LEARNER_STAGES)):
        left = [0.0] * len(figs)
        for stage in order:
            shares = []
            for f in figs:
                st = f.rollout_stages if side == "rollout" else f.learner_stages
                total = sum(st.values()) or 1.0
                shares.append(100 * st.get(stage, 0.0) / total)
            ax.barh(names, shares, left=left, color=COLORS[stage], label=stage, edgecolor="white", linewidth=0.5)
            for i, s in enumerate(shares):
                if s >= 7:
                    ax.text(left[i] + s / 2, i, f"{s:.0f}", ha="center", va="center", fontsize=8)
            left = [a + b for a, b in zip(left, shares)]
        ax.set_xlim(0, 100)
        ax.set_xlabel("% of wall time")
        ax.set_title(f"{side} ({'mean over workers' if side == 'rollout' else 'one process'})")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(figs) < 3 else -0.12), ncol=3, fontsize=8,
                  frameon=False)
    axes[0].invert_yaxis()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def to_json(f: Figures) -> dict[str, Any]:
    return dict(f.__dict__)
