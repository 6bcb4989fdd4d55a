"""Generated lowering of softmax, log_softmax, layer_norm and rms_norm, computed in f32 (in f64 for f64).

softmax is linalg.softmax between conversions. The others are short chains of linalg.generic ops
over x's iteration space: reductions into f32 row statistics (indexed by the kept dims), tiny
pointwise steps on the statistics, and one pointwise generic producing the result in x's storage
type. layer_norm makes two passes over the row (mean, then the sum of squared deviations) instead
of E[x^2] - E[x]^2, which cancels catastrophically when |mean| >> std.

Dispatches with IREE's default fusion (gfx942, sm_80 and CPU alike): rms_norm and softmax one each;
layer_norm and log_softmax two, because a reduction feeding another reduction is not fused.
"""

from __future__ import annotations

from ...frontend.graph import TensorType
from ..emitter import Emitter, T, tensor_type
from ..registry import lowering
from .reduce import Space, count, pointwise, reduction

F32 = "f32"


def acc_elt(storage: str) -> str:
    """The type the statistics and arithmetic use: f32, or f64 for f64 tensors."""
    return "f64" if storage == "f64" else F32


class _Rows:
    """x split into the reduced dims `axes` and the kept dims that index each row's statistics."""

    def __init__(self, E: Emitter, x: T, axes):
        self.x = x
        self.acc = acc_elt(x.mlir_elt)
        self.space = Space.of(E, x)
        self.axes = list(axes)
        self.kept = [i for i in range(x.rank) if i not in self.axes]
        self.stats = self.space.sub(self.kept)

    @property
    def full(self):
        return (self.x, list(range(self.x.rank)))

    def per_row(self, t: T):
        """Operand entry of a statistics tensor inside a generic over x's whole space."""
        return (t, self.kept)

    def first(self, E: Emitter) -> T:
        """Each row's first element in f32, a statistics tensor (a slice, not a constant-index map:
        IREE's GPU tiling rejects `(d0, d1) -> (d0, 0)` reads inside the row's dispatch)."""
        x, rank = self.x, self.x.rank
        offsets = ", ".join("0" for _ in range(rank))
        sizes = ", ".join(str(1 if i in self.axes else s) for i, s in enumerate(self.space.sizes))
        strides = ", ".join("1" for _ in range(rank))
        ty = tensor_type(self.stats.shape, x.mlir_elt)
        k = E.op(f"tensor.extract_slice {x.name}[{offsets}] [{sizes}] [{strides}] : {x.mlir} to {ty}")
        return self.on_stats(E, [T(k, TensorType(self.stats.shape, x.type.dtype))], lambda E, a: self.load(E, a[0]))

    def load(self, E: Emitter, v: str) -> str:
        return E.cast_scalar(v, self.x.mlir_elt, self.acc)

    def reduce(self, E: Emitter, ins, identity, step) -> T:
        return reduction(E, self.space, ins, self.axes, self.acc, identity, step)

    def on_stats(self, E: Emitter, stats, fn) -> T:
        """Pointwise over the statistics' space (one value per row)."""
        return pointwise(E, self.stats, [(s, list(range(len(self.kept)))) for s in stats], self.acc, fn)

    def finish(self, E: Emitter, ins, fn) -> T:
        """Pointwise over x's space producing the result in x's storage type."""
        storage = self.x.mlir_elt
        return pointwise(E, self.space, ins, storage, lambda E, a: E.cast_scalar(fn(E, a), self.acc, storage))


def _row_max_and_sum(E: Emitter, rows: _Rows):
    """The row max m and sum(exp(x - m)), each a reduction IREE recognizes (maximumf, addf)."""
    t = rows.acc
    m = rows.reduce(
        E, [rows.full], float("-inf"), lambda E, a, r: E.op(f"arith.maximumf {rows.load(E, a[0])}, {r} : {t}")
    )

    def exp_sum(E, a, r):
        e = E.op(f"math.exp {E.sub(rows.load(E, a[0]), a[1], t)} : {t}")
        return E.add(e, r, t)

    s = rows.reduce(E, [rows.full, rows.per_row(m)], 0.0, exp_sum)
    return m, s


def _softmax(E: Emitter, node, ins, ctx):
    # linalg.softmax stays one op through IREE's dispatch formation and is decomposed (max,
    # exp-sum, divide) inside a single dispatch; the equivalent chain of generics takes two.
    x = ins[0]
    acc = acc_elt(x.mlir_elt)
    x32 = E.convert(x, acc)
    init = E.empty(E.dims(x), acc)
    ty = x32.mlir
    y = E.op(f"linalg.softmax dimension({node.attrs['axis']}) ins({x32.name} : {ty}) outs({init} : {ty}) -> {ty}")
    return [E.convert(T(y, x.type, acc), x.mlir_elt)]


def _log_softmax(E: Emitter, node, ins, ctx):
    rows = _Rows(E, ins[0], [node.attrs["axis"]])
    m, s = _row_max_and_sum(E, rows)
    t = rows.acc
    log_s = rows.on_stats(E, [s], lambda E, a: E.op(f"math.log {a[0]} : {t}"))
    return [
        rows.finish(
            E,
            [rows.full, rows.per_row(m), rows.per_row(log_s)],
            lambda E, a: E.sub(E.sub(rows.load(E, a[0]), a[1], t), a[2], t),
        )
    ]


def _inv_std(E: Emitter, rows: _Rows, sum_sq: T, eps: float) -> T:
    """1 / sqrt(sum_sq / n + eps) per row."""
    t = rows.acc
    n = count(E, rows.space, rows.axes, t)

    def fn(E, a):
        ms = E.op(f"arith.divf {a[0]}, {n} : {t}")
        return E.op(f"math.rsqrt {E.add(ms, E.const(eps, t), t)} : {t}")

    return rows.on_stats(E, [sum_sq], fn)


def _affine(rows: _Rows, params):
    """Operands of the present weight/bias (indexed by the normalized dims) and how each applies."""
    present = [(t, fn) for t, fn in params if t is not None]
    return [(t, rows.axes) for t, _ in present], present


def _apply_affine(E: Emitter, y: str, scalars, present, acc: str) -> str:
    """y * weight + bias for the present parameters, each converted to `acc` from its own storage type."""
    for v, (t, fn) in zip(scalars, present):
        y = fn(E, y, E.cast_scalar(v, t.mlir_elt, acc), acc)
    return y


def _layer_norm(E: Emitter, node, ins, ctx):
    # Two passes over each row, both on data shifted by the row's first element k: pass one sums
    # x - k (so the mean of a row with |mean| >> std is not lost to f32 rounding of a large sum),
    # pass two sums (x - k - c)^2 with c = mean(x - k). The result uses (x - k) - c, never a
    # rounded large mean.
    x, weight, bias = ins
    rows = _Rows(E, x, range(node.attrs["axis"], x.rank))
    t = rows.acc
    n = count(E, rows.space, rows.axes, t)

    k = rows.first(E)

    def shifted(E, a):
        return E.sub(rows.load(E, a[0]), a[1], t)

    total = rows.reduce(E, [rows.full, rows.per_row(k)], 0.0, lambda E, a, r: E.add(shifted(E, a), r, t))
    c = rows.on_stats(E, [total], lambda E, a: E.op(f"arith.divf {a[0]}, {n} : {t}"))

    def sq_dev(E, a, r):
        d = E.sub(shifted(E, a), a[2], t)
        return E.add(E.mul(d, d, t), r, t)

    var_sum = rows.reduce(E, [rows.full, rows.per_row(k), rows.per_row(c)], 0.0, sq_dev)
    inv = _inv_std(E, rows, var_sum, node.attrs["eps"])
    params, present = _affine(rows, [(weight, Emitter.mul), (bias, Emitter.add)])

    def y(E, a):
        v = E.mul(E.sub(shifted(E, a), a[2], t), a[3], t)
        return _apply_affine(E, v, a[4:], present, t)

    return [rows.finish(E, [rows.full, rows.per_row(k), rows.per_row(c), rows.per_row(inv), *params], y)]


def _rms_norm(E: Emitter, node, ins, ctx):
    return [rms_norm_of(E, *ins, node.attrs["eps"], node.attrs["axis"])]


def rms_norm_of(E: Emitter, x: T, weight: T | None, eps: float, axis: int) -> T:
    """rms_norm's code for x normalized over its dims axis.. (weight: their shape, or None)."""
    rows = _Rows(E, x, range(axis, x.rank))
    t = rows.acc

    def sq(E, a, r):
        v = rows.load(E, a[0])
        return E.add(E.mul(v, v, t), r, t)

    sum_sq = rows.reduce(E, [rows.full], 0.0, sq)
    inv = _inv_std(E, rows, sum_sq, eps)
    params, present = _affine(rows, [(weight, Emitter.mul)])
    return rows.finish(
        E,
        [rows.full, rows.per_row(inv), *params],
        lambda E, a: _apply_affine(E, E.mul(rows.load(E, a[0]), a[1], t), a[2:], present, t),
    )


lowering("softmax")(_softmax)
lowering("log_softmax")(_log_softmax)
lowering("layer_norm")(_layer_norm)
lowering("rms_norm")(_rms_norm)
