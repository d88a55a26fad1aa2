"""OpenMP wait policy: filled into the environment before torch loads, never overriding the user's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from searchr1.core.openmp import passive_openmp_waits, set_openmp_waits
from searchr1.learner.settings import LearnerSettings


@pytest.fixture
def no_policy(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)


def test_passive_is_filled_in(no_policy):
    import os

    assert set_openmp_waits("passive") == "PASSIVE"
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


def test_spin_leaves_libgomp_default(no_policy):
    import os

    assert set_openmp_waits("spin") == "default"
    assert "OMP_WAIT_POLICY" not in os.environ


def test_the_environment_wins(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert set_openmp_waits("passive") == "ACTIVE"
    passive_openmp_waits()
    import os

    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


@pytest.mark.parametrize(("waits", "staleness", "policy"), [
    ("auto", 0, "spin"), ("auto", 1, "passive"), ("auto", 2, "passive"),
    ("spin", 2, "spin"), ("passive", 0, "passive"),
])
def test_learner_resolves_auto_from_staleness(waits, staleness, policy):
    s = LearnerSettings(openmp_waits=waits, algorithm={"max_staleness": staleness})
    assert s.openmp_wait_policy() == policy


def test_learner_refuses_an_unknown_policy():
    with pytest.raises(ValueError, match="openmp_waits"):
        LearnerSettings(openmp_waits="busy")


def test_settings_and_policy_load_before_torch():
    """The learner command applies the policy after reading its settings: neither may import torch, or
    libgomp would have read the environment already."""
    code = ("import sys\nfrom searchr1.core.settings import load_settings\n"
            "from searchr1.learner.settings import LearnerSettings\nimport searchr1.cli\n"
            "from searchr1.core.openmp import set_openmp_waits\n"
            "LearnerSettings(); print('torch' in sys.modules, 'faiss' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
