"""A slow checkpoint that keeps writing is progress to the learner's watchdog; one that stopped writing is
not. The real `Checkpointer` saves a policy with AdamW state while the fault hook pauses before each file
(a slow disk), and the watchdog looks at it through `bytes_written` as the learner's probe does."""

from __future__ import annotations

import threading
import time

import torch
from torch import nn

from searchr1.core.faults import FaultSwitches
from searchr1.core.watchdog import Watchdog
from searchr1.learner.train.checkpoint import Checkpointer, Component, TrainState

torch.set_num_threads(1)


def _policy() -> Component:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 64)).sum().backward()
    opt.step()
    return Component("policy", model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))


def _save_slowly(tmp_path, pause_s: float) -> tuple[list[bool], float, Checkpointer]:
    switches = tmp_path / "switches"
    switches.mkdir()
    (switches / "checkpoint.slow_write").write_text(str(pause_s))
    ck = Checkpointer(tmp_path / "ck", keep=2, faults=FaultSwitches(switches))
    policy = _policy()
    dog = Watchdog("learner", 2.0)
    seen: list[bool] = []
    done = threading.Event()

    def probe() -> None:  # the probe thread asks every 0.1 s, as /healthz and the lease keeper do
        while not done.is_set():
            seen.append(dog.alive())
            time.sleep(0.1)

    watcher = threading.Thread(target=probe)
    t0 = time.monotonic()
    with dog.progressing(ck.bytes_written, every_s=0.1):
        watcher.start()
        try:
            ck.save(TrainState(step=1, version=1), [policy])
        finally:
            done.set()
            watcher.join()
    return seen, time.monotonic() - t0, ck


def test_a_save_slower_than_the_bound_that_keeps_writing_is_alive(tmp_path):
    # three files, 1.3 s before each: 3.9 s or more in all, about twice the 2 s bound, never 2 s without a
    # file landing
    seen, took, ck = _save_slowly(tmp_path, 1.3)
    assert took > 3.9
    assert all(seen), seen
    assert ck.latest() == tmp_path / "ck" / "step00000001" and ck.bytes_written() == 0


def test_a_save_that_stops_writing_past_the_bound_is_not(tmp_path):
    seen, _took, _ck = _save_slowly(tmp_path, 2.5)
    assert not all(seen)
