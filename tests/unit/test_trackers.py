"""The optional experiment trackers (`searchr1.core.tracking`): the learner's step log hands each step's
numeric figures to TensorBoard as scalars (event files a TensorBoard reader reads back); a tracker whose
package is missing names the extra to install; the `tensorboard` and `wandb` extras are installed here at
versions their requirements accept."""

from __future__ import annotations

import json
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from searchr1.core.tracking import TensorBoardLog, TrackerUnavailable, numeric
from searchr1.learner.metrics import StepLog

ROOT = Path(__file__).resolve().parents[2]


def test_the_step_log_writes_tensorboard_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    tb = TensorBoardLog(tmp_path / "tb")
    log = StepLog(tmp_path / "run.jsonl", tb)
    for step in (1, 2):
        log.write(step, {"reward_mean": 0.25 * step, "em_mean": 0.5, "note": "text", "nan": float("nan"),
                         "flag": True})
    tb.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "run.jsonl").read_text().splitlines()] == [1, 2]
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert set(acc.Tags()["tensors"]) == {"reward_mean", "em_mean"}  # numeric and finite only
    assert [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors("reward_mean")] == \
        [(1, 0.25), (2, 0.5)]


def test_numeric_figures_only():
    assert numeric({"a": 1, "b": 2.5, "c": True, "d": "x", "e": float("inf"), "f": None}) == {"a": 1.0, "b": 2.5}


def test_a_missing_tracker_names_its_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboard.summary", None)
    with pytest.raises(TrackerUnavailable, match=r"pip install 'searchr1\[tensorboard\]'"):
        TensorBoardLog(tmp_path)


@pytest.mark.parametrize("extra", ["tensorboard", "wandb"])
def test_the_tracker_extras_are_installed(extra):
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for spec in pyproject["project"]["optional-dependencies"][extra]:
        req = Requirement(spec)
        assert req.specifier.contains(metadata.version(req.name), prereleases=True), (spec, metadata.version(req.name))
