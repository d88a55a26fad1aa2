"""The reports of `searchr1 eval`: `eval.md` (Markdown tables), the rich table the command prints, and
`write_outputs` (eval.json + eval.md), all from the summary `eval_stats.aggregate` builds.

Reports show whatever group keys the summary has, in its order; nothing here names a dataset's fields.

What this module does not do: aggregate (`eval_stats.py`) or run the evaluation (`evaluate.py`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from searchr1.rollout.eval_stats import DEFAULT_GROUP_BY, METRICS, aggregate


def _fmt(key: str, value: float | None) -> str:
    if value is None:
        return "–"
    if key in ("searches", "turns"):
        return f"{value:.2f}"
    if key in ("response_tokens", "generated_tokens"):
        return f"{value:.1f}"
    return f"{value:.3f}"


def markdown_report(summary: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    """`eval.md`: the run's settings, then per mode one table overall + one per group key."""
    lines = ["# Evaluation", ""]
    for k, v in meta.items():
        if not isinstance(v, (dict, list)):
            lines.append(f"- **{k}**: {v}")
    lines.append("")
    head = "| group | questions | trajectories | " + " | ".join(t for _, t in METRICS) + " |"
    rule = "|---|---:|---:|" + "---:|" * len(METRICS)

    def row(name: str, m: Mapping[str, float]) -> str:
        cells = " | ".join(_fmt(k, m.get(k)) for k, _ in METRICS)
        return f"| {name} | {int(m['questions'])} | {int(m['trajectories'])} | {cells} |"

    titles = {"greedy": "Greedy (temperature 0)",
              "sampled": f"Sampled (temperature {meta.get('temperature', '?')}, "
                         f"{meta.get('samples', '?')} per question)"}
    for mode in ("greedy", "sampled"):
        if mode not in summary:
            continue
        s = summary[mode]
        lines += [f"## {titles[mode]}", "", head, rule, row("all", s["overall"]), ""]
        for key, groups in s["by"].items():
            lines += [f"### by {key}", "", head, rule, *(row(g, m) for g, m in groups.items()), ""]
    lines.append("Means over trajectories (greedy: one per question). EM = `exact_match` on the response, "
                 "Search-R1 EM = `searchr1_em` on prompt + response, format valid = the `format` scorer, "
                 "≥1 search = share of trajectories that searched at least once.")
    return "\n".join(lines) + "\n"


def summary_table(summary: Mapping[str, Any]):
    """A rich table: per group (all, then each group key's groups under a heading row) one row for greedy
    and one for sampled."""
    from rich.table import Table

    table = Table(title="searchr1 eval", title_justify="left", pad_edge=False)
    table.add_column("group", overflow="fold", min_width=12)
    table.add_column("mode", no_wrap=True)
    table.add_column("traj", justify="right", no_wrap=True)
    cols = (("em", "EM"), ("f1", "F1"), ("format_valid", "format"), ("searches", "srch/q"),
            ("searched", "≥1 srch"), ("turns", "turns/q"))
    for _, title in cols:
        table.add_column(title, justify="right", no_wrap=True)
    modes = [(name, summary[name]) for name in ("greedy", "sampled") if name in summary]

    def add(name: str, key: str | None, group: str | None) -> None:
        first = True
        for mode, s in modes:
            m = s["overall"] if key is None else s["by"].get(key, {}).get(group)
            if m is None:
                continue
            table.add_row(name if first else "", mode, str(int(m["trajectories"])),
                          *(f"{m[k]:.1f}" if k in ("searches", "turns") else f"{m[k]:.2f}" for k, _ in cols))
            first = False

    add("all", None, None)
    keys: list[str] = []
    for _, s in modes:
        keys += [k for k in s["by"] if k not in keys]
    for key in keys:
        table.add_section()
        table.add_row(f"[bold]{key}[/]")
        groups = sorted({g for _, s in modes for g in s["by"].get(key, {})})
        for group in groups:
            add(f"  {group}", key, group)
    return table


def write_outputs(out_dir: str | Path, records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any],
                  group_by: Sequence[str] = DEFAULT_GROUP_BY) -> dict[str, Any]:
    """Write `eval.json` (meta, summary, per-question records in their JSON form) and `eval.md`; returns
    the JSON document. Blocking file I/O: async callers run it in a thread."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = aggregate(records, group_by)
    doc = {"meta": dict(meta), "summary": summary, "records": [dict(r) for r in records]}
    tmp = out / "eval.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(out / "eval.json")
    (out / "eval.md").write_text(markdown_report(summary, meta), encoding="utf-8")
    return doc
