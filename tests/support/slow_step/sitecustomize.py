"""A learner step that takes long, for tests/integration/test_learner_stop_grace.py: on PYTHONPATH, this
`sitecustomize` makes every training step after the first of a torchrun rank (LOCAL_RANK set) sleep
`SLOW_STEP_S` seconds after training, standing in for a GPU step of minutes. Only that test puts this
directory on PYTHONPATH; the product reads no such variable."""

import os

if os.environ.get("LOCAL_RANK") is not None and os.environ.get("SLOW_STEP_S"):
    import time

    from searchr1.learner.service import Learner

    _train = Learner.train
    _calls = [0]

    def _slow_train(self, batch):
        figures = _train(self, batch)
        _calls[0] += 1
        if _calls[0] > 1:
            time.sleep(float(os.environ["SLOW_STEP_S"]))
        return figures

    Learner.train = _slow_train
