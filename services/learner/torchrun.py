"""`python -m searchr1.learner.torchrun ARGS…`: torchrun (`torch.distributed.run`) with the same arguments,
whose wait between forwarding SIGTERM to the ranks and SIGKILLing them is `TORCH_ELASTIC_SHUTDOWN_TIMEOUT`
seconds on every torch release the images pin.

torchrun reads that variable itself from torch 2.12 on; before (torch 2.10, the CUDA 12 install route)
it kills the ranks 30 s after SIGTERM whatever the variable says, which cuts a GPU step and its
checkpoint short (`learner/stop_budget.py` computes how long they take). On such a release this module
makes torchrun's process context close with the variable's timeout (the agent calls `close` with its
default); on a release that reads the variable it changes nothing. Without the variable it is plain
torchrun.

The learner under torchrun is started with this module wherever searchr1 starts it: `searchr1 up` with a
`[placement]`, the generated compose project, the Kubernetes gpu overlays.
"""

from __future__ import annotations

import dataclasses
import os

SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


def reads_shutdown_timeout() -> bool:
    """Whether this torch's torchrun takes its shutdown timeout from `SHUTDOWN_TIMEOUT_ENV` (2.12 on)."""
    from torch.distributed.launcher.api import LaunchConfig

    return "shutdown_timeout" in {f.name for f in dataclasses.fields(LaunchConfig)}


def apply_shutdown_timeout(seconds: int) -> bool:
    """On a torch whose torchrun ignores `SHUTDOWN_TIMEOUT_ENV`, make its process contexts wait `seconds`
    (in place of their 30 s) for the ranks after forwarding a signal. Returns whether it patched."""
    if reads_shutdown_timeout():
        return False
    from torch.distributed.elastic.multiprocessing import api

    close = api.PContext.close

    def close_with_timeout(self, death_sig=None, timeout: int = 30) -> None:
        close(self, death_sig, seconds)

    api.PContext.close = close_with_timeout  # type: ignore[method-assign]
    return True


def main(argv: list[str] | None = None) -> None:
    value = os.environ.get(SHUTDOWN_TIMEOUT_ENV, "").strip()
    if value:
        if not value.isdigit():
            from searchr1.core.commandline import error

            raise SystemExit(error(f"{SHUTDOWN_TIMEOUT_ENV}={value!r} is not a whole number of seconds"))
        apply_shutdown_timeout(int(value))
    from torch.distributed.run import main as torchrun

    torchrun(argv)


if __name__ == "__main__":
    main()
