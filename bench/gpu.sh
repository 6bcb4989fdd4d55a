#!/usr/bin/env bash
# The model benchmarks on an NVIDIA GPU: compile here, run there.
#   bench/gpu.sh compile   # CPU machine with rocmc installed: out/bench/gpu/*.vmfb (cuda:sm_80, weights as inputs)
#                          # and the iree-base-runtime wheel for the GPU machine's Python in .whl/
#   bench/gpu.sh run       # GPU machine (python3 with torch, nvidia-ml-py; no compiler): installs the runtime
#                          # wheel, runs python3 -m bench.run_gpu run, writes out/bench/gpu/gpu.json
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-out/bench/gpu}
case "${1:-}" in
  compile)
    ${PY:-.venv/bin/python} -m bench.run_gpu compile --out "$OUT_DIR"
    ls .whl/iree_base_runtime-*.whl >/dev/null 2>&1 || ../shared/tools/gpu-wheels.sh >/dev/null ;;
  run)
    SITE=${SITE:-/tmp/rocmc-site}
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/iree_base_runtime-*.whl
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -m bench.run_gpu run --out "$OUT_DIR" ;;
  *) echo "usage: $0 compile|run" >&2; exit 2 ;;
esac
