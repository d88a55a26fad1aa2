"""The closing tables of `weight_sync.py`: each phase's median and range over the runs, seconds per GB, and
the 7B snapshot path modelled from those rates (`model_7b`)."""

from __future__ import annotations

import statistics
from collections import defaultdict

PHASES = ("write", "hash", "announce", "transfer", "verify", "reload")
BYTES_7B = 7_615_616_512 * 2
"""Qwen2.5-7B's parameters in bf16 (15.2 GB)."""
GOAL_7B_S = 10.0


def _cell(xs: list[float]) -> str:
    med = statistics.median(xs)
    return f"{med:.2f}" if len(xs) == 1 else f"{med:.2f} ({min(xs):.2f}–{max(xs):.2f})"


def _groups(rows) -> dict[tuple[str, str, str], list]:
    out: dict[tuple[str, str, str], list] = defaultdict(list)
    for r in rows:
        out[(r.size, r.variant, r.transport)].append(r)
    return out


def summary(rows) -> str:
    """One line per size × variant × transport: median (range) wall seconds per phase over the runs,
    end to end, GB/s, CPU seconds and the load averages."""
    head = ("| size | variant | transport | runs | " + " | ".join(PHASES)
            + " | end to end, s | GB/s | CPU s | load average |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for (size, variant, transport), rs in _groups(rows).items():
        gb = rs[0].bytes / 1e9
        phases = " | ".join(_cell([r.seconds.get(p, 0.0) for r in rs]) for p in PHASES)
        total = [r.total for r in rs]
        loads = [r.load for r in rs]
        lines.append(f"| {size} | {variant} | {transport} | {len(rs)} | {phases} | {_cell(total)} | "
                     f"{gb / statistics.median(total):.3f} | {_cell([sum(r.cpu.values()) for r in rs])} | "
                     f"{min(loads):.1f}–{max(loads):.1f} |")
    return "\n".join(lines)


def per_gb(rs) -> dict[str, float]:
    """Median wall seconds per GB of each phase over `rows` of one size, variant and transport."""
    gb = rs[0].bytes / 1e9
    return {p: statistics.median(r.seconds.get(p, 0.0) for r in rs) / gb for p in PHASES}


def cpu_per_gb(rs) -> dict[str, float]:
    gb = rs[0].bytes / 1e9
    return {p: statistics.median(r.cpu.get(p, 0.0) for r in rs) / gb for p in PHASES}


def model_7b(rows) -> str:
    """The 7B snapshot path (15.2 GB bf16) modelled from the largest size's per-GB medians: the learner's
    publish (write + hash + announce, once per version) and each worker's pin or download, verified read
    and reload, in wall and CPU seconds; against the goal of ≤ 10 s for publish + verify + reload."""
    groups = _groups(rows)
    largest = max((rs[0].bytes for rs in groups.values()), default=0)
    gb7 = BYTES_7B / 1e9
    lines = [f"7B snapshot path modelled from the per-GB medians at {largest / 1e9:.2f} GB ({gb7:.1f} GB bf16):",
             "| variant | transport | s/GB: " + " | ".join(PHASES) + " | CPU s/GB | publish, s (CPU s) | "
             "worker, s (CPU s) | publish + worker, s (CPU s) |", "|---|---|" + "---|" * (len(PHASES) + 4)]
    for (_, variant, transport), rs in groups.items():
        if rs[0].bytes != largest:
            continue
        w, c = per_gb(rs), cpu_per_gb(rs)
        publish, publish_cpu = ((x["write"] + x["hash"] + x["announce"]) * gb7 for x in (w, c))
        worker, worker_cpu = ((x["transfer"] + x["verify"] + x["reload"]) * gb7 for x in (w, c))
        over = publish + worker > GOAL_7B_S
        lines.append(f"| {variant} | {transport} | " + " | ".join(f"{w[p]:.3f}" for p in PHASES)
                     + f" | {sum(c.values()):.2f} | {publish:.1f} ({publish_cpu:.1f}) | {worker:.1f} "
                     f"({worker_cpu:.1f}) | {publish + worker:.1f} ({publish_cpu + worker_cpu:.1f})"
                     f"{' (goal ≤ 10)' if over else ''} |")
    return "\n".join(lines)
