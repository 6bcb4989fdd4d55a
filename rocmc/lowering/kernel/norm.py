"""RMSNorm and LayerNorm as hand-written kernels (custom_kernels/rms_norm.hip, layer_norm.hip).

The kernels see x as rows x cols: cols = the product of the normalized dims (axis..rank-1), rows = the
product of the others. The host picks how many threads share a row (`group`) from the row length,
mirroring the kernels' register cache: each thread holds up to `cache` 16-byte vectors, so a row of up
to group * cache * width elements is read once; short rows share a 256-thread workgroup. Rows that fit
4 vectors a thread use the `_short` kernels (cache 4): measured on an H100, their lower register count
(40-48 vs 57-64 on sm_90) beats the larger cache up to 4096 f32 / 8192 bf16 columns (BENCHMARKS.md; the
4096-column rows were measured again with bench/kernel_sweep.py, halving the threads per row for cache 8).
"""

from __future__ import annotations

import math

from ...frontend.graph import Node
from .. import kernels
from ..emitter import Emitter, T
from ..module import LowerContext
from ..registry import lowering
from ..target import Target
from .dispatch import WIDE, dispatch, f32_bits

BLOCK = kernels.FAMILIES["rms_norm"].block  # layer_norm's too: both are rows.h kernels
CACHE = 8  # vectors each thread keeps in registers (C in custom_kernels/rows.h)
SHORT_CACHE = 4  # the same for the `_short` kernels
_LIMIT = 1 << 31  # kernels index rows and columns with 32-bit integers


def group_size(cols: int, dtype: str, cache: int = CACHE) -> int:
    """Threads per row: enough for the row to fit the register cache, a power of two in [1, BLOCK]."""
    vec = WIDE[dtype] if cols % WIDE[dtype] == 0 else 1
    need = -(-cols // (vec * cache))
    g = 1
    while g < need and g < BLOCK:
        g *= 2
    return g


def variant(cols, dtype: str) -> tuple[str, int]:
    """(symbol suffix, register cache) of the kernel for a row length (the general one when unknown)."""
    if isinstance(cols, int):
        vec = WIDE[dtype] if cols % WIDE[dtype] == 0 else 1
        if cols <= BLOCK * SHORT_CACHE * vec:
            return "_short", SHORT_CACHE
    return "", CACHE


def _group(E: Emitter, cols, dtype: str, cache: int = CACHE):
    """group_size() for a static row length, or the same choice computed at run time."""
    if isinstance(cols, int):
        return group_size(cols, dtype, cache)
    wide = WIDE[dtype]
    c0, c1 = E.index(0), E.index(1)
    rem = E.op(f"arith.remui {cols}, {E.index(wide)} : index")
    aligned = E.op(f"arith.cmpi eq, {rem}, {c0} : index")
    vec = E.op(f"arith.select {aligned}, {E.index(wide * cache)}, {E.index(cache)} : index")
    need = E.ceildivui(cols, vec)
    g = c1
    size = 2
    while size <= BLOCK:
        more = E.op(f"arith.cmpi ugt, {need}, {E.index(size // 2)} : index")
        g = E.op(f"arith.select {more}, {E.index(size)}, {g} : index")
        size *= 2
    return g


def _grid(E: Emitter, rows, group):
    if isinstance(rows, int) and isinstance(group, int):
        return -(-rows * group // BLOCK)
    return E.ceildivui(E.product([rows, group]), BLOCK)


def _supports(names):
    def supports(node: Node, target: Target):
        x = node.inputs[0]
        if x.dtype.name not in kernels.DTYPES:
            return f"x is {x.dtype}; the kernel is built for {', '.join(kernels.DTYPES)}"
        for v, name in zip(node.inputs[1:], names):
            if v is not None and v.dtype != x.dtype:
                return f"{name} is {v.dtype} but x is {x.dtype}; the kernel reads one element type"
        rows = math.prod(d for d in x.shape[: node.attrs["axis"]] if isinstance(d, int))
        cols = math.prod(d for d in x.shape[node.attrs["axis"] :] if isinstance(d, int))
        if rows * cols >= _LIMIT * 2 or cols >= _LIMIT:
            return f"x has {rows * cols} elements; the kernel indexes rows and columns with 32-bit integers"
        return kernels.arch_problem(target.code_arch)

    return supports


def _rows_cols(E: Emitter, x: T, axis: int):
    dims = E.dims(x)
    return E.product(dims[:axis]), E.product(dims[axis:])


def norm_kernel(E: Emitter, ctx: LowerContext, node: Node, op: str, x: T, affine: list, eps: float, axis: int) -> T:
    """The `op` kernel's dispatch (rms_norm: affine [weight]; layer_norm: [weight, bias], each None when absent)
    normalizing x over its dims axis..; recorded as `node`'s."""
    fam = kernels.FAMILIES[op]
    dtype = x.type.dtype.name
    rows, cols = _rows_cols(E, x, axis)
    suffix, cache = variant(cols, dtype)
    group = _group(E, cols, dtype, cache)
    optional = dict(zip((n for n, _ in fam.flags), affine))  # w (and b): the FLAG_* bits
    flags = fam.flag_bits(**{n: t is not None for n, t in optional.items()})
    constants = {"rows": rows, "cols": cols, "group": group, "eps": f32_bits(eps), "flags": flags}
    grid = _grid(E, rows, group)
    return dispatch(E, ctx, node, f"{op}_{dtype}{suffix}", constants, {"x": x, **optional}, x.type, E.dims(x), grid)


def _lower(op: str):
    def lower(E: Emitter, node: Node, ins, ctx: LowerContext):
        x, *affine = ins
        return [norm_kernel(E, ctx, node, op, x, affine, node.attrs["eps"], node.attrs["axis"])]

    return lower


lowering("rms_norm", impl="kernel", kinds=("rocm", "cuda"), priority=10, supports=_supports(("weight",)))(
    _lower("rms_norm")
)
lowering("layer_norm", impl="kernel", kinds=("rocm", "cuda"), priority=10, supports=_supports(("weight", "bias")))(
    _lower("layer_norm")
)
