"""`benchmarks/system.py`'s bookkeeping: the variants' placements (colocated: every core to every process;
disaggregated: rollout and its small services on their cores, the learner on the rest), speed-ups paired
run by run with their spread, and the explanation printed below the goal (hand-checked per-step figures)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from system_report import Figures  # noqa: E402
from system_run import drop_dotted, set_dotted  # noqa: E402
from system_summary import mean_figures, paired, spread, summary_table, why  # noqa: E402
from system_variants import colocated, disaggregated, variants  # noqa: E402


def test_placements_of_the_two_regimes():
    assert colocated(2)["placement"]["cpu_colocate"] is True
    assert colocated(2)["placement"]["learner"] == {"cores": [0, 1]}
    split = disaggregated(8, 3)["placement"]
    assert split["rollout"] == {"cores": [0, 1, 2], "workers": 1} and split["learner"] == {"cores": [3, 4, 5, 6, 7]}
    assert split["redis"] == {"cores_with": "rollout"}
    with pytest.raises(ValueError, match="leave the learner a core"):
        disaggregated(2, 2)
    v = variants(2, 1)
    assert v["lockstep"].max_staleness == 0 and v["lockstep"].overrides["placement.cpu_colocate"] is True
    assert v["async2"].overrides["placement.learner.cores"] == [1] and "learner.threads" in v["async2"].drop
    cfg = {"learner": {"threads": 2, "seed": 0}}
    drop_dotted(cfg, "learner.threads")
    set_dotted(cfg, "placement.rollout.cores", [0])
    assert cfg == {"learner": {"seed": 0}, "placement": {"rollout": {"cores": [0]}}}


def _fig(name: str, to_n: float, to_level: float | None, em: float | None, learner: dict, rollout: dict,
         steps: int = 10) -> Figures:
    return Figures(name, name, steps, to_n, to_level, None, em, None, None, None, None, None, None, None,
                   rollout, learner)


L = {"forward_backward": 20.0, "optimizer": 0.0, "queue_wait": 10.0}
R = {"generation": 10.0, "search_wait": 0.0, "queue_wait": 20.0}


def test_speedups_are_paired_within_a_run():
    runs = [{"lockstep": _fig("lockstep", 30.0, 24.0, 0.60, L, R), "async2": _fig("async2", 20.0, 20.0, 0.59, L, R)},
            {"lockstep": _fig("lockstep", 40.0, 30.0, 0.62, L, R), "async2": _fig("async2", 25.0, None, 0.63, L, R)}]
    p = paired(runs, "lockstep", "async2")
    assert p.to_steps == pytest.approx([1.5, 1.6]) and p.to_level == pytest.approx([1.2])
    assert p.em_delta == pytest.approx([-1.0, 1.0])
    assert spread([1.5, 1.6]) == "1.55× (1.50–1.60×)" and spread([]) == "n/a" and spread([1.2]) == "1.20×"
    table = summary_table(runs, "lockstep", ["async2"])
    assert "| 2 | 1.55× (1.50–1.60×) | 1.20× | +0.0 (-1.0 to +1.0) |" in table[-1]
    mean = mean_figures([runs[0]["async2"], runs[1]["async2"]])
    assert mean.seconds_to_n == pytest.approx(22.5) and mean.learner_stages["forward_backward"] == 20.0


def test_below_the_goal_it_says_which_side_sets_the_pace():
    base = _fig("lockstep", 30.0, 30.0, None, {"forward_backward": 20.0, "queue_wait": 10.0},
                {"generation": 10.0, "queue_wait": 20.0})
    # disaggregated: the learner on one of two cores takes 1.6x as long, generation 1.2x
    best = _fig("async2", 32.0, 32.0, None, {"forward_backward": 32.0, "queue_wait": 0.0},
                {"generation": 12.0, "queue_wait": 20.0})
    lines = why(base, replace(best, label="async k = 2"), 0.94, 2, 1, "python benchmarks/system.py")
    text = "\n".join(lines)
    assert "learner busy 2.00 s (forward/backward 2.00 s) + rollout busy 1.00 s" in text
    assert "learner busy 3.20 s (1.60× lockstep's), rollout busy 1.20 s (1.20×)" in text
    assert "no shorter than its slower side (learner, 3.20 s): at most 0.94× lockstep's 3.00 s" in text
    assert "--search-latency-ms 200" in text and "--config configs/smollm2-cpu.toml" in text
