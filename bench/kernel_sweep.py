"""Side-by-side timing of versions of the norm kernels, with the copy and IREE's generated kernel in the same run.

    python -m bench.kernel_sweep compile [--out out/kernel_sweep]   # here: PTX per version, IREE's kernels, plans
    python -m bench.kernel_sweep run [--out out/kernel_sweep]       # there: CuPy launches, triton do_bench

A version is a build of the kernel sources with tuning switches (-D, see custom_kernels/rows.h and rocmc_gpu.h)
plus a launch choice (register cache C = the `_short` or general symbol, threads per row, grid size). Every
version is checked against torch in float64 on the benchmark input and on rows of mean 300 (f32) / 8 (bf16)
(the errors print with the times; a version that does not load or launch is reported and skipped), then timed
in ROUNDS interleaved rounds (do_bench medians); the table gives the median of the rounds in ms and the
percentage of the device-to-device copy (torch `copy_`) of the same run.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import numpy as np

from bench import kernels as bk  # graphs, launch plans, IREE's dispatches, timing

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3
CASES = (
    ("rms_norm", "f32", (4096, 4096)),
    ("rms_norm", "f32", (16384, 4096)),
    ("rms_norm", "bf16", (4096, 4096)),
    ("layer_norm", "bf16", (4096, 4096)),
    ("layer_norm", "bf16", (16384, 4096)),
    ("layer_norm", "f32", (4096, 4096)),
    ("rope", "bf16", (1, 32, 4096, 128)),
)
# label -> (-D switches (None: the committed sources), cache symbol (None: the lowering's choice, "" general,
# "_short"), threads-per-row factor, grid: None (a group per row) or ("div", R) / ("cap", G): R times fewer
# workgroups / at most G, each group then working through several rows, with ROCMC_PREFETCH)
VERSIONS = {
    "v3": (None, None, 1, None),  # the sources of commit V3
    "v4 (defaults)": ([], None, 1, None),
    "v4, LN two-pass": (["ROCMC_LN_ONEPASS=0"], None, 1, None),
    "v4, bf16 cvt x1": (["ROCMC_HW_BF16=1"], None, 1, None),
    "v4, bf16 integer rounding": (["ROCMC_HW_BF16=0"], None, 1, None),
    "v4, two barriers": (["ROCMC_SYNC1=0"], None, 1, None),
    "v4 + st.cs": (["ROCMC_STREAM=1"], None, 1, None),
    "v4 + ld.cs/st.cs": (["ROCMC_STREAM=2"], None, 1, None),
    "v4, C8 g/2": ([], "", 0.5, None),
    "v4 + prefetch, grid 264": (["ROCMC_PREFETCH=1"], None, 1, ("cap", 264)),
}
ROPE_VERSIONS = ("v3", "v4 (defaults)", "v4, bf16 integer rounding")  # rope.hip sees only the bf16 rounding
BLOCK = 256
V3 = "28fffa3"  # the commit whose custom_kernels/ are v3 (the baseline of the versions table in BENCHMARKS.md)


def _case_name(op, dt, shape):
    return f"{op}_{dt}_{'x'.join(map(str, shape))}"


def _ptx_name(label, source):
    """A file name for a version's build of `source` (letters, digits, '.' and '_' only)."""
    return f"{re.sub(r'[^A-Za-z0-9.]+', '_', label)}.{source.split('.')[0]}.ptx"


# ---- compile here ----------------------------------------------------------------------------------------


def _committed(source: str) -> bytes:
    """PTX of `source` as of commit V3."""
    import subprocess
    import tempfile
    from rocmc.lowering import kernels

    with tempfile.TemporaryDirectory() as tmp:
        for f in kernels.KERNEL_DIR.iterdir():
            if f.suffix in (".hip", ".h"):
                text = subprocess.run(
                    ["git", "show", f"{V3}:custom_kernels/{f.name}"], cwd=ROOT, check=True, capture_output=True
                ).stdout
                (Path(tmp) / f.name).write_bytes(text)
        saved, kernels.KERNEL_DIR = kernels.KERNEL_DIR, Path(tmp)
        try:
            return kernels.build(source, "sm_80").data
        finally:
            kernels.KERNEL_DIR = saved


def compile_all(out: Path) -> None:
    import rocmc
    from rocmc.lowering import kernels
    from rocmc.lowering.kernel import norm

    out.mkdir(parents=True, exist_ok=True)
    for label, (switches, *_) in VERSIONS.items():
        for source in kernels.SOURCES:
            data = (
                _committed(source)
                if switches is None
                else kernels.build(source, "sm_80", [f"-D{s}" for s in switches]).data
            )
            (out / _ptx_name(label, source)).write_bytes(data)
    plans = {}
    for op, dt, shape in CASES:
        name = _case_name(op, dt, shape)
        inter = True if op == "rope" else None
        base = bk._launch(op, dt, shape, inter)
        generated = rocmc.compile(bk._graph(op, dt, shape, inter), bk.TARGET, impl="generated")
        launches = {}
        for label, (_, cache, factor, grid) in VERSIONS.items():
            if op == "rope":
                if label in ROPE_VERSIONS:
                    launches[label] = {**base, "ptx": _ptx_name(label, base["source"])}
                continue
            rows, cols = shape
            suffix = norm.variant(cols, dt)[0] if cache is None else cache
            group = int(min(BLOCK, max(1, base["constants"][2] * factor)))
            consts = [rows, cols, group, *base["constants"][3:]]
            if cache is not None and (suffix, group) == (norm.variant(cols, dt)[0], base["constants"][2]):
                continue  # the lowering's own choice: measured as the other versions
            blocks = -(-rows * group // BLOCK)
            if grid is not None:
                blocks = -(-blocks // grid[1]) if grid[0] == "div" else min(blocks, grid[1])
            launches[label] = {
                "symbol": f"{op}_{dt}{suffix}",
                "grid": blocks,
                "constants": consts,
                "block": base["block"],
                "ptx": _ptx_name(label, base["source"]),
            }
        plans[name] = {
            "op": op,
            "dtype": dt,
            "shape": list(shape),
            "interleaved": inter,
            "launches": launches,
            "generated": bk._generated_dispatches(generated, out, name),
        }
    (out / "plans.json").write_text(json.dumps(plans, indent=1))
    print(f"compiled {len(VERSIONS)} versions x {len(kernels.SOURCES)} sources, {len(plans)} cases -> {out}")


# ---- run there -------------------------------------------------------------------------------------------


def _inputs(op, dt, shape, g, shift=0.0):
    import torch

    tdt = {"f32": torch.float32, "bf16": torch.bfloat16}[dt]
    x = torch.rand(shape, device="cuda", generator=g).mul_(4).sub_(2).add_(shift).to(tdt)
    if op == "rope":
        ang = torch.rand((shape[2], shape[3] // 2), device="cuda", generator=g) * 6.3
        return x, [ang.cos().to(tdt), ang.sin().to(tdt)]
    w = (torch.rand(shape[1:], device="cuda", generator=g) + 0.5).to(tdt)
    b = (torch.rand(shape[1:], device="cuda", generator=g) - 0.5).to(tdt)
    return x, [w, b] if op == "layer_norm" else [w]


def _cp(t):
    import cupy
    import torch

    return cupy.asarray(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def _launcher(fn, plan, op, x, extra, y):
    bufs = [_cp(x), *map(_cp, extra)] + ([_cp(x)] if op == "rope" else []) + [_cp(y)]
    consts = [np.uint32(v) for v in plan["constants"]]
    return lambda: fn((plan["grid"],), tuple(plan["block"]), (*bufs, *consts))


def _torch_fn(op, x, extra, inter):
    if op == "rope":
        return bk._torch_ref(op, x, None, None, extra[0], extra[1], inter)
    return bk._torch_ref(op, x, extra[0], extra[1] if len(extra) > 1 else None, None, None, inter)


def _ref(op, x, extra, inter):
    """The float64 result (torch on the GPU)."""
    return _torch_fn(op, x.double(), [t.double() for t in extra], inter)()


def _err(y, want):
    return float((y.double() - want).norm() / want.norm())


def run_all(out: Path) -> None:
    import cupy
    import torch

    plans = json.loads((out / "plans.json").read_text())
    modules = {}
    results = []
    print(f"card: {torch.cuda.get_device_name()}")
    for name, p in plans.items():
        op, dt, shape, inter = p["op"], p["dtype"], tuple(p["shape"]), p["interleaved"]
        g = torch.Generator(device="cuda").manual_seed(hash(name) & 0xFFFF)
        x, extra = _inputs(op, dt, shape, g)
        xs, extra_s = _inputs(op, dt, shape, g, shift=300.0 if dt == "f32" else 8.0)
        want, want_s = _ref(op, x, extra, inter), _ref(op, xs, extra_s, inter)
        y = torch.empty_like(x)
        nbytes = x.numel() * x.element_size()
        timers = {"copy": lambda: y.copy_(x), "torch": _torch_fn(op, x, extra, inter)}
        errs = {}
        for label, plan in p["launches"].items():
            try:
                if plan["ptx"] not in modules:
                    modules[plan["ptx"]] = cupy.RawModule(path=str(out / plan["ptx"]))
                fn = modules[plan["ptx"]].get_function(plan["symbol"])
                ys = torch.full_like(x, float("nan"))
                _launcher(fn, plan, op, xs, extra_s, ys)()
                y.fill_(float("nan"))
                run = _launcher(fn, plan, op, x, extra, y)
                run()
                torch.cuda.synchronize()
                errs[label] = (_err(y, want), _err(ys, want_s))
                timers[label] = run
            except Exception as e:  # a version that does not load or launch is reported, not fatal
                errs[label] = (float("nan"), float("nan"))
                print(f"{name} {label}: {type(e).__name__}: {e}")
        gen = p["generated"]  # IREE's dispatches (None when they take push constants)
        times = {k: [] for k in list(timers) + (["IREE gen"] if gen else [])}
        for _ in range(ROUNDS):
            for k, fn in timers.items():
                times[k].append(bk._bench(fn))
            if gen:
                times["IREE gen"].append(bk._generated_kernels(out, name, gen))
        med = {k: statistics.median(v) for k, v in times.items()}
        copy_bw = 2 * nbytes / (med["copy"] * 1e-3)
        print(f"\n{name}  (copy {copy_bw / 1e9:.0f} GB/s)")
        print(f"  {'version':<30} {'ms':>8} {'%copy':>6} {'vs gen':>7} {'rounds':>26} {'err':>8} {'err shifted':>11}")
        for k, t in sorted(med.items(), key=lambda kv: kv[1]):
            pct = 100 * 2 * nbytes / (t * 1e-3) / copy_bw
            vs = f"{med['IREE gen'] / t:6.3f}x" if gen else "-"
            e = errs.get(k)
            es = f"{e[0]:8.1e} {e[1]:11.1e}" if e else ""
            rounds = " ".join(f"{v:.4f}" for v in times[k])
            print(f"  {k:<30} {t:8.4f} {pct:6.1f} {vs:>7} {rounds:>26} {es}")
            results.append(
                {
                    "case": name,
                    "version": k,
                    "ms": t,
                    "rounds": times[k],
                    "pct_copy": pct,
                    "err": e[0] if e else None,
                    "err_shifted": e[1] if e else None,
                }
            )
        timers.clear()
    (out / "sweep.json").write_text(json.dumps(results, indent=1))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("compile", "run"))
    p.add_argument("--out", default=str(ROOT / "out" / "kernel_sweep"))
    a = p.parse_args(argv)
    (compile_all if a.mode == "compile" else run_all)(Path(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
