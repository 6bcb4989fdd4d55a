"""Generated lowering of resize: one gather over the output with compile-time tap tables.

Per resized dim, `axis_taps` (the op's own definition) gives each output position its input
positions and weights; they become small constant vectors indexed by the output position (one
index vector and one weight vector per tap, never a 2-D table read at a constant column: IREE's GPU
tiling rejects such maps). The body reads every combination of taps across the resized dims with
tensor.extract (2 per dim for linear, 4 for cubic, 1 for nearest) and sums value * product of
weights in f32, so bilinear/trilinear/bicubic are one dispatch, with no intermediate tensors.
Nearest only copies elements (any dtype, no arithmetic). Positions that tf_crop_and_resize maps
outside the input take the extrapolation value. Taps whose weight is zero everywhere are dropped.
"""

from __future__ import annotations

import itertools

import numpy as np

from ... import dtypes
from ...frontend.graph import TensorType
from ...frontend.ops.resize import dim_taps, resized_dims
from ..emitter import Emitter, T, affine_map
from ..registry import lowering


def _tables(E: Emitter, ctx, node, x: T):
    """Per resized dim: (dim, [(index vector, weight vector or None)], outside vector or None)."""
    a = node.attrs
    nearest = a["mode"] == "nearest"
    out = []
    for i in resized_dims(a):
        taps = dim_taps(a, x.shape, i)
        keep = [t for t in range(taps.weight.shape[1]) if np.any(taps.weight[:, t] != 0)] or [0]
        n = taps.index.shape[0]
        vecs = []
        for t in keep:
            idx = ctx.constant(E, taps.index[:, t].astype(np.int32), TensorType((n,), dtypes.i32), "ridx")
            w = (
                None
                if nearest
                else ctx.constant(E, taps.weight[:, t].astype(np.float32), TensorType((n,), dtypes.f32), "rw")
            )
            vecs.append((idx, w))
        outside = None
        if taps.outside.any():
            outside = ctx.constant(E, taps.outside.astype(np.int8), TensorType((n,), dtypes.i8), "rout")
        out.append((i, vecs, outside))
    return out


def _lower_resize(E: Emitter, node, ins, ctx):
    x, a = ins[0], node.attrs
    if not resized_dims(a):
        return [x]
    rank, store = x.rank, x.mlir_elt
    acc = dtypes.acc_mlir(store)
    tables = _tables(E, ctx, node, x)
    operands = []  # (T, dim it is indexed by)
    for dim, vecs, outside in tables:
        operands += [(t, dim) for pair in vecs for t in pair if t is not None]
        operands += [(outside, dim)] if outside is not None else []
    y_type = node.outputs[0].type
    sizes = [E.dim(x, i) if s is None else s for i, s in enumerate(a["sizes"])]
    init = E.empty(sizes, store)

    def body(E, args):
        it = iter(args)
        per_dim = []  # (dim, [(index, weight)], outside flag)
        for dim, vecs, outside in tables:
            taps = []
            for idx, w in vecs:
                i = E.op(f"arith.index_cast {next(it)} : i32 to index")
                taps.append((i, next(it) if w is not None else None))
            per_dim.append((dim, taps, next(it) if outside is not None else None))
        here = [E.op(f"linalg.index {d} : index") for d in range(rank)]
        total = None
        for combo in itertools.product(*(taps for _, taps, _ in per_dim)):
            at = list(here)
            weight = None
            for (dim, _, _), (i, w) in zip(per_dim, combo):
                at[dim] = i
                weight = w if weight is None or w is None else E.op(f"arith.mulf {weight}, {w} : f32")
            v = E.op(f"tensor.extract {x.name}[{', '.join(at)}] : {x.mlir}")
            if weight is None:  # nearest: the element itself
                total = v
                continue
            term = E.op(f"arith.mulf {E.cast_scalar(v, store, acc)}, {E.cast_scalar(weight, 'f32', acc)} : {acc}")
            total = term if total is None else E.op(f"arith.addf {total}, {term} : {acc}")
        result = total if a["mode"] == "nearest" else E.cast_scalar(total, acc, store)
        flags = [E.op(f"arith.cmpi ne, {o}, {E.const(0, 'i8')} : i8") for _, _, o in per_dim if o is not None]
        if flags:
            out = flags[0]
            for f in flags[1:]:
                out = E.op(f"arith.ori {out}, {f} : i1")
            fill = E.const(a["extrapolation_value"], store)
            result = E.op(f"arith.select {out}, {fill}, {result} : {store}")
        return [result]

    maps = [affine_map(rank, [d]) for _, d in operands] + [affine_map(rank, range(rank))]
    r = E.generic(
        [(t.name, t.mlir) for t, _ in operands], [(init, T("", y_type, store).mlir)], maps, ["parallel"] * rank, body
    )
    return [T(r[0], y_type)]


lowering("resize")(_lower_resize)
