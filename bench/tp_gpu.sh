#!/usr/bin/env bash
# Tensor-parallel Llama on NVIDIA GPUs (bench/tp_gpu.py). Compile here, run there.
#   bench/tp_gpu.sh compile        # CPU machine with rocmc installed: out/tp_gpu (configs and .vmfb files, no
#                                  # weights: each rank makes its own); the runtime wheel for the GPU machine in .whl/
#   bench/tp_gpu.sh run [RUNS]     # GPU machine with 2 GPUs (python3, torch; no compiler), out/tp_gpu and the wheel
#                                  # carried along: every run (default: small 1, small 2, 7b 1, 7b 2, 70b 2), then the table
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${DIR:-out/tp_gpu}
case "${1:-}" in
  compile)
    ${PY:-.venv/bin/python} -m bench.tp_gpu compile --dir "$DIR"
    ls .whl/iree_base_runtime-*.whl >/dev/null 2>&1 || ../shared/tools/gpu-wheels.sh >/dev/null ;;
  run)
    SITE=${SITE:-/tmp/rocmc-site}
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${WHEELS:-.whl}"/iree_base_runtime-*.whl
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    for run in ${2:-small:1 small:2 7b:1 7b:2 70b:2}; do
      shape=${run%:*} tp=${run#*:}
      python3 -m rocmc.cli launch -n "$tp" python3 -m bench.tp_gpu run --dir "$DIR" --shape "$shape" --tp "$tp" \
        || echo "run $shape tp=$tp failed"
    done
    python3 -m bench.tp_gpu report --dir "$DIR" | tee "$DIR/report.md"
    if [ -n "${OUT:-}" ]; then cp "$DIR"/run_*.json "$DIR/report.md" "$OUT"/; fi ;;
  *) echo "usage: $0 compile | run ['shape:tp ...']" >&2; exit 2 ;;
esac
