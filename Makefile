# Everything a newcomer needs: `make demo` and `make test` install what is missing first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
TORCH_PIN := torch==2.13.0

.PHONY: install demo test test-fast lint bench regen gpu-check gpu-bundle clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# Keep a torch that is already there; otherwise take the pinned CPU build.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: install
	$(BIN)/mystique-gen examples/traces/mlp_sgd.et.json.gz -o generated/mlp_sgd.py
	$(BIN)/python generated/mlp_sgd.py --device cpu --warmup 5 --iters 50

# Two pytest workers (pytest-xdist): most tests wait on subprocesses, and two of them
# run in about half the time on two cores. TEST_WORKERS=0 runs them in this process.
# The slowest tests are listed at the end, so a CI log shows what keeps it long.
TEST_WORKERS ?= 2

test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --durations=15

test-fast: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow"

lint: install
	$(BIN)/ruff check mystique_gen tests scripts examples
	$(BIN)/black --check -q -l 88 generated tests/golden mystique_gen/harness

bench: install
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python scripts/bench.py

regen: install
	$(BIN)/python scripts/regen.py

# One run that proves every CUDA path (about 3-6 minutes on one GPU; exit 3 without CUDA).
# `make gpu-check GPU_CHECK_ARGS=--dry-run` runs the CPU parts here.
gpu-check: install
	PY=$(BIN)/python scripts/gpu_check.sh $(GPU_CHECK_ARGS)

# What a lent GPU machine lacks beside the checkout (it reaches no package index, and
# ../shared does not travel): black's wheels for its Python in .whl/, and a copy of the
# shared traces in shared/ (both ignored by git). README, GPU check, says how to run.
GPU_PYTHON ?= 3.12
gpu-bundle: install
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: \
		--python-version $(GPU_PYTHON) --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 -d .whl \
		black==26.10.1 pytokens==0.4.1 pathspec==1.1.1 platformdirs==4.14.9
	rm -rf shared && mkdir -p shared && cp -r ../shared/traces shared/

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
