#!/usr/bin/env bash
# A 7B-shaped Llama on an NVIDIA GPU, rocmc against transformers (bench/llm_gpu.py). Compile here, run there.
#   bench/llm_gpu.sh compile        # CPU machine with rocmc installed: out/llm_gpu/config.json, one .vmfb per
#                                   # target (cuda:sm_80 and gfx942, no weights inside: ~4 MB each) and
#                                   # compile.json (wall time, peak RSS of the process tree, .vmfb size);
#                                   # the iree-base-runtime wheel for the GPU machine's Python into .whl/
#   bench/llm_gpu.sh run [OUTDIR] [--profile]   # GPU machine (python3 with torch, transformers, safetensors; no compiler),
#                                   # out/llm_gpu and the wheel ($WHEELS, default .whl) carried along: installs it, writes the
#                                   # random checkpoint to $CKPT (13.5 GB), writes OUTDIR/llm_gpu.json and .log;
#                                   # --profile adds the kernel time of rocmc's decode and prefill (torch.profiler)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${DIR:-out/llm_gpu}
case "${1:-}" in
  compile)
    ${PY:-.venv/bin/python} -m bench.llm_gpu compile --dir "$DIR" --repeat "${REPEAT:-1}"
    ls .whl/iree_base_runtime-*.whl >/dev/null 2>&1 || ../shared/tools/gpu-wheels.sh >/dev/null ;;
  run)
    out=${2:-$DIR}
    mkdir -p "$out"
    SITE=${SITE:-/tmp/rocmc-site}
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${WHEELS:-.whl}"/iree_base_runtime-*.whl
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    python3 -m bench.llm_gpu run --dir "$DIR" --ckpt "${CKPT:-/tmp/llm_gpu_ckpt}" --json "$out/llm_gpu.json" "${@:3}" \
      2>&1 | tee "$out/llm_gpu.log" ;;
  *) echo "usage: $0 compile | run [OUTDIR] [--profile]" >&2; exit 2 ;;
esac
