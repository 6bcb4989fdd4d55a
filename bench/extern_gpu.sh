#!/usr/bin/env bash
# The extern-call GPU check end to end. Here (CPU machine, from the project root):
#   bench/extern_gpu.sh compile      # .vmfb files for cuda:sm_80 into out/extern_gpu, runtime wheel into .whl
# On the GPU machine (with out/extern_gpu and .whl carried along):
#   bench/extern_gpu.sh run [DIR] [MODE...]   # installs the runtime wheel into .site, runs each mode
#                                             # (default: sync caching async), writes DIR/extern_gpu_MODE.json
set -euo pipefail
case "${1:-}" in
  compile)
    .venv/bin/python -m bench.extern_gpu compile --out out/extern_gpu
    ../shared/tools/gpu-wheels.sh >/dev/null
    ;;
  run)
    dir="${2:-out/extern_gpu}"
    modes="${*:3}"
    python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/iree_base_runtime-*.whl
    rc=0
    for mode in ${modes:-sync caching async}; do
      PYTHONPATH="$PWD/.site:$PWD" python3 -m bench.extern_gpu run --mode $mode --out out/extern_gpu \
        --json "$dir/extern_gpu_$mode.json" || rc=1
    done
    exit $rc
    ;;
  *) echo "usage: $0 compile | run [DIR]" >&2; exit 2 ;;
esac
