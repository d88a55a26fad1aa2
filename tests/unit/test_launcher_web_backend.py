"""`searchr1 up` with a web search backend (`[retriever] backend = "web"` in the run config, or
RETRIEVER_BACKEND=web): no index is needed, so a missing one is neither built nor a problem."""

from __future__ import annotations

from searchr1.launcher.planner import build_plan, web_search_backend
from searchr1.launcher.settings import LauncherSettings


def test_a_web_backend_needs_no_index(tmp_path, monkeypatch):
    monkeypatch.delenv("RETRIEVER_BACKEND", raising=False)
    web = tmp_path / "web.toml"
    web.write_text('[launcher]\n[retriever]\nbackend = "web"\n[retriever.web]\nprovider = "searxng"\n')
    local = tmp_path / "local.toml"
    local.write_text("[launcher]\n")
    assert web_search_backend(web) and not web_search_backend(local)
    assert not web_search_backend(tmp_path / "missing.toml")

    plan = build_plan(LauncherSettings(command=["x"]), web, tmp_path / "run")  # default index: RUN_DIR/index
    assert plan.problems == [] and "index-build" not in [p.name for p in plan.specs]
    plan = build_plan(LauncherSettings(command=["x"]), local, tmp_path / "run")
    assert any("index" in p and "missing" in p for p in plan.problems)  # the local backend still needs one

    monkeypatch.setenv("RETRIEVER_BACKEND", "web")  # the environment overrides the file, as for the retriever
    assert web_search_backend(local)
    assert build_plan(LauncherSettings(command=["x"]), local, tmp_path / "run").problems == []
