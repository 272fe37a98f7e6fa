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
PYTEST_ARGS ?=
BIN       := $(VENV)/bin

.PHONY: install run test prepare lint clean help

help:
	@echo "make run    install, prepare SmolLM2-135M-Instruct, start gateway :$(PORT) + $(WORKERS) workers"
	@echo "            (MODEL=SmolLM2-135M-Instruct-SwiftKV serves the distilled SwiftKV model)"
	@echo "make test   install and run the test suite"

$(BIN)/activate:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/activate pyproject.toml constraints.txt
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	@touch $@

install: $(VENV)/.installed

prepare: install
	$(BIN)/modelkit prepare

run: install
	$(BIN)/swiftserve up --model $(MODEL) --workers $(WORKERS) --port $(PORT)

# pytest exit code 5 (no tests collected, e.g. a -k filter) is not a failure.
test: install
	$(BIN)/modelkit prepare --quiet
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then rc=0; fi; exit $$rc

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
