"""LSTM/GRU as extern calls on an NVIDIA GPU: `dnn.lstm` / `dnn.gru` served by cuDNN's v8 RNN API.

    python -m bench.rnn_gpu compile [--out out/rnn_gpu]   # here: needs iree-base-compiler
    python -m bench.rnn_gpu run [--out out/rnn_gpu]       # GPU machine: iree-base-runtime + cuDNN

`compile` builds, for cuda:sm_80, each case twice: with the library call (`libraries=["dnn"]`,
which the cuDNN provider serves on cuda devices) and with the generated scf.for lowering. `run`
loads both on the cuda device, compares them with the float64 reference on fresh random inputs and
times them (median of a module call, inputs on the device, results copied back to the host), with torch's cuDNN
nn.LSTM / nn.GRU for scale when torch is installed. Prints a markdown table, writes rnn_gpu.json;
exit status 1 if a comparison fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import numpy as np

import rocmc
from rocmc import ops

from bench.common import median_ms

TARGET = "cuda:sm_80"
SEED = 4321
GATES = {"lstm": 4, "gru": 3}
# name -> (op, dtype, seq, batch, input, hidden); seq is symbolic in every graph
CASES = {
    "lstm_f32_small": ("lstm", "f32", 37, 3, 13, 17),
    "gru_f32_small": ("gru", "f32", 37, 3, 13, 17),
    "lstm_f16_small": ("lstm", "f16", 37, 3, 13, 17),
    "gru_f16_small": ("gru", "f16", 37, 3, 13, 17),
    "lstm_f32_large": ("lstm", "f32", 128, 32, 256, 512),
    "gru_f32_large": ("gru", "f32", 128, 32, 256, 512),
}


def case_graph(name):
    """The graph and its input shapes: x and the initial states are inputs, weights constants."""
    op, dtype, seq, batch, inp, hidden = CASES[name]
    rng = np.random.default_rng(SEED)
    npt = rocmc.dtype(dtype).np
    bound = 1 / np.sqrt(hidden)  # torch's init range
    w = lambda *s: rng.uniform(-bound, bound, s).astype(npt)  # noqa: E731
    g = rocmc.Graph(name)
    x = g.input("x", ("seq", batch, inp), dtype)
    states = [g.input("h0", (1, batch, hidden), dtype)]
    if op == "lstm":
        states.append(g.input("c0", (1, batch, hidden), dtype))
    gates = GATES[op] * hidden
    g.output(*getattr(ops, op)(x, w(gates, inp), w(gates, hidden), w(gates), w(gates), *states))
    return g, [(seq, batch, inp)] + [(1, batch, hidden)] * len(states)


IMPLS = {"cudnn": {"libraries": ["dnn"]}, "generated": {"impl": "generated"}}


def compile_all(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    for name in CASES:
        g, _ = case_graph(name)
        for impl, kw in IMPLS.items():
            art = rocmc.compile(g, TARGET, **kw)
            art.save(out / f"{name}_{impl}.vmfb")
            print(f"{name}_{impl}: {len(art.vmfb)} bytes, imports {[x['import'] for x in art.metadata['externs']]}")


def _median_ms(fn):
    return median_ms(fn, warmup=3, reps=20)


def _rel_err(got, want):
    return max(float(np.max(np.abs(a.astype(np.float64) - b) / (np.abs(b) + 1.0))) for a, b in zip(got, want))


def _torch_ms(name, inputs):
    try:
        import torch
    except ImportError:
        return None
    op, dtype, seq, batch, inp, hidden = CASES[name]
    tdt = {"f32": torch.float32, "f16": torch.float16}[dtype]
    torch.backends.cudnn.allow_tf32 = False
    layer = getattr(torch.nn, op.upper())(inp, hidden).cuda().to(tdt)
    xs = [torch.from_numpy(np.asarray(v)).cuda() for v in inputs]
    state = (xs[1], xs[2]) if op == "lstm" else xs[1]

    def call():
        with torch.no_grad():
            layer(xs[0], state)
        torch.cuda.synchronize()

    return _median_ms(call)


def _torch_first() -> str | None:
    """Let torch load its bundled cuDNN before the provider looks for one: the provider then binds
    the same, already loaded library (same soname) instead of another copy found in a wheel."""
    try:
        import torch

        torch.backends.cudnn.is_available()
        return f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}"
    except Exception:
        return None


def run_all(out: Path, json_out: Path | None) -> bool:
    from iree import runtime as rt
    from rocmc.runtime.providers.cudnn import prepare_cuda

    results, ok = {"cases": {}, "torch": _torch_first()}, True
    prepare_cuda()
    print(f"torch: {results['torch']}")
    print("| case | impl | max rel err vs float64 | tol | median ms/call |")
    print("|---|---|---|---|---|")
    for name in CASES:
        g, shapes = case_graph(name)
        dtype = CASES[name][1]
        tol = 5e-3 if dtype == "f16" else 1e-4
        rng = np.random.default_rng()
        inputs = [rng.uniform(-1, 1, s).astype(rocmc.dtype(dtype).np) for s in shapes]
        want = rocmc.evaluate(g, *inputs)
        entry = results["cases"].setdefault(name, {"shape": CASES[name]})
        for impl in IMPLS:
            try:
                mod = rocmc.load(out / f"{name}_{impl}.vmfb", device="cuda")
                got = mod(*inputs)
                err = _rel_err(got, want)
                dev_inputs = [rt.asdevicearray(mod.device, v) for v in inputs]
                ms = _median_ms(lambda: mod(*dev_inputs))  # results come back to the host: the call is complete
                mod.close()
            except Exception:
                traceback.print_exc()
                err, ms = float("nan"), float("nan")
            passed = bool(err <= tol)
            ok &= passed
            entry[impl] = {"max_rel_err": err, "tol": tol, "pass": passed, "median_ms": ms}
            print(f"| {name} | {impl} | {err:.2e} | {tol:.0e} | {ms:.3f} |", flush=True)
        try:
            entry["torch_ms"] = _torch_ms(name, inputs)
            if entry["torch_ms"] is not None:
                print(f"| {name} | torch nn.{CASES[name][0].upper()} (cuDNN) | | | {entry['torch_ms']:.3f} |")
        except Exception:
            traceback.print_exc()
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=2))
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["compile", "run"])
    ap.add_argument("--out", default="out/rnn_gpu", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.cmd == "compile":
        compile_all(a.out)
        return 0
    return 0 if run_all(a.out, a.json) else 1


if __name__ == "__main__":
    sys.exit(main())
