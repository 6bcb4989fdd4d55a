"""Performance of the hand-written kernels on an NVIDIA GPU against copy bandwidth, torch and IREE's codegen.

    python -m bench.kernels compile [--out out/gpu_kernels/bench]   # here: .vmfb files, PTX, launch plans
    python -m bench.kernels run [--out out/gpu_kernels/bench]       # there: torch, CuPy, iree-benchmark-module

Measured in one run on one card:
- copy: device-to-device copy of x (torch `copy_`), bandwidth = 2 * bytes(x) / time;
- kernel: the PTX that rocmc embeds, launched alone with CuPy (same grid, block and constants the .vmfb
  uses), timed with CUDA events (triton do_bench median); its output is checked against torch in f32;
- torch: `F.rms_norm`, `F.layer_norm`, an eager torch RoPE (half-split / interleaved);
- IREE generated kernels: the PTX of IREE's own dispatches for the op (impl="generated"), launched alone
  with CuPy with the grid and buffer sizes of IREE's command buffer (hal stage), timed like ours;
- IREE: iree-benchmark-module medians (caching device allocator) of rocmc .vmfb files with the kernel
  and with impl="generated" (IREE's own dispatch): one op per call (end to end, with the per-call
  overhead), and a chain of CHAIN ops per call, whose difference gives the time of one dispatch.
% of copy = (bytes read + written by the op, once each) / time, over the copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

TARGET = "cuda:sm_80"
NORM_SIZES = ((4096, 4096), (16384, 4096), (32768, 8192))
ROPE_SHAPES = ((1, 32, 4096, 128), (8, 32, 2048, 128))
DTYPES = ("f32", "bf16")
CHAIN = 8
ESIZE = {"f32": 4, "bf16": 2}


def cases():
    """(name, op, dtype, shape, variant) of every measurement."""
    out = []
    for op in ("rms_norm", "layer_norm"):
        for dt in DTYPES:
            for r, c in NORM_SIZES:
                out.append((f"{op}_{dt}_{r}x{c}", op, dt, (r, c), None))
    for dt in DTYPES:
        for shape in ROPE_SHAPES:
            for inter in (False, True):
                v = "interleaved" if inter else "half"
                out.append((f"rope_{v}_{dt}_{'x'.join(map(str, shape))}", "rope", dt, shape, inter))
    return out


# ---- compile here ----------------------------------------------------------------------------------------


def _graph(op, dt, shape, inter, chain=1):
    """The op applied `chain` times in a row (each on the previous result)."""
    import rocmc
    from rocmc import ops

    g = rocmc.Graph("b")
    y = g.input("x", shape, dt)
    if op == "rope":
        t, r = shape[2], shape[3] // 2
        c, s = g.input("cos", (t, r), dt), g.input("sin", (t, r), dt)
        step = lambda v: ops.rope(v, c, s, interleaved=inter)  # noqa: E731
    else:
        w = g.input("w", shape[1:], dt)
        b = g.input("b", shape[1:], dt) if op == "layer_norm" else None
        step = (
            (lambda v: ops.rms_norm(v, w, eps=1e-6))
            if op == "rms_norm"
            else (lambda v: ops.layer_norm(v, w, b, eps=1e-5))
        )
    for _ in range(chain):
        y = step(y)
    g.output(y)
    return g


def _launch(op, dt, shape, inter) -> dict:
    """The symbol, grid and constants the lowering gives this case (read back from the emitted MLIR)."""
    import rocmc
    from rocmc.lowering.module import lower

    text = lower(_graph(op, dt, shape, inter), TARGET).text
    text = text[text.index("func.func @main") :]  # the executable's count regions reuse SSA names
    m = re.search(r"flow\.dispatch @\w+::@(\w+)\[%(\w+)\]\(([^)]*)\)", text)
    symbol, grid, args = m.group(1), m.group(2), [a.strip() for a in m.group(3).split(",")]

    def value(name):
        name = name.lstrip("%")
        d = re.search(rf"%{name} = arith\.constant (-?\d+) : (?:i32|index)", text)
        return int(d.group(1)) & 0xFFFFFFFF

    spec = rocmc.lowering.kernels.KERNELS[symbol]
    return {
        "symbol": symbol,
        "source": spec.source,
        "grid": value(grid),
        "constants": [value(a) for a in args[: spec.constants]],
        "block": list(spec.workgroup),
    }


def _generated_dispatches(art, out: Path, name: str) -> list | None:
    """IREE's dispatches of a generated artifact: entry, grid, block and binding sizes (None if they take
    push constants, which this benchmark does not reproduce). Writes their PTX to <name>.generated.ptx."""
    hal = art.ir("hal")
    ptx = b"".join(p.read_bytes() for p in sorted((art.stage_dir() / "binaries").glob("*.ptx")))
    (out / f"{name}.generated.ptx").write_bytes(ptx)
    text = ptx.decode()
    found = []
    for m in re.finditer(
        r"hal\.command_buffer\.dispatch<[^>]*>[^\n]*\[%(\w+)\] workgroups\(\[([^\]]*)\]\)"
        r"(.*?)flags\(",
        hal,
        re.S,
    ):
        if "constants(" in m.group(3):
            return None
        fid = re.search(rf"%{m.group(1)} = hal\.executable\.lookup\.function .*?::@(\w+)\) :", hal).group(1)
        grid = [int(re.match(r"%c(\d+)", g.strip()).group(1)) for g in m.group(2).split(",")]
        sizes = [int(v) for v in re.findall(r"\)\[%c\d+(?:_\d+)?, %c(\d+)(?:_\d+)?\]", m.group(3))]
        entry = text[text.index(f".entry {fid}(") :]
        block = [int(v) for v in re.search(r"\.(?:maxntid|reqntid) (\d+), (\d+), (\d+)", entry).groups()]
        found.append({"entry": fid, "grid": grid, "block": block, "bindings": sizes})
    return found


def compile_all(out: Path) -> None:
    import rocmc
    from rocmc.lowering import kernels

    out.mkdir(parents=True, exist_ok=True)
    plans = {}
    for name, op, dt, shape, inter in cases():
        for k in (1, CHAIN):
            g = _graph(op, dt, shape, inter, k)
            rocmc.compile(g, TARGET).save(out / f"{name}.kernel.k{k}.vmfb")
            rocmc.compile(g, TARGET, impl="generated").save(out / f"{name}.generated.k{k}.vmfb")
        generated = rocmc.compile(_graph(op, dt, shape, inter), TARGET, impl="generated")
        plans[name] = {
            "op": op,
            "dtype": dt,
            "shape": list(shape),
            "interleaved": inter,
            **_launch(op, dt, shape, inter),
            "generated": _generated_dispatches(generated, out, name),
        }
    for source in kernels.SOURCES:
        (out / f"{source.split('.')[0]}.ptx").write_bytes(kernels.build(source, "sm_80").data)
    (out / "plans.json").write_text(json.dumps(plans, indent=1))
    print(f"compiled {len(plans)} benchmark cases -> {out}")


# ---- run there -------------------------------------------------------------------------------------------


def _bench(fn):
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")  # ms


def _torch_ref(op, x, w, b, c, s, inter):
    import torch
    import torch.nn.functional as F

    if op == "rms_norm":
        return lambda: F.rms_norm(x, (x.shape[-1],), w, 1e-6)
    if op == "layer_norm":
        return lambda: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
    if inter:

        def rope_i():
            x0, x1 = x[..., 0::2], x[..., 1::2]
            return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), -1).flatten(-2)

        return rope_i
    r = x.shape[-1] // 2

    def rope_h():
        x0, x1 = x[..., :r], x[..., r:]
        return torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), -1)

    return rope_h


def _iree_inputs(tensors, dt: str, tmp: Path) -> list[str]:
    """Write device tensors as raw files; iree-benchmark-module's --input flags for them."""
    import torch

    args = []
    for i, t in enumerate(tensors):
        f = tmp / f"in{i}.bin"
        (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).cpu().numpy().tofile(f)
        args.append(f"--input={'x'.join(map(str, t.shape))}x{dt}=@{f}")
    return args


def _iree_median(vmfb: Path, args: list) -> float | None:
    """iree-benchmark-module median (ms) of main() on the cuda device."""
    import iree.runtime as ireert

    tool = Path(ireert.__file__).resolve().parents[1] / "_runtime_libs" / "iree-benchmark-module"
    cmd = [
        str(tool),
        "--device=cuda",
        "--device_allocator=caching",
        f"--module={vmfb}",
        "--function=main",
        *args,
        "--benchmark_repetitions=5",
        "--benchmark_min_time=0.05s",
        "--benchmark_min_warmup_time=0.05",
        "--benchmark_format=json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"iree-benchmark-module failed for {vmfb.name}: {proc.stderr[-500:]}")
        return None
    data = json.loads(proc.stdout)
    for bm in data["benchmarks"]:
        if bm.get("aggregate_name") == "median":
            unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0}[bm["time_unit"]]
            return bm["real_time"] * unit
    return None


def _generated_kernels(out: Path, name: str, dispatches: list) -> float:
    """Time of IREE's generated dispatches of one op, launched back to back alone (random buffers)."""
    import cupy
    import torch

    mod = cupy.RawModule(path=str(out / f"{name}.generated.ptx"))
    launches = []
    keep = []
    for d in dispatches:
        bufs = [cupy.asarray(torch.rand((n + 3) // 4, device="cuda")) for n in d["bindings"]]
        keep.append(bufs)
        fn = mod.get_function(d["entry"])
        launches.append((fn, tuple(d["grid"]), tuple(d["block"]), tuple(bufs)))

    def run():
        for fn, grid, block, args in launches:
            fn(grid, block, args)

    t = _bench(run)
    del keep, launches
    torch.cuda.empty_cache()
    return t


def run_all(out: Path) -> None:
    import cupy
    import torch

    plans = json.loads((out / "plans.json").read_text())
    modules = {}
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / "rocmc-bench"
    tmp.mkdir(parents=True, exist_ok=True)
    torch_dt = {"f32": torch.float32, "bf16": torch.bfloat16}
    rows = []
    copy_cache = {}
    for name, p in plans.items():
        op, dt, shape, inter = p["op"], p["dtype"], tuple(p["shape"]), p["interleaved"]
        g = torch.Generator(device="cuda").manual_seed(hash(name) & 0xFFFF)
        x = torch.rand(shape, device="cuda", generator=g, dtype=torch.float32).mul_(4).sub_(2).to(torch_dt[dt])
        w = b = c = s = None
        if op == "rope":
            t, r = shape[2], shape[3] // 2
            ang = torch.rand((t, r), device="cuda", generator=g) * 6.3
            c, s = ang.cos().to(torch_dt[dt]), ang.sin().to(torch_dt[dt])
            ins = [x, c, s]
        else:
            w = (torch.rand(shape[1:], device="cuda", generator=g) + 0.5).to(torch_dt[dt])
            b = (torch.rand(shape[1:], device="cuda", generator=g) - 0.5).to(torch_dt[dt])
            ins = [x, w] + ([b] if op == "layer_norm" else [])
        nbytes = x.numel() * ESIZE[dt]
        if (shape, dt) not in copy_cache:
            y = torch.empty_like(x)
            copy_cache[(shape, dt)] = 2 * nbytes / (_bench(lambda: y.copy_(x)) * 1e-3) / 1e9
            del y
        copy_bw = copy_cache[(shape, dt)]
        # The kernel alone, through CuPy, with the .vmfb's launch parameters.
        src = p["source"].split(".")[0]
        if src not in modules:
            modules[src] = cupy.RawModule(path=str(out / f"{src}.ptx"))
        kern = modules[src].get_function(p["symbol"])
        y = torch.full_like(x, float("nan"))

        def cp(tns):
            return cupy.asarray(tns.view(torch.int16) if tns.dtype == torch.bfloat16 else tns)

        if op == "rope":
            bufs = [cp(x), cp(c), cp(s), cp(x), cp(y)]
        elif op == "rms_norm":
            bufs = [cp(x), cp(w), cp(y)]
        else:
            bufs = [cp(x), cp(w), cp(b), cp(y)]
        consts = [np.uint32(v) for v in p["constants"]]
        launch = lambda: kern((p["grid"],), tuple(p["block"]), (*bufs, *consts))  # noqa: E731
        launch()
        torch.cuda.synchronize()
        ref_fn = _torch_ref(
            op,
            x.float(),
            None if w is None else w.float(),
            None if b is None else b.float(),
            None if c is None else c.float(),
            None if s is None else s.float(),
            inter,
        )
        want = ref_fn()
        err = float((y.float() - want).norm() / want.norm())
        t_kernel = _bench(launch)
        t_torch = _bench(_torch_ref(op, x, w, b, c, s, inter))
        t_gen_kernel = _generated_kernels(out, name, p["generated"]) if p["generated"] else None
        moved = 2 * nbytes
        args = _iree_inputs(ins, dt, tmp)
        iree = {}
        for impl in ("kernel", "generated"):
            t1, tk = (_iree_median(out / f"{name}.{impl}.k{k}.vmfb", args) for k in (1, CHAIN))
            iree[impl] = (t1, None if t1 is None or tk is None else (tk - t1) / (CHAIN - 1))
        rows.append(
            {
                "case": name,
                "kernel_ms": t_kernel,
                "torch_ms": t_torch,
                "copy_gbs": copy_bw,
                "kernel_pct_copy": 100 * moved / (t_kernel * 1e-3) / 1e9 / copy_bw,
                "torch_pct_copy": 100 * moved / (t_torch * 1e-3) / 1e9 / copy_bw,
                "generated_kernel_ms": t_gen_kernel,
                "iree_kernel_call_ms": iree["kernel"][0],
                "iree_kernel_dispatch_ms": iree["kernel"][1],
                "iree_generated_call_ms": iree["generated"][0],
                "iree_generated_dispatch_ms": iree["generated"][1],
                "rel_err_vs_torch_f32": err,
            }
        )
        del x, y, bufs, ins
        torch.cuda.empty_cache()
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print(f"card: {torch.cuda.get_device_name()}  driver/cuda: {torch.version.cuda}")
    print("times in ms; IREE: call = one op per call end to end, disp = one dispatch (chain difference)")
    hdr = (
        f"{'case':<36} {'kernel':>7} {'%copy':>6} {'torch':>7} {'%copy':>6} {'copyGB/s':>8} {'gen krnl':>8} "
        f"{'krnl call':>9} {'krnl disp':>9} {'gen call':>8} {'gen disp':>8} {'rel err':>8}"
    )
    print(hdr)
    for r in rows:
        f = lambda v: f"{v:8.4f}" if v is not None else f"{'-':>8}"  # noqa: E731
        f9 = lambda v: f"{v:9.4f}" if v is not None else f"{'-':>9}"  # noqa: E731
        print(
            f"{r['case']:<36} {r['kernel_ms']:7.4f} {r['kernel_pct_copy']:6.1f} {r['torch_ms']:7.4f} "
            f"{r['torch_pct_copy']:6.1f} {r['copy_gbs']:8.0f} {f(r['generated_kernel_ms'])} {f9(r['iree_kernel_call_ms'])} "
            f"{f9(r['iree_kernel_dispatch_ms'])} {f(r['iree_generated_call_ms'])} {f(r['iree_generated_dispatch_ms'])} "
            f"{r['rel_err_vs_torch_f32']:8.1e}"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("compile", "run"))
    p.add_argument("--out", default=str(ROOT / "out" / "gpu_kernels" / "bench"))
    a = p.parse_args(argv)
    (compile_all if a.mode == "compile" else run_all)(Path(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
