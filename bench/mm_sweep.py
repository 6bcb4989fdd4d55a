"""Side-by-side timing of tile configurations of the tiled GEMMs (linear_mm: custom_kernels/linear_mm.hip, mm.h;
linear_wgmma: custom_kernels/linear_wgmma.hip, Hopper only) on a 7B model's prefill projections and a 4096^3 GEMM,
with torch (cuBLAS) in the same run.

    python -m bench.mm_sweep compile [--out out/mm_sweep]   # here: PTX per version (-D switches)
    python -m bench.mm_sweep run [--out out/mm_sweep]       # there: CuPy launches, triton do_bench

A version past static shared memory's 48 KB takes its tiles from dynamic shared memory (mm.h's MM_TILES), which
the launch sizes as IREE's export attribute would. Every version is checked against torch in f32 on the benchmark
inputs (relative L2 printed with the time); the table gives each shape's median us and TFLOP/s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from bench.common import build_version, sweep_main, sweep_value

# (name, w rows (outputs, x2 when gated), K, epilogue): Llama-2-7B's prefill projections, then a square GEMM.
SHAPES = (
    ("qkv", 12288, 4096, "none"),
    ("o+res", 4096, 4096, "residual"),
    ("gate_up", 22016, 4096, "gated"),
    ("down+res", 4096, 11008, "residual"),
    ("4096^3", 4096, 4096, "none"),
)
ROWS = {"4096^3": (4096,)}
DEFAULT_ROWS = (512, 2048)
BM = 128
# label -> -D switches (the defaults: the committed source's tile, BN 128, 3 stages, 2 workgroups a multiprocessor)
VERSIONS = {
    "128x128 s3 (default)": [],
    "128x128 s4": ["ROCMC_MM_STAGES=4"],
    "128x256 s4": ["ROCMC_MM_BN=256", "ROCMC_MM_STAGES=4", "ROCMC_MM_OCC=1"],
}
# label -> -D switches of linear_wgmma.hip (sm_90a), chunks of 64: a stage is (128 + BN) x 128 bytes
# "BLOCK=n": the family's workgroup size changed to n for that build (n / 128 warpgroups of 64 rows: BM = n / 2)
WGMMA = {
    "wgmma s3 occ2 (default)": [],
    "wgmma s3 occ2 async": ["ROCMC_WG_ASYNC=1"],
    "wgmma 256x128 s3": ["BLOCK=512", "ROCMC_WG_OCC=1"],
    "wgmma 256x128 s4": ["BLOCK=512", "ROCMC_WG_STAGES=4", "ROCMC_WG_OCC=1"],
    "wgmma 256x128 s4 async": ["BLOCK=512", "ROCMC_WG_STAGES=4", "ROCMC_WG_OCC=1", "ROCMC_WG_ASYNC=1"],
}


def _build(kernels, name: str, arch: str, flags, block: int, local_memory: int):
    """A version of family `name`'s source with its workgroup size and the dynamic shared memory its launch gives."""
    source = kernels.FAMILIES[name].source
    return build_version(kernels, [name], source, arch, flags, block=block, local_memory=local_memory)


def compile_all(out: Path) -> None:
    from rocmc.lowering import kernels

    out.mkdir(parents=True, exist_ok=True)
    fam = kernels.FAMILIES["linear_mm"]
    plan = {}
    for i, (label, flags) in enumerate(VERSIONS.items()):
        bn, stages = sweep_value(flags, "ROCMC_MM_BN", 128), sweep_value(flags, "ROCMC_MM_STAGES", 3)
        smem = stages * (BM + bn) * 64
        dynamic = smem if smem > 49152 else 0
        obj = _build(kernels, "linear_mm", "sm_80", flags, fam.block, dynamic)
        (out / f"v{i}.ptx").write_bytes(obj.data)
        plan[label] = {"ptx": f"v{i}.ptx", "bn": bn, "dynamic": dynamic}
    wg = kernels.FAMILIES["linear_wgmma"]
    for i, (label, flags) in enumerate(WGMMA.items()):
        block = sweep_value(flags, "BLOCK", wg.block)
        bn, stages, bm = 128, sweep_value(flags, "ROCMC_WG_STAGES", 3), block // 2
        dynamic = stages * (bm + bn) * 128
        obj = _build(kernels, "linear_wgmma", "sm_90a", flags, block, dynamic)
        (out / f"w{i}.ptx").write_bytes(obj.data)
        plan[label] = {
            "ptx": f"w{i}.ptx",
            "bn": bn,
            "bm": bm,
            "block": block,
            "dynamic": dynamic,
            "symbol": "linear_wgmma",
        }
    bits = {n: 1 << i for i, (n, _) in enumerate(fam.flags)}
    (out / "plan.json").write_text(json.dumps({"versions": plan, "flags": bits, "block": fam.block}, indent=1))


def run_all(out: Path) -> None:
    import cupy
    import torch
    from triton.testing import do_bench

    plan = json.loads((out / "plan.json").read_text())
    bits, block = plan["flags"], plan["block"]
    print(torch.cuda.get_device_name(), flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    dummy = torch.zeros(8, device="cuda", dtype=torch.float16)
    cases = []
    for name, rows_w, k, epi in SHAPES:
        w = torch.rand((rows_w, k), device="cuda", generator=g).sub_(0.5).mul_(2 / k**0.5).half()
        n = rows_w // 2 if epi == "gated" else rows_w
        for m in ROWS.get(name, DEFAULT_ROWS):
            x = torch.rand((m, k), device="cuda", generator=g).sub_(0.5).half()
            res = torch.rand((m, n), device="cuda", generator=g).half() if epi == "residual" else dummy
            full = x.float() @ w.float().T
            want = torch.nn.functional.silu(full[:, :n]) * full[:, n:] if epi == "gated" else full
            if epi == "residual":
                want = want + res.float()
            flags = {"gated": bits["gated"] | bits["silu"], "residual": bits["residual"]}.get(epi, 0)
            cases.append((name, m, n, k, x, w, res, flags, want, 2.0 * m * rows_w * k))
    table = {}
    for label, v in plan["versions"].items():
        kern = cupy.RawModule(path=str(out / v["ptx"])).get_function(v.get("symbol", "linear_mm") + "_f16")
        if v["dynamic"]:
            kern.max_dynamic_shared_size_bytes = v["dynamic"]
        for name, m, n, k, x, w, res, flags, want, flop in cases:
            y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
            args = tuple(cupy.asarray(t) for t in (x, w, dummy, res, dummy, y)) + tuple(
                np.uint32(a) for a in (m, n, k, flags, 0)
            )
            outs = v["bn"] // 2 if flags & bits["gated"] else v["bn"]
            bm, threads = v.get("bm", BM), v.get("block", block)
            grid = ((m + bm - 1) // bm * ((n + outs - 1) // outs),)

            def launch():
                kern(grid, (threads,), args, shared_mem=v["dynamic"])

            launch()
            torch.cuda.synchronize()
            err = float((y.float() - want).norm() / want.norm())
            t = do_bench(launch, warmup=25, rep=200, return_mode="median")
            table[(label, name, m)] = t
            print(
                f"{label:22s} {name:9s} M={m:5d} {t * 1e3:8.1f} us {flop / t / 1e9:6.1f} TF/s err {err:.1e}", flush=True
            )
    for name, m, n, k, x, w, res, flags, want, flop in cases:
        if flags & bits["gated"]:
            fn = lambda: (lambda f: torch.nn.functional.silu(f[:, :n]) * f[:, n:])(x @ w.T)  # noqa: E731
        elif flags & bits["residual"]:
            fn = lambda: torch.addmm(res, x, w.T)  # noqa: E731
        else:
            fn = lambda: x @ w.T  # noqa: E731
        t = do_bench(fn, warmup=25, rep=200, return_mode="median")
        table[("torch", name, m)] = t
        print(f"{'torch':22s} {name:9s} M={m:5d} {t * 1e3:8.1f} us {flop / t / 1e9:6.1f} TF/s", flush=True)
    print("\nsum over a layer's four projections (us), rows " + " / ".join(map(str, DEFAULT_ROWS)) + "; 4096^3:")
    for label in [*plan["versions"], "torch"]:
        sums = [sum(table[(label, s[0], m)] for s in SHAPES[:4]) * 1e3 for m in DEFAULT_ROWS]
        print(
            f"  {label:22s} "
            + " / ".join(f"{s:8.1f}" for s in sums)
            + f" ; {table[(label, '4096^3', 4096)] * 1e3:7.1f}"
        )


def main(argv=None) -> int:
    return sweep_main(__doc__, "out/mm_sweep", compile_all, run_all, argv)


if __name__ == "__main__":
    sys.exit(main())
