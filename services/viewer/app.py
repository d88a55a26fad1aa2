"""The viewer's FastAPI app: server-rendered pages over one run's trajectory archive.

Pages: `/` the run (plots against step, filters, the paged listing), `/trajectory` one trajectory turn by
turn, `/question` every trajectory of one question across steps (and, with a second run to compare, its
trajectories there), and, when the viewer was given a policy to ask (`asker`), `/ask`: a question through
the agent loop, its trajectory shown turn by turn as on the trajectory page. Routes that read Parquet are
plain functions: FastAPI runs them in its thread pool, so reads never block the event loop; `/ask` awaits
the asker on the loop that owns its engine. Bad query parameters answer 400 with the reason.

The asker is passed in (`searchr1 view --model` builds one with `searchr1.api.open_asker`): anything with
`async ask(question)` returning a result with `to_json()` (question, answer, response, finish_reason,
num_turns, num_searches, generated_tokens, error). This package imports no engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pyarrow as pa
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from searchr1.viewer import series as S
from searchr1.viewer.auth import CookieTokenMiddleware
from searchr1.viewer.plots import line_plot
from searchr1.viewer.settings import ViewerSettings
from searchr1.viewer.store import ArchiveNotFound, ArchiveStore, Query, find_archive
from searchr1.viewer.turns import attach_mask, blocks, highlight, token_cells

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
LIST_COLUMNS = ["step", "task_id", "index", "question", "reward", "em", "finish_reason", "num_searches",
                "response_tokens", "data_source", "worker_id", "policy_version", "part", "malformed"]


def _opt(params: dict[str, str], name: str, kind: type) -> Any:
    raw = params.get(name, "").strip()
    if raw == "":
        return None
    try:
        return kind(raw)
    except ValueError:
        raise HTTPException(400, f"{name}: {raw!r} is not a valid {kind.__name__}") from None


def parse_query(params: dict[str, str]) -> Query:
    """The listing filters from the query string (empty fields = any)."""
    return Query(min_step=_opt(params, "min_step", int), max_step=_opt(params, "max_step", int),
                 min_reward=_opt(params, "min_reward", float), max_reward=_opt(params, "max_reward", float),
                 finish_reason=_opt(params, "finish_reason", str), searches=_opt(params, "searches", int),
                 data_source=_opt(params, "data_source", str), text=_opt(params, "q", str))


def _distinct(table: pa.Table, col: str) -> list[str]:
    return sorted(v for v in set(table.column(col).to_pylist()) if v is not None)


class TokenizerError(ValueError):
    """The `tokenizer` setting names no readable tokenizer.json."""


def load_tokenizer(path: Path | None):
    """A `tokenizers.Tokenizer` from `path` (a tokenizer.json or a directory with one), or None; raises
    `TokenizerError` when there is none to read there."""
    if path is None:
        return None
    from tokenizers import Tokenizer

    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise TokenizerError(f"no tokenizer.json at {file}")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own untyped errors on a bad file
        raise TokenizerError(f"cannot read the tokenizer {file}: {exc}") from None


class Viewer:
    """The pages of one run (and the ask page); each method answers one route."""

    def __init__(self, run_dir: Path | None, settings: ViewerSettings, step_log: Path | None,
                 asker: Any = None, ask_info: dict[str, str] | None = None) -> None:
        self.s = settings
        self.store = ArchiveStore(find_archive(run_dir), settings.cache_dir) if run_dir is not None else None
        self.other = ArchiveStore(find_archive(settings.compare), settings.cache_dir) if settings.compare else None
        self.log_path = step_log or (S.find_step_log(run_dir) if run_dir is not None else None)
        self.run_dir = run_dir
        self.tokenizer = load_tokenizer(settings.tokenizer)
        self.asker = asker
        self.ask_info = ask_info or {}
        self.static = {"run": (run_dir.name or str(run_dir)) if run_dir is not None else "",
                       "compare": settings.compare, "has_run": run_dir is not None, "can_ask": asker is not None}

    @property
    def base(self) -> dict[str, Any]:
        """What every page shows: the run, the compared run, the ask link, the parts left out."""
        broken = {**(self.store.broken if self.store else {}), **(self.other.broken if self.other else {})}
        return {**self.static, "broken": broken}

    @property
    def run_store(self) -> ArchiveStore:
        if self.store is None:
            raise HTTPException(404, "this viewer was started without a run directory: only /ask")
        return self.store

    def error(self, request: Request, exc: HTTPException) -> HTMLResponse:
        return TEMPLATES.TemplateResponse(request, "error.html", {**self.base, "status": exc.status_code,
                                                                  "detail": exc.detail}, status_code=exc.status_code)

    def unreadable(self, request: Request, exc: ArchiveNotFound) -> HTMLResponse:
        return self.error(request, HTTPException(503, str(exc)))

    async def ask_page(self, request: Request) -> HTMLResponse:
        """The form; with `?q=` the question's trajectory (gold answers from `?gold=a, b` mark the answer)."""
        if self.asker is None:
            raise HTTPException(404, "start the viewer with --model (and --index or --retriever) to ask a policy")
        question = (request.query_params.get("q") or "").strip()
        gold = [g.strip() for g in (request.query_params.get("gold") or "").split(",") if g.strip()]
        if len(question) > 4000:
            raise HTTPException(400, "q: a question of at most 4000 characters")
        result, verdict = None, None
        if question:
            result = (await self.asker.ask(question)).to_json()
            if gold:
                from searchr1.core.protocol import normalize_answer

                verdict = result["answer"] is not None and normalize_answer(result["answer"]) in {
                    normalize_answer(g) for g in gold}
        return TEMPLATES.TemplateResponse(request, "ask.html", {
            **self.base, **self.ask_info, "question": question, "gold": gold, "result": result, "verdict": verdict,
            "blocks": blocks(result["response"]) if result else [], "hl": highlight})

    def run_page(self, request: Request) -> HTMLResponse:
        params = dict(request.query_params)
        q = parse_query(params)
        page = _opt(params, "page", int)
        page = 1 if page is None else page
        if page < 1:
            raise HTTPException(400, "page must be >= 1")
        if self.store is None:
            return RedirectResponse("/ask", status_code=303)  # type: ignore[return-value]
        summary = self.store.summary()
        picked = self.store.select(q)
        series = S.archive_series(picked if any(v is not None for v in vars(q).values()) else summary)
        records = [r for r in S.read_step_log(self.log_path)
                   if (q.min_step is None or r.get("step", 0) >= q.min_step)
                   and (q.max_step is None or r.get("step", 0) <= q.max_step)]
        series.update(S.log_series(records))
        validated = [r for r in S.read_step_log(S.find_validation(self.run_dir) if self.run_dir else None)
                     if (q.min_step is None or r.get("step", 0) >= q.min_step)
                     and (q.max_step is None or r.get("step", 0) <= q.max_step)]
        series.update(S.validation_series(validated))
        marks = S.alarm_steps(series)
        size = self.s.page_size
        keep = {k: v for k, v in params.items() if k != "page" and v != ""}
        steps = summary.column("step").to_pylist()
        return TEMPLATES.TemplateResponse(request, "run.html", {
            **self.base, "plots": [line_plot(title, pts, marks) for title, pts in series.items()],
            "rows": picked.slice((page - 1) * size, size).select(LIST_COLUMNS).to_pylist(),
            "total": picked.num_rows, "all": summary.num_rows, "page": page,
            "pages": max(1, -(-picked.num_rows // size)), "params": params, "marks": marks,
            "page_url": lambda n: "/?" + urlencode({**keep, "page": n}),
            "finish_reasons": _distinct(summary, "finish_reason"), "sources": _distinct(summary, "data_source"),
            "steps": (min(steps, default=0), max(steps, default=0)),
            "step_log": self.log_path, "events": S.guard_events(records)})

    def trajectory_page(self, request: Request) -> HTMLResponse:
        params = dict(request.query_params)
        part, step, index = (_opt(params, k, int) for k in ("part", "step", "index"))
        task_id = _opt(params, "task_id", str)
        if None in (part, step, index, task_id):
            raise HTTPException(400, "part, step, task_id and index are required")
        source = self.other if params.get("src") == "compare" else self.run_store
        if source is None:
            raise HTTPException(400, "src=compare needs a run to compare with (--compare)")
        rows = source.trajectories(part, step, task_id)
        row = next((r for r in rows if r["index"] == index), None)
        if row is None:
            raise HTTPException(404, f"no trajectory {task_id} #{index} at step {step} in part {part}")
        bs = blocks(row["response_text"] or "")
        aligned = attach_mask(bs, row["loss_mask"], row["behavior_logprobs"])
        tok = self.tokenizer
        pieces = [tok.decode([i]) for i in row["response_ids"]] if tok else None
        return TEMPLATES.TemplateResponse(request, "trajectory.html", {
            **self.base, "r": row, "blocks": bs, "aligned": aligned, "gold": row["golden_answers"] or [],
            "hl": highlight, "components": json.loads(row["reward_components"] or "{}"),
            # step s trains on version s - 1: a row sampled with it is 0 versions stale
            "staleness": row["step"] - 1 - row["policy_version"], "siblings": rows,
            "cells": token_cells(row["response_ids"], row["loss_mask"], row["behavior_logprobs"], pieces),
            "env_tokens": sum(1 for m in row["loss_mask"] if not m), "decoded": tok is not None,
            "all_masked": bool(row["loss_mask"]) and not any(row["loss_mask"]),
            "part": part, "src_q": "&src=compare" if source is self.other else ""})

    def question_page(self, request: Request) -> HTMLResponse:
        task_id = _opt(dict(request.query_params), "task_id", str)
        if task_id is None:
            raise HTTPException(400, "task_id is required")
        mine = _question_rows(self.run_store, task_id)
        if not mine:
            raise HTTPException(404, f"no trajectory of task {task_id!r} in this run")
        theirs = _question_rows(self.other, task_id) if self.other else None
        return TEMPLATES.TemplateResponse(request, "question.html", {
            **self.base, "task_id": task_id, "question": mine[0]["question"], "gold": mine[0]["golden_answers"],
            "mine": mine, "theirs": theirs, "hl": highlight, "by_step": _by_step(mine)})


def create_app(run_dir: Path | None, settings: ViewerSettings | None = None, step_log: Path | None = None,
               asker: Any = None, ask_info: dict[str, str] | None = None) -> Any:
    """The viewer of the run at `run_dir` (its `archive/` or the part directory itself; None: only the ask
    page), with `/ask` when an `asker` is given (`ask_info`: model, search and decoding shown on the page),
    behind the token when one is set."""
    settings = settings or ViewerSettings()
    if run_dir is None and asker is None:
        raise ArchiveNotFound("nothing to show: give a run directory, or a policy to ask")
    v = Viewer(Path(run_dir) if run_dir is not None else None, settings, step_log, asker, ask_info)
    app = FastAPI(title="searchr1 viewer", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(HTTPException, v.error)
    app.add_exception_handler(ArchiveNotFound, v.unreadable)
    app.add_api_route("/ask", v.ask_page, methods=["GET"], response_class=HTMLResponse)
    app.add_api_route("/healthz", lambda: JSONResponse({"status": "ok"}), methods=["GET"])
    app.add_api_route("/", v.run_page, methods=["GET"], response_class=HTMLResponse)
    app.add_api_route("/trajectory", v.trajectory_page, methods=["GET"], response_class=HTMLResponse)
    app.add_api_route("/question", v.question_page, methods=["GET"], response_class=HTMLResponse)
    return CookieTokenMiddleware(app, settings.token) if settings.token else app


def _question_rows(store: ArchiveStore, task_id: str) -> list[dict]:
    """Every kept trajectory of one task, step by step, with its answer and queries (read part by part)."""
    from searchr1.core.health import queries
    from searchr1.core.protocol import extract_answer

    picked = store.select(Query(task_id=task_id))
    out = []
    for part in sorted(set(picked.column("part").to_pylist())):
        steps = {s for s, p in zip(picked.column("step").to_pylist(), picked.column("part").to_pylist()) if p == part}
        for step in sorted(steps):
            for r in store.trajectories(part, step, task_id):
                text = r["response_text"] or ""
                out.append({**{k: r[k] for k in ("step", "index", "reward", "finish_reason", "num_searches",
                                                  "policy_version", "question", "golden_answers", "worker_id")},
                            "part": part, "answer": extract_answer(text), "queries": queries(text)})
    return sorted(out, key=lambda r: (r["step"], r["index"]))


def _by_step(rows: list[dict]) -> list[tuple[int, float, int]]:
    """(step, mean reward, trajectories) per step."""
    acc: dict[int, list[float]] = {}
    for r in rows:
        acc.setdefault(r["step"], []).append(r["reward"])
    return [(s, sum(v) / len(v), len(v)) for s, v in sorted(acc.items())]
