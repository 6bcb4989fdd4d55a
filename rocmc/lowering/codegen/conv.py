"""Generated lowering of the convolution family: linalg named convolutions and poolings.

- conv: tensor.pad, then `linalg.conv_{1d_ncw_fcw,2d_nchw_fchw,3d_ncdhw_fcdhw}` (grouped:
  `conv_2d_ngchw_gfchw` on expanded shapes, a linalg.generic for 1-D and 3-D, which have no grouped
  named op) into an accumulator that starts as the broadcast bias.
  f16/bf16 accumulate in f32 (the named ops extend their inputs to the `outs` type) and round once.
- transposed conv: the input is spread out (stride-1 zeros between elements) and padded by
  dilation*(k-1) - pad (cropped where that is negative), then convolved at stride 1 with the kernel
  flipped and its channel dims swapped.
- pools: `linalg.pooling_nchw_max` over -inf padding (an integer max pads with the type's least
  value), `pooling_nchw_sum` over zero padding divided by each window's count (a compile-time table
  when spatial dims are static, index arithmetic in the body otherwise); 3-D pools and integer max
  pools are the same windows as a linalg.generic (linalg has no NCDHW pooling, and its NCHW max is
  signed only). ceil_mode pads the high side so the last partial window exists.
- static inputs are cropped to the extent the windows read: IREE rewrites a single-window conv or
  pool into a reduction that expects the window to cover the whole (padded) input.
- batch norm and LRN compute in f32 whatever the storage type; dropout is the identity.

The batch and spatial dims may be dynamic: output sizes are computed with index arithmetic that
folds to constants when the input sizes are static.
"""

from __future__ import annotations

import functools

import numpy as np

from ... import symbolic
from ... import dtypes
from ...frontend.graph import TensorType
from ...frontend.ops.conv import pool_taps
from ..emitter import Emitter, T, affine_map, tensor_type
from ..registry import lowering

NAMED_CONV = {1: "linalg.conv_1d_ncw_fcw", 2: "linalg.conv_2d_nchw_fchw", 3: "linalg.conv_3d_ncdhw_fcdhw"}
NAMED_POOL = {2: "linalg.pooling_nchw"}


def _i64s(vals) -> str:
    return f"dense<[{', '.join(map(str, vals))}]> : tensor<{len(vals)}xi64>"


# Sizes are ints when static and SSA index values when dynamic (the Emitter's index arithmetic folds the
# former); types spell a dynamic dim "?".
def _typed(name: str, sizes, like: T, elt=None) -> T:
    return T(
        name,
        TensorType(tuple(s if isinstance(s, int) else "?" for s in sizes), like.type.dtype),
        elt if elt is not None else like.elt,
    )


def _csv(vals) -> str:
    return ", ".join(str(v) for v in vals)


def _pad(E: Emitter, x: T, lows, highs, value) -> T:
    """tensor.pad with constant `value`; amounts are sizes (ints or SSA index values)."""
    if all(isinstance(v, int) and v == 0 for v in list(lows) + list(highs)):
        return x
    sizes = [
        d + lo + hi if all(isinstance(v, int) for v in (d, lo, hi)) else "?" for d, lo, hi in zip(x.shape, lows, highs)
    ]
    out = _typed(E.fresh("pad"), sizes, x)
    c = E.const(value, x.mlir_elt)
    with E.region(
        f"{out.name} = tensor.pad {x.name} low[{_csv(lows)}] high[{_csv(highs)}]",
        f": {x.mlir} to {out.mlir}",
        ["index"] * len(sizes),
        "i",
    ):
        E.emit(f"tensor.yield {c} : {x.mlir_elt}")
    return out


def _split_channels(E: Emitter, t: T, axis: int, groups: int, op="expand") -> T:
    """(.., C, ..) <-> (.., G, C/G, ..) at `axis` (tensor.expand_shape / collapse_shape)."""
    dims = E.dims(t)
    if op == "expand":
        sizes = dims[:axis] + [groups, dims[axis] // groups] + dims[axis + 1 :]
        assoc = [[i] for i in range(axis)] + [[axis, axis + 1]] + [[i + 1] for i in range(axis + 1, t.rank)]
    else:
        sizes = dims[:axis] + [dims[axis] * dims[axis + 1]] + dims[axis + 2 :]
        assoc = [[i] for i in range(axis)] + [[axis, axis + 1]] + [[i] for i in range(axis + 2, t.rank)]
    out = _typed(E.fresh("r"), sizes, t)
    reassoc = "[" + ", ".join("[" + _csv(g) + "]" for g in assoc) + "]"
    if op == "expand":
        E.emit(
            f"{out.name} = tensor.expand_shape {t.name} {reassoc} output_shape [{_csv(sizes)}] "
            f": {t.mlir} into {out.mlir}"
        )
    else:
        E.emit(f"{out.name} = tensor.collapse_shape {t.name} {reassoc} : {t.mlir} into {out.mlir}")
    return out


def _init(E: Emitter, sizes, like: T, bias: T | None, elt: str) -> T:
    """The accumulator: zeros, or the bias broadcast along the channel dim (1)."""
    if bias is None:
        return _typed(E.filled(sizes, elt, 0.0), sizes, like, elt)
    init = _typed(E.empty(sizes, elt), sizes, like, elt)
    rank = len(sizes)
    src = bias.mlir_elt
    r = E.generic(
        [(bias.name, bias.mlir)],
        [(init.name, init.mlir)],
        [affine_map(rank, [1]), affine_map(rank, range(rank))],
        ["parallel"] * rank,
        lambda E, a: [E.cast_scalar(a[0], src, elt)],
    )
    return _typed(r[0], sizes, like, elt)


def _result(E: Emitter, node, t: T) -> list:
    """The node's result: its graph type (symbolic dims by name) in its storage element type."""
    out = node.outputs[0].type
    return [E.convert(T(t.name, out, t.elt), out.dtype.mlir)]


def _grouped_generic(E: Emitter, x: T, w: T, init: T, strides, dilations) -> str:
    """Grouped conv (1-D, 3-D) as linalg.generic over (n, g, f, o..., c, k...): no named op exists."""
    nsp = len(strides)
    c = 3 + nsp
    ks = [c + 1 + i for i in range(nsp)]
    pos = [f"d{3 + i} * {s} + d{k} * {d}" for i, (s, d, k) in enumerate(zip(strides, dilations, ks))]
    rank = c + 1 + nsp
    maps = [
        affine_map(rank, [0, 1, c, *pos]),
        affine_map(rank, [1, 2, c, *ks]),
        affine_map(rank, [0, 1, 2, *range(3, 3 + nsp)]),
    ]
    acc = init.mlir_elt

    def body(E, a):
        xs, ws = E.cast_scalar(a[0], x.mlir_elt, acc), E.cast_scalar(a[1], w.mlir_elt, acc)
        m = E.op(f"arith.mulf {xs}, {ws} : {acc}")
        return [E.op(f"arith.addf {a[2]}, {m} : {acc}")]

    return E.generic(
        [(x.name, x.mlir), (w.name, w.mlir)],
        [(init.name, init.mlir)],
        maps,
        ["parallel"] * (3 + nsp) + ["reduction"] * (1 + nsp),
        body,
    )[0]


def _conv(E: Emitter, xp: T, w: T, bias: T | None, strides, dilations, groups) -> T:
    """Convolution of an already padded input: returns the accumulator (f32 for f16/bf16)."""
    nsp = xp.rank - 2
    acc = dtypes.acc_mlir(xp.mlir_elt)
    dims = E.dims(xp)
    geometry = list(zip(w.shape[2:], strides, dilations))
    out = [E.addi(E.divsi(E.subi(dims[2 + i], d * (k - 1) + 1), s), 1) for i, (k, s, d) in enumerate(geometry)]
    xp = _crop(E, xp, [E.addi(E.muli(E.subi(o, 1), s), d * (k - 1) + 1) for o, (k, s, d) in zip(out, geometry)])
    init = _init(E, [dims[0], w.shape[0], *out], xp, bias, acc)
    attrs = f"{{dilations = {_i64s(dilations)}, strides = {_i64s(strides)}}}"
    if groups == 1:
        r = E.op(
            f"{NAMED_CONV[nsp]} {attrs} ins({xp.name}, {w.name} : {xp.mlir}, {w.mlir}) "
            f"outs({init.name} : {init.mlir}) -> {init.mlir}"
        )
        return T(r, init.type, acc)
    xg = _split_channels(E, xp, 1, groups)  # (N, G, C/G, ...)
    wg = _split_channels(E, w, 0, groups)  # (G, F/G, C/G, k...)
    ig = _split_channels(E, init, 1, groups)  # (N, G, F/G, ...)
    if nsp == 2:
        r = E.op(
            f"linalg.conv_2d_ngchw_gfchw {attrs} ins({xg.name}, {wg.name} : {xg.mlir}, {wg.mlir}) "
            f"outs({ig.name} : {ig.mlir}) -> {ig.mlir}"
        )
    else:
        r = _grouped_generic(E, xg, wg, ig, strides, dilations)
    return _split_channels(E, T(r, ig.type, acc), 1, groups, "collapse")


def _lower_conv(E: Emitter, node, ins, ctx):
    x, w, b = ins
    a = node.attrs
    xp = _pad(E, x, [0, 0] + [p[0] for p in a["padding"]], [0, 0] + [p[1] for p in a["padding"]], 0.0)
    return _result(E, node, _conv(E, xp, w, b, a["stride"], a["dilation"], a["groups"]))


def _flip_swap(E: Emitter, w: T, groups: int) -> T:
    """(C_in, F/G, k...) -> (F, C_in/G, k...) with every kernel dim reversed: the forward-conv
    weight whose correlation equals the transposed convolution. A gather (tensor.extract in the
    body): IREE's tiling rejects the reversed indexing map `k-1-d` on a generic operand."""
    nsp = w.rank - 2
    wg = _split_channels(E, w, 0, groups)  # (G, C/G, F/G, k...)
    g, c, f, *k = wg.shape
    sizes = [g, f, c, *k]
    init = E.empty(sizes, w.mlir_elt)

    def body(E, a):
        i = [E.op(f"linalg.index {d} : index") for d in range(3 + nsp)]
        flipped = [E.subi(kk - 1, i[3 + j]) for j, kk in enumerate(k)]
        return [E.op(f"tensor.extract {wg.name}[{_csv([i[0], i[2], i[1], *flipped])}] : {wg.mlir}")]

    r = E.generic(
        [],
        [(init, tensor_type(sizes, w.mlir_elt))],
        [affine_map(3 + nsp, range(3 + nsp))],
        ["parallel"] * (3 + nsp),
        body,
    )
    return _split_channels(E, _typed(r[0], sizes, w), 0, groups, "collapse")


def _spread_gather(E: Emitter, x: T, strides, lows, highs) -> T:
    """The strided case: x[i] lands at i*stride + low, zeros elsewhere, as one gather generic
    (a strided tensor.insert_slice into zeros fails IREE's ROCm codegen when sizes are dynamic)."""
    dims = E.dims(x)
    sizes = dims[:2] + [
        E.addi(E.muli(E.subi(d, 1), s), 1 + lo + hi) for d, s, lo, hi in zip(dims[2:], strides, lows, highs)
    ]
    init = _typed(E.empty(sizes, x.mlir_elt), sizes, x)

    def body(E, a):
        n, c, *pos = (E.op(f"linalg.index {i} : index") for i in range(x.rank))
        zero, one = E.index(0), E.index(1)
        at, ok = [], E.const(True, "i1")
        for p, d, s, lo in zip(pos, dims[2:], strides, lows):
            i = E.subi(p, lo)
            q = E.divsi(i, s)
            on_grid = E.op(f"arith.cmpi eq, {E.op(f'arith.remsi {i}, {E.index(s)} : index')}, {zero} : index")
            inside = E.op(
                f"arith.andi {E.op(f'arith.cmpi sge, {i}, {zero} : index')}, "
                f"{E.op(f'arith.cmpi slt, {q}, {E.as_index(d)} : index')} : i1"
            )
            ok = E.op(f"arith.andi {ok}, {E.op(f'arith.andi {on_grid}, {inside} : i1')} : i1")
            at.append(E.maxsi(E.minsi(q, E.subi(d, one)), zero))
        v = E.op(f"tensor.extract {x.name}[{_csv([n, c, *at])}] : {x.mlir}")
        return [E.op(f"arith.select {ok}, {v}, {E.const(0.0, x.mlir_elt)} : {x.mlir_elt}")]

    r = E.generic([], [(init.name, init.mlir)], [affine_map(x.rank, range(x.rank))], ["parallel"] * x.rank, body)
    return _typed(r[0], sizes, x)


def _spread(E: Emitter, x: T, strides, lows, highs) -> T:
    """Zero-insert (stride-1 zeros between elements) and pad by lows/highs, which may be negative."""
    if any(s > 1 for s in strides):
        return _spread_gather(E, x, strides, lows, highs)
    t = _pad(E, x, [0, 0] + [max(v, 0) for v in lows], [0, 0] + [max(v, 0) for v in highs], 0.0)
    if all(v >= 0 for v in lows + highs):
        return t
    crop_lo, crop_hi = [max(-v, 0) for v in lows], [max(-v, 0) for v in highs]
    dims = E.dims(t)
    sizes = dims[:2] + [E.subi(d, lo + hi) for d, lo, hi in zip(dims[2:], crop_lo, crop_hi)]
    out = _typed(E.fresh("crop"), sizes, t)
    E.emit(
        f"{out.name} = tensor.extract_slice {t.name}[0, 0, {_csv(crop_lo)}] [{_csv(sizes)}] "
        f"[{_csv([1] * t.rank)}] : {t.mlir} to {out.mlir}"
    )
    return out


def _lower_conv_transpose(E: Emitter, node, ins, ctx):
    x, w, b = ins
    a = node.attrs
    reach = [d * (k - 1) for d, k in zip(a["dilation"], w.shape[2:])]
    lows = [r - p[0] for r, p in zip(reach, a["padding"])]
    highs = [r - p[1] + op for r, p, op in zip(reach, a["padding"], a["output_padding"])]
    xs = _spread(E, x, a["stride"], lows, highs)
    wf = _flip_swap(E, w, a["groups"])
    return _result(E, node, _conv(E, xs, wf, b, [1] * len(reach), a["dilation"], a["groups"]))


def _pool_input(E: Emitter, node, x: T, dilation, value):
    """The input as the windows read it: padded low by the attribute and high up to the extent the
    last window reaches (in ceil_mode it may overhang the attribute's padding), then cropped to that
    extent (a ceil_mode window dropped for starting in the padding, or floor mode, leaves trailing
    elements unread). Returns the input and the output's spatial sizes."""
    a = node.attrs
    highs, outs, reach = [], [], []
    for i in range(x.rank - 2):
        size, k, s, (lo, hi) = E.dim(x, 2 + i), a["kernel_size"][i], a["stride"][i], a["padding"][i]
        out = symbolic.pool_size(E.ix, size, k, s, lo, hi, dilation[i], ceil=a["ceil_mode"])
        need = E.addi(E.muli(E.subi(out, 1), s), dilation[i] * (k - 1) + 1)
        highs.append(E.maxsi(E.subi(need, E.addi(size, lo)), 0))
        outs.append(out)
        reach.append(need)
    xp = _pad(E, x, [0, 0] + [p[0] for p in a["padding"]], [0, 0] + highs, value)
    return _crop(E, xp, reach), outs


def _crop(E: Emitter, x: T, reach) -> T:
    """x without the trailing spatial elements no window reads (`reach`: the extent the windows
    span per spatial dim). Static dims only: the rewrite that needs an exact fit sees static shapes."""
    dims = E.dims(x)
    spatial = [r if isinstance(r, int) and isinstance(d, int) else d for d, r in zip(dims[2:], reach)]
    if spatial == dims[2:]:
        return x
    sizes = dims[:2] + spatial
    out = _typed(E.fresh("crop"), sizes, x)
    E.emit(
        f"{out.name} = tensor.extract_slice {x.name}[{_csv([0] * x.rank)}] [{_csv(sizes)}] "
        f"[{_csv([1] * x.rank)}] : {x.mlir} to {out.mlir}"
    )
    return out


def _combine(kind: str, x: T) -> str:
    """The scalar op that folds one window element into the pool's accumulator."""
    if kind == "sum":
        return "arith.addf"
    if x.type.dtype.is_float:
        return "arith.maximumf"
    return "arith.maxui" if x.type.dtype.unsigned else "arith.maxsi"


def _pool(E: Emitter, kind: str, xp: T, kernel, strides, dilations, init: T) -> T:
    """Reduce (max or sum) each window of the padded input into `init`. Integer max pools take the
    generic form: linalg's NCHW max pooling is signed only."""
    nsp = len(kernel)
    k = E.empty(kernel, init.mlir_elt)
    kty = tensor_type(kernel, init.mlir_elt)
    if nsp in NAMED_POOL and xp.type.dtype.is_float:
        r = E.op(
            f"{NAMED_POOL[nsp]}_{kind} {{dilations = {_i64s(dilations)}, strides = {_i64s(strides)}}} "
            f"ins({xp.name}, {k} : {xp.mlir}, {kty}) outs({init.name} : {init.mlir}) -> {init.mlir}"
        )
        return T(r, init.type, init.elt)
    rank = 2 + 2 * nsp
    pos = [f"d{2 + i} * {s} + d{2 + nsp + i} * {d}" for i, (s, d) in enumerate(zip(strides, dilations))]
    maps = [affine_map(rank, [0, 1, *pos]), affine_map(rank, range(2 + nsp, rank)), affine_map(rank, range(2 + nsp))]
    src, acc, combine = xp.mlir_elt, init.mlir_elt, _combine(kind, xp)

    def body(E, a):
        return [E.op(f"{combine} {a[2]}, {E.cast_scalar(a[0], src, acc)} : {acc}")]

    r = E.generic(
        [(xp.name, xp.mlir), (k, kty)],
        [(init.name, init.mlir)],
        maps,
        ["parallel"] * (2 + nsp) + ["reduction"] * nsp,
        body,
    )
    return T(r[0], init.type, init.elt)


def _lower_max_pool(E: Emitter, node, ins, ctx):
    x, a = ins[0], node.attrs
    # Max is exact in the storage type: no wider accumulator needed. Padding with the type's
    # least value (-inf for floats) never wins.
    dt = x.type.dtype
    least = float("-inf") if dt.is_float else int(np.iinfo(dt.np).min)
    xp, out = _pool_input(E, node, x, a["dilation"], least)
    sizes = E.dims(x)[:2] + out
    init = _typed(E.filled(sizes, x.mlir_elt, least), sizes, x)
    return _result(E, node, _pool(E, "max", xp, a["kernel_size"], a["stride"], a["dilation"], init))


def window_counts(size, k, s, pads, d, n_out, include_pad) -> np.ndarray:
    """Taps each output position averages over along one dim (the op's own rule, pool_taps)."""
    return np.array([inside if include_pad else len(taps) for taps, inside in pool_taps(size, k, s, pads, d, n_out)])


def _window_count(E: Emitter, o: str, size, k, s, pads, d, include_pad) -> str:
    """window_counts for one position `o` (an index value), for sizes known only at run time: the
    taps j in [0, k) with lo <= start + j*d < hi."""
    start = E.subi(E.muli(o, s), pads[0])
    lo, hi = (E.index(-pads[0]), E.as_index(E.addi(size, pads[1]))) if include_pad else (E.index(0), E.as_index(size))
    first = E.maxsi(E.op(f"arith.ceildivsi {E.subi(lo, start)}, {E.index(d)} : index"), 0)
    # j*d < hi - start, i.e. j < ceil((hi - start) / d): one past the last tap inside
    last = E.minsi(E.op(f"arith.ceildivsi {E.subi(hi, start)}, {E.index(d)} : index"), k)
    return E.maxsi(E.subi(last, first), 0)


def _lower_avg_pool(E: Emitter, node, ins, ctx):
    x, a = ins[0], node.attrs
    acc, store = dtypes.acc_mlir(x.mlir_elt), x.mlir_elt
    nsp = x.rank - 2
    xp, out = _pool_input(E, node, x, a["dilation"], 0.0)
    sizes = E.dims(x)[:2] + out
    total = _pool(
        E, "sum", xp, a["kernel_size"], a["stride"], a["dilation"], _typed(E.filled(sizes, acc, 0.0), sizes, x, acc)
    )
    total = T(total.name, node.outputs[0].type, acc)
    spatial = E.dims(x)[2:]
    geometry = [
        (spatial[i], a["kernel_size"][i], a["stride"][i], a["padding"][i], a["dilation"][i]) for i in range(nsp)
    ]
    include = a["count_include_pad"]
    if all(isinstance(d, int) for d in spatial):
        # The divisor only depends on the position: a separable table, computed here once.
        per_dim = [window_counts(*g, out[i], include) for i, g in enumerate(geometry)]
        table = functools.reduce(np.multiply.outer, per_dim).astype(np.float32)
        counts = ctx.constant(E, table, TensorType(table.shape, dtypes.f32), "cnt")

        def body(E, v):
            q = E.op(f"arith.divf {v[0]}, {E.cast_scalar(v[1], 'f32', acc)} : {acc}")
            return E.cast_scalar(q, acc, store)

        return [E.map([total, counts], node.outputs[0].type, body)]

    def dynamic_body(E, v):
        n = [_window_count(E, E.op(f"linalg.index {2 + i} : index"), *g, include) for i, g in enumerate(geometry)]
        count = E.product(n)
        count = E.op(f"arith.index_cast {count} : index to i64")
        q = E.op(f"arith.divf {v[0]}, {E.cast_scalar(count, 'i64', acc)} : {acc}")
        return E.cast_scalar(q, acc, store)

    return [E.map([total], node.outputs[0].type, dynamic_body)]


def _channel_generic(E: Emitter, x: T, params: list, out_type: TensorType, body) -> T:
    """Elementwise over x with per-channel (axis 1) parameter vectors."""
    rank = x.rank
    init = E.empty(E.dims(x), x.mlir_elt)
    maps = [affine_map(rank, range(rank))] + [affine_map(rank, [1])] * len(params) + [affine_map(rank, range(rank))]
    r = E.generic(
        [(x.name, x.mlir)] + [(p.name, p.mlir) for p in params], [(init, x.mlir)], maps, ["parallel"] * rank, body
    )
    return T(r[0], out_type, x.elt)


def _lower_batch_norm(E: Emitter, node, ins, ctx):
    x, mean, var, w, b = ins
    params = [p for p in (mean, var, w, b) if p is not None]
    store, t = x.mlir_elt, "f32"

    def body(E, a):
        xs, m, v, *rest = (E.cast_scalar(s, p.mlir_elt, t) for s, p in zip(a, [x] + params))
        eps = E.const(node.attrs["eps"], t)
        sd = E.op(f"math.sqrt {E.op(f'arith.addf {v}, {eps} : {t}')} : {t}")
        y = E.op(f"arith.divf {E.op(f'arith.subf {xs}, {m} : {t}')}, {sd} : {t}")
        if w is not None:
            y = E.op(f"arith.mulf {y}, {rest.pop(0)} : {t}")
        if b is not None:
            y = E.op(f"arith.addf {y}, {rest.pop(0)} : {t}")
        return [E.cast_scalar(y, t, store)]

    return [_channel_generic(E, x, params, node.outputs[0].type, body)]


def _lower_lrn(E: Emitter, node, ins, ctx):
    x, a = ins[0], node.attrs
    size, rank, store = a["size"], x.rank, x.mlir_elt
    sq = E.map(
        [x],
        x.type,
        lambda E, v: E.op(f"arith.mulf {(s := E.cast_scalar(v[0], store, 'f32'))}, {s} : f32"),
        out_elt="f32",
    )
    # Zero channels around the edges so every window has `size` taps (torch pads the same way).
    sqp = _pad(E, sq, [0, size // 2] + [0] * (rank - 2), [0, (size - 1) // 2] + [0] * (rank - 2), 0.0)
    init = T(E.filled(E.dims(x), "f32", 0.0), x.type, "f32")
    taps = E.empty([size], "f32")
    src = [0, f"d1 + d{rank}"] + list(range(2, rank))
    r = E.generic(
        [(sqp.name, sqp.mlir), (taps, tensor_type([size], "f32"))],
        [(init.name, init.mlir)],
        [affine_map(rank + 1, src), affine_map(rank + 1, [rank]), affine_map(rank + 1, range(rank))],
        ["parallel"] * rank + ["reduction"],
        lambda E, v: [E.op(f"arith.addf {v[0]}, {v[2]} : f32")],
    )
    sums = T(r[0], x.type, "f32")

    def body(E, v):
        xs = E.cast_scalar(v[0], store, "f32")
        scale, k, beta = (E.const(v, "f32") for v in (a["alpha"] / size, a["k"], a["beta"]))
        base = E.op(f"math.fma {scale}, {v[1]}, {k} : f32")
        den = E.op(f"math.powf {base}, {beta} : f32")
        return E.cast_scalar(E.op(f"arith.divf {xs}, {den} : f32"), "f32", store)

    return [E.map([x, sums], x.type, body)]


lowering("conv1d", "conv2d", "conv3d")(_lower_conv)


def _conv_transpose_fits(node, target):
    """IREE 3.13's GPU codegen fails on the conv of a strided transposed conv in f16/bf16 when
    spatial sizes are dynamic ('vector.transfer_write ... restricted to workgroup distributed
    contexts', whichever way the zeros are inserted); f32, static sizes, stride 1 and the CPU compile."""
    x = node.inputs[0].type
    if (
        target.is_gpu
        and x.dtype.name in ("f16", "bf16")
        and any(s > 1 for s in node.attrs["stride"])
        and not all(isinstance(d, int) for d in x.shape[2:])
    ):
        return f"IREE's GPU codegen fails on strided {x.dtype} transposed conv with symbolic spatial dims"
    return None


lowering("conv_transpose1d", "conv_transpose2d", "conv_transpose3d", supports=_conv_transpose_fits)(
    _lower_conv_transpose
)
lowering("max_pool2d", "max_pool3d")(_lower_max_pool)
lowering("avg_pool2d", "avg_pool3d")(_lower_avg_pool)
lowering("batch_norm")(_lower_batch_norm)
lowering("lrn")(_lower_lrn)
lowering("dropout")(lambda E, node, ins, ctx: [ins[0]])
