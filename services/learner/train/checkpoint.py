"""Resumable checkpoints: `checkpoints/step{n:08d}/` with the policy (and critic) weights, optimizer and
scheduler state, step, policy version, the task ids already trained on, dispatcher position and RNG;
with an EMA reference (`ref_ema_tau < 1`) also the reference's weights (a weights-only component).

Everything is safetensors + JSON (nothing is unpickled): optimizer state is flattened into named tensors
plus a JSON description. A checkpoint is written to a dot-directory, fsynced with a manifest of digests
and renamed when complete (`durable.py`), so a crash mid-write leaves the previous checkpoint as the
latest, and a checkpoint whose files do not match its manifest is skipped for the newest older one that
verifies. Each records the fencing token of the learner that wrote it (`lease.py`). Collective under FSDP (state dicts are gathered
to rank 0, which alone writes).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from searchr1.core.faults import fault_point
from searchr1.core.lease import Lease
from searchr1.learner.train.durable import problem, restore_old_copies, seal
from searchr1.learner.train.model import DistInfo, full_state_dict, load_full_state_dict

_PREFIX = "step"
log = logging.getLogger("searchr1.learner")


@dataclass
class TrainState:
    """The non-tensor progress of a run."""

    step: int = 0
    """Training steps completed."""
    version: int = 0
    """Policy version (= steps completed; 0 = initial weights)."""
    consumed: set[str] = field(default_factory=set)
    """Task ids whose groups were trained on (replays of them are acked and skipped)."""
    dispatcher: dict[str, int] = field(default_factory=dict)
    """Dispatcher position {epoch, cursor}."""
    fence: int = 0
    """Fencing token of the learner that wrote the checkpoint (0: no lease)."""


def _flatten_optimizer(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    keys, scalars = [], {}
    for i, (key, st) in enumerate(sd["state"].items()):
        keys.append(key)
        for name, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state/{i}/{name}"] = value.detach().cpu().contiguous().clone()
            else:
                scalars[f"{i}/{name}"] = value
    return tensors, {"keys": keys, "scalars": scalars, "param_groups": sd["param_groups"]}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[Any, dict[str, Any]] = {k: {} for k in meta["keys"]}
    keys = meta["keys"]
    for name, t in tensors.items():
        _, i, attr = name.split("/", 2)
        state[keys[int(i)]][attr] = t
    for name, v in meta["scalars"].items():
        i, attr = name.split("/", 1)
        state[keys[int(i)]][attr] = v
    return {"state": state, "param_groups": meta["param_groups"]}


def _optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo) -> dict[str, Any]:
    if info.enabled:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
    return optimizer.state_dict()


def _load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, sd: dict[str, Any], info: DistInfo) -> None:
    if info.enabled:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, sd, options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True))
        return
    optimizer.load_state_dict(sd)


def _tensors(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous().clone() for k, v in sd.items()}


@dataclass
class Component:
    """A model saved under `name`, with its optimizer and scheduler when it is trained (None for a
    weights-only component such as an EMA reference)."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None


class Checkpointer:
    """Saves and restores `Component`s plus a `TrainState` under `root`."""

    def __init__(self, root: Path, keep: int, info: DistInfo | None = None, *, lease: Lease | None = None) -> None:
        self.root = Path(root)
        self.keep = keep
        self.info = info or DistInfo()
        self.lease = lease
        """The learner's lease (rank 0 on Redis): checked before each write; its token goes into each
        checkpoint."""

    @property
    def fence(self) -> int:
        """The fencing token written into each checkpoint (0: no lease)."""
        return self.lease.token if self.lease is not None else 0

    def latest(self) -> Path | None:
        """The newest checkpoint that verifies against its manifest; newer ones that do not are logged
        and skipped (their groups were never acked: acks follow a durable checkpoint)."""
        if not self.root.is_dir():
            return None
        if self.info.is_main:
            for path in restore_old_copies(self.root):
                log.warning("restored checkpoint %s from a re-save cut between its renames", path)
        done = sorted(p for p in self.root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))
        for path in reversed(done):
            why = problem(path)
            if why is None:
                return path
            log.warning("skipping checkpoint %s: %s", path, why)
        return None

    def save(self, state: TrainState, components: list[Component]) -> Path | None:
        """Write a checkpoint for `state.step` (collective; rank 0 writes). Returns its path on rank 0."""
        gathered = []
        for c in components:
            optim_sd = None if c.optimizer is None else _optimizer_state(c.model, c.optimizer, self.info)
            gathered.append((c, full_state_dict(c.model, self.info), optim_sd))
        if not self.info.is_main:
            return None
        if self.lease is not None:
            self.lease.check()
        final = self.root / f"{_PREFIX}{state.step:08d}"
        tmp = self.root / f".tmp-{final.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        meta: dict[str, Any] = {
            "step": state.step, "version": state.version, "consumed": sorted(state.consumed), "fence": self.fence,
            "dispatcher": state.dispatcher, "python_rng": _jsonable(random.getstate()), "components": {},
        }
        for c, model_sd, optim_sd in gathered:
            save_file(_tensors(model_sd), str(tmp / f"{c.name}.safetensors"))
            if optim_sd is None:
                meta["components"][c.name] = {"optimizer": None, "scheduler": None}
                continue
            opt_tensors, opt_meta = _flatten_optimizer(optim_sd)
            save_file(opt_tensors, str(tmp / f"{c.name}.optimizer.safetensors"))
            meta["components"][c.name] = {"optimizer": opt_meta, "scheduler": _jsonable(c.scheduler.state_dict())}
        save_file({"cpu": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        (tmp / "state.json").write_text(json.dumps(meta))
        fault_point("checkpoint.before_seal")  # test hook (core/faults.py): off unless its env var is set
        seal(tmp, final)
        self._prune()
        return final

    def load(self, components: list[Component], path: Path | None = None) -> TrainState | None:
        """Restore the latest (or given) checkpoint into `components`; None when there is none.
        Every rank must call it; all ranks read the (shared) files. A weights-only component the
        checkpoint lacks (an EMA reference switched on at resume) keeps its current weights."""
        path = path or self.latest()
        if path is None:
            return None
        meta = json.loads((path / "state.json").read_text())
        for c in components:
            cm = meta["components"].get(c.name)
            if cm is None:
                if c.optimizer is None:
                    continue
                raise ValueError(f"checkpoint {path} has no component {c.name!r} (it has {sorted(meta['components'])})")
            model_sd = load_file(str(path / f"{c.name}.safetensors"))
            load_full_state_dict(c.model, model_sd, self.info)
            if c.optimizer is None:
                continue
            opt = _unflatten_optimizer(load_file(str(path / f"{c.name}.optimizer.safetensors")), cm["optimizer"])
            _load_optimizer(c.model, c.optimizer, opt, self.info)
            c.scheduler.load_state_dict(cm["scheduler"])
        torch.set_rng_state(load_file(str(path / "rng.safetensors"))["cpu"])
        random.setstate(_tuplify(meta["python_rng"]))
        return TrainState(step=meta["step"], version=meta["version"], consumed=set(meta["consumed"]),
                          dispatcher=dict(meta["dispatcher"]), fence=int(meta.get("fence", 0)))

    def _prune(self) -> None:
        """Keep the newest `keep` checkpoints; remove dot-directories a killed save left behind."""
        done = sorted(p for p in self.root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))
        for old in done[: max(0, len(done) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
        for left in self.root.glob(".tmp-*"):
            shutil.rmtree(left, ignore_errors=True)
        restore_old_copies(self.root)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    return None  # e.g. LambdaLR's lr_lambdas functions (rebuilt from settings)


def _tuplify(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuplify(v) for v in value)
    return value
