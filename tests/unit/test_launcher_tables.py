"""`searchr1 up` checks every service table of its run config before it starts anything (and `--dry-run`
shows the same): a typo or an out-of-bounds value in any service's table is a problem naming the table and
the field; a table no service reads is a note; every shipped config passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from searchr1.launcher.tables import SERVICE_TABLES, table_problems

ROOT = Path(__file__).resolve().parents[2]


def test_each_service_table_is_checked_by_its_settings_class(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('[rollout.agent]\nmax_turnz = 2\n[learner.optim]\nlr = -1\n[retriever]\nport = 1\n'
                      '[reward]\nworkers = 0\n[viewer]\npage_size = 0\n[index]\nkind = "nope"\n[rolout]\nmodel = "x"\n'
                      '[launcher]\nrun = "r"\n')
    problems, notes = table_problems(config)
    assert sorted(p.split("]")[0] + "]" for p in problems) == ["[index]", "[learner]", "[retriever]", "[reward]",
                                                                 "[rollout]", "[viewer]"]
    assert "[rollout] agent.max_turnz: Extra inputs are not permitted" in problems
    assert "[learner] optim.lr: Input should be greater than 0" in problems
    assert notes == [n for n in notes if n.startswith("[rolout] is read by no searchr1 service")] and len(notes) == 1


@pytest.mark.parametrize("config", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_passes(config):
    problems, notes = table_problems(config)
    assert problems == []
    assert all(n.startswith("[soak]") for n in notes)


def test_dry_run_refuses_with_the_tables_problems(tmp_path):
    from searchr1.cli import build_app

    config = tmp_path / "run.toml"
    config.write_text("[rollout.agent]\nmax_turnz = 2\n")
    r = CliRunner().invoke(build_app(), ["up", "-c", str(config), "--dry-run", "--run-dir", str(tmp_path / "run")],
                           env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "problem: [rollout] agent.max_turnz: Extra inputs are not permitted" in r.stdout


def test_the_tables_cover_every_service_with_a_section():
    import importlib

    for table, target in SERVICE_TABLES.items():
        module, _, name = target.partition(":")
        assert getattr(importlib.import_module(module), name).section == table
