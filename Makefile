# Everything lives in .venv inside the checkout.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml requirements/verl.txt requirements/skyrl.txt
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch from pip's configured index (PyPI: the multi-GB CUDA build on Linux x86-64); only
	# if that fails, the CPU build from PyTorch's index. A torch==2.13.0 already in .venv stays.
	$(BIN)/pip install -q "torch==2.13.0" || $(BIN)/pip install -q "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps -r requirements/verl.txt
	$(BIN)/pip install -q --no-deps -r requirements/skyrl.txt
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/keel demo

# Three workers on two cores: a third of the suite's time is spent waiting (servers starting,
# sockets, browsers), so a third worker fills it. Each test file runs on one worker, so a
# module's shared browser or server stays one. A test that failed under the workers' load runs
# once more, alone (--lf): make test fails when it fails again (docs/architecture.md).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=20 || $(BIN)/python -m pytest -q --lf --lfnf=none

lint: $(STAMP)
	$(BIN)/ruff check server trainer_hooks wire dashboard learners keel tests bench
	$(BIN)/mypy server dashboard trainer_hooks wire learners keel

bench: $(STAMP)
	$(BIN)/python -m bench.ingest

clean:
	rm -rf $(VENV)
