"""Side-by-side timing of versions of the linear_q kernel (custom_kernels/linear_q.hip) on a 7B model's decode
projections over 4- and 8-bit weights (groups of 128), with cuBLAS on the f16 weights and the device copy in the
same run.

    python -m bench.quant_sweep compile [--out out/quant_sweep]   # here: PTX per version (-D switches)
    python -m bench.quant_sweep run [--out out/quant_sweep]       # there: CuPy launches, triton do_bench

The projections are a decode step's: q/k/v joined with the RMSNorm (FLAG_NORM), o with the residual, gate/up
joined with the norm and silu(gate) * up, down with the residual. Every version is checked against torch in f32 on
the benchmark inputs (the relative L2 error prints with the time; a second set of zeros with fractional parts checks
the zeros' correction); the table gives each projection's median time in us and its packed bytes (weights, scales,
zeros) / time in TB/s, for 1 and 2 rows of x.

QUANT_SWEEP_ONLY="label,projection,bits,rows" runs that one case alone (for a profiler: `ncu --kernel-name
linear_q_f16 --launch-count 1 ...` then sees its first launch).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from bench.common import build_version, sweep_main, sweep_value

# (name, out features, in features, flags): Llama-2-7B's projections (gate/up joined: 2 x 11008 rows).
SHAPES = (
    ("qkv", 12288, 4096, ("norm",)),
    ("o", 4096, 4096, ("residual",)),
    ("gate_up", 11008, 4096, ("norm", "gated", "silu")),
    ("down", 4096, 11008, ("residual",)),
)
ROWS = (1, 2)
BITS = (4, 8)
GROUP = 128
# label -> -D switches of linear_q.hip (none: the working tree's source); "REV=<git revision>": that revision's
# custom_kernels/ instead (a baseline in the same run)
VERSIONS = {
    "committed (REV=HEAD)": ["REV=HEAD"],
    "working tree": [],
    "no L2 prefetch": ["QX_PF=0"],
    "L2 prefetch 1 round ahead": ["QX_PF=1"],
    "L2 prefetch 2 rounds ahead": ["QX_PF=2"],
}
WAVES = 4  # BLOCK 128 / 32


def compile_all(out: Path) -> None:
    from rocmc.lowering import kernels

    out.mkdir(parents=True, exist_ok=True)
    plan = {}
    for i, (label, flags) in enumerate(VERSIONS.items()):
        obj = build_version(kernels, ["linear_q"], "linear_q.hip", "sm_80", flags)
        (out / f"v{i}.ptx").write_bytes(obj.data)
        qwr = sweep_value(flags, "QWR", 4)
        plan[label] = [f"v{i}.ptx", qwr * WAVES]
        print(f"built {label}", flush=True)
    fam = kernels.FAMILIES["linear_q"]
    bits = {n: 1 << i for i, (n, _) in enumerate(fam.flags)}
    (out / "plan.json").write_text(json.dumps({"versions": plan, "flags": bits, "block": fam.block}, indent=1))


def _unpack(w, bits: int, k: int):
    """(rows, k * bits / 8) uint8 -> (rows, k) integers (4-bit: k even in the low nibble)."""
    import torch

    w = w.to(torch.int32)
    if bits == 8:
        return w
    return torch.stack((w & 15, w >> 4), dim=-1).reshape(w.shape[0], k)


def run_all(out: Path) -> None:
    import cupy
    import torch
    from triton.testing import do_bench

    plan = json.loads((out / "plan.json").read_text())
    fl, block = plan["flags"], plan["block"]
    g = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name(), flush=True)
    buf = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    copy = do_bench(lambda: buf[: 1 << 29].copy_(buf[1 << 29 :]), warmup=10, rep=100, return_mode="median")
    print(f"copy: {2 * (1 << 29) / copy / 1e9:.2f} TB/s", flush=True)
    dummy = torch.zeros(8, device="cuda", dtype=torch.float16)
    cases = {}  # (name, bits) -> tensors
    for name, n, k, flags in SHAPES:
        rows = 2 * n if "gated" in flags else n
        for bits in BITS:
            w = torch.randint(0, 256, (rows, k * bits // 8), device="cuda", generator=g, dtype=torch.uint8)
            groups = k // GROUP
            s = (torch.rand((rows, groups), device="cuda", generator=g) + 0.5).mul_(2 / ((1 << bits) * k**0.5)).half()
            z_int = torch.randint(0, 1 << bits, (rows, groups), device="cuda", generator=g).half()
            z_frac = (z_int.float() + torch.rand((rows, groups), device="cuda", generator=g) * 0.8 - 0.4).half()
            cases[(name, bits)] = (w, s, z_int, z_frac)
    x_all = torch.randn((2, 11008), device="cuda", generator=g).half()
    norm_w = (torch.rand((11008,), device="cuda", generator=g) + 0.5).half()
    eps = 1e-5
    table = {}
    only = os.environ.get("QUANT_SWEEP_ONLY")
    refs = {}  # (projection, bits, rows, zero set) -> (residual, f32 reference)
    for label, (ptx, qrows) in plan["versions"].items():
        kern = cupy.RawModule(path=str(out / ptx)).get_function("linear_q_f16")
        for name, n, k, flags in SHAPES:
            gated = "gated" in flags
            bits_f = sum(fl[f] for f in flags)
            grid = (n + (qrows // 2 if gated else qrows) - 1) // (qrows // 2 if gated else qrows)
            for bits in BITS:
                w, s, z_int, z_frac = cases[(name, bits)]
                for m in ROWS:
                    if only and only != f"{label},{name},{bits},{m}":
                        continue
                    x = x_all[:m, :k].contiguous()
                    nw = norm_w[:k].contiguous() if "norm" in flags else dummy
                    errs = []
                    for zi, z in enumerate((z_int, z_frac)):
                        key = (name, bits, m, zi)
                        if key not in refs:  # the inputs and the f32 reference, once for every version
                            res = (
                                torch.randn((m, n), device="cuda", generator=g).half() if "residual" in flags else dummy
                            )
                            q = _unpack(w, bits, k).float().reshape(w.shape[0], k // GROUP, GROUP)
                            full_w = ((q - z.float()[..., None]) * s.float()[..., None]).reshape(w.shape[0], k)
                            xf = x.float()
                            if "norm" in flags:
                                xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * nw.float()
                            full = xf @ full_w.T
                            if gated:
                                want = torch.nn.functional.silu(full[:, :n]) * full[:, n:]
                            else:
                                want = full + res.float() if "residual" in flags else full
                            refs[key] = res, want
                        res, want = refs[key]
                        y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
                        args = tuple(cupy.asarray(t) for t in (x, w, s, z, dummy, res, nw, y)) + tuple(
                            np.uint32(v) for v in (m, n, k, k // GROUP, bits, bits_f, np.float32(eps).view(np.uint32))
                        )

                        def launch(args=args):
                            kern((grid,), (block,), args)

                        launch()
                        torch.cuda.synchronize()
                        errs.append(float((y.float() - want).norm() / want.norm()))
                    t = do_bench(launch, warmup=20, rep=100, return_mode="median")
                    nbytes = w.numel() + 2 * s.numel() * 2
                    table[(label, name, bits, m)] = t
                    print(
                        f"{label:28s} {name:8s} {bits}-bit M={m} {t * 1e3:7.1f} us {nbytes / t / 1e9:5.2f} TB/s "
                        f"err {errs[0]:.1e} / fractional zeros {errs[1]:.1e}",
                        flush=True,
                    )
    if only:
        return
    for name, n, k, flags in SHAPES:
        rows = 2 * n if "gated" in flags else n
        wf = torch.randn((rows, k), device="cuda", generator=g).half()
        for m in ROWS:
            x = x_all[:m, :k].contiguous()
            t = do_bench(lambda: x @ wf.T, warmup=20, rep=100, return_mode="median")
            table[("cuBLAS f16", name, 16, m)] = t
            print(f"{'cuBLAS f16':28s} {name:8s} M={m} {t * 1e3:7.1f} us {wf.numel() * 2 / t / 1e9:5.2f} TB/s")
    print("\nsum over the four projections (us), rows 1 / 2:")
    for bits in BITS:
        for label in plan["versions"]:
            sums = [sum(table[(label, sh[0], bits, m)] for sh in SHAPES) * 1e3 for m in ROWS]
            print(f"  {bits}-bit {label:28s} " + " / ".join(f"{v:7.1f}" for v in sums))
    sums = [sum(table[("cuBLAS f16", sh[0], 16, m)] for sh in SHAPES) * 1e3 for m in ROWS]
    print(f"  f16   {'cuBLAS':28s} " + " / ".join(f"{v:7.1f}" for v in sums))


def main(argv=None) -> int:
    return sweep_main(__doc__, "out/quant_sweep", compile_all, run_all, argv)


if __name__ == "__main__":
    sys.exit(main())
