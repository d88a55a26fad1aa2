"""The soak's figures from what it sampled: times from each fault to the next training step (p50/p99/max),
the silent stalls (no step for longer than a bound while nothing says why),
slopes of Redis `used_memory`, of the disk used under the run directory and of each process's RSS after
warm-up, and the plot. Pure functions over lists of samples, except `plot` (matplotlib, to a PNG).

A process killed and restarted starts a new incarnation (a new pid) whose memory starts from scratch, so an
RSS slope over the whole run would mostly measure the kills. The slope reported per process is the pooled
within-incarnation slope: each incarnation's samples taken after its own warm-up are centred on their own
means, and one least-squares slope is fitted through all of them (a leak shows as growth within every
incarnation; a restart's drop does not count).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class RssSample:
    t: float
    """Seconds since the soak started."""
    name: str
    pid: int
    rss: int
    """Bytes."""


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`-th percentile (0–100) by linear interpolation between closest ranks; None when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    return {"n": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "max": max(values) if values else None}


def next_step_after(fault_t: float, step_times: Sequence[float]) -> float | None:
    """Seconds from a fault to the first training step logged after it (`step_times` ascending)."""
    for t in step_times:
        if t > fault_t:
            return t - fault_t
    return None


def silent_stalls(step_times: Sequence[float], start: float, end: float, bound_s: float,
                  signals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The silent stalls of a run: spans longer than `bound_s`, between `start` and `end`, with no training
    step and no signal (an alert firing, a process restarted or stopped with its cause: `signals` as
    (from, to) intervals). A stall during which a signal fired counts only for its silent stretches: a
    restart early in a long wait does not excuse the rest of it. `step_times` ascending."""
    gaps, last = [], start
    for t in [*(t for t in step_times if start < t <= end), end]:
        if t - last > bound_s:
            gaps.append((last, t))
        last = max(last, t)
    spans = sorted((a, b) for a, b in signals if b >= a)
    out = []
    for a, b in gaps:
        cursor = a
        for sa, sb in spans:
            if sb < cursor or sa > b:
                continue
            if sa - cursor > bound_s:
                out.append((cursor, sa))
            cursor = max(cursor, sb)
        if b - cursor > bound_s:
            out.append((cursor, b))
    return out


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (t, y) points (units of y per unit of t); None with fewer than 3 points or
    no spread in t."""
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    stt = sum((t - mt) ** 2 for t, _ in points)
    if stt == 0:
        return None
    return sum((t - mt) * (y - my) for t, y in points) / stt


def pooled_slope(samples: Sequence[RssSample], warmup_s: float) -> tuple[float | None, float]:
    """The pooled within-incarnation slope of RSS (bytes per second) of one process's samples, and the
    seconds of samples it is fitted on. An incarnation's first `warmup_s` seconds are left out."""
    by_pid: dict[int, list[RssSample]] = defaultdict(list)
    for s in samples:
        by_pid[s.pid].append(s)
    stt = sty = 0.0
    used = 0.0
    for run in by_pid.values():
        start = run[0].t
        kept = [s for s in run if s.t - start >= warmup_s]
        if len(kept) < 3:
            continue
        mt = sum(s.t for s in kept) / len(kept)
        my = sum(s.rss for s in kept) / len(kept)
        stt += sum((s.t - mt) ** 2 for s in kept)
        sty += sum((s.t - mt) * (s.rss - my) for s in kept)
        used += kept[-1].t - kept[0].t
    return (sty / stt if stt else None), used


def rss_slopes(samples: Sequence[RssSample], warmup_s: float) -> dict[str, dict]:
    """Per process name: the pooled slope in MiB per hour, the seconds it is fitted on, incarnations seen,
    and the last and peak RSS in MiB."""
    by_name: dict[str, list[RssSample]] = defaultdict(list)
    for s in samples:
        by_name[s.name].append(s)
    out = {}
    for name, run in sorted(by_name.items()):
        per_s, used = pooled_slope(run, warmup_s)
        out[name] = {"slope_mib_per_h": None if per_s is None else per_s * 3600 / MIB, "fitted_s": used,
                     "incarnations": len({s.pid for s in run}), "last_mib": run[-1].rss / MIB,
                     "peak_mib": max(s.rss for s in run) / MIB}
    return out


def plot(path, *, steps: Sequence[tuple[float, int]], faults: Sequence[dict], redis: Sequence[tuple[float, int]],
         disk: Sequence[tuple[float, int]], rss: Sequence[RssSample], title: str) -> None:
    """Four panels over the soak's minutes: steps logged (faults marked by kind), Redis `used_memory`,
    disk used under the run directory, each process's RSS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    ax = axes[0]
    ax.plot([t / 60 for t, _ in steps], [n for _, n in steps], color="black", lw=1.2, label="steps logged")
    colors = {"kill": "tab:red", "partition": "tab:blue", "slow": "tab:orange", "poison": "tab:brown",
              "reward_outage": "tab:pink", "bad_row": "black", "disk_full": "tab:gray", "slow_checkpoint": "tab:olive",
              "redis_loss": "tab:purple", "idle_flood": "tab:cyan"}
    for kind, color in colors.items():
        ts = [f["t"] / 60 for f in faults if f["kind"] == kind]
        if ts:
            ax.vlines(ts, 0, 1, transform=ax.get_xaxis_transform(), colors=color, alpha=0.35, lw=1, label=kind)
    ax.set_ylabel("training steps logged")
    ax.legend(loc="upper left", fontsize=8)
    axes[1].plot([t / 60 for t, _ in redis], [b / MIB for _, b in redis], color="tab:purple")
    axes[1].set_ylabel("Redis used_memory (MiB)")
    axes[2].plot([t / 60 for t, _ in disk], [b / MIB for _, b in disk], color="tab:green")
    axes[2].set_ylabel("disk under run dir (MiB)")
    by_name: dict[str, list[RssSample]] = defaultdict(list)
    for s in rss:
        by_name[s.name].append(s)
    for name, run in sorted(by_name.items()):
        axes[3].plot([s.t / 60 for s in run], [s.rss / MIB for s in run], lw=0.9, label=name)
    axes[3].set_ylabel("RSS (MiB)")
    axes[3].set_xlabel("minutes")
    axes[3].legend(loc="upper left", fontsize=7, ncol=4)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
