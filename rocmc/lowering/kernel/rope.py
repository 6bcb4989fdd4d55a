"""RoPE as a hand-written kernel (custom_kernels/rope.hip): half-split or interleaved pairs, (b, h, t, d)
or (b, t, h, d), partial rotation, shared or per-batch tables, optional position_ids. rope_store_kv as one
(custom_kernels/rope_store_kv.hip): RoPE of q and k and the store of k and v into the KV cache in one pass, the
cache updated in place (a tied result).

The head dim is static (the op requires it), so the work split is decided here: items of U elements
(16 bytes when the head dim and r allow it), one per thread, and a grid that covers them once.
"""

from __future__ import annotations

import math

from ...frontend.graph import Node
from .. import kernels
from ..emitter import Emitter
from ..module import LowerContext
from ..registry import lowering
from ..target import Target
from .dispatch import WIDE, dispatch, dispatch_results

FAMILY = kernels.FAMILIES["rope"]
BLOCK = FAMILY.block
# layout -> positions of (b, h, t) in x
AXES = {"bhsd": (0, 1, 2), "bshd": (0, 2, 1)}


def items_per_row(d: int, r: int, interleaved: bool, dtype: str) -> int:
    """Work items of one (b, h, t) row, as the kernel splits it when 16-byte accesses apply."""
    w = WIDE[dtype]
    u = w if d % w == 0 and r % w == 0 else (2 if interleaved else 1)
    return d // u if interleaved else d // u - r // u


def supports(node: Node, target: Target):
    x, cos, _, pos = node.inputs
    if x.dtype.name not in kernels.DTYPES:
        return f"x is {x.dtype}; the kernel is built for {', '.join(kernels.DTYPES)}"
    if pos is not None and pos.dtype.name not in ("i32", "i64"):
        return f"position_ids are {pos.dtype}; the kernel reads i32 or i64"
    if cos.dtype != x.dtype:
        return f"cos/sin are {cos.dtype} but x is {x.dtype}; the kernel reads one element type"
    n = math.prod(s for s in x.shape if isinstance(s, int))
    if n >= 1 << 32:
        return f"x has {n} elements; the kernel indexes rows with 32-bit integers"
    return kernels.arch_problem(target.code_arch)


def lower(E: Emitter, node: Node, ins, ctx: LowerContext):
    x, cos, sin, pos = ins
    a = node.attrs
    dims = E.dims(x)
    b, h, t = (dims[i] for i in AXES[a["layout"]])
    d, r = x.shape[3], a["rotary_dim"] // 2
    dtype = x.type.dtype.name
    # Table rows per batch: 0 when one (T, r) table (or a batch-1 table) serves every batch.
    table_stride = 0 if cos.rank == 2 or cos.shape[0] == 1 else E.dim(cos, 1)
    pos_stride = 0 if pos is None or pos.shape[0] == 1 else t
    flags = FAMILY.flag_bits(
        bshd=a["layout"] == "bshd", pos=pos is not None, pos_i64=pos is not None and pos.type.dtype.bits == 64
    )
    rows = E.product([b, h, t])
    groups = E.ceildivui(E.product([rows, items_per_row(d, r, a["interleaved"], dtype)]), BLOCK)
    symbol = f"rope_{'interleaved' if a['interleaved'] else 'half'}_{dtype}"
    constants = {
        "b": b,
        "h": h,
        "t": t,
        "d": d,
        "r": r,
        "table_stride": table_stride,
        "pos_stride": pos_stride,
        "nblocks": groups,
        "flags": flags,
    }
    return [dispatch(E, ctx, node, symbol, constants, {"x": x, "cs": cos, "sn": sin, "pos": pos}, x.type, dims, groups)]


lowering("rope", impl="kernel", kinds=("rocm", "cuda"), priority=10, supports=supports)(lower)


STORE = kernels.FAMILIES["rope_store_kv"]
_TABLES = ("f32", "f16", "bf16")


def supports_store(node: Node, target: Target):
    qkv, _, cos, _, pos, slots = node.inputs
    if qkv.dtype.name not in kernels.DTYPES:
        return f"qkv is {qkv.dtype}; the kernel is built for {', '.join(kernels.DTYPES)}"
    if cos.dtype.name not in _TABLES:
        return f"the tables are {cos.dtype}; the kernel reads {', '.join(_TABLES)}"
    for name, v in (("positions", pos), ("slots", slots)):
        if v is not None and v.dtype.name not in ("i32", "i64"):
            return f"{name} are {v.dtype}; the kernel reads i32 or i64"
    n = math.prod(s for s in qkv.shape if isinstance(s, int))
    if n >= 1 << 31:
        return f"qkv has {n} elements; the kernel indexes them with 32-bit integers"
    return kernels.arch_problem(target.code_arch)


def lower_store(E: Emitter, node: Node, ins, ctx: LowerContext):
    qkv, cache, cos, sin, pos, slots = ins
    a = node.attrs
    hq, hkv, (k0, v0), rot = a["heads"], a["kv_heads"], a["entries"], a["rotary_dim"]
    b, t, heads, d = E.dims(qkv)
    r, dtype, w = rot // 2, qkv.type.dtype.name, WIDE[qkv.type.dtype.name]
    shared = lambda v: v is not None and v.shape[0] == 1 and qkv.shape[0] != 1  # noqa: E731 - one for all rows
    n = E.product([b, t])
    unit = w if d % w == 0 and r % w == 0 else (2 if a["interleaved"] else 1)
    groups = E.ceildivui(E.product([n, heads, d // unit]), STORE.block)
    tab = cos.type.dtype.name
    flags = STORE.flag_bits(
        pos_i64=pos.type.dtype.bits == 64,
        slots=slots is not None,
        slots_i64=slots is not None and slots.type.dtype.bits == 64,
        tab_f32=tab == "f32",
        tab_f16=tab == "f16",
    )
    constants = {
        "n": n,
        "t": t,
        "hq": hq,
        "hkv": hkv,
        "d": d,
        "r": r,
        "S": cache.shape[2],
        "E": cache.shape[0],
        "P": E.dim(cos, 0),
        "k0": k0,
        "v0": v0,
        "pos_stride": 0 if shared(pos) else t,
        "slot_stride": 0 if shared(slots) else 1,
        "nblocks": groups,
        "flags": flags,
    }
    symbol = f"rope_store_kv_{'interleaved' if a['interleaved'] else 'half'}_{dtype}"
    inputs = {"qkv": qkv, "cs": cos, "sn": sin, "pos": pos, "slots": slots, "cache": cache}
    q_type = node.outputs[0].type
    new_cache, q = dispatch_results(E, ctx, node, symbol, constants, inputs, {"q": (q_type, [b, t, hq, d])}, groups)
    return [q, new_cache]


lowering("rope_store_kv", impl="kernel", kinds=("rocm", "cuda"), priority=10, supports=supports_store)(lower_store)
