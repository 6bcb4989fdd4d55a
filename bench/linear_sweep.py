"""Side-by-side timing of versions of the linear_rows kernel (custom_kernels/linear_rows.hip) on a 7B model's decode
projections, with cuBLAS (torch.matmul) and the device copy in the same run.

    python -m bench.linear_sweep compile [--out out/linear_sweep]   # here: PTX per version (-D switches)
    python -m bench.linear_sweep run [--out out/linear_sweep]       # there: CuPy launches, triton do_bench

Every version is checked against torch in f32 on the benchmark inputs (the error prints with the time); the
table gives each projection's median time in us and its weight bytes / time in TB/s, for 1, 8 and 32 rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from bench.common import build_version, sweep_main, sweep_value

# (name, out features, in features, gated): Llama-2-7B's projections (gate/up joined: 2 x 11008 rows).
SHAPES = (
    ("qkv", 12288, 4096, False),
    ("o", 4096, 4096, False),
    ("gate_up", 11008, 4096, True),
    ("down", 4096, 11008, False),
)
ROWS = (1, 8, 32)
# label -> -D switches of the kernel source (the defaults: the committed source); "BLOCK=n": the family's
# workgroup size changed to n for that build (256 threads no longer build: a wave would take fewer than the 2 rows
# of w a gate and up pair needs)
VERSIONS = {
    "default": [],
    "one group at a time": ["ROCMC_LIN_PIPE=0"],
    "64 threads": ["BLOCK=64"],
    "register cap 3": ["ROCMC_LIN_OCC=3"],
    "8 chunks a group": ["ROCMC_LIN_U1=8", "ROCMC_LIN_U2=8"],
    "contiguous k": ["ROCMC_LIN_CONTIG=1"],
    "ld.global.nc": ["ROCMC_LOAD_NC=1"],
}
TILE = 16


def compile_all(out: Path) -> None:
    from rocmc.lowering import kernels

    out.mkdir(parents=True, exist_ok=True)
    fam = kernels.FAMILIES["linear_rows"]
    plan = {}
    for i, (label, flags) in enumerate(VERSIONS.items()):
        block = sweep_value(flags, "BLOCK", fam.block)
        obj = build_version(kernels, ["linear_rows"], "linear_rows.hip", "sm_80", flags, block=block)
        (out / f"v{i}.ptx").write_bytes(obj.data)
        plan[label] = [f"v{i}.ptx", block]
    bits = {n: 1 << i for i, (n, _) in enumerate(fam.flags)}
    (out / "plan.json").write_text(json.dumps({"versions": plan, "flags": bits}, indent=1))


def run_all(out: Path) -> None:
    import cupy
    import torch
    from triton.testing import do_bench

    plan = json.loads((out / "plan.json").read_text())
    bits = plan["flags"]
    g = torch.Generator(device="cuda").manual_seed(0)
    dummy = torch.zeros(8, device="cuda", dtype=torch.float16)
    x_all = torch.rand((32, 11008), device="cuda", generator=g).sub_(0.5).half()
    buf = torch.empty(1 << 28, device="cuda", dtype=torch.uint8)
    copy = do_bench(lambda: buf[: 1 << 27].copy_(buf[1 << 27 :]), warmup=25, rep=200, return_mode="median")
    print(f"copy: {2 * (1 << 27) / copy / 1e9:.2f} TB/s", flush=True)
    weights = {}
    for name, n, k, gated in SHAPES:
        rows = 2 * n if gated else n
        weights[name] = torch.rand((rows, k), device="cuda", generator=g).sub_(0.5).mul_(2 / k**0.5).half()
    table = {}
    for label, (ptx, block) in plan["versions"].items():
        kern = cupy.RawModule(path=str(out / ptx)).get_function("linear_rows_f16")
        for name, n, k, gated in SHAPES:
            w = weights[name]
            for m in ROWS:
                x = x_all[:m, :k].contiguous()
                y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
                res = torch.rand((m, n), device="cuda", generator=g).half() if not gated else dummy
                flags = bits["gated"] | bits["silu"] if gated else bits["residual"]
                # the family's bindings (x, w, bias, residual, norm, y) and constants (M, N, K, flags, eps)
                args = tuple(cupy.asarray(t) for t in (x, w, dummy, res, dummy, y)) + tuple(
                    np.uint32(v) for v in (m, n, k, flags, 0)
                )

                def launch():
                    kern(((n + TILE - 1) // TILE,), (block,), args)

                launch()
                torch.cuda.synchronize()
                full = x.float() @ w.float().T
                want = torch.nn.functional.silu(full[:, :n]) * full[:, n:] if gated else full + res.float()
                err = float((y.float() - want).norm() / want.norm())
                t = do_bench(launch, warmup=25, rep=100, return_mode="median")
                table[(label, name, m)] = (t, err)
                print(
                    f"{label:12s} {name:8s} M={m:2d} {t * 1e3:7.1f} us {w.numel() * 2 / t / 1e9:5.2f} TB/s "
                    f"err {err:.1e}",
                    flush=True,
                )
    for name, n, k, gated in SHAPES:
        w = weights[name]
        for m in ROWS:
            x = x_all[:m, :k].contiguous()
            t = do_bench(lambda: x @ w.T, warmup=25, rep=100, return_mode="median")
            print(
                f"{'cuBLAS':12s} {name:8s} M={m:2d} {t * 1e3:7.1f} us {w.numel() * 2 / t / 1e9:5.2f} TB/s", flush=True
            )
    print("\nsum over the four projections (us), rows 1 / 8 / 32:")
    for label in plan["versions"]:
        sums = [sum(table[(label, s[0], m)][0] for s in SHAPES) * 1e3 for m in ROWS]
        print(f"  {label:12s} " + " / ".join(f"{v:7.1f}" for v in sums))


def main(argv=None) -> int:
    return sweep_main(__doc__, "out/linear_sweep", compile_all, run_all, argv)


if __name__ == "__main__":
    sys.exit(main())
