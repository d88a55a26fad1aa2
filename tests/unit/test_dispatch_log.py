"""The dispatcher's durable record of published task ids (`learner/tools/dispatch_log.py`)."""

from __future__ import annotations

from searchr1.learner.tools.dispatch_log import DispatchLog, dispatch_log_path, read_dispatched


def test_ids_are_appended_across_restarts_and_a_torn_last_line_is_left_out(tmp_path):
    path = dispatch_log_path(tmp_path / "learner", "r1")
    assert path == tmp_path / "learner" / "r1.dispatched" and read_dispatched(path) == []
    first = DispatchLog(path)
    first.record(["q1@e0", "q2@e0"])
    assert read_dispatched(path) == ["q1@e0", "q2@e0"]  # flushed: readable before close
    first.close()
    again = DispatchLog(path)  # a restarted learner appends (it may re-publish ids)
    again.record(["q2@e0"])
    again.close()
    with path.open("a") as f:
        f.write("q3@")  # a crash in the middle of a line
    assert read_dispatched(path) == ["q1@e0", "q2@e0", "q2@e0"]
