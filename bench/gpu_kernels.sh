#!/usr/bin/env bash
# The hand-written kernels on an NVIDIA GPU, end to end: compile here, run there.
#   bench/gpu_kernels.sh compile   # CPU machine with rocmc installed: the GPU tests' modules (tests/gpu) and the
#                                  # benchmark's .vmfb files, PTX, launch plans -> out/gpu_kernels
#   bench/gpu_kernels.sh run       # GPU machine (python3 with pytest, torch, triton, cupy; the iree-base-runtime
#                                  # wheel in .whl/): the kernels' GPU tests (correctness), then performance
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-out/gpu_kernels}
case "${1:-}" in
  compile)
    PY=${PY:-.venv/bin/python}
    $PY -m pytest tests/gpu/test_gpu_kernels.py --gpu-compile "$OUT_DIR/tests" -q
    $PY -m bench.kernels compile --out "$OUT_DIR/bench" ;;
  run)
    SITE=${SITE:-/tmp/rocmc-site}
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/iree_base_runtime-*.whl
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    status=0
    python3 -m pytest tests/gpu/test_gpu_kernels.py -m gpu --gpu-artifacts "$OUT_DIR/tests" -q || status=$?
    [ "${SKIP_PERF:-0}" = 1 ] || python3 -m bench.kernels run --out "$OUT_DIR/bench"
    exit $status ;;
  *) echo "usage: $0 compile|run" >&2; exit 2 ;;
esac
