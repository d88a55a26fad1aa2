"""The viewer's ask page in Debian's headless Chromium: the committed tiny-world warm start (transformers
engine, greedy) answers a question typed into the form, searching the world's BM25 index served in-process;
the page shows the trajectory turn by turn (policy blocks set apart from the retrieved passages), the answer
and, with gold answers, whether it is correct. A run page with one unreadable archive part still loads and
names the part. `VIEWER_SCREENSHOTS=DIR` saves the ask page (docs/img/viewer-ask.png)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.archive_fixture import write_archive
from tests.support.viewer_server import serve_viewer

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

playwright_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
    pytest.skip("Chromium is absent (Debian: apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def page():
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                                    args=ARGS)
        context = browser.new_context(viewport={"width": 1360, "height": 900})
        pg = context.new_page()
        errors: list[str] = []
        pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.console_errors = errors
        yield pg
        browser.close()


def _shot(page, name: str) -> None:
    out = os.environ.get("VIEWER_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(out) / name), full_page=True)


def test_ask_page_shows_the_trajectory_turn_by_turn(page, tiny_world):
    from searchr1.api import open_asker

    world, index, warm = tiny_world
    info = {"model": "tiny-world warm start", "source": "tiny world BM25", "decoding": "greedy, hf"}
    with serve_viewer(None, asker=lambda: open_asker(warm, index=index, engine="hf"), ask_info=info) as url:
        page.goto(url + "/")  # without a run: straight to the ask page
        assert page.url.endswith("/ask")
        page.fill("#question", "Which company does Nalfo Traincirk work for?")
        page.fill("#gold", "Sous Foundry")
        page.click("#submit")
        page.wait_for_selector("#turns .block", timeout=120_000)
        kinds = [b.get_attribute("data-kind") for b in page.locator("#turns .block").all()]
        assert kinds[:3] == ["think", "search", "information"] and kinds[-1] == "answer", kinds
        env = page.locator("#turns .block[data-env=true]")
        assert env.count() == kinds.count("information") and env.first.get_attribute("data-kind") == "information"
        assert page.locator("#turns .block[data-kind=information] ol.docs li").count() >= 1
        assert page.locator("#turns .block[data-kind=search] .query").first.inner_text() == "Nalfo Traincirk"
        assert page.locator("#turns .block[data-kind=information] mark.gold").count() >= 1  # the gold is retrieved
        assert page.inner_text("#finish") == "answer"
        assert page.inner_text("#verdict") in ("correct", "wrong")
        assert page.locator("#answer b").inner_text().strip() != ""
        _shot(page, "viewer-ask.png")
        assert "q=Which+company" in page.url  # the question is in the address: a page to share
        assert page.console_errors == []


def test_an_unreadable_part_is_named_and_the_rest_shown(page, tmp_path):
    write_archive(tmp_path / "archive", steps=4, groups_per_step=2, every_steps=2)
    parts = sorted((tmp_path / "archive").glob("part-*.parquet"))
    parts[0].write_bytes(b"not parquet at all")
    with serve_viewer(tmp_path) as url:
        response = page.goto(url + "/")
        assert response.status == 200
        assert parts[0].name in page.inner_text("#broken-parts")
        assert page.locator("#count").inner_text() == "16 matching"  # the other part's steps
        assert page.console_errors == []
