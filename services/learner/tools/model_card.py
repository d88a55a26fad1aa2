"""The model card (README.md) of an exported folder (`export.py`): Hub metadata, how to prompt and stop the
model, how it was trained (the run config's algorithm and schedule), the run's figures — the learner's
first and last step, the validation curve (`RUN_DIR/validation.jsonl`), every evaluation found under the run
directory (`eval.json`) with its setting fingerprint — and the digests of what was exported.

Every figure is read from the run's own files; a file that is missing leaves its section out (saying so),
never a made-up number. Pure apart from reading those files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from searchr1.core.protocol import SEARCH_R1_TEMPLATE

STEP_FIGURES = ("reward_mean", "em_mean", "searches_per_trajectory", "response_length_mean", "entropy", "kl_loss")
EVAL_METRICS = (("searchr1_em", "Search-R1 EM"), ("em", "EM"), ("cover_em", "cover EM"), ("f1", "F1"),
                ("format_valid", "format valid"), ("searches", "searches/q"))


def _records(path: Path) -> list[dict]:
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict):
            out.append(r)
    return out


def step_log(run: Path) -> list[dict]:
    """The learner's step records (`RUN/learner/*.jsonl`, the newest file), in order."""
    logs = sorted((run / "learner").glob("*.jsonl"), key=lambda p: p.stat().st_mtime) if (run / "learner").is_dir() else []
    return [r for r in _records(logs[-1]) if isinstance(r.get("step"), int)] if logs else []


def evaluations(run: Path) -> list[tuple[Path, dict]]:
    """Every eval.json under the run directory (three levels deep), oldest first."""
    found = []
    for depth in ("*/eval.json", "*/*/eval.json", "*/*/*/eval.json"):
        for p in run.glob(depth):
            try:
                doc = json.loads(p.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and "summary" in doc:
                found.append((p, doc))
    return sorted(found, key=lambda x: x[0].stat().st_mtime)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "–" if v is None else str(v)


def _settings(config: Path | None) -> list[str]:
    if config is None:
        return ["No run config was found (pass --config to `searchr1 weights export`); the training settings are "
                "not listed."]
    from searchr1.core.settings import load_settings
    from searchr1.learner.settings import LearnerSettings

    try:
        s: Any = load_settings(LearnerSettings, config)
    except (ValueError, OSError) as exc:
        return [f"The run config {config.name} could not be read ({exc})."]

    def get(path: str) -> Any:
        obj = s
        for part in path.split("."):
            obj = getattr(obj, part, None)
        return obj

    rows = [("algorithm", get("algorithm.advantage")), ("group size", get("dispatcher.group_size")),
            ("groups per step", get("batch.groups_per_step")), ("learning rate", get("optim.lr")),
            ("total steps", get("optim.total_steps")), ("KL loss coefficient", get("algorithm.kl_loss_coef")),
            ("entropy coefficient", get("algorithm.entropy_coef")), ("training dtype", get("model.dtype"))]
    return [f"Run config `{config.name}`:", "", "| setting | value |", "|---|---|",
            *(f"| {k} | {_fmt(v)} |" for k, v in rows if v is not None)]


def _fingerprint_lines(fp: Mapping[str, Any]) -> list[str]:
    r = fp.get("retriever", {}) or {}
    corpus = r.get("corpus", {}) or {}
    return [f"- fingerprint id: `{fp.get('id', '?')}`",
            f"- retriever: {r.get('kind', '?')} index of {r.get('count', '?')} passages, encoder {r.get('encoder')}, "
            f"index sha256 `{r.get('index_sha256')}`",
            f"- corpus: {corpus.get('name')} ({corpus.get('size')} bytes, sha256 `{corpus.get('sha256')}`)",
            f"- passages per search (top-k): {fp.get('top_k')}; prompt template: "
            f"{(fp.get('prompt_template') or {}).get('name')}",
            f"- limits: {json.dumps(fp.get('limits', {}), sort_keys=True)}",
            f"- decoding: {json.dumps(fp.get('decoding', {}), sort_keys=True)}"]


def model_card(run: Path, result: Any, *, base: Path, config: Path | None, model_config: Mapping[str, Any]) -> str:
    """README.md of the exported folder (`result`: the `ExportResult`)."""
    arch = (model_config.get("architectures") or ["?"])[0]
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation",
             f"base_model: {base.name}", "tags:", "- searchr1", "- search-r1", "- reinforcement-learning",
             "- retrieval-augmented-generation", "---", "",
             f"# {run.name} (policy version {result.version})", "",
             f"A policy trained with searchr1 (the Search-R1 method: RL with a search engine in the loop) from "
             f"`{base.name}` ({arch}, weights in {result.dtype}). It reasons in `<think>`, searches with "
             "`<search> query </search>`, reads the passages it is given back in `<information>…</information>` "
             "and answers in `<answer>…</answer>`.", "",
             "## Use", "",
             "Prompt it with Search-R1's template (the question stripped, ending in `?`), through the chat "
             "template when the tokenizer has one. Generate one turn at a time and stop at `</search>` or "
             "`</answer>`; after a search, append `\\n\\n<information>Doc 1(Title: …) …\\nDoc 2(…) …</information>\\n\\n` "
             "with the retrieved passages and generate the next turn. `searchr1 ask --model DIR --index INDEX` "
             "does all of this; so does `searchr1.api.ask`.", "",
             "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
             "tok = AutoTokenizer.from_pretrained(\"DIR\")", "model = AutoModelForCausalLM.from_pretrained(\"DIR\")",
             "prompt = tok.apply_chat_template([{\"role\": \"user\", \"content\": TEMPLATE.format(question=q)}],",
             "                                 add_generation_prompt=True, tokenize=False)",
             "ids = tok(prompt, return_tensors=\"pt\", add_special_tokens=False).input_ids",
             "out = model.generate(ids, max_new_tokens=500, stop_strings=[\"</search>\", \"</answer>\"], tokenizer=tok)",
             "```", "", "With vLLM: `SamplingParams(stop=[\"</search>\", \"</answer>\"], include_stop_str_in_output=True)`.",
             "", "The prompt template (`TEMPLATE`):", "", "```text", SEARCH_R1_TEMPLATE, "```", "",
             "## Training", ""]
    lines += _settings(config)
    lines += ["", "## Figures", ""]
    steps = step_log(run)
    if steps:
        first, last = steps[0], steps[-1]
        keys = [k for k in STEP_FIGURES if k in last or k in first]
        lines += [f"The learner's step log ({len(steps)} steps), first and last step:", "",
                  "| | step | " + " | ".join(keys) + " |", "|---|---:|" + "---:|" * len(keys),
                  *(f"| {name} | {r['step']} | " + " | ".join(_fmt(r.get(k)) for k in keys) + " |"
                    for name, r in (("first", first), ("last", last)))]
    else:
        lines.append("No learner step log in the run directory (RUN_DIR/learner/*.jsonl).")
    validation = [r for r in _records(run / "validation.jsonl") if isinstance(r.get("step"), int)]
    lines.append("")
    if validation:
        lines += ["Validation during training (greedy, held-out questions, `RUN_DIR/validation.jsonl`):", "",
                  "| step | version | Search-R1 EM | EM | cover EM | F1 | failed |", "|---:|---:|---:|---:|---:|---:|---:|",
                  *(f"| {r['step']} | {_fmt(r.get('version'))} | {_fmt(r.get('searchr1_em'))} | {_fmt(r.get('em'))} | "
                    f"{_fmt(r.get('cover_em'))} | {_fmt(r.get('f1'))} | {_fmt(r.get('failed'))} |" for r in validation[-12:])]
    else:
        lines.append("No validation during training was recorded (`[launcher.validation] eval_every`).")
    evals = evaluations(run)
    lines.append("")
    fingerprint = None
    if evals:
        lines += ["Evaluations in the run directory (greedy trajectories):", "",
                  "| evaluation | model | questions | " + " | ".join(t for _, t in EVAL_METRICS) + " | failed | setting |",
                  "|---|---|---:|" + "---:|" * (len(EVAL_METRICS) + 1) + "---|"]
        for path, doc in evals:
            g = doc.get("summary", {}).get("greedy", {}).get("overall", {})
            fp = doc.get("meta", {}).get("fingerprint") or {}
            fingerprint = fp or fingerprint
            failed = int(g.get("failed_searches") or 0) + int(g.get("failed_scores") or 0)
            lines.append(f"| {path.parent.relative_to(run)} | {Path(str(doc.get('meta', {}).get('model', '?'))).name} | "
                         f"{_fmt(g.get('questions'))} | " + " | ".join(_fmt(g.get(k)) for k, _ in EVAL_METRICS)
                         + f" | {failed} | `{str(fp.get('id', '–'))[:12]}` |")
    else:
        lines.append("No evaluation (eval.json) in the run directory: run `searchr1 eval` and export again to "
                     "list it here.")
    lines += ["", "## Setting fingerprint", ""]
    if fingerprint:
        lines += ["What the latest evaluation above was measured with (equal ids: measured the same way):", "",
                  *_fingerprint_lines(fingerprint)]
    else:
        lines.append("No evaluation recorded one.")
    lines += ["", "## Files", "",
              f"- version {result.version} of the run `{run.name}`, digest `{result.snapshot_digest}` " + (
                  "(published as a delta: rebuilt from the newest full version before it and the deltas after, "
                  "each verified against its own manifest, every tensor against its checksum)" if result.rebuilt
                  else "(its files verified against its manifest before the export)"),
              f"- model.safetensors sha256 `{result.weights_sha256}`",
              f"- tokenizer and chat template from `{base.name}`", ""]
    return "\n".join(lines)
