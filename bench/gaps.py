"""Where a GPU call's idle time goes, from a profile's Chrome trace (torch.profiler / Kineto).

    python -m bench.gaps TRACE.json [--call rocmc_call]

Each GPU operation (kernel, copy, fill) is matched to the host call that issued it (the trace's
`correlation`). Inside each marked call, every gap between one operation's end and the next one's start is
split in two: the part during which the next operation had not been issued yet (the GPU waited for the
host: `starved`) and the part after it was issued (`queued`: the work was there, the GPU still did not run
it: launch latency, a wait on an event, a change of configuration between kernels). The host's own time is
listed by API call, so a blocking call (an event or stream synchronize, an allocation that waits) shows.
`bench/llm_gpu.py run --profile --trace DIR` writes such traces and stores this analysis with its profile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATS = {"cuda_runtime", "cuda_driver"}


def analyse(trace: dict, call: str = "rocmc_call") -> dict:
    """Medians over the marked calls (us), the queued gaps' largest followers, and host API time by name."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    calls = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == call)
    issued = {}
    host = []
    for e in events:
        if e.get("cat") in HOST_CATS:
            host.append(e)
            corr = e.get("args", {}).get("correlation")
            if corr is not None:
                issued[corr] = e["ts"] + e["dur"]
    gpu = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"], issued.get(e.get("args", {}).get("correlation")))
        for e in events
        if e.get("cat") in GPU_CATS
    )
    rows, followers, api = [], {}, {}
    for c0, c1 in calls:
        ops = [g for g in gpu if g[3] is not None and c0 <= g[3] <= c1]
        if not ops:
            continue
        starved = queued = 0.0
        n_queued = 0
        for prev, cur in zip(ops, ops[1:]):
            gap = cur[0] - prev[1]
            if gap <= 0:
                continue
            late = min(gap, max(0.0, cur[3] - prev[1]))  # the host issued it only after prev ended
            starved += late
            queued += gap - late
            if gap - late > 0:
                n_queued += 1
                name = _short(cur[2])
                n, t = followers.get(name, (0, 0.0))
                followers[name] = (n + 1, t + gap - late)
        for e in host:
            if c0 <= e["ts"] <= c1:
                n, t = api.get(e["name"], (0, 0.0))
                api[e["name"]] = (n + 1, t + e["dur"])
        rows.append(
            {
                "call_us": c1 - c0,
                "gpu_ops": len(ops),
                "gpu_busy_us": sum(o[1] - o[0] for o in ops),
                "first_issue_to_start_us": ops[0][0] - ops[0][3],
                "gap_starved_us": starved,
                "gap_queued_us": queued,
                "gaps_queued": n_queued,
                "after_last_issue_us": ops[-1][1] - max(o[3] for o in ops),
            }
        )
    if not rows:
        return {"calls": 0}
    k = len(rows)
    out = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    out["calls"] = k
    out["queued_gap_before"] = [
        {"name": n, "per_call": c / k, "us_per_call": t / k}
        for n, (c, t) in sorted(followers.items(), key=lambda kv: -kv[1][1])[:12]
    ]
    out["host_api"] = [
        {"name": n, "per_call": c / k, "us_per_call": t / k}
        for n, (c, t) in sorted(api.items(), key=lambda kv: -kv[1][1])[:12]
    ]
    return out


def _short(name: str) -> str:
    return name.split("(")[0][:80]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--call", default="rocmc_call")
    a = ap.parse_args()
    print(json.dumps(analyse(json.loads(a.trace.read_text()), a.call), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
