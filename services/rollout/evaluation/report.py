"""The reports of `searchr1 eval`: `eval.md` (Markdown tables), the rich table the command prints, and
`write_outputs` (eval.json + eval.md), all from the summary `stats.aggregate` builds; and Search-R1's
Table 3 layout of one or more evaluations (`stats.paper_table`) as Markdown and as a rich table.

Reports show whatever group keys the summary has, in its order; nothing here names a dataset's fields.

What this module does not do: aggregate (`stats.py`) or run the evaluation (`evaluate.py`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from searchr1.rollout.evaluation.stats import METRICS, PaperTable, aggregate


def _fmt(key: str, value: float | None) -> str:
    if value is None:
        return "–"
    if key in ("failed_searches", "failed_scores", "scored"):
        return str(int(value))
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
    lines += failure_lines(summary)
    fingerprint = meta.get("fingerprint")
    if isinstance(fingerprint, Mapping):
        lines += ["## Setting fingerprint", "", f"`{fingerprint.get('id', '?')}` — equal ids: measured the same way "
                  "(model weights, corpus, index, encoder, retriever settings, top-k, prompt template, limits, "
                  "decoding, metrics).", ""]
        lines += [f"- {k}: `{v}`" for k, v in flatten(fingerprint).items() if k != "id"]
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
    lines.append("Means over trajectories (greedy: one per question); scores over the scored ones. Search-R1 EM = "
                 "`searchr1_em` on prompt + response (the paper's score), EM = `exact_match` on the response, "
                 "cover EM = `substring_match` (a gold answer inside the answer), F1 = `f1`, format valid = the "
                 "`format` scorer, ≥1 search = share of trajectories that searched at least once; failed "
                 "searches and unscored count trajectories.")
    return "\n".join(lines) + "\n"


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted keys (lists and scalars as values)."""
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def failures(summary: Mapping[str, Any]) -> tuple[int, int, int, float]:
    """(failed searches, unscored trajectories, trajectories, failure rate) over every mode."""
    searches = scores = total = 0
    bad = 0.0
    for mode in ("greedy", "sampled"):
        overall = summary.get(mode, {}).get("overall")
        if overall:
            n = int(overall.get("trajectories", 0))
            searches += int(overall.get("failed_searches") or 0)
            scores += int(overall.get("failed_scores") or 0)
            total += n
            bad += float(overall.get("failure_rate") or 0.0) * n
    return searches, scores, total, (bad / total if total else 0.0)


def failure_lines(summary: Mapping[str, Any]) -> list[str]:
    """The report's failure line: how many trajectories had a failed search or no score."""
    searches, scores, total, rate = failures(summary)
    if not searches and not scores:
        return [f"No failures: every search of the {total} trajectories was answered and every one was scored.", ""]
    return [f"**Failures: {searches} of {total} trajectories had a failed search, {scores} could not be scored "
            f"({rate:.1%} of trajectories).** Their numbers do not measure the model; see `error` and "
            "`score_error` in eval.json.", ""]


def summary_table(summary: Mapping[str, Any]):
    """A rich table: per group (all, then each group key's groups under a heading row) one row for greedy
    and one for sampled."""
    from rich.table import Table

    table = Table(title="searchr1 eval", title_justify="left", pad_edge=False)
    table.add_column("group", overflow="fold", min_width=12)
    table.add_column("mode", no_wrap=True)
    table.add_column("traj", justify="right", no_wrap=True)
    cols = (("searchr1_em", "S-R1 EM"), ("em", "EM"), ("cover_em", "cover"), ("f1", "F1"),
            ("format_valid", "format"), ("searches", "srch/q"), ("searched", "≥1 srch"), ("turns", "turns/q"),
            ("failed_searches", "failed srch"), ("failed_scores", "unscored"))
    for _, title in cols:
        table.add_column(title, justify="right", no_wrap=True)
    modes = [(name, summary[name]) for name in ("greedy", "sampled") if name in summary]

    def add(name: str, key: str | None, group: str | None) -> None:
        first = True
        for mode, s in modes:
            m = s["overall"] if key is None else s["by"].get(key, {}).get(group)
            if m is None:
                continue
            table.add_row(name if first else "", mode, str(int(m["trajectories"])), *(_cell(k, m.get(k)) for k, _ in cols))
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


def _cell(key: str, value: Any) -> Any:
    from rich.text import Text

    if value is None:
        return "–"
    if key in ("failed_searches", "failed_scores"):
        return Text(str(int(value)), style="bold red" if value else "")
    return f"{value:.1f}" if key in ("searches", "turns") else f"{value:.2f}"


def write_outputs(out_dir: str | Path, records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any],
                  group_by: Sequence[str]) -> dict[str, Any]:
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


METRIC_NAMES = {"searchr1_em": "Search-R1 EM (qa_em.compute_score_em)", "em": "EM (exact_match)",
                "cover_em": "cover EM (substring_match)", "f1": "F1"}


def _cells(table: PaperTable) -> list[list[str]]:
    """Per row: label, one cell per column ("–" where the row lacks it), the average († over fewer sets), the
    failed trajectories, the setting fingerprint's first 12 hex digits."""
    out = []
    for row in table.rows:
        cells = [f"{row.scores[ds]:.3f}" if ds in row.scores else "–" for ds, _ in table.columns]
        avg = "–" if row.average is None else f"{row.average:.3f}" + ("" if row.complete else "†")
        out.append([row.label, *cells, avg, str(row.failed), (row.fingerprint or "–")[:12]])
    return out


def paper_table_note(table: PaperTable) -> str:
    """The line under the table: metric, decoding, max_turns, questions per column, what † means."""
    turns = sorted({r.max_turns for r in table.rows if r.max_turns is not None})
    counts = {ds: sorted({r.questions[ds] for r in table.rows if ds in r.questions}) for ds, _ in table.columns}
    sizes = ", ".join(f"{title} {'/'.join(map(str, counts[ds]))}" for ds, title in table.columns)
    note = (f"{METRIC_NAMES[table.metric]} of the greedy trajectory; max_turns "
            f"{'/'.join(map(str, turns)) or '?'}; Avg. = unweighted mean of the columns; questions: {sizes}.")
    if not all(r.complete for r in table.rows):
        note += " † over the test sets the row has."
    note += (" Failed = greedy trajectories whose search failed or that could not be scored; setting = the "
             "fingerprint id in eval.json (rows with different ids were not measured the same way).")
    return note


def paper_table_markdown(table: PaperTable) -> str:
    """Search-R1's Table 3 layout as Markdown: a row per model, a column per test set, Avg."""
    head = ["Model", *(title for _, title in table.columns), "Avg.", "Failed", "Setting"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in _cells(table)]
    return "\n".join(lines) + "\n\n" + paper_table_note(table) + "\n"


def paper_table_rich(table: PaperTable):
    """The same table for the console."""
    from rich.table import Table

    out = Table(title=f"{METRIC_NAMES[table.metric]}, greedy", title_justify="left", caption=paper_table_note(table),
                caption_justify="left", pad_edge=False)
    out.add_column("Model", overflow="fold", min_width=12)
    for _, title in table.columns:
        out.add_column(title, justify="right", no_wrap=True)
    out.add_column("Avg.", justify="right", no_wrap=True, style="bold")
    out.add_column("Failed", justify="right", no_wrap=True)
    out.add_column("Setting", no_wrap=True)
    from rich.text import Text

    for cells in _cells(table):
        out.add_row(*cells[:-2], Text(cells[-2], style="" if cells[-2] == "0" else "bold red"), cells[-1])
    return out


def averages_rich(tables: Sequence[PaperTable]):
    """Every metric's average per model (one column per table, in order): EM, cover EM and F1 beside
    Search-R1's EM."""
    from rich.table import Table

    out = Table(title="Avg. per metric, greedy", title_justify="left", pad_edge=False)
    out.add_column("Model", overflow="fold", min_width=12)
    for t in tables:
        out.add_column(METRIC_NAMES[t.metric].split(" (")[0], justify="right", no_wrap=True)
    for i, row in enumerate(tables[0].rows):
        cells = []
        for t in tables:
            r = t.rows[i]
            cells.append("–" if r.average is None else f"{r.average:.3f}" + ("" if r.complete else "†"))
        out.add_row(row.label, *cells)
    return out


def eval_labels(evals: Sequence[tuple[str | Path, Mapping[str, Any]]]) -> list[str]:
    """A row label per (eval.json path, document): the evaluated model's directory name (`meta.model`),
    with its parent's name when that is not unique, and the eval.json's folder when even that repeats."""
    models = [str(doc.get("meta", {}).get("model") or Path(path).parent.name) for path, doc in evals]
    labels = [Path(m).name or m for m in models]
    if len(set(labels)) < len(labels):
        labels = ["/".join(Path(m).parts[-2:]) for m in models]
    if len(set(labels)) < len(labels):
        labels = [f"{label} ({Path(path).parent.name})" for label, (path, _) in zip(labels, evals)]
    return labels


def read_eval(path: str | Path) -> dict[str, Any]:
    """An `eval.json` (or the directory holding one); ValueError when it is missing or not one."""
    p = Path(path)
    if p.is_dir():
        p = p / "eval.json"
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{p}: no such eval.json") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{p}: not a readable eval.json ({exc})") from None
    if not isinstance(doc, dict) or "summary" not in doc:
        raise ValueError(f"{p}: not an eval.json of `searchr1 eval` (no summary)")
    return doc
