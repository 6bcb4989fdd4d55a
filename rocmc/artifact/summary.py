"""An artifact's summary in words (`Artifact.summary()`, `rocmc inspect`): its functions, parameters
and states, what rocmc.rewrite replaced, its collectives, its dispatches and the implementations passed over."""

from __future__ import annotations

import math

from ..dtypes import ALL as DTYPES
from .schema import functions


def summary_text(art, stages: bool) -> str:
    """The summary of `art`; `stages`: it was made by rocmc.compile, so its dispatches can be listed."""
    lines = [repr(art)]
    if art.metadata.get("compile_note"):
        lines.append(f"note: {art.metadata['compile_note']}")
    if len(art.functions) > 1:
        lines.append(f"functions: {', '.join(art.functions)}")
    if art.parameters:
        total = sum(math.prod(p["shape"]) * DTYPES[p["dtype"]].np.itemsize for p in art.parameters)
        lines.append(f"parameters: {len(art.parameters)} ({total / 2**20:.1f} MiB), from {art.parameter_source()}")
        for p in art.parameters:
            n = math.prod(p["shape"]) * DTYPES[p["dtype"]].np.itemsize
            lines.append(f"  {p['name']:<48} {p['dtype']}[{','.join(map(str, p['shape']))}] {n} bytes")
    held = any("held_states" in f for f in functions(art.metadata))
    where = (
        "on the device, held by the loaded Module: the functions take it from their caller, updated in place"
        if held
        else "on the device, a global of the module"
    )
    for st in art.metadata.get("states", []):
        lines.append(f"state: {st['name']} {st['dtype']}[{','.join(map(str, st['shape']))}] ({where})")
    for f in functions(art.metadata) if held else []:
        if f.get("async_storage") == "caller":
            lines.append(
                f"  {f['asynchronous']}: its results' buffers and transient storage come from the caller "
                "(no queue allocation for them)"
            )
    lines += rewrite_lines(art.metadata) + _collective_lines(art.metadata)
    if not stages:
        lines.append("dispatches: (listed for artifacts made by rocmc.compile; this one was loaded)")
        lines += [
            f"  {c['node']:<6} {c['op']:<16} {c['impl']}"
            for f in functions(art.metadata)
            for c in f["implementations"]
            if c["impl"] != "generated"
        ]
        return "\n".join(lines)
    lines.append("dispatches:")
    for d in art.dispatches():
        extra = f" [{d['arch']}]" if "arch" in d else ""
        lines.append(
            f"  {d['name']:<60} {d['kind']:<12} {d['impl']:<10}{extra} {' '.join(d['nodes'])} ({', '.join(d['ops'])})"
        )
    return "\n".join(lines + _passed_over(art.metadata))


def rewrite_lines(meta: dict) -> list[str]:
    """What rocmc.rewrite replaced, one line per fused node: `rewrite: rms_norm %16 <- 8 nodes (...)`."""
    if "rewrites" not in meta:
        return ["rewrite: off"]
    if not meta["rewrites"]:
        return ["rewrite: nothing recognized"]
    out = []
    for r in meta["rewrites"]:
        where = f"{r['function']}: " if r["function"] != meta.get("function", "main") else ""
        nodes = ", ".join(f"{i} {op}" for i, op in r["replaced"])
        out.append(f"rewrite: {where}{r['op']} {r['node']} <- {len(r['replaced'])} nodes ({nodes})")
    return out


def _collective_lines(meta: dict) -> list[str]:
    """A tensor-parallel rank's program: how many ranks, and each function's collectives by implementation."""
    world = meta.get("world_size", 1)
    if world == 1:
        return []
    how = {"iree": "NCCL/RCCL enqueued by IREE on the device stream", "host": "the host process group"}
    lines = [f"tensor parallel: one of {world} ranks (run with `rocmc launch -n {world}`); collectives per call:"]
    for f in functions(meta):
        counts: dict = {}
        for c in f["implementations"]:
            if c["op"] in ("all_reduce", "all_gather"):
                counts[(c["op"], c["impl"])] = counts.get((c["op"], c["impl"]), 0) + 1
        if counts:
            lines.append(
                f"  {f['name']}: "
                + ", ".join(f"{n} {op} ({impl}: {how.get(impl, impl)})" for (op, impl), n in sorted(counts.items()))
            )
    return lines


def _passed_over(meta: dict) -> list[str]:
    """Nodes where a preferred implementation (a library call, a hand-written kernel) was not used,
    with the reason: e.g. a GEMM too small for a library call."""
    rows = [c for f in functions(meta) for c in f["implementations"] if c.get("skipped")]
    if not rows:
        return []
    return ["passed over:"] + [
        f"  {c['node']:<6} {c['op']:<16} {c['impl']:<10} ({'; '.join(c['skipped'])})" for c in rows
    ]
