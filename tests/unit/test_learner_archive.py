"""The trajectory archive: rows and columns, durable parts rolled every N steps, duplicates after a restart
told apart, filters, groups rebuilt for replay, and the `searchr1 archive` commands on a written archive."""

from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from searchr1.cli import build_app
from searchr1.core.schemas import Trajectory, TrajectoryGroup
from searchr1.learner.tools.archive import (
    SCHEMA,
    ArchiveError,
    ArchiveWriter,
    Filter,
    describe,
    groups_by_step,
    latest_copies,
    parts,
    read,
    rows,
)
from searchr1.learner.tools.archive_commands import styled_segments
from tests.support.synthetic import synthetic_group


def _groups(step: int, n: int = 2) -> list[TrajectoryGroup]:
    return [synthetic_group(f"s{step}-t{i}", group_size=3, rewards=[1.0, 0.0, 0.5], rng=random.Random(step * 10 + i))
            for i in range(n)]


def _ids(step: int, n: int = 2) -> list[str]:
    return [f"{1000 + step}-{i}" for i in range(n)]


def test_rows_one_per_trajectory_with_every_column():
    g = _groups(3, 1)[0]
    g.trajectories[1] = g.trajectories[1].model_copy(update={
        "response_text": "<search>x</search><information>doc</information>", "finish_reason": "length",
        "reward_components": {"em": 0.0, "format": 0.5}})
    t = rows(3, [g], ["1-0"])
    assert t.schema == SCHEMA and t.num_rows == 3
    r = t.to_pylist()[1]
    assert (r["step"], r["task_id"], r["entry_id"], r["index"], r["worker_id"]) == (3, "s3-t0", "1-0", 1, "synthetic")
    assert r["reward"] == 0.0 and json.loads(r["reward_components"]) == {"em": 0.0, "format": 0.5}
    assert r["finish_reason"] == "length" and r["response_text"].startswith("<search>")
    traj = g.trajectories[1]
    assert r["prompt_ids"] == traj.prompt_ids and r["response_ids"] == traj.response_ids
    assert r["loss_mask"] == traj.loss_mask
    assert r["behavior_logprobs"] == pytest.approx(traj.behavior_logprobs, abs=1e-6)
    with pytest.raises(ValueError, match="2 groups but 1 entry ids"):
        rows(1, _groups(1), ["x"])


def test_parts_roll_every_n_steps_and_leave_no_temporary_file(tmp_path):
    w = ArchiveWriter(tmp_path, every_steps=2)
    for step in range(1, 6):
        assert w.append(step, _groups(step), _ids(step)).name == f"part-{(step - 1) // 2:06d}.parquet"
    infos = describe(tmp_path)
    assert [(i.path.name, i.first_step, i.last_step, i.groups, i.rows) for i in infos] == [
        ("part-000000.parquet", 1, 2, 4, 12), ("part-000001.parquet", 3, 4, 4, 12),
        ("part-000002.parquet", 5, 5, 2, 6)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [i.path.name for i in infos]
    assert read(tmp_path).num_rows == 30


def test_a_crashed_write_leaves_readers_a_whole_archive(tmp_path):
    w = ArchiveWriter(tmp_path, every_steps=10)
    w.append(1, _groups(1), _ids(1))
    (tmp_path / ".part-000000.parquet.tmp").write_bytes(b"PAR1 half written")  # killed mid-write
    assert [p.name for p in parts(tmp_path)] == ["part-000000.parquet"]
    assert pq.read_table(tmp_path / "part-000000.parquet").num_rows == 6


def test_a_restarted_writer_opens_a_new_part_and_duplicates_are_told_apart(tmp_path):
    w = ArchiveWriter(tmp_path, every_steps=10)
    w.append(1, _groups(1), _ids(1))
    w.append(2, _groups(2), _ids(2))  # archived, then the learner dies before checkpointing step 2
    again = ArchiveWriter(tmp_path, every_steps=10)  # resumes from the step-1 checkpoint
    assert again.append(2, _groups(2), _ids(2)).name == "part-000001.parquet"
    table = read(tmp_path)
    assert table.num_rows == 18
    kept = latest_copies(table)
    assert kept.num_rows == 12
    assert sorted({(r["step"], r["part"]) for r in kept.select(["step", "part"]).to_pylist()}) == [(1, 0), (2, 1)]


def test_filters():
    g = _groups(1, 2)
    g[1] = g[1].model_copy(update={"task": g[1].task.model_copy(update={"data_source": "hotpotqa"})})
    table = rows(1, g, ["a", "b"])
    table = table.append_column("part", table.column("step"))
    assert Filter(task_id="s1-t0").apply(table).num_rows == 3
    assert Filter(data_source="hotpotqa").apply(table).num_rows == 3
    assert Filter(min_reward=0.5).apply(table).num_rows == 4
    assert Filter(min_reward=0.5, max_reward=0.5).apply(table).num_rows == 2
    assert Filter(min_step=2).apply(table).num_rows == 0
    assert Filter(finish_reason="answer").apply(table).num_rows == 6


def test_groups_rebuilt_in_step_order(tmp_path):
    w = ArchiveWriter(tmp_path, every_steps=1)
    written = {step: _groups(step) for step in (1, 2, 3)}
    for step, gs in written.items():
        w.append(step, gs, _ids(step))
    rebuilt = groups_by_step(latest_copies(read(tmp_path)))
    assert [s for s, _ in rebuilt] == [1, 2, 3]
    for step, gs in rebuilt:
        for got, want in zip(gs, written[step], strict=True):
            assert got.task.task_id == want.task.task_id and got.worker_id == want.worker_id
            assert got.policy_version == want.policy_version
            for a, b in zip(got.trajectories, want.trajectories, strict=True):
                assert isinstance(a, Trajectory)
                assert (a.prompt_ids, a.response_ids, a.loss_mask, a.reward) == (
                    b.prompt_ids, b.response_ids, b.loss_mask, b.reward)
                assert a.behavior_logprobs == pytest.approx(b.behavior_logprobs, abs=1e-6)


def test_reading_an_empty_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ArchiveError, match="no archive parts"):
        read(tmp_path)


def test_information_blocks_are_set_apart():
    segs = styled_segments("a<search>q</search><information>doc</information><answer>x</answer>")
    assert [s for s, _ in segs] == ["a", "<search>q</search>", "<information>doc</information>", "<answer>x</answer>"]
    assert segs[2][1] != segs[1][1] != "" and segs[0][1] == ""


@pytest.fixture
def archive_dir(tmp_path):
    d = tmp_path / "archive"
    w = ArchiveWriter(d, every_steps=2)
    for step in (1, 2, 3):
        gs = _groups(step)
        gs[0].trajectories[0] = gs[0].trajectories[0].model_copy(update={
            "response_text": "<search>capital</search><information>Doc 1: Paris</information><answer>Paris</answer>"})
        w.append(step, gs, _ids(step))
    return d


def test_cli_list_show_export(archive_dir, tmp_path):
    app, runner = build_app(), CliRunner()
    r = runner.invoke(app, ["archive", "list", str(archive_dir)])
    assert r.exit_code == 0, r.output
    assert "part-000000.parquet" in r.output and "part-000001.parquet" in r.output
    assert "18 trajectories in 2 parts" in r.output

    r = runner.invoke(app, ["archive", "show", str(archive_dir), "--min-step", "2", "--task-id", "s2-t0",
                            "--limit", "5"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "q s2-t0?" in r.output and "Doc 1: Paris" in r.output and "em 1" in r.output
    assert "3 of 3 matching trajectories shown" in r.output

    r = runner.invoke(app, ["archive", "export", str(archive_dir), str(tmp_path / "ds"), "--max-reward", "0"])
    assert r.exit_code == 0, r.output
    import datasets

    ds = datasets.load_from_disk(str(tmp_path / "ds"))
    assert len(ds) == 6 and set(ds["reward"]) == {0.0} and "response_ids" in ds.column_names

    r = runner.invoke(app, ["archive", "export", str(archive_dir), str(tmp_path / "out.jsonl"), "--format", "jsonl"])
    assert r.exit_code == 0, r.output
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert len(lines) == 18 and json.loads(lines[0])["step"] == 1

    r = runner.invoke(app, ["archive", "export", str(archive_dir), str(tmp_path / "o.parquet"), "--format", "parquet",
                            "--data-source", "nowhere"])
    assert r.exit_code == 0 and pq.read_table(tmp_path / "o.parquet").num_rows == 0

    r = runner.invoke(app, ["archive", "show", str(tmp_path / "missing")])
    assert r.exit_code != 0 and "no archive parts" in r.output


def test_train_offers_replay_and_the_archive_group_is_listed():
    app, runner = build_app(), CliRunner()
    r = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "--replay" in r.output
    r = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert "archive" in r.output
    r = runner.invoke(app, ["archive", "--help"], env={"COLUMNS": "200"})
    assert all(c in r.output for c in ("list", "show", "export"))


def _resumed_group(task_id: str):
    g = synthetic_group(task_id, group_size=2, policy_version=4)
    t = g.trajectories[0]
    cut = next(i for i in range(1, len(t.loss_mask)) if t.loss_mask[i] == 1)  # a seam after the first token
    g.trajectories[0] = t.model_copy(update={"segments": [(0, cut, 4), (cut, len(t.loss_mask), 5)]})
    return g


def test_segments_are_archived_and_rebuilt_and_parts_written_before_them_read_as_none(tmp_path):
    w = ArchiveWriter(tmp_path / "a", every_steps=1)
    g = _resumed_group("seg")
    w.append(1, [g], ["1-0"])
    table = read(tmp_path / "a")
    assert table.column("segments").to_pylist()[1] == []
    assert table.column("segments").to_pylist()[0] == [list(s) for s in g.trajectories[0].segments]
    (_, (back,)), = groups_by_step(table)
    assert back.trajectories[0].segments == g.trajectories[0].segments
    # a part without the column (an archive written by an earlier release) still reads, segments null
    old = rows(1, [synthetic_group("old")], ["1-1"]).drop_columns(["segments"])
    pq.write_table(old, tmp_path / "a" / "part-000001.parquet")
    both = read(tmp_path / "a", columns=["task_id", "segments"])
    assert both.column("segments").to_pylist()[2:] == [None] * 4
    (_, groups), = groups_by_step(read(tmp_path / "a"))
    assert [len(t.segments) for g2 in groups for t in g2.trajectories] == [2, 0] + [0] * 4
