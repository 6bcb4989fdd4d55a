"""RoPE as a hand-written kernel (custom_kernels/rope.hip): half-split or interleaved pairs, (b, h, t, d)
or (b, t, h, d), partial rotation, shared or per-batch tables, optional position_ids.

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
from .dispatch import WIDE, dispatch

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
