"""`searchr1 rehearse`: train a shipped run config on CPU exactly as configured but for the swaps of
`rehearsal.py`, through the real services, and judge the run.

One rehearsal is three learner runs over one set of trajectories:

1. `searchr1 up` of the rehearsed config for `steps` steps: Redis, the retriever, the reward service, a vLLM
   rollout worker in the config's `engine.dtype`, the learner as two gloo ranks in its `model.dtype`.
2. The fp32 reference: `searchr1 train --replay` of the run's trajectory archive, one process, the same
   learner table with `model.dtype = "float32"` — the same groups, in the same steps, trained in fp32.
3. The round trip: `searchr1 train --replay` of the same archive resumed from the run's last checkpoint
   (copied), which re-publishes the checkpoint's version at start and finds no step left to train.

Checks (`Check`): the steps ran, with finite losses; the importance ratio against the engine stayed in its
healthy band (`mismatch_abs_logp_mean` at most the MismatchHigh alert's 0.1, the per-token ratio extremes
reported); a published version names the architecture a fresh engine loads (the stand-in's); the trained state is fp32 master weights that moved from the stand-in as the fp32 reference's
did (share of weights changed within 5 points, RMS movement within 25%); every version was published in
the engine's dtype; the engine reloaded the published versions (every step's groups were sampled with the
version before it: a step trained on older weights would show staleness); the checkpoint round-trips (the
version re-published from it is bit for bit the version the run published).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from searchr1.core.settings import read_config_file
from searchr1.launcher.rehearsal import (
    Difference,
    StandIns,
    check_swaps,
    rehearsal_config,
    same_rehearsal,
)
from searchr1.weightsync import materialize

MISMATCH_BAND = 0.1
"""`mismatch_abs_logp_mean` above this is the MismatchHigh alert's fleet-wide disagreement."""

_ENGINE_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class RehearsalReport:
    """One rehearsal: the configs it stands for, its swaps, its steps' figures and its checks."""

    name: str
    configs: list[str]
    swaps: list[dict[str, Any]]
    steps: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_cli(args: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None) -> int:
    """`python -m searchr1.cli ARGS`, its output to `log`; its exit code (124 on timeout)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        try:
            return subprocess.run([sys.executable, "-m", "searchr1.cli", *args], stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout_s,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}).returncode
        except subprocess.TimeoutExpired:
            return 124


def replay_config(rehearsed: dict[str, Any], out: Path, archive: Path, *, dtype: str | None = None) -> dict[str, Any]:
    """A one-process `train --replay` config: the rehearsed learner table with its outputs under `out`
    (and `model.dtype` set to `dtype` when given)."""
    learner = json.loads(json.dumps(rehearsed["learner"]))
    learner.update(log_dir=str(out / "learner"), threads=2)
    learner.setdefault("weights", {})["dir"] = str(out / "weights")
    learner.setdefault("checkpoint", {})["dir"] = str(out / "checkpoints")
    learner.setdefault("archive", {})["replay_from"] = str(archive)
    learner.setdefault("redis", {})["run"] = out.name
    if dtype is not None:
        learner.setdefault("model", {})["dtype"] = dtype
    return {"learner": learner}


def read_steps(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _latest(root: Path, prefix: str) -> Path | None:
    found = sorted(p for p in root.glob(f"{prefix}*") if p.is_dir()) if root.is_dir() else []
    return found[-1] if found else None


def _movement(initial: Path, checkpoint: Path) -> tuple[float, float, set[str]]:
    """(share of master values that differ from the stand-in's, RMS of the differences, the dtypes of the
    checkpoint's floating tensors) over the parameters both hold."""
    import torch
    from safetensors.torch import load_file

    start, masters = load_file(str(initial)), load_file(str(checkpoint / "policy.safetensors"))
    changed = total = 0
    squares = 0.0
    dtypes = {str(t.dtype).removeprefix("torch.") for t in masters.values() if t.is_floating_point()}
    for k, t in masters.items():
        if k not in start or not t.is_floating_point():
            continue
        d = t.to(torch.float64) - start[k].to(torch.float64)
        changed += int((d != 0).sum())
        total += d.numel()
        squares += float((d * d).sum())
    return changed / max(total, 1), math.sqrt(squares / max(total, 1)), dtypes


def _snapshot_tensors(version_dir: Path):
    from safetensors.torch import load_file

    return load_file(str(version_dir / "model.safetensors"))


def _safetensors_dtypes(path: Path) -> set[str]:
    """The dtypes in a safetensors file's header (read without loading the tensors)."""
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def judge(rehearsed: dict[str, Any], run_dir: Path, work: Path, steps_wanted: int, stand_in: Path,
          rc: dict[str, int]) -> tuple[list[dict[str, Any]], list[Check]]:
    """The figures of the run's steps and the checks of the module docstring."""
    run = rehearsed["launcher"]["run"]
    steps = read_steps(run_dir / "learner" / f"{run}.jsonl")
    checks = [Check("services ran", rc["up"] == 0, f"searchr1 up exited {rc['up']} (logs: {run_dir / 'logs'})"),
              Check("steps trained", len(steps) == steps_wanted and all(math.isfinite(s.get("loss", math.nan))
                                                                       for s in steps),
                    f"{len(steps)} of {steps_wanted} steps, losses {[round(s.get('loss', math.nan), 4) for s in steps]}")]
    gaps = [s.get("mismatch_abs_logp_mean", math.nan) for s in steps]
    highs = [s.get("is_ratio_max", math.nan) for s in steps]
    lows = [s.get("is_ratio_min", math.nan) for s in steps]
    checks.append(Check("importance ratio in its band", bool(gaps) and all(g <= MISMATCH_BAND for g in gaps),
                        f"mean |Δ log p| per step {[f'{g:.2e}' for g in gaps]} (band ≤ {MISMATCH_BAND}); per-token "
                        f"ratio within [{min(lows, default=math.nan):.3f}, {max(highs, default=math.nan):.3f}]"))
    stale = [s.get("staleness_mean", math.nan) for s in steps]
    checks.append(Check("engine reloaded each version", len(steps) >= 2 and all(x == 0 for x in stale),
                        f"staleness of each step's groups {stale} (0: sampled with the version the step followed)"))
    engine_dtype = str(rehearsed.get("rollout", {}).get("engine", {}).get("dtype", "auto"))
    weights = run_dir / "weights"
    if weights.is_dir():  # the newest version as a full snapshot, whichever form it was published in
        materialize(weights)
    last = _latest(weights, "v")
    if last is not None:
        have = _safetensors_dtypes(last / "model.safetensors")
        want = _ENGINE_DTYPES.get(engine_dtype)
        changed = [s.get("published_changed_frac") for s in steps]
        arch = json.loads((last / "config.json").read_text()).get("architectures")
        base = json.loads((stand_in / "config.json").read_text()).get("architectures")
        checks.append(Check("a fresh engine can load it", arch == base,
                            f"{last.name}/config.json names {arch}; the stand-in is {base}"))
        checks.append(Check("published in the engine's dtype", want is None or have == {want},
                            f"{last.name}: {sorted(have)} (engine.dtype {engine_dtype}); published values changed "
                            f"per step {[None if c is None else f'{c:.2e}' for c in changed]}"))
    else:
        checks.append(Check("published in the engine's dtype", False, f"no version under {weights}"))
    ckpt = _latest(run_dir / "checkpoints", "step")
    fp32_ckpt = _latest(work / "fp32" / "checkpoints", "step")
    if ckpt is None or fp32_ckpt is None:
        checks.append(Check("masters move as fp32's", False,
                            f"checkpoints: run {ckpt}, fp32 replay {fp32_ckpt} (exit {rc.get('fp32')})"))
    else:
        share, rms, dtypes = _movement(stand_in / "model.safetensors", ckpt)
        share32, rms32, _ = _movement(stand_in / "model.safetensors", fp32_ckpt)
        ok = dtypes == {"float32"} and abs(share - share32) <= 0.05 and rms32 > 0 and 0.8 <= rms / rms32 <= 1.25
        checks.append(Check("masters move as fp32's", ok,
                            f"masters {sorted(dtypes)}; share moved {share:.4f} against fp32's {share32:.4f}, RMS "
                            f"movement {rms:.3e} against {rms32:.3e}"))
    rt = _latest(work / "roundtrip" / "weights", "v")
    if last is None or rt is None or rt.name != last.name:
        checks.append(Check("checkpoint round-trips", False,
                            f"run's last version {last}, re-published {rt} (exit {rc.get('roundtrip')})"))
    else:
        a, b = _snapshot_tensors(last), _snapshot_tensors(rt)
        same = a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].equal(b[k]) for k in a)
        checks.append(Check("checkpoint round-trips", same,
                            f"{rt.name} re-published from {ckpt.name if ckpt else None}: "
                            f"{'bit for bit' if same else 'differs from'} the run's {last.name}"))
    return steps, checks


def differences_json(diffs: list[Difference]) -> list[dict[str, Any]]:
    return [asdict(d) for d in diffs]


@dataclass
class Planned:
    """One rehearsal to run: the configs it stands for and its rehearsed config."""

    name: str
    config: dict[str, Any]
    swaps: list[Difference]
    sources: list[str]


def plan(configs: list[Path], stand_ins: StandIns, out: Path, steps: int,
         services: dict[str, Any] | None) -> list[Planned]:
    """The rehearsals `configs` need: each config rehearsed, configs that rehearse alike (same digest)
    folded into the first one's rehearsal. Raises `RehearsalError` / `ConfigError` for a config that cannot
    be rehearsed."""
    by_digest: dict[str, Planned] = {}
    for path in configs:
        shipped = read_config_file(path)
        name = f"rehearse-{path.stem}"
        rehearsed = rehearsal_config(shipped, stand_ins, name=name, run_dir=out / name / "run", steps=steps,
                                     services=services)
        swaps = check_swaps(shipped, rehearsed)
        digest = same_rehearsal(rehearsed)
        if digest in by_digest:
            by_digest[digest].sources.append(str(path))
        else:
            by_digest[digest] = Planned(name, rehearsed, swaps, [str(path)])
    return list(by_digest.values())


def run_one(p: Planned, out: Path, steps: int, stand_ins: StandIns, timeout_s: float) -> RehearsalReport:
    """The three learner runs of the module docstring, then the checks."""
    work = out / p.name
    shutil.rmtree(work, ignore_errors=True)
    run_dir = Path(p.config["launcher"]["run_dir"])
    cfg = write_config(work / "rehearsal.yaml", p.config)
    rc = {"up": run_cli(["up", "--config", str(cfg)], work / "up.log", timeout_s)}
    archive = run_dir / "archive"
    if archive.is_dir():
        fp32 = write_config(work / "fp32.yaml", replay_config(p.config, work / "fp32", archive, dtype="float32"))
        rc["fp32"] = run_cli(["train", "--config", str(fp32), "--max-steps", str(steps)], work / "fp32.log", timeout_s)
        rt_dir = work / "roundtrip"
        if (run_dir / "checkpoints").is_dir():
            shutil.copytree(run_dir / "checkpoints", rt_dir / "checkpoints")
        rt = write_config(work / "roundtrip.yaml", replay_config(p.config, rt_dir, archive))
        rc["roundtrip"] = run_cli(["train", "--config", str(rt)], work / "roundtrip.log", timeout_s)
    steps_figures, checks = judge(p.config, run_dir, work, steps, stand_ins.model, rc)
    report = RehearsalReport(p.name, p.sources, differences_json(p.swaps), steps_figures, checks)
    (work / "report.json").write_text(json.dumps(report.to_json(), indent=1, default=str))
    return report
