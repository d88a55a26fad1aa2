"""The soak's report: from what `tests/faults/soak.py` recorded (its faults, its sampler, the run's restarts
and the audit) the JSON figures, whether the soak passed, and their text and Markdown renderings."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.faults import soak_curves as curves
from tests.faults.harness import FaultRun


def recoveries(faults: list[dict], step_times: list[float]) -> dict[str, list[float]]:
    """Seconds from each fault to the next step, by kind and, for kills, by `kill <service>`; each fault's
    `next_step_after_s` is set."""
    out: dict[str, list[float]] = {}
    for f in faults:
        f["next_step_after_s"] = curves.next_step_after(f["t"], step_times)
        if f["next_step_after_s"] is not None and "skipped" not in f:
            out.setdefault(f["kind"], []).append(f["next_step_after_s"])
            if f["kind"] == "kill":
                out.setdefault(f"kill {f['target']}", []).append(f["next_step_after_s"])
    return out


def problems_of(s: Any, audit: dict, rss: dict[str, dict], died: str | None,
                silent: list[dict] | None = None) -> list[str]:
    """Why the soak fails (empty: it passed)."""
    problems = [died] if died else []
    if silent:
        problems.append(f"{len(silent)} silent stall(s): no step for longer than {s.stall_bound_s:.0f} s while no "
                        "alert fired and no process was restarted or stopped")
    if audit["lost"]:
        problems.append(f"{audit['lost']} task(s) lost")
    if audit["trained_twice"]:
        problems.append(f"{audit['trained_twice']} task(s) trained twice")
    if not audit["ok"]:
        problems.append("the audit is not ok")
    for name, r in rss.items():
        if name == "soak":
            continue  # the harness itself: its memory holds the run's record (samples, scrapes); reported only
        if r["fitted_s"] < s.rss_min_fit_s:
            continue  # too short to tell a leak from the allocator's and caches' moves (judged: False)
        if r["slope_mib_per_h"] is not None and r["slope_mib_per_h"] > s.rss_slope_bound_mib_per_h:
            problems.append(f"RSS of {name} grows {r['slope_mib_per_h']:.1f} MiB/h "
                            f"(bound {s.rss_slope_bound_mib_per_h:g})")
    return problems


def stalls(s: Any, sm: Any, signals: list[tuple[float, float, str]]) -> dict:
    """The silent stalls (`soak_curves.silent_stalls`) from the first step to the end, and the signals by
    kind (an alert's name, `restart of X`, `searchr1 up stopped`)."""
    start = sm.step_times[0] if sm.step_times else 0.0
    silent = curves.silent_stalls(sm.step_times, start, sm.now(), s.stall_bound_s, [(a, b) for a, b, _ in signals])
    kinds: dict[str, int] = {}
    for _, _, why in signals:
        key = why.split(" (")[0]
        kinds[key] = kinds.get(key, 0) + 1
    longest = max((b - a for a, b in zip([start, *sm.step_times], [*sm.step_times, sm.now()], strict=True)),
                  default=None)
    return {"bound_s": s.stall_bound_s, "silent": [{"from_s": a, "to_s": b, "s": b - a} for a, b in silent],
            "longest_without_a_step_s": longest, "signals": dict(sorted(kinds.items()))}


def build(s: Any, sm: Any, faults: list[dict], run: FaultRun, audit: dict, died: str | None, *, network: str,
          config: Path | None, chaos_s: float, signals: list[tuple[float, float, str]] | None = None) -> dict:
    """The report (`OUT/soak.json`): settings, machine, faults, recovery summaries, curves and slopes, the
    audit, the restarts, the silent stalls, and `ok` with the `problems` when not."""
    by_kind = recoveries(faults, sm.step_times)
    healthy = _healthy_after(run, faults)
    rss = curves.rss_slopes(sm.rss, s.rss_warmup_s)
    for r in rss.values():
        r["judged"] = r["fitted_s"] >= s.rss_min_fit_s
    stalled = stalls(s, sm, signals or [])
    problems = problems_of(s, audit, rss, died, stalled["silent"])
    counts: dict[str, int] = {}
    for f in faults:
        key = f"{f['kind']} {f['target']}"
        counts[key] = counts.get(key, 0) + 1
    redis_warm = [p for p in sm.redis if p[0] >= s.rss_warmup_s]
    disk_warm = [p for p in sm.disk if p[0] >= s.rss_warmup_s]
    return {
        "settings": asdict(s), "config": str(config) if config else None, "network": network,
        "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "platform": platform.platform(),
                    "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30},
        "duration_s": sm.now(), "chaos_s": chaos_s, "steps_logged": len(sm.step_times), "faults": faults,
        "fault_counts": dict(sorted(counts.items())),
        "recovery_s": {k: curves.summary(v) for k, v in sorted(by_kind.items())},
        "recovery_all_s": curves.summary([v for k, vs in by_kind.items() if k in s.kinds for v in vs]),
        "healthy_after_kill_s": {k: curves.summary(v) for k, v in sorted(healthy.items())},
        "redis_used_memory": {"last_mib": sm.redis[-1][1] / curves.MIB if sm.redis else None,
                              "peak_mib": max((b for _, b in sm.redis), default=0) / curves.MIB,
                              "slope_mib_per_h": _per_h(curves.slope(redis_warm))},
        "disk": {"last_mib": sm.disk[-1][1] / curves.MIB if sm.disk else None,
                 "slope_mib_per_h": _per_h(curves.slope(disk_warm))},
        "rss": rss, "audit": audit, "restarts": _restarts(run), "stalls": stalled,
        "problems": problems, "ok": not problems,
        "curves": {"steps": sm.steps, "redis": sm.redis, "disk": sm.disk, "rss": [asdict(r) for r in sm.rss]},
    }


def _per_h(per_s: float | None) -> float | None:
    return None if per_s is None else per_s * 3600 / curves.MIB


def _healthy_after(run: FaultRun, faults: list[dict]) -> dict[str, list[float]]:
    """Per killed service: seconds from the kill to the supervisor's restart of it healthy again
    (`RUN_DIR/restarts.jsonl`); each kill's `healthy_after_s` is set."""
    path = run.run_dir / "restarts.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    out: dict[str, list[float]] = {}
    for f in faults:
        if f["kind"] != "kill" or "skipped" in f:
            continue
        match = [r for r in records if r["name"] == f["target"] and r.get("healthy_at") is not None
                 and r["died_at"] >= f["wall"] - 1.0]
        if match:
            f["healthy_after_s"] = min(r["healthy_at"] for r in match) - f["wall"]
            out.setdefault(f["target"], []).append(f["healthy_after_s"])
    return out


def _restarts(run: FaultRun) -> dict[str, int]:
    path = run.run_dir / "restarts.jsonl"
    counts: dict[str, int] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            name = json.loads(line)["name"]
            counts[name] = counts.get(name, 0) + 1
    return counts


def summary_text(r: dict) -> str:
    def f(v) -> str:
        return "-" if v is None else f"{v:.1f}"
    lines = [f"soak: {r['chaos_s'] / 60:.1f} min of faults ({r['duration_s'] / 60:.1f} min in all), {r['steps_logged']} steps, {len(r['faults'])} faults; "
             f"{r['network']}; load average {', '.join(f'{x:.2f}' for x in r['machine']['load_average'])}"]
    lines.append("faults: " + ", ".join(f"{k} ×{v}" for k, v in r["fault_counts"].items()))
    for name, s in r["healthy_after_kill_s"].items():
        lines.append(f"  {name} healthy again after its kill: n={s['n']} p50 {f(s['p50'])} s, "
                     f"max {f(s['max'])} s")
    for kind, s in r["recovery_s"].items():
        lines.append(f"  to the next step after {kind}: n={s['n']} p50 {f(s['p50'])} s, p99 {f(s['p99'])} s, "
                     f"max {f(s['max'])} s")
    st = r.get("stalls")
    if st:
        lines.append(f"silent stalls (no step for > {st['bound_s']:.0f} s with no alert, restart or stop): "
                     f"{len(st['silent'])}; longest span without a step {f(st['longest_without_a_step_s'])} s; "
                     "signals: " + ", ".join(f"{k} ×{v}" for k, v in st["signals"].items()))
    a = r["audit"]
    lines.append(f"audit: dispatched {a['dispatched']}, trained once {a['trained_once']}, trained twice "
                 f"{a['trained_twice']}, lost {a['lost']}, dropped {a['dropped']} {a['dropped_reasons']}, "
                 f"dead-lettered {a['dead_lettered']} {a['dead_reasons']}, in flight {a['in_flight']}, "
                 f"resumes {a['learner_resumes']}, ok {a['ok']}")
    red, disk = r["redis_used_memory"], r["disk"]
    lines.append(f"redis used_memory: last {f(red['last_mib'])} MiB, peak {f(red['peak_mib'])} MiB, slope "
                 f"{f(red['slope_mib_per_h'])} MiB/h; disk: last {f(disk['last_mib'])} MiB, slope "
                 f"{f(disk['slope_mib_per_h'])} MiB/h")
    for name, v in r["rss"].items():
        lines.append(f"  RSS {name}: slope {f(v['slope_mib_per_h'])} MiB/h over {v['fitted_s'] / 60:.0f} min"
                     f"{'' if v.get('judged', True) else ' (too short to judge)'}, "
                     f"{v['incarnations']} incarnation(s), peak {v['peak_mib']:.0f} MiB")
    lines.append("PASS" if r["ok"] else "FAIL: " + "; ".join(r["problems"]))
    return "\n".join(lines)


def markdown(r: dict) -> str:
    """The report's tables in Markdown (docs/reliability.md): faults by kind, recovery, memory and disk, audit."""
    def f(v, unit: str = "") -> str:
        return "—" if v is None else f"{v:.1f}{unit}"
    m = r["machine"]
    out = [f"Seed {r['settings']['seed']}, {r['chaos_s'] / 60:.0f} min of faults ({r['duration_s'] / 60:.0f} min "
           f"with start-up, settling and the audit), {r['steps_logged']} steps logged; {r['network']}; "
           f"{m['cpus']} cores, {m['mem_gib']:.0f} GiB, load average at the end "
           f"{', '.join(f'{x:.1f}' for x in m['load_average'])}.", "",
           "| fault | count | healthy again p50 / max | next step p50 / p99 / max |", "|---|---|---|---|"]
    healthy = r["healthy_after_kill_s"]
    for key, count in r["fault_counts"].items():
        kind, target = key.split(" ", 1)
        rec = r["recovery_s"].get(key if kind == "kill" else kind, {})
        h = healthy.get(target, {}) if kind == "kill" else {}
        if kind == "kill":
            out.append(f"| {key} | {count} | {f(h.get('p50'), ' s')} / {f(h.get('max'), ' s')} | "
                       f"{f(rec.get('p50'), ' s')} / {f(rec.get('p99'), ' s')} / {f(rec.get('max'), ' s')} |")
        else:
            out.append(f"| {key} | {count} | | (all {kind}, below) |")
    for kind in ("kill", "partition", "slow", "poison", "reward_outage", "bad_row", "disk_full", "slow_checkpoint",
                 "redis_loss", "idle_flood"):
        if kind in r["recovery_s"]:
            rec = r["recovery_s"][kind]
            out.append(f"| all {kind} | {rec['n']} | | {f(rec['p50'], ' s')} / {f(rec['p99'], ' s')} / "
                       f"{f(rec['max'], ' s')} |")
    a, red, disk = r["audit"], r["redis_used_memory"], r["disk"]
    out += ["", "| curve | last | peak | slope after warm-up |", "|---|---|---|---|",
            f"| Redis used_memory | {f(red['last_mib'], ' MiB')} | {f(red['peak_mib'], ' MiB')} | "
            f"{f(red['slope_mib_per_h'], ' MiB/h')} |",
            f"| disk under the run directory | {f(disk['last_mib'], ' MiB')} | | {f(disk['slope_mib_per_h'], ' MiB/h')} |"]
    for name, v in r["rss"].items():
        out.append(f"| RSS {name} ({v['incarnations']} incarnation(s), fitted on {v['fitted_s'] / 60:.0f} min"
                   f"{'' if v.get('judged', True) else ', too short to judge'}) | "
                   f"{v['last_mib']:.0f} MiB | {v['peak_mib']:.0f} MiB | {f(v['slope_mib_per_h'], ' MiB/h')} |")
    st = r.get("stalls")
    if st:
        out += ["", f"Silent stalls (no step for longer than {st['bound_s']:.0f} s while no alert fired and no "
                f"process was restarted or stopped): **{len(st['silent'])}**; the longest span without a step "
                f"{f(st['longest_without_a_step_s'], ' s')}; signals seen: "
                + ", ".join(f"{k} ×{v}" for k, v in st["signals"].items()) + "."]
    out += ["", f"Audit: {a['dispatched']} tasks dispatched, {a['trained_once']} trained once, **{a['lost']} lost, "
            f"{a['trained_twice']} trained twice**, {a['dropped']} dropped {a['dropped_reasons'] or ''}, "
            f"{a['dead_lettered']} dead-lettered {a['dead_reasons'] or ''}, {a['in_flight']} in flight at the stop; "
            f"learner resumed from steps {a['learner_resumes']}, {len(a['superseded_steps'])} steps archived again, "
            f"{a['resumed_trajectories']} trajectories resumed across weight versions; "
            f"restarts {r['restarts']}; verdict: {'PASS' if r['ok'] else 'FAIL: ' + '; '.join(r['problems'])}."]
    return "\n".join(out)
