"""Extern calls on an NVIDIA GPU: the `dnn.*` imports served by the cuDNN provider.

    python -m bench.extern_gpu compile [--out out/extern_gpu]   # here: needs iree-base-compiler
    python -m bench.extern_gpu run [--out out/extern_gpu]       # GPU machine: iree-base-runtime + cuDNN

`compile` builds, for cuda:sm_80, one module per extern op, the graph holding every extern op (f32
and f16), the two conv2d timing cases and a ResNet-style block (extern conv and generated conv).
`run` loads them on the cuda device, where the imports bind to the cuDNN provider, and

- measures the per-call overhead of an extern conv2d: median wall time of the module (inputs and
  outputs stay on the device) minus the library kernel's own time (the same cuDNN execution plan
  launched back to back from the provider; torch's cuDNN conv for comparison), raw and less IREE's
  fixed cost of any module call (the null module): overhead = module - kernel - null;
- times the ResNet-style block three ways: cuDNN-extern conv, IREE-generated conv, torch.

It prints a markdown summary and writes extern_gpu.json. Exit status 1 if a timed module's result is
wrong. The extern ops' numerics against float64 are tests: tests/gpu/test_gpu_extern.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import traceback
from pathlib import Path

import numpy as np

import rocmc
from rocmc import ops
from rocmc.runtime.providers.dnn import ACTIVE  # (the live providers: public registry)

from bench.common import median_ms

TARGET = "cuda:sm_80"
SEED = 1234


def _w(rng, *shape, dtype="f32"):
    return rng.uniform(-1, 1, shape).astype(rocmc.dtype(dtype).np)


# ---- the cases -------------------------------------------------------------------------------------


def single_op_cases(rng, dtype="f32"):
    """name -> (graph, input shapes): one extern op per module, odd sizes, symbolic batch."""
    out = {}

    def case(name, shape, build):
        g = rocmc.Graph(name)
        x = g.input("x", ("n",) + shape[1:], dtype)
        g.output(build(x))
        out[f"{name}_{dtype}"] = (g, [shape])

    case(
        "conv2d",
        (2, 6, 17, 15),
        lambda x: ops.conv2d(
            x,
            _w(rng, 8, 3, 3, 3, dtype=dtype),
            _w(rng, 8, dtype=dtype),
            stride=(2, 1),
            padding=1,
            dilation=(1, 2),
            groups=2,
        ),
    )
    case("conv1d", (2, 6, 19), lambda x: ops.conv1d(x, _w(rng, 4, 6, 5, dtype=dtype), None, stride=2, padding=2))
    case(
        "conv_transpose2d",
        (2, 4, 7, 9),
        lambda x: ops.conv_transpose2d(
            x,
            _w(rng, 4, 3, 3, 2, dtype=dtype),
            _w(rng, 6, dtype=dtype),
            stride=2,
            padding=1,
            output_padding=1,
            groups=2,
        ),
    )
    case(
        "conv_transpose1d",
        (2, 4, 11),
        lambda x: ops.conv_transpose1d(x, _w(rng, 4, 5, 4, dtype=dtype), None, stride=3, padding=1, dilation=2),
    )
    case("max_pool2d", (2, 3, 13, 11), lambda x: ops.max_pool2d(x, 3, stride=2, padding=1))
    case(
        "avg_pool2d_exclude",
        (2, 3, 13, 11),
        lambda x: ops.avg_pool2d(x, (2, 3), stride=(1, 2), padding=1, count_include_pad=False),
    )
    case(
        "avg_pool2d_include",
        (2, 3, 13, 11),
        lambda x: ops.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=True),
    )
    case("softmax", (2, 5, 7, 3), lambda x: ops.softmax(x, axis=2))
    case("log_softmax", (2, 5, 33), lambda x: ops.log_softmax(x, axis=-1))
    for act, kw in (
        ("relu", {}),
        ("sigmoid", {}),
        ("tanh", {}),
        ("elu", {"alpha": 0.7}),
        ("leaky_relu", {"negative_slope": 0.2}),
        ("clipped_relu", {"ceiling": 0.5}),
    ):
        case(act, (3, 5, 7), lambda x, act=act, kw=kw: getattr(ops, act)(x, **kw))
    stats = np.float32
    case(
        "batch_norm",
        (2, 5, 6, 7),
        lambda x: ops.batch_norm(
            x, _w(rng, 5).astype(stats), rng.uniform(0.5, 2, 5).astype(stats), _w(rng, 5).astype(stats), None, eps=1e-3
        ),
    )
    case("lrn", (2, 7, 5, 3), lambda x: ops.lrn(x, 5, alpha=0.3, beta=0.75, k=2.0))
    return out


def conv_case(n, c, hw, f):
    rng = np.random.default_rng(SEED)
    g = rocmc.Graph(f"conv_{n}x{c}x{hw}x{hw}")
    x = g.input("x", (n, c, hw, hw), "f32")
    g.output(ops.conv2d(x, _w(rng, f, c, 3, 3) * 0.05, None, padding=1))
    return g


def conv_winput_case(n, c, hw, f):
    """The same convolution with the weights as an input: no constant for IREE to copy into a
    transient buffer before the call (what a module does with each constant it hands an import)."""
    g = rocmc.Graph(f"conv_w_{n}x{c}x{hw}x{hw}")
    x = g.input("x", (n, c, hw, hw), "f32")
    w = g.input("w", (f, c, 3, 3), "f32")
    g.output(ops.conv2d(x, w, None, padding=1))
    return g


def add_case(constant: bool):
    """x + c with c a 256x256x3x3 f32 constant (the large conv's weights, 2.36 MB) or an input:
    what reading a module constant costs a generated dispatch."""
    rng = np.random.default_rng(SEED)
    g = rocmc.Graph("add_const" if constant else "add_input")
    x = g.input("x", (256, 256, 3, 3), "f32")
    g.output(x + (_w(rng, 256, 256, 3, 3) if constant else g.input("c", (256, 256, 3, 3), "f32")))
    return g


def resnet_block():
    rng = np.random.default_rng(SEED)
    g = rocmc.Graph("resnet_block")
    x = g.input("x", (1, 64, 56, 56), "f32")

    def conv_bn(v):
        y = ops.conv2d(v, _w(rng, 64, 64, 3, 3) * 0.05, None, padding=1)
        return ops.batch_norm(y, _w(rng, 64), rng.uniform(0.5, 2, 64).astype(np.float32), _w(rng, 64), _w(rng, 64))

    g.output(ops.relu(conv_bn(ops.relu(conv_bn(x))) + x))
    return g, rng


CONV_CASES = {"conv_small": (1, 64, 56, 64), "conv_large": (32, 256, 56, 256)}


def null_graph():
    """The cheapest module: one tiny generated dispatch. Its call time is IREE's fixed cost."""
    g = rocmc.Graph("null")
    x = g.input("x", (1, 64, 56, 56), "f32")
    g.output(ops.relu(x))
    return g


def chain_graph(k):
    """k extern calls in a row (relu on 1x64x56x56): the marginal cost of one more call."""
    g = rocmc.Graph(f"chain{k}")
    y = g.input("x", (1, 64, 56, 56), "f32")
    for _ in range(k):
        y = ops.relu(y)
    g.output(y)
    return g


def modules():
    """name -> (graph, compile kwargs)."""
    rng = np.random.default_rng(SEED)
    out = {}
    for name, (g, _) in {**single_op_cases(rng), **single_op_cases(rng, "f16")}.items():
        out[name] = (g, {"libraries": ["dnn"]})
    for name, (n, c, hw, f) in CONV_CASES.items():
        out[name] = (conv_case(n, c, hw, f), {"libraries": ["dnn"]})
        out[name + "_generated"] = (conv_case(n, c, hw, f), {"impl": "generated"})
        out[name + "_winput"] = (conv_winput_case(n, c, hw, f), {"libraries": ["dnn"]})
    out["null"] = (null_graph(), {"impl": "generated"})
    out["add_const"] = (add_case(True), {"impl": "generated"})
    out["add_input"] = (add_case(False), {"impl": "generated"})
    for k in (1, 5):
        out[f"chain{k}"] = (chain_graph(k), {"libraries": ["dnn"]})
    out["resnet_extern"] = (resnet_block()[0], {"impl": {"conv2d": "dnn"}})
    out["resnet_generated"] = (resnet_block()[0], {"impl": "generated"})
    return out


def input_shapes(name, g):
    rng = np.random.default_rng(SEED)
    cases = {**single_op_cases(rng), **single_op_cases(rng, "f16")}
    if name in cases:
        return cases[name][1]
    return [tuple(v.shape) for v in g.inputs]


# ---- compile (here) -------------------------------------------------------------------------------


def compile_all(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    for name, (g, kw) in modules().items():
        art = rocmc.compile(g, TARGET, **kw)
        art.save(out / f"{name}.vmfb")
        print(f"{name}: {len(art.vmfb)} bytes, imports {[x['import'] for x in art.metadata['externs']]}")


# ---- run (GPU machine) ----------------------------------------------------------------------------


def time_calls(out: Path, results: dict) -> bool:
    """IREE's fixed cost of a module call (null), and the marginal cost of one more extern call:
    (chain5 - chain1) / 4, from which the relu kernel's own time is subtracted."""
    from iree import runtime as rt

    x = np.random.default_rng().uniform(-1, 1, (1, 64, 56, 56)).astype(np.float32)
    row, ok = {}, True
    names = ("null",) if MODE == "async" else ("null", "chain1", "chain5")
    for name in names:
        mod = rocmc.load(out / f"{name}.vmfb")
        xd = rt.asdevicearray(mod.device, x)
        ok &= bool(np.allclose(mod(xd), np.maximum(x, 0)))
        _reset_stats()
        row[f"{name}_us"] = median_ms(lambda: mod(xd, output="device"), reps=200) * 1e3
        if name != "null":
            row[f"{name}_callback_us"] = _phases()
        mod.close()
        del mod, xd
    if MODE != "async":
        row["per_extern_call_us"] = (row["chain5_us"] - row["chain1_us"]) / 4
    results["calls"] = row
    print("calls", json.dumps(row))
    return ok


def _reset_stats() -> None:
    """Zero every live provider's call timings: the next _phases() covers what runs from here."""
    for p in ACTIVE:
        p.call_stats(reset=True)


def _phases() -> dict:
    """Mean microseconds per extern call in each phase of the provider's callback."""
    stats = [p.call_stats() for p in ACTIVE]
    calls = sum(st["calls"] for st in stats)
    return {
        k[:-2]: sum(st[k] for st in stats) / max(calls, 1) * 1e6 for k in ("inputs_s", "output_s", "launch_s", "sync_s")
    }


def time_convs(out: Path, results: dict) -> bool:
    from iree import runtime as rt
    from rocmc.runtime.providers.capi import capsule_address

    ok = True
    for name, (n, c, hw, f) in CONV_CASES.items():
        g = conv_case(n, c, hw, f)
        x = np.random.default_rng().uniform(-1, 1, (n, c, hw, hw)).astype(np.float32)
        want = rocmc.evaluate(g, x)
        row = {}
        for variant in ("", "_generated") if MODE != "async" else ("_generated",):
            mod = rocmc.load(out / f"{name}{variant}.vmfb")
            xd = rt.asdevicearray(mod.device, x)
            got = mod(xd)
            err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            ok &= err < 1e-4
            row[f"err{variant or '_extern'}"] = err
            _reset_stats()
            row[f"module_ms{variant or '_extern'}"] = median_ms(
                lambda: mod(xd, output="device"), reps=200 if n == 1 else 50
            )
            if not variant:
                row["callback_us"] = _phases()
            mod.close()
            del mod, xd
        if MODE == "async":
            results["conv"][name] = row
            print(name, json.dumps(row))
            continue
        # The library kernel alone: the very plan the module's calls used (the device's shared
        # provider keeps it), launched back to back on its stream, one synchronize.
        dev = rocmc.runtime.get_device("cuda")
        prov, plan = next(
            (p, pl)
            for p in ACTIVE
            for key, pl in p.cached_plans()
            if key[0] == "conv2d" and key[2][0] == (n, c, hw, hw)
        )
        xv = rt.asdevicearray(dev, x)._buffer_view
        wn = np.random.default_rng().uniform(-1, 1, (f, c, 3, 3)).astype(np.float32) * 0.05
        wv = rt.asdevicearray(dev, wn)._buffer_view
        yv = rt.asdevicearray(dev, np.zeros((n, f, hw, hw), np.float32))._buffer_view
        caps = [dev.create_dlpack_capsule(v, 2, 0) for v in (xv, wv, yv)]
        ptrs = [capsule_address(cp) for cp in caps]
        reps = 200 if n == 1 else 20
        # the weights as an input: the module without IREE's copy of a constant
        mod = rocmc.load(out / f"{name}_winput.vmfb")
        wd, xd = rt.asdevicearray(mod.device, wn), rt.asdevicearray(mod.device, x)
        err = float(np.max(np.abs(mod(xd, wd) - rocmc.evaluate(conv_winput_case(n, c, hw, f), x, wn))))
        row["err_winput_abs"] = err
        ok &= err < 1e-3
        _reset_stats()
        row["module_ms_winput"] = median_ms(lambda: mod(xd, wd, output="device"), reps=200 if n == 1 else 50)
        row["callback_us_winput"] = _phases()
        mod.close()
        del mod, xd, wd

        def burst():
            for _ in range(reps):
                plan.run(ptrs, ptrs[2])
            prov.rt.call("stream_sync", stream=prov.stream)

        row["kernel_ms"] = median_ms(burst, warmup=2, reps=7) / reps
        row["search"] = plan.info
        row["module_minus_kernel_us"] = (row["module_ms_extern"] - row["kernel_ms"]) * 1e3
        row["winput_minus_kernel_us"] = (row["module_ms_winput"] - row["kernel_ms"]) * 1e3
        null = results.get("calls", {}).get("null_us")
        if null is not None:
            row["null_us"] = null
            row["overhead_us"] = row["module_minus_kernel_us"] - null
            row["overhead_winput_us"] = row["winput_minus_kernel_us"] - null
        try:
            import torch

            torch.backends.cudnn.allow_tf32 = False
            tx = torch.from_numpy(x).cuda()
            tw = torch.randn(f, c, 3, 3, device="cuda")
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(5):
                torch.nn.functional.conv2d(tx, tw, padding=1)
            start.record()
            for _ in range(reps):
                torch.nn.functional.conv2d(tx, tw, padding=1)
            end.record()
            torch.cuda.synchronize()
            row["torch_ms"] = start.elapsed_time(end) / reps
        except Exception as e:  # torch is a comparison only
            row["torch_ms"] = f"unavailable: {e}"
        del caps
        results["conv"][name] = row
        print(name, json.dumps(row))
    return ok


def time_constants(out: Path, results: dict) -> bool:
    """A generated x + c with c a 2.36 MB module constant vs an input of the same size."""
    from iree import runtime as rt

    rng = np.random.default_rng()
    x, c = (rng.uniform(-1, 1, (256, 256, 3, 3)).astype(np.float32) for _ in range(2))
    row = {}
    for name in ("add_const", "add_input"):
        mod = rocmc.load(out / f"{name}.vmfb")
        args = [rt.asdevicearray(mod.device, a) for a in ((x,) if name == "add_const" else (x, c))]
        row[f"{name}_us"] = median_ms(lambda: mod(*args, output="device"), reps=200) * 1e3
        mod.close()
        del mod, args
    results["constants"] = row
    print("constants", json.dumps(row))
    return True


def _plan_infos() -> list:
    """What each cached convolution plan chose (plan API, engine, fused bias, graph replay)."""
    out = []
    for prov in ACTIVE:
        for key, plan in prov.cached_plans():
            if key[0].startswith("conv"):
                out.append({"op": key[0], "element_type": int(key[1]), "shapes": key[2], **plan.info})
    return out


def time_resnet(out: Path, results: dict) -> bool:
    from iree import runtime as rt

    g, _ = resnet_block()
    x = np.random.default_rng().uniform(-1, 1, (1, 64, 56, 56)).astype(np.float32)
    want = rocmc.evaluate(g, x)
    row, ok = {}, True
    for variant in ("extern", "generated") if MODE != "async" else ("generated",):
        mod = rocmc.load(out / f"resnet_{variant}.vmfb")
        xd = rt.asdevicearray(mod.device, x)
        err = float(np.max(np.abs(mod(xd) - want)) / np.max(np.abs(want)))
        ok &= err < 1e-4
        row[f"err_{variant}"] = err
        row[f"{variant}_ms"] = median_ms(lambda: mod(xd, output="device"))
        mod.close()
        del mod, xd
    try:
        import torch
        import torch.nn.functional as F

        torch.backends.cudnn.allow_tf32 = False
        tx = torch.from_numpy(x).cuda()
        ws = [torch.randn(64, 64, 3, 3, device="cuda") * 0.05 for _ in range(2)]
        stats = [
            (
                torch.randn(64, device="cuda"),
                torch.rand(64, device="cuda") + 0.5,
                torch.randn(64, device="cuda"),
                torch.randn(64, device="cuda"),
            )
            for _ in range(2)
        ]

        def block():
            y = tx
            for w, (m, v, a, b) in zip(ws, stats):
                y = F.batch_norm(F.conv2d(y, w, padding=1), m, v, a, b, eps=1e-5)
                if w is ws[0]:
                    y = F.relu(y)
            return F.relu(y + tx)

        def timed():
            block()
            torch.cuda.synchronize()

        row["torch_ms"] = median_ms(timed)
    except Exception as e:
        row["torch_ms"] = f"unavailable: {e}"
    results["resnet_block"] = row
    print("resnet_block", json.dumps(row))
    return ok


MODE = "sync"


def _open_device(mode: str):
    """sync: IREE's plain synchronous CUDA allocations (what DLPack export of IREE's buffers needs);
    caching: the same behind IREE's caching allocator; async: IREE's default pooled async
    allocations (no export, so generated modules only: the baseline of IREE's own call cost)."""
    from iree import runtime as rt
    from rocmc.runtime.providers.cudnn import prepare_cuda

    if mode == "sync":
        rt.flags.parse_flags("--cuda_async_allocations=false")
    elif mode == "caching":
        prepare_cuda()


def run_all(out: Path, json_out: Path | None, mode: str):
    global MODE
    MODE = mode
    _open_device(mode)
    results = {"device": None, "mode": mode, "conv": {}, "resnet_block": {}}
    try:
        import subprocess

        results["device"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        pass
    ok = True
    steps = {
        "caching": (time_calls, time_convs, time_constants, time_resnet),
        "sync": (time_calls, time_convs),
        "async": (time_calls, time_convs, time_resnet),
    }[mode]
    for step in steps:
        try:
            ok &= step(out, results)
        except Exception:
            traceback.print_exc()
            ok = False
    results["versions"] = _versions()
    results["plans"] = _plan_infos()
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=2))
    summary(results)
    gc.collect()
    return ok


def _versions() -> dict:
    out = {}
    try:
        from rocmc.runtime.providers.cudnn import CudnnProvider

        for prov in ACTIVE:
            if isinstance(prov, CudnnProvider):
                out["cudnn"] = int(prov.api.lib.cudnnGetVersion())
                break
    except Exception as e:  # versions are a report only
        out["cudnn"] = f"unknown: {e}"
    try:
        import torch

        out["torch"] = torch.__version__
    except Exception:
        pass
    return out


def summary(results: dict):
    """The per-call overhead table, markdown."""
    calls = results.get("calls", {})
    print(f"\n{results['device']}, mode {results['mode']}, {results.get('versions')}")
    if "null_us" in calls:
        print(
            f"null module (IREE's fixed cost of a call): {calls['null_us']:.1f} us; "
            f"per extern call (chain) {calls.get('per_extern_call_us', float('nan')):.1f} us"
        )
    print(
        "| case | extern module ms | kernel alone ms | null module us | module - kernel us "
        "| overhead (module - kernel - null) us | callback in/out/launch/sync us | w as input: module ms "
        "/ - kernel us / overhead us | torch ms | generated ms | plan |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.get("conv", {}).items():
        if "kernel_ms" not in r:
            continue
        cb = r.get("callback_us", {})
        phases = "/".join(f"{cb.get(k, float('nan')):.1f}" for k in ("inputs", "output", "launch", "sync"))
        torch_ms = r["torch_ms"] if isinstance(r["torch_ms"], str) else f"{r['torch_ms']:.3f}"
        print(
            f"| {name} | {r['module_ms_extern']:.3f} | {r['kernel_ms']:.3f} | {r.get('null_us', float('nan')):.1f} "
            f"| {r['module_minus_kernel_us']:.1f} | {r.get('overhead_us', float('nan')):.1f} | {phases} "
            f"| {r['module_ms_winput']:.3f} / {r['winput_minus_kernel_us']:.1f} / "
            f"{r.get('overhead_winput_us', float('nan')):.1f} | {torch_ms} "
            f"| {r.get('module_ms_generated', float('nan')):.3f} | {r['search']} |"
        )
    rb = results.get("resnet_block")
    if rb:
        print("resnet block:", json.dumps(rb))
    for info in results.get("plans", []):
        print("plan:", json.dumps(info))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["compile", "run"])
    ap.add_argument("--out", default="out/extern_gpu", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--mode",
        choices=["sync", "caching", "async"],
        default="sync",
        help="how IREE allocates CUDA memory (see _open_device)",
    )
    a = ap.parse_args(argv)
    if a.cmd == "compile":
        compile_all(a.out)
        return 0
    return 0 if run_all(a.out, a.json, a.mode) else 1


if __name__ == "__main__":
    sys.exit(main())
