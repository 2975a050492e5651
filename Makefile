# make test  : fresh machine -> .venv, pinned CPU torch, the project, then triton and
#              the test extras; lint, the wheel smoke step, the CPU suites, then the
#              Triton-interpreter suite.
# make demo  : the main job, compiled, on a small batch; installs only what it needs
#              (pinned CPU torch and the project, no extras).
# make gpu-test : the same suites with CUDA tensors, system python, no network.
# make gpu-bench : the op, model and propose benches; rows appended to benchmarks/results/.
#
# Lanes are chosen by marker alone, over all of tests/ (see tests/conftest.py):
# interpreter / kernel / cuda. docs/design.md explains them.

PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV ?= .venv
SMOKE_VENV ?= .venv-smoke
PY := $(VENV)/bin/python
# -rfE: the failures' names and errors in the summary, the tail a CI log shows.
PYTEST_FLAGS ?= -q -rfE
# Two workers: CI has two cores, and compile tests are CPU-bound. loadfile keeps a
# file on one worker (its module fixtures compile once); files go out heaviest first
# (tests/conftest.py, tests/file_durations.json), so neither worker idles at the end.
XDIST ?= -n 2 --dist loadfile
# Two stamps: the demo's install (torch and the project) and the full one on top of it
# (triton and the test extras), so `make demo` then `make test` adds what the tests
# need, and `make test` then `make demo` installs nothing.
BASE_STAMP := $(VENV)/.specdraft-base-installed
STAMP := $(VENV)/.specdraft-installed

.PHONY: install lint wheel-smoke test test-cpu test-interpreter demo gpu-test gpu-bench bench-plot clean

# torch goes in first and pinned: a plain `torch` requirement in a fresh venv would
# pull the registry's newest build with several GB of CUDA packages. pip runs quiet,
# so each step says what it installs.
$(BASE_STAMP): pyproject.toml Makefile
	@test -x $(PY) || { echo "install: creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "install: $(TORCH_SPEC) (CPU) into $(VENV)"
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	@echo "install: the project, editable, no extras"
	$(PY) -m pip install -q -e .
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	@echo "install: triton"
	$(PY) -m pip install -q triton
	@echo "install: the project's test extras (pytest, hypothesis, ruff, transformers, matplotlib, ...)"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Ship what we test: the built wheel, installed in its own venv (torch, no hypothesis,
# no triton), imports every module from outside the tree and runs the demo. The venv
# is kept between runs; see the script.
wheel-smoke:
	PYTHON="$(PYTHON)" TORCH_SPEC="$(TORCH_SPEC)" SMOKE_VENV="$(SMOKE_VENV)" bash .ci/wheel_smoke.sh

test-cpu: $(STAMP)
	$(PY) -m pytest $(PYTEST_FLAGS) $(XDIST) -m "not interpreter" tests

# TRITON_INTERPRET must be set before any kernel is defined, hence its own run.
test-interpreter: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest $(PYTEST_FLAGS) $(XDIST) -m "interpreter or kernel" tests

# Each stage timed by .ci/stage.sh; pytest lists its slowest tests (DURATIONS). One
# stage at a time: run beside the CPU lane, the wheel smoke step made that lane 164 s
# slower on 2 cores (877 s against 713 s, cold) and itself 65 s slower.
DURATIONS ?= --durations=25
test: $(STAMP)
	@bash .ci/stage.sh lint $(MAKE) --no-print-directory lint
	@bash .ci/stage.sh wheel-smoke $(MAKE) --no-print-directory wheel-smoke
	@bash .ci/stage.sh test-cpu $(MAKE) --no-print-directory test-cpu PYTEST_FLAGS="$(PYTEST_FLAGS) $(DURATIONS)"
	@bash .ci/stage.sh test-interpreter $(MAKE) --no-print-directory test-interpreter PYTEST_FLAGS="$(PYTEST_FLAGS) $(DURATIONS)"

demo: $(BASE_STAMP)
	$(PY) -m specdraft.demo

# For a GPU machine that already has torch, triton, pytest and hypothesis.
gpu-test:
	$(PYTHON) -m pip install -q --no-deps --no-build-isolation -e .
	SPECDRAFT_DEVICE=cuda $(PYTHON) -m pytest $(PYTEST_FLAGS) -m "not interpreter" tests

gpu-bench:
	$(PYTHON) -m pip install -q --no-deps --no-build-isolation -e .
	$(PYTHON) benchmarks/bench_shift_and_cache.py --tiles
	$(PYTHON) benchmarks/bench_prepare_and_step.py
	$(PYTHON) benchmarks/bench_expand.py
	$(PYTHON) benchmarks/bench_sampling.py
	$(PYTHON) benchmarks/bench_budget_keep.py
	$(PYTHON) benchmarks/bench_models.py
	$(PYTHON) benchmarks/bench_propose.py --k 3
	$(PYTHON) benchmarks/bench_propose.py --k 5

# The PNGs of benchmarks/results/ from its tables (matplotlib: the plot extra).
bench-plot: $(STAMP)
	$(PY) benchmarks/plot.py

clean:
	rm -rf $(VENV) $(SMOKE_VENV) build *.egg-info src/*.egg-info .hypothesis .pytest_cache .ruff_cache
