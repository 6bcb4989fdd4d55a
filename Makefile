# Two entry points on a fresh Debian machine: `make demo` (the main job on the CPU), `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
APTSTAMP := $(VENV)/.apt

.PHONY: demo test install toolchain clean

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
	$(BIN)/python -m pytest -n 2 tests

clean:
	rm -rf $(VENV) build out
