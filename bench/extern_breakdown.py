"""Where a compiled module's library calls spend their time, on an NVIDIA GPU: the providers' per-phase
call timings (`call_stats()`: pointers of the inputs, the result buffer, the launch, the stream
synchronize, graph captures) over timed calls, and what each plan chose (`cached_plans()`).

    python3 -m bench.extern_breakdown llama out/bench/gpu13/llama_h4096_s2048_f16.blas+static.vmfb
    python3 -m bench.extern_breakdown resnet out/bench/rn_fused/resnet18_b32_f32.cudnn_conv+const.vmfb
    python3 -m bench.extern_breakdown chain out/gemm_gpu/chain.7.vmfb out/gemm_gpu/chain.8.vmfb

`llama` and `resnet` take a module of bench/run_gpu.py (its case is read from the file name; weights as
inputs unless the variant ends in +const); `chain` the GEMM chains of bench/gemm_gpu.py, and reports the
difference per extra call between the two.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from bench import models

CALLS = 50


def _args(kind: str, path: Path, device):
    from iree import runtime as rt

    if kind == "chain":
        rng = np.random.default_rng(0)
        arrays = [
            rng.uniform(-1, 1, (64, 1024)).astype(np.float16),
            (rng.uniform(-1, 1, (1024, 1024)) * 0.03).astype(np.float16),
        ]
    else:
        case = models.parse(path.name.split(".")[0])
        weights = [] if path.name.endswith("+const.vmfb") else models.weight_arrays(models.rocmc_graph(case))
        arrays = models.inputs(case) + weights
    return [rt.asdevicearray(device, a) for a in arrays]


def breakdown(kind: str, path: Path) -> float:
    """Prints the per-call phases and plans of one module; returns its mean ms per call."""
    import rocmc
    from rocmc.runtime.providers.dnn import ACTIVE

    mod = rocmc.load(path)
    args = _args(kind, path, mod.device)
    for _ in range(5):
        mod(*args, output="device")
    for p in ACTIVE:
        p.call_stats(reset=True)
    t0 = time.perf_counter()
    for _ in range(CALLS):
        mod(*args, output="device")
    per_call = (time.perf_counter() - t0) / CALLS * 1e3
    print(f"{path.name}: {per_call:.3f} ms per call (mean of {CALLS})")
    for p in ACTIVE:
        st = p.call_stats()
        if not st["calls"]:
            continue
        n = st["calls"]
        phases = ", ".join(f"{k[:-2]} {st[k] / n * 1e6:.1f} us" for k in ("inputs_s", "output_s", "launch_s", "sync_s"))
        print(
            f"  {p.library}: {n / CALLS:.0f} calls a module call, {sum(st[k] for k in st if k.endswith('_s')) / CALLS * 1e3:.3f} ms "
            f"of them; per library call: {phases}; graph captures {st['captures']}"
        )
        for key, plan in p.cached_plans():
            print(f"    {key[0]} {list(key[2])}: {plan.info}")
    return per_call


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("llama", "resnet", "chain"))
    ap.add_argument("modules", nargs="+", type=Path)
    a = ap.parse_args()
    from rocmc.runtime.providers.cudnn import prepare_cuda

    prepare_cuda()  # library calls need exportable device buffers
    times = [breakdown(a.kind, m) for m in a.modules]
    if a.kind == "chain" and len(times) == 2:
        print(f"marginal cost of one more call: {(times[1] - times[0]) * 1e3:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
