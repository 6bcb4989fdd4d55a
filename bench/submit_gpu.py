"""Where a stream-ordered decode step's host time goes: each step issued (`Module.submit`) before the step before it
is read, the time `submit` takes and the time the read takes, per step (medians of 3 x 60 steps), and a
synchronous call for comparison. Where the steps overlap on the GPU, the step time is the GPU's and the host's
wait is in the read; where something in `submit` waits for the GPU, it shows there.

    python3 -m bench.submit_gpu MODULE.vmfb CHECKPOINT_DIR [--device cuda] [--profile]   # GPU machine
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("module")
    p.add_argument("checkpoint")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--profile", action="store_true", help="also the GPU's busy time over steps issued ahead")
    a = p.parse_args(argv)
    import rocmc
    from rocmc.runtime.module import reshaped

    lm = rocmc.llm.load(a.module, a.checkpoint, device=a.device)
    mod, b = lm.module, lm.sizes.max_batch
    tokens = np.full((b, 1), 5, np.int64)
    positions = np.full((b, 1), min(600, lm.sizes.max_seq_len - 1), np.int64)
    times = {"submit": [], "read": [], "step": []}
    for _ in range(3):
        prev = mod.submit("decode", tokens=tokens, positions=positions)
        t_prev = time.perf_counter()
        for _ in range(a.steps):
            t0 = time.perf_counter()
            sub = mod.submit("decode", tokens=reshaped(prev.outputs[0], (b, 1)), positions=positions)
            t1 = time.perf_counter()
            prev.output(0)
            t2 = time.perf_counter()
            times["submit"].append(t1 - t0)
            times["read"].append(t2 - t1)
            times["step"].append(t2 - t_prev)
            prev, t_prev = sub, t2
        prev.output(0)
    calls = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        mod.decode(tokens=tokens, positions=positions)
        calls.append(time.perf_counter() - t0)
    times["synchronous call"] = calls
    if a.profile:  # the GPU's busy time over a run of steps issued ahead (CUPTI, through torch.profiler)
        from torch.profiler import ProfilerActivity, profile

        prev = mod.submit("decode", tokens=tokens, positions=positions)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(a.steps):
                sub = mod.submit("decode", tokens=reshaped(prev.outputs[0], (b, 1)), positions=positions)
                prev.output(0)
                prev = sub
            prev.output(0)
            wall = time.perf_counter() - t0
        spans = sorted(
            (e.time_range.start, e.time_range.end)
            for e in prof.events()
            if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start
        )
        busy, end = 0.0, None
        for s0, s1 in spans:  # the union of the kernels' intervals (us)
            if end is None or s0 > end:
                busy += s1 - s0
                end = s1
            elif s1 > end:
                busy += s1 - end
                end = s1
        first, last = spans[0][0], max(s1 for _, s1 in spans)
        print(
            f"profiled {a.steps} steps issued ahead: wall {wall * 1e3 / a.steps:.3f} ms a step (CUPTI slows the "
            f"host), GPU busy {busy / 1e3 / a.steps:.3f} ms a step, {100 * busy / (last - first):.1f}% of the "
            f"kernels' span ({(last - first) / 1e3 / a.steps:.3f} ms a step)"
        )
    for name, v in times.items():
        v = sorted(v)
        print(
            f"{name}: median {statistics.median(v) * 1e3:.3f} ms, p10 {v[len(v) // 10] * 1e3:.3f}, "
            f"p90 {v[9 * len(v) // 10] * 1e3:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
