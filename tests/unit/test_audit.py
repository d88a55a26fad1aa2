"""The delivery audit's counting (`searchr1.learner.tools.audit.audit`) on hand-built records: every category,
the step archived again by a restarted learner, and the checkpoint cross-check."""

from __future__ import annotations

from searchr1.learner.tools.audit import (
    CheckpointRecord,
    DeadRecord,
    StreamRecord,
    TrainedRow,
    audit,
    kept_rows,
    table_rows,
)


def t(entry: str, task: str, state: str = "acked") -> StreamRecord:
    return StreamRecord(entry, task, state)  # type: ignore[arg-type]


def g(entry: str, task: str, state: str = "acked", version: int = 0) -> StreamRecord:
    return StreamRecord(entry, task, state, version)  # type: ignore[arg-type]


def test_every_category_is_counted_once():
    tasks = [t("1-0", "a"), t("2-0", "b"), t("3-0", "c"), t("4-0", "d"), t("5-0", "e"), t("6-0", "f"),
             t("7-0", "g", "pending"), t("8-0", "h", "undelivered"), t("9-0", "a")]  # `a` published twice
    groups = [g("1-0", "a"), g("2-0", "b"), g("3-0", "c", version=0), g("4-0", "d"), g("5-0", "e", "pending"),
              g("6-0", "a")]  # the second group of `a`: a replay, acked
    dead = [DeadRecord("searchr1:r:trajectories", "d", "sampled at temperature 0.7, trains at 1.0"),
            DeadRecord("searchr1:r:tasks", None, "not msgpack")]
    trained = [TrainedRow(1, 0, "a"), TrainedRow(1, 0, "b")]
    report = audit(tasks, groups, dead, trained, CheckpointRecord(1, 1, frozenset({"a", "b"})),
                   drop_reasons={}, learner_resumes=[], announced_version=1,
                   worker_versions={"rollout-0": 1, "rollout-1": 0})
    assert report.dispatched == 8 and report.task_entries == 9
    assert report.trained_once == 2 and report.trained_twice == []
    assert report.dropped == {"c": "acked untrained (sampled at version 0)"}
    assert report.dead == {"d": "sampled at temperature 0.7, trains at 1.0"}
    assert sorted(report.in_flight) == ["e", "g", "h"]  # group pending, task pending, task undelivered
    assert report.lost == ["f"]  # its task was acked, its group is nowhere
    assert report.undecodable_dead == 1
    assert not report.ok and not report.workers_on_final_version
    rows = dict(table_rows(report))
    assert rows["lost"] == "1: f" and rows["  rollout-1"] == "v0  (behind)" and rows["verdict"] == "FAILED"


def test_a_step_archived_again_after_a_restart_counts_once():
    # the learner archived step 2 (tasks c, d) in part 0 and was killed before checkpointing it; restarted
    # from step 1, it trained step 2 on c and e (part 1), then step 3 on d and f
    trained = [TrainedRow(1, 0, "a"), TrainedRow(1, 0, "b"), TrainedRow(2, 0, "c"), TrainedRow(2, 0, "d"),
               TrainedRow(2, 1, "c"), TrainedRow(2, 1, "e"), TrainedRow(3, 1, "d"), TrainedRow(3, 1, "f")]
    kept, superseded = kept_rows(trained)
    assert superseded == [2] and {(r.step, r.task_id) for r in kept} == {
        (1, "a"), (1, "b"), (2, "c"), (2, "e"), (3, "d"), (3, "f")}
    tasks = [t(f"{i}-0", k) for i, k in enumerate("abcdef", 1)]
    report = audit(tasks, [g(f"{i}-0", k) for i, k in enumerate("abcdef", 1)], [], trained,
                   CheckpointRecord(3, 3, frozenset("abcdef")), learner_resumes=[1])
    assert report.ok and report.trained_once == 6 and report.lost == [] and report.trained_twice == []
    assert report.superseded_steps == [2] and report.last_trained_step == 3


def test_trained_in_two_checkpointed_steps_is_trained_twice():
    trained = [TrainedRow(1, 0, "a"), TrainedRow(2, 0, "a"), TrainedRow(2, 0, "b")]
    report = audit([t("1-0", "a"), t("2-0", "b")], [], [], trained, CheckpointRecord(2, 2, frozenset("ab")))
    assert report.trained_twice == ["a"] and report.trained_once == 1 and not report.ok


def test_two_groups_of_one_task_in_one_step_are_trained_twice():
    trained = [TrainedRow(1, 0, "a"), TrainedRow(1, 0, "a"), TrainedRow(1, 0, "b")]
    report = audit([t("1-0", "a"), t("1-1", "b")], [], [], trained)
    assert report.trained_twice == ["a"] and report.trained_once == 1 and not report.ok


def test_checkpoint_and_archive_must_agree_and_drop_reasons_come_from_the_log():
    trained = [TrainedRow(1, 0, "a"), TrainedRow(2, 0, "b")]
    tasks = [t("1-0", "a"), t("2-0", "b"), t("3-0", "c")]
    report = audit(tasks, [g("3-0", "c", version=0)], [], trained, CheckpointRecord(1, 1, frozenset({"a", "z"})),
                   drop_reasons={"c": "sampled at version 0, learner at 2 (max_staleness 0)"},
                   announced_version=2, worker_versions={"rollout-0": 2})
    assert report.checkpoint_mismatch == ["z"]  # step 2 is past the checkpoint: not compared
    assert report.dropped == {"c": "sampled at version 0, learner at 2 (max_staleness 0)"}
    assert report.workers_on_final_version and not report.ok
    assert report.as_json()["dropped_reasons"] == {"sampled at version 0, learner at 2 (max_staleness 0)": 1}


def test_trained_but_never_dispatched_is_flagged():
    report = audit([t("1-0", "a")], [], [], [TrainedRow(1, 0, "a"), TrainedRow(1, 0, "x")])
    assert report.trained_not_dispatched == ["x"] and not report.ok


def test_trajectories_resumed_across_weight_versions_are_counted_on_kept_rows_only():
    tasks = [t("1-0", "a"), t("1-1", "b")]
    trained = [TrainedRow(1, 0, "a", resumed=2), TrainedRow(1, 1, "a", resumed=1), TrainedRow(1, 1, "b")]
    report = audit(tasks, [], [], trained)  # step 1 archived again in part 1: part 0's copy is superseded
    assert report.resumed_trajectories == 1 and report.as_json()["resumed_trajectories"] == 1
    assert ("trajectories resumed across weight versions", "1") in table_rows(report)


def test_the_archive_reader_counts_resumed_trajectories_per_group(tmp_path):
    from searchr1.learner.tools.archive import ArchiveWriter
    from searchr1.learner.tools.audit_sources import read_archive
    from tests.support.synthetic import synthetic_group

    group = synthetic_group("r", group_size=3, policy_version=2)
    n = len(group.trajectories[1].loss_mask)
    group.trajectories[1] = group.trajectories[1].model_copy(update={"segments": [(0, 1, 2), (1, n, 3)]})
    ArchiveWriter(tmp_path, every_steps=1).append(4, [group, synthetic_group("s")], ["4-0", "4-1"])
    assert [(r.task_id, r.step, r.resumed) for r in read_archive(tmp_path)] == [("r", 4, 1), ("s", 4, 0)]
