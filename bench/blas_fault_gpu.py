"""The GEMM library path under fault hunting: a 7B-shaped Llama (fewer layers) whose projections call the vendor
GEMM library (`libraries=["blas"]`), prefilled at random lengths and decoded, once per variant of the provider, each
variant in its own process (an illegal memory access ends a CUDA context).

    python -m bench.blas_fault_gpu compile --dir out/blas_fault [--layers 4]        # CPU machine: blas.vmfb, default.vmfb
    python3 -m bench.blas_fault_gpu run --dir out/blas_fault --json out.json         # GPU machine
    python3 -m bench.blas_fault_gpu time --dir out/blas_fault --json t.json          # the library path's prefill time

A variant is features joined by '+': `plain` (the provider as shipped), `device_sync` (the whole device
synchronized before each library call: IREE's stream drained), `no_graphs` (no captured stream graphs), `no_timing`
(the heuristic's first algorithm, no timed choice on the call's buffers), `blocking` (CUDA_LAUNCH_BLOCKING=1),
`keep_outputs` / `keep_inputs` (every result / operand of a library call kept alive to the end: no memory reused),
`no_caching` (the device without IREE's caching allocator), `pooled_outputs` (results allocated as before the fix,
without the export usage: IREE's caching allocator pools them).
A variant is clean when every call returns and every logit is finite; the last library calls are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np


def compile_module(a) -> None:
    import rocmc
    from bench.llm_gpu import SHAPES, llama_config

    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    cfg = llama_config(SHAPES["7b"] | {"num_hidden_layers": a.layers})
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    for name, libraries in (("blas.vmfb", ["blas"]), ("default.vmfb", [])):
        art = rocmc.llm.compile_hf(
            d / "config.json", a.target, max_seq_len=a.max_seq_len, libraries=libraries, cache=False
        )
        art.save(d / name)
        print(name, art.summary(), sep="\n")


FEATURES = (
    "plain",
    "device_sync",
    "no_graphs",
    "no_timing",
    "blocking",
    "keep_outputs",
    "keep_inputs",
    "no_caching",
    "pooled_outputs",
)
TRACE: list = []  # the provider's last calls: (op, shapes, pointers, how the launch ran)


def patch(variant: str) -> None:
    """Change the provider for one variant (this process only): features joined by '+'."""
    import ctypes

    from rocmc.runtime.providers import blas, dnn, plans

    features = set(variant.split("+"))
    if features - set(FEATURES):
        raise SystemExit(f"unknown features {features - set(FEATURES)}")
    run = dnn.DnnProvider.run
    kept: list = []
    cu = ctypes.CDLL("libcuda.so.1")

    def traced(self, op, tensors, attrs):
        if "device_sync" in features:
            rc = cu.cuCtxSynchronize()
            if rc:
                raise RuntimeError(f"cuCtxSynchronize before the library call: CUDA error {rc}")
        if "keep_inputs" in features:
            kept.extend(tensors)
        TRACE.append([op, [tuple(t.shape) for t in tensors], None, "planned"])
        del TRACE[:-8]
        out = run(self, op, tensors, attrs)
        if "keep_outputs" in features:
            kept.append(out)
        return out

    dnn.DnnProvider.run = traced
    if "no_caching" in features:  # the device opened without IREE's caching allocator
        from iree import runtime as rt

        from rocmc.runtime import devices

        rt.flags.parse_flags("--cuda_async_allocations=false")
        drv = rt.get_driver("cuda")
        devices._devices["cuda"] = drv.create_device(drv.query_available_devices()[0])
    if "pooled_outputs" in features:  # results allocated as before the fix: IREE's caching allocator pools them
        from iree import runtime as hal

        def pooled(device, nbytes, shape, element_type):
            buf = device.allocator.allocate_buffer(hal.MemoryType.DEVICE_LOCAL, hal.BufferUsage.DEFAULT, nbytes)
            return hal.HalBufferView(buf, shape, element_type)

        dnn.result_view = pooled
    call = plans.Replays.__call__

    def replay(self, key):
        TRACE[-1][2] = [hex(k) if k else None for k in key]
        TRACE[-1][3] = "replay" if key in self.cache else ("capture" if key in self.seen else "direct")
        return call(self, key)

    plans.Replays.__call__ = replay
    if "no_graphs" in features:
        blas.Replays = lambda p, launch: None
    if "no_timing" in features:
        blas._choose = lambda p, g, ds, found, ptrs, align: (found[0][0], found[0][1], False)


def child(a) -> int:
    patch(a.variant)
    import rocmc
    from rocmc.llm.runtime import _SlotTable

    d = Path(a.dir)
    lm = rocmc.llm.load(d / a.vmfb, Path(a.ckpt), device="cuda")
    cfg = json.loads((d / "config.json").read_text())
    rng = np.random.default_rng(a.seed)
    lengths = [int(n) for n in rng.integers(1, a.longest + 1, a.prefills)]
    out: dict = {"variant": a.variant, "lengths": lengths, "calls": 0, "error": None}
    t0 = time.perf_counter()
    try:
        for i, n in enumerate(lengths):
            ids = [int(t) for t in rng.integers(3, cfg["vocab_size"], n)]
            slots = _SlotTable(lm.sizes, lm.config, chunk=a.longest)
            for feeds in slots.prefill(0, ids):
                res = lm.module.prefill(**feeds, output="device")
                out["calls"] += 1
            logits = res[1].to_host()
            if not np.isfinite(logits.astype(np.float32)).all():
                raise RuntimeError(f"prefill {i} ({n} tokens): non-finite logits")
            nxt = int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1]))
            for _ in range(a.decode_steps):
                r = lm.module.decode(**slots.decode(np.resize(np.asarray([nxt]), lm.sizes.max_batch)))
                out["calls"] += 1
                if not np.isfinite(np.asarray(r[1], dtype=np.float32)).all():
                    raise RuntimeError(f"decode after prefill {i}: non-finite logits")
                nxt = int(np.asarray(r[0]).reshape(-1)[0])
    except Exception as e:  # noqa: BLE001 - the run reports what stopped it
        out["error"] = f"{type(e).__name__}: {e}"[:2000]
        out["traceback"] = traceback.format_exc()[-3000:]
    out["wall_s"] = time.perf_counter() - t0
    out["clean"] = out["error"] is None
    out["provider_stats"] = [p.call_stats() for p in _providers()]
    out["last_library_calls"] = TRACE
    print("RESULT " + json.dumps(out), flush=True)
    return 0 if out["clean"] else 1


def _providers():
    from rocmc.runtime.providers import dnn

    return list(dnn.ACTIVE)


def run(a) -> int:
    from bench.llm_gpu import write_checkpoint

    cfg = json.loads((Path(a.dir) / "config.json").read_text())
    write_checkpoint(cfg, Path(a.ckpt))
    results = []
    for variant in a.variants.split(","):
        env = dict(os.environ)
        if "blocking" in variant.split("+"):
            env["CUDA_LAUNCH_BLOCKING"] = "1"
        cmd = [sys.executable, "-m", "bench.blas_fault_gpu", "child", "--variant", variant]
        cmd += ["--dir", a.dir, "--ckpt", a.ckpt, "--prefills", str(a.prefills), "--longest", str(a.longest)]
        cmd += ["--decode-steps", str(a.decode_steps), "--seed", str(a.seed), "--vmfb", a.vmfb]
        if a.sanitizer:
            cmd = ["compute-sanitizer", "--tool", a.sanitizer, "--print-limit", "20"] + cmd
        t = time.perf_counter()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        res = json.loads(lines[-1][7:]) if lines else {"variant": variant, "clean": False}
        res |= {"rc": p.returncode, "process_s": time.perf_counter() - t}
        if not lines or a.sanitizer:
            log = Path(a.json).with_name(f"{Path(a.json).stem}_{variant}.log")
            log.write_text(p.stdout + p.stderr)
            res["output"] = str(log)
        results.append(res)
        print(json.dumps({k: v for k, v in res.items() if k not in ("traceback", "lengths")}), flush=True)
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


def time_prefill(a) -> int:
    """Median wall time of a prefill of --tokens tokens (a fresh slot table each; logits read back), for each module
    of --vmfbs, interleaved round by round in one process: the library path beside the default one."""
    import statistics

    import rocmc
    from bench.llm_gpu import write_checkpoint
    from rocmc.llm.runtime import _SlotTable

    d = Path(a.dir)
    cfg = json.loads((d / "config.json").read_text())
    write_checkpoint(cfg, Path(a.ckpt))
    lms = {name: rocmc.llm.load(d / name, Path(a.ckpt), device="cuda") for name in a.vmfbs.split(",")}
    ids = [int(t) for t in np.random.default_rng(a.seed).integers(3, cfg["vocab_size"], a.tokens)]
    times: dict = {name: [] for name in lms}
    logits: dict = {}
    for r in range(a.reps + 2):
        for name, lm in lms.items():
            slots = _SlotTable(lm.sizes, lm.config, chunk=a.tokens)
            t = time.perf_counter()
            for feeds in slots.prefill(0, ids):
                res = lm.module.prefill(**feeds, output="device")
            logits[name] = np.asarray(res[1].to_host(), np.float32)
            if r >= 2:  # two warm-up rounds: plans, algorithm timing, graph captures
                times[name].append(time.perf_counter() - t)
    ref = next(iter(logits.values()))
    out = {
        name: {
            "median_ms": 1e3 * statistics.median(ts),
            "min_ms": 1e3 * min(ts),
            "last_logits_rel_l2_vs_first": float(np.linalg.norm(logits[name] - ref) / np.linalg.norm(ref)),
        }
        for name, ts in times.items()
    }
    out["tokens"], out["layers"] = a.tokens, cfg["num_hidden_layers"]
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(json.dumps(out), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--dir", default="out/blas_fault")
    c.add_argument("--layers", type=int, default=4)
    c.add_argument("--target", default="cuda:sm_80")
    c.add_argument("--max-seq-len", type=int, default=1280)
    for name in ("run", "child"):
        r = sub.add_parser(name)
        r.add_argument("--dir", default="out/blas_fault")
        r.add_argument("--ckpt", default="/tmp/blas_fault_ckpt")
        r.add_argument("--prefills", type=int, default=30)
        r.add_argument("--longest", type=int, default=1024)
        r.add_argument("--decode-steps", type=int, default=4)
        r.add_argument("--seed", type=int, default=5)
        r.add_argument("--vmfb", default="blas.vmfb", help="the module in --dir (compile writes blas.vmfb)")
        if name == "run":
            r.add_argument("--json", required=True)
            r.add_argument("--variants", default="plain,device_sync,no_graphs,no_timing,blocking")
            r.add_argument("--sanitizer", default=None, help="run each variant under compute-sanitizer --tool X")
            r.add_argument("--timeout", type=int, default=240)
        else:
            r.add_argument("--variant", required=True, help="features joined by '+'")
    t = sub.add_parser("time")
    t.add_argument("--dir", default="out/blas_fault")
    t.add_argument("--ckpt", default="/tmp/blas_fault_ckpt")
    t.add_argument("--vmfbs", default="default.vmfb,blas.vmfb")
    t.add_argument("--tokens", type=int, default=512)
    t.add_argument("--reps", type=int, default=10)
    t.add_argument("--seed", type=int, default=5)
    t.add_argument("--json", required=True)
    a = ap.parse_args()
    return {"compile": compile_module, "run": run, "child": child, "time": time_prefill}[a.cmd](a) or 0


if __name__ == "__main__":
    raise SystemExit(main())
