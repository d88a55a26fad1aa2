"""Resumable checkpoints: `checkpoints/step{n:08d}/` with the policy (and critic) weights, optimizer and
scheduler state, step, policy version, the task ids already trained on, dispatcher position and RNG;
with an EMA reference (`ref_ema_tau < 1`) also the reference's weights (a weights-only component).

Everything is safetensors + JSON (nothing is unpickled): optimizer state is flattened into named tensors
plus a JSON description. A checkpoint is written to a dot-directory, fsynced with a manifest of digests
and renamed when complete (`durable.py`), so a crash mid-write leaves the previous checkpoint as the
latest, and a checkpoint whose files do not match its manifest is skipped for the newest older one that
verifies. Each records the fencing token of the learner that wrote it (`searchr1.streams.Lease`), which writes it
into a temporary directory of its own token (`.tmp-t{token}-step…`); the loader prefers the highest token
and never loads one a newer learner's takeover made stale, and a learner whose token is older than a
recorded takeover (or than the checkpoint it would replace) refuses to write (`fences.py`). A save that
fails (a full disk, a lost lease) removes its temporary directory before the error goes on, and a start
removes the ones its own token or older ones left (a process killed mid-save), so a brief disk-full does
not leave a partial copy taking the room the next save needs. The task ids already trained on are stored
compressed (`algo/consumed.py`). Collective under FSDP (state dicts are
gathered to rank 0, which alone writes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from searchr1.core.faults import NO_FAULTS, Faults
from searchr1.learner.algo import consumed as consumed_ids
from searchr1.learner.train.durable import problem, restore_old_copies, seal
from searchr1.learner.train.fences import newest, read_takeovers, record_takeover, stale
from searchr1.learner.train.model import DistInfo, full_state_dict, is_sharded, load_full_state_dict
from searchr1.streams import Lease, LeaseLost

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
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
    return optimizer.state_dict()


def _load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, sd: dict[str, Any], info: DistInfo) -> None:
    if is_sharded(model):
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

    def __init__(self, root: Path, keep: int, info: DistInfo | None = None, *, lease: Lease | None = None,
                 faults: Faults = NO_FAULTS) -> None:
        self.root = Path(root)
        self.keep = keep
        self.info = info or DistInfo()
        self.lease = lease
        """The learner's lease (rank 0 on Redis): checked before each write; its token goes into each
        checkpoint and names the temporary directory it is written in."""
        self.faults = faults
        """The fault suite's hook (`checkpoint.before_seal`); never fires outside it."""
        self.writing: Path | None = None
        """The temporary directory of the save in progress (rank 0), for `bytes_written`."""

    def bytes_written(self) -> int:
        """Bytes in the files of the save in progress (0: none): the progress the learner's watchdog counts
        while a checkpoint is written (`searchr1.core.watchdog.Watchdog.progressing`); any thread."""
        tmp = self.writing
        if tmp is None:
            return 0
        total = 0
        try:
            with os.scandir(tmp) as entries:
                for e in entries:
                    with contextlib.suppress(OSError):
                        total += e.stat(follow_symlinks=False).st_size
        except OSError:  # not made yet, or sealed and renamed away
            return 0
        return total

    @property
    def fence(self) -> int:
        """The fencing token written into each checkpoint (0: no lease)."""
        return self.lease.token if self.lease is not None else 0

    def _done(self) -> list[tuple[int, int, Path]]:
        """(fence, step, path) of every checkpoint directory, by fence then step."""
        out = []
        for p in self.root.iterdir():
            if p.is_dir() and p.name.startswith(_PREFIX):
                out.append((_fence_of(p), int(p.name[len(_PREFIX):]), p))
        return sorted(out)

    def latest(self) -> Path | None:
        """The checkpoint with the highest token, then step, that verifies against its manifest and that no
        newer learner's takeover made stale; the others are logged and skipped (their groups were never
        acked: acks follow a durable checkpoint, and a stale learner's acks are fenced off)."""
        if not self.root.is_dir():
            return None
        if self.info.is_main:
            for path in restore_old_copies(self.root):
                log.warning("restored checkpoint %s from a re-save cut between its renames", path)
            self._remove_leftovers()
        takeovers = read_takeovers(self.root)
        for fence, step, path in reversed(self._done()):
            newer = stale(fence, step, takeovers)
            if newer is not None:
                log.warning("skipping checkpoint %s: written with fencing token %d after token %d took the run "
                            "over from step %d", path, fence, newer, takeovers[newer])
                continue
            why = problem(path)
            if why is None:
                return path
            log.warning("skipping checkpoint %s: %s", path, why)
        return None

    def _check_fence(self, step: int) -> None:
        """Raise `LeaseLost` when a newer learner took the run over or wrote this step (rank 0, lease)."""
        if self.lease is None:
            return
        self.lease.check()
        token = self.lease.token
        takeover = newest(read_takeovers(self.root)) if self.root.is_dir() else 0
        final = self.root / f"{_PREFIX}{step:08d}"
        theirs = _fence_of(final) if final.is_dir() else 0
        if max(takeover, theirs) > token:
            self.lease.mark_lost(f"checkpoint of step {step} refused: fencing token {max(takeover, theirs)} "
                                 f"took the run over, this learner's is {token}")
            raise LeaseLost(self.lease.lost or "fenced off")

    def save(self, state: TrainState, components: list[Component]) -> Path | None:
        """Write a checkpoint for `state.step` (collective; rank 0 writes). Returns its path on rank 0."""
        gathered = []
        for c in components:
            optim_sd = None if c.optimizer is None else _optimizer_state(c.model, c.optimizer, self.info)
            gathered.append((c, full_state_dict(c.model, self.info), optim_sd))
        if not self.info.is_main:
            return None
        self._check_fence(state.step)
        final = self.root / f"{_PREFIX}{state.step:08d}"
        tmp = self.root / (f".tmp-t{self.fence}-{final.name}" if self.fence else f".tmp-{final.name}")
        shutil.rmtree(tmp, ignore_errors=True)
        self.writing = tmp
        try:
            self._write(state, gathered, tmp, final)
        except BaseException as exc:  # a full disk, a lost lease: the partial copy goes now, not at the next save
            shutil.rmtree(tmp, ignore_errors=True)
            log.error("checkpoint of step %d failed (%s: %s); its temporary directory %s was removed",
                      state.step, type(exc).__name__, exc, tmp)
            raise
        finally:
            self.writing = None
        self._prune()
        return final

    def _write(self, state: TrainState, gathered: list, tmp: Path, final: Path) -> None:
        """Write the checkpoint into `tmp` and seal it as `final` (rank 0)."""
        tmp.mkdir(parents=True)
        meta: dict[str, Any] = {
            "step": state.step, "version": state.version, **consumed_ids.encode(state.consumed),
            "fence": self.fence, "dispatcher": state.dispatcher, "python_rng": _jsonable(random.getstate()),
            "components": {},
        }
        for c, model_sd, optim_sd in gathered:
            self.faults.pause_at("checkpoint.slow_write")  # the fault suite's hook: a slow disk
            save_file(_tensors(model_sd), str(tmp / f"{c.name}.safetensors"))
            if optim_sd is None:
                meta["components"][c.name] = {"optimizer": None, "scheduler": None}
                continue
            opt_tensors, opt_meta = _flatten_optimizer(optim_sd)
            self.faults.pause_at("checkpoint.slow_write")
            save_file(opt_tensors, str(tmp / f"{c.name}.optimizer.safetensors"))
            meta["components"][c.name] = {"optimizer": opt_meta, "scheduler": _jsonable(c.scheduler.state_dict())}
        self.faults.pause_at("checkpoint.slow_write")
        save_file({"cpu": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        (tmp / "state.json").write_text(json.dumps(meta))
        self.faults.kill_at("checkpoint.before_seal")  # the fault suite's hook: a torn checkpoint
        self._check_fence(state.step)  # a takeover while this one was written: not sealed
        seal(tmp, final)

    def load(self, components: list[Component], path: Path | None = None) -> TrainState | None:
        """Restore the latest (or given) checkpoint into `components`; None when there is none.
        Every rank must call it; all ranks read the (shared) files. A weights-only component the
        checkpoint lacks (an EMA reference switched on at resume) keeps its current weights."""
        path = path or self.latest()
        if path is None:
            self._take_over(0)
            return None
        meta = json.loads((path / "state.json").read_text())
        if self.lease is not None and int(meta.get("fence", 0)) > self.lease.token:
            self.lease.mark_lost(f"checkpoint {path} was written with fencing token {meta['fence']}, newer than "
                                 f"this learner's {self.lease.token}")
            raise LeaseLost(self.lease.lost or "fenced off")
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
        self._take_over(int(meta["step"]))
        return TrainState(step=meta["step"], version=meta["version"], consumed=consumed_ids.decode(meta),
                          dispatcher=dict(meta["dispatcher"]), fence=int(meta.get("fence", 0)))

    def _take_over(self, step: int) -> None:
        """Record that this learner's token resumed the run from `step` (rank 0 with a lease)."""
        if self.lease is not None and self.info.is_main and self.lease.token > 0:
            record_takeover(self.root, self.lease.token, step)

    def _mine(self, fence: int) -> bool:
        """Whether this learner may remove what token `fence` wrote: its own or an older token's (with a
        lease, a newer token's are never touched)."""
        return self.lease is None or fence <= self.fence

    def _prune(self) -> None:
        """Keep the newest `keep` checkpoints of this token and older ones; remove dot-directories a killed
        save of this token or an older one left behind."""
        done = sorted((step, path) for fence, step, path in self._done() if self._mine(fence))
        for _step, old in done[: max(0, len(done) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
        self._remove_leftovers()
        restore_old_copies(self.root)

    def _remove_leftovers(self) -> None:
        """Remove the temporary directories of saves of this token or an older one that never finished."""
        for left in self.root.glob(".tmp-*"):
            if left.is_dir() and self._mine(_tmp_fence(left.name)):
                log.warning("removing %s, left by a checkpoint save that never finished", left)
                shutil.rmtree(left, ignore_errors=True)


def _fence_of(path: Path) -> int:
    """The fencing token a checkpoint directory records (0: none, or unreadable)."""
    try:
        return int(json.loads((path / "state.json").read_text()).get("fence", 0))
    except (OSError, ValueError, AttributeError):
        return 0


def _tmp_fence(name: str) -> int:
    """The token in a temporary directory's name `.tmp-t{token}-…` (0: none)."""
    head = name[len(".tmp-"):]
    if head.startswith("t") and "-" in head and head[1:head.index("-")].isdigit():
        return int(head[1:head.index("-")])
    return 0


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
