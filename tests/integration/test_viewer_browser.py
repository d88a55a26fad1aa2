"""The trajectory viewer in a real browser: Debian's headless Chromium driven by Playwright against the
viewer served on loopback over an archive written by the learner's writer. Pages load without console
errors, filters narrow the listing, a trajectory shows its turns with environment blocks set apart and
the gold answer marked, a question shows its trajectories across steps, the token gate works from a
browser, and parts written while the viewer runs show up.

Set VIEWER_SCREENSHOTS=DIR to save the three pages as PNGs (docs/img holds the ones in the docs)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.archive_fixture import write_archive, write_step_log
from tests.support.viewer_server import serve_viewer

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

playwright_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
    pytest.skip("Chromium is absent (Debian: apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                              args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.console_errors = errors
    yield pg
    context.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("run")
    write_archive(d / "archive", steps=14, groups_per_step=4, collapse_from=11)
    write_step_log(d, steps=14, collapse_from=11)
    return d


def _shot(page, name: str) -> None:
    out = os.environ.get("VIEWER_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(out) / name), full_page=True)


def test_run_page_plots_filters_and_paging(page, run_dir):
    with serve_viewer(run_dir, page_size=20) as url:
        page.goto(url + "/")
        assert page.locator("#plots svg.plot").count() == 15  # 11 from the archive, 4 from the step log
        assert page.locator("#plots svg[aria-label='entropy'] polyline").count() == 1
        assert page.locator("#plots svg[aria-label='malformed rate'] rect.mark").count() >= 1  # collapse marked
        assert page.locator("#count").inner_text() == "224 matching"
        assert page.locator("#trajectories tbody tr").count() == 20
        _shot(page, "viewer-run.png")
        page.click("#next")
        assert "page 2 of 12" in page.inner_text(".pager")
        page.select_option("select[name=finish_reason]", "length")
        page.fill("input[name=min_step]", "12")
        page.click("#apply")
        count = int(page.locator("#count").inner_text().split()[0])
        assert 0 < count < 224
        finishes = page.locator("#trajectories tbody tr td:nth-child(6)").all_inner_texts()
        assert finishes and all(f.startswith("length") for f in finishes)
        steps = [int(s) for s in page.locator("#trajectories tbody tr td:nth-child(1)").all_inner_texts()]
        assert min(steps) >= 12
        page.goto(url + "/?q=nairobi")
        questions = page.locator("#trajectories tbody tr td:nth-child(2)").all_inner_texts()
        assert questions and all("Kenya" in q for q in questions)
        page.goto(url + "/?searches=2&data_source=nq")
        cells = page.locator("#trajectories tbody tr td:nth-child(7)").all_inner_texts()
        assert cells and set(cells) == {"2"}
        assert page.console_errors == []


def test_trajectory_page_turns_and_mask(page, run_dir):
    with serve_viewer(run_dir) as url:
        page.goto(url + "/?searches=2&max_step=10")
        page.locator("a.traj").first.click()
        page.wait_for_selector("#turns")
        kinds = [b.get_attribute("data-kind") for b in page.locator("#turns .block").all()]
        assert kinds == ["think", "search", "information", "think", "search", "information", "think", "answer"]
        env = page.locator("#turns .block[data-env=true]")
        assert env.count() == 2 and all(k == "information" for k in
                                        (b.get_attribute("data-kind") for b in env.all()))
        env_bg = env.first.evaluate("e => getComputedStyle(e).backgroundColor")
        own_bg = page.locator("#turns .block[data-env=false]").first.evaluate("e => getComputedStyle(e).backgroundColor")
        assert env_bg != own_bg
        assert page.locator("#mask-aligned").count() == 1
        assert page.locator("#turns .block[data-kind=information] ol.docs li").count() == 4
        assert page.locator("#turns .block[data-kind=information] mark.gold").count() >= 2
        tokens = page.locator("#tokens .tok")
        assert tokens.count() == page.locator("#tokens .tok.own").count() + page.locator("#tokens .tok.envtok").count()
        assert page.locator("#tokens .tok.envtok").count() > 0
        assert "staleness" in page.inner_text("#meta")
        _shot(page, "viewer-trajectory.png")
        assert page.console_errors == []


def test_question_page_across_steps(page, run_dir):
    with serve_viewer(run_dir) as url:
        page.goto(url + "/")
        page.locator("#trajectories tbody tr td:nth-child(2) a").first.click()
        page.wait_for_selector("#mine")
        steps = {int(s) for s in page.locator("#mine tbody tr td:nth-child(1)").all_inner_texts()}
        assert len(steps) > 1
        _shot(page, "viewer-question.png")
        page.locator("#mine a.traj").last.click()
        page.wait_for_selector("#turns")
        assert page.console_errors == []


def test_before_after_pair(page, run_dir, tmp_path):
    other = write_archive(tmp_path / "after", steps=2, groups_per_step=4, seed=5)
    with serve_viewer(run_dir, compare=other) as url:
        page.goto(url + "/question?task_id=q4")
        assert page.locator("#pair #mine tbody tr").count() > 0
        assert page.locator("#pair #theirs tbody tr").count() > 0
        page.locator("#theirs a.traj").first.click()
        page.wait_for_selector("#turns")
        assert page.console_errors == []


def test_token_from_the_browser(page, run_dir):
    with serve_viewer(run_dir, token="s3cret") as url:
        response = page.goto(url + "/")
        assert response.status == 401
        page.goto(url + "/?token=wrong")
        assert "missing or invalid bearer token" in page.content()
        page.goto(url + "/?token=s3cret&min_step=3")
        assert page.url.endswith("/?min_step=3")  # token moved to a cookie, out of the address bar
        assert page.locator("#trajectories tbody tr").count() > 0
        page.locator("a.traj").first.click()
        page.wait_for_selector("#turns")


def test_live_run_new_parts_show_up(page, tmp_path):
    write_archive(tmp_path / "archive", steps=3, groups_per_step=2, every_steps=2)
    with serve_viewer(tmp_path) as url:
        page.goto(url + "/")
        assert page.locator("#count").inner_text() == "24 matching"
        # the learner goes on (a new part, steps 4-5) after a restart that re-trained step 3 (a second copy)
        write_archive(tmp_path / "archive", steps=3, groups_per_step=2, every_steps=3, seed=9, first_step=3)
        page.reload()
        assert page.locator("#count").inner_text() == "40 matching"
        page.goto(url + "/?min_step=3&max_step=3")
        assert page.locator("#count").inner_text() == "8 matching"  # the kept copy only
        assert page.console_errors == []
