"""Each setting is declared once, on its settings field: the runtime classes that mirror settings (frozen
views the hot paths read) take their defaults from those fields through `core.settings.default`, and the
commands that map flags onto a settings class leave every default to it. A literal default re-typed on a
runtime class, or a flag default re-typed on a command, fails here even while the two values agree."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect

import pytest
import typer.main

from searchr1.cli import build_app
from searchr1.core.settings import RetrySettings, default
from searchr1.retriever.build_settings import FaissBuildSettings
from searchr1.retriever.settings import BatchSettings, LimitSettings, SearchSettings
from searchr1.reward.settings import JudgeSettings
from searchr1.rollout.settings import (
    AgentSettings,
    EvalSettings,
    RetrieverClientSettings,
    RewardClientSettings,
    TaskSettings,
)
from searchr1.weightsync import LoadSettings
from searchr1.world.settings import WarmstartSettings

MIRRORS = [
    # (module, runtime class, {runtime field: (settings class, settings field)})
    ("searchr1.rollout.agent", "AgentLimits", {f: (AgentSettings, f) for f in (
        "max_turns", "max_tokens_per_turn", "max_obs_tokens", "max_response_tokens")}),
    ("searchr1.rollout.agent", "Sampling", {f: (AgentSettings, f) for f in ("temperature", "top_p", "top_k")}),
    ("searchr1.rollout.engine", "TurnRequest", {f: (AgentSettings, f) for f in ("temperature", "top_p", "top_k")}),
    ("searchr1.rollout.evaluation.evaluate", "EvalConfig", {"template": (AgentSettings, "template")}),
    ("searchr1.rollout.worker", "Worker", {
        **{f: (TaskSettings, f) for f in ("max_concurrent", "block_ms", "reclaim_interval_s", "drain_timeout_s")},
        "weight_poll_s": (LoadSettings, "poll_interval_s")}),
    ("searchr1.world.traces", "TraceRates", {f: (WarmstartSettings, f) for f in (
        "p_guess", "p_needless_search", "p_noisy_query", "p_wrong_copy", "topk")}),
    ("searchr1.retriever.indexes", "FaissParams", {
        **{f: (FaissBuildSettings, f) for f in ("hnsw_m", "hnsw_ef_construction", "ivf_nlist", "pq_m", "pq_nbits")},
        **{f: (SearchSettings, f) for f in ("hnsw_ef_search", "ivf_nprobe")}}),
]


def _class_source(module: str, name: str) -> ast.ClassDef:
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


@pytest.mark.parametrize("module,name,fields", MIRRORS, ids=[m[1] for m in MIRRORS])
def test_runtime_defaults_come_from_the_settings_fields(module, name, fields):
    cls = getattr(importlib.import_module(module), name)
    runtime = {f.name: f.default for f in dataclasses.fields(cls)}
    for field, (settings, setting) in fields.items():
        assert runtime[field] == default(settings, setting), f"{name}.{field} drifted from {settings.__name__}"
    declared = {n.target.id: n.value for n in _class_source(module, name).body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for field in fields:
        value = declared[field]
        assert (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "default"), (
            f"{name}.{field} re-declares its default ({ast.unparse(value)}): read it with "
            f"core.settings.default from the settings class that declares it")


INIT_MIRRORS = [
    # (module, class, {__init__ keyword: the settings default it takes})
    ("searchr1.rollout.batcher", "SearchBatcher", {
        "top_k": default(RetrieverClientSettings, "top_k"), "max_batch": default(RetrieverClientSettings, "max_batch"),
        "max_wait_s": default(RetrieverClientSettings, "max_wait_ms") / 1000,
        "max_query_chars": default(RetrieverClientSettings, "max_query_chars")}),
    ("searchr1.retriever.batcher", "MicroBatcher", {
        "max_queries": default(BatchSettings, "max_queries"), "max_wait_s": default(BatchSettings, "max_wait_ms") / 1000,
        "refill_share": default(BatchSettings, "refill_share"),
        "max_queue_queries": default(LimitSettings, "max_queue_queries")}),
    ("searchr1.reward.judge", "LLMJudge", {
        f: default(JudgeSettings, f) for f in (
            "timeout_s", "retries", "backoff_s", "max_backoff_s", "cache_size", "max_concurrency")}),
]


@pytest.mark.parametrize("module,name,params", INIT_MIRRORS, ids=[m[1] for m in INIT_MIRRORS])
def test_constructor_defaults_come_from_the_settings_fields(module, name, params):
    cls = getattr(importlib.import_module(module), name)
    signature = inspect.signature(cls.__init__).parameters
    init = next(n for n in _class_source(module, name).body
                if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    literal = {a.arg: d for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True)
               if isinstance(d, ast.Constant)}
    for param, expected in params.items():
        assert signature[param].default == expected, f"{name}({param}=…) drifted from its setting"
        assert param not in literal, f"{name}({param}=…) re-declares its default: read it from the settings class"


def test_eval_group_keys_and_the_reward_clients_policy_are_the_settings_defaults():
    from searchr1.core.clients.reward import DEFAULT_RETRY
    from searchr1.rollout.evaluation.stats import DEFAULT_GROUP_BY

    assert list(DEFAULT_GROUP_BY) == default(EvalSettings, "group_by")
    assert DEFAULT_RETRY == RewardClientSettings().retry_policy()


def test_web_search_retries_are_the_retry_settings():
    from searchr1.retriever.web.settings import WebSettings

    assert issubclass(WebSettings, RetrySettings)
    own = {n.target.id for n in _class_source("searchr1.retriever.web.settings", "WebSettings").body
           if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert not own & {"timeout_s", "retries", "deadline_s"}, "declared by RetrySettings"


SETTINGS_COMMANDS = {("rollout", "once"): {"question", "seed", "steer"}, ("index", "build"): set()}
"""Commands whose flags map onto a settings class, and the flags that are not settings."""


@pytest.mark.parametrize("path", list(SETTINGS_COMMANDS), ids=[" ".join(p) for p in SETTINGS_COMMANDS])
def test_settings_backed_flags_leave_defaults_to_the_settings(path):
    cmd = typer.main.get_command(build_app())
    for name in path:
        cmd = cmd.commands[name]
    retyped = {p.name: p.default for p in cmd.params
               if p.name not in SETTINGS_COMMANDS[path] and p.default is not None}
    assert not retyped, f"`searchr1 {' '.join(path)}` re-types settings defaults: {retyped}"
