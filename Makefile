# Two entry points on a fresh Debian machine: `make demo` (the main job on the CPU), `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
APTSTAMP := $(VENV)/.apt

.PHONY: demo test lint install toolchain clean bench wheel wheel-test

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(STAMP)

# clang-19 + lld-19 build the hand-written HIP kernels (AMDGPU code objects and PTX); llvm-19 checks them.
$(APTSTAMP): | $(STAMP)
	@if ! command -v clang-19 >/dev/null || ! command -v ld.lld-19 >/dev/null || ! command -v llvm-readelf-19 >/dev/null; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq clang-19 lld-19 llvm-19 >/dev/null; \
	fi
	touch $@

toolchain: $(APTSTAMP)

demo: $(STAMP) $(APTSTAMP)
	$(BIN)/python examples/llama_block.py --demo

test: $(STAMP) $(APTSTAMP)
	$(BIN)/python -m pytest -n 2 --durations=20 tests

# The linter and formatter (ruff, configured in pyproject.toml) and the type checker over the core (mypy).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The sdist and, built from it, the wheel (HIP sources included as rocmc/kernels/): a file the sdist lacks
# (MANIFEST.in) breaks the wheel too.
WHEEL_DIR := out/wheel

wheel: $(STAMP)
	rm -rf $(WHEEL_DIR)
	$(BIN)/python -m build -q --outdir $(WHEEL_DIR) .

# Install the wheel into a fresh venv and run .ci/wheel_smoke.py from outside the source tree, so the
# checkout can't stand in for a file the wheel lacks.
wheel-test: wheel $(APTSTAMP)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  $(PY) -m venv "$$tmp/venv" && \
	  "$$tmp/venv/bin/pip" install -q $(abspath $(WHEEL_DIR))/rocmc-*.whl && \
	  cd "$$tmp" && "$$tmp/venv/bin/python" $(abspath .ci/wheel_smoke.py)

# CPU benchmarks (bench/): rocmc vs ONNX Runtime vs PyTorch, compile time, plots. Their own venv keeps the
# test venv small; torch is the CPU build.
BENCH_VENV  := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): pyproject.toml bench/requirements.txt
	$(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --upgrade pip
	$(BENCH_VENV)/bin/pip install -q -r bench/requirements.txt
	$(BENCH_VENV)/bin/pip install -q -e .
	touch $@

bench: $(BENCH_STAMP) $(APTSTAMP)
	$(BENCH_VENV)/bin/python -m bench.run_cpu --out out/bench
	$(BENCH_VENV)/bin/python -m bench.compile_time --out out/bench
	$(BENCH_VENV)/bin/python -m bench.plots --out out/bench

clean:
	rm -rf $(VENV) $(BENCH_VENV) build out
