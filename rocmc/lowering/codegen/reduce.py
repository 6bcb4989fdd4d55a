"""Generated lowering of reductions, and the loop helpers the norms share.

A reduction is one linalg.generic whose reduced dims are `reduction` iterators writing an accumulator
made by linalg.fill with the combiner's identity; f16/bf16 accumulate in f32. A pointwise generic then
finishes (divide by the count, sqrt, round to the storage type, re-insert kept dims); IREE fuses it
into the reduction's dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...dtypes import acc_mlir
from ...frontend.graph import TensorType
from ..emitter import FLOAT_TYPES, Emitter, T, affine_map, tensor_type
from ..registry import lowering


@dataclass
class Space:
    """An iteration space: its graph dims (ints or symbols) and emitted sizes (ints or SSA indices)."""

    shape: tuple
    sizes: list

    @classmethod
    def of(cls, E: Emitter, x: T) -> "Space":
        return cls(tuple(x.shape), E.dims(x))

    @property
    def rank(self) -> int:
        return len(self.shape)

    def sub(self, dims) -> "Space":
        return Space(tuple(self.shape[i] for i in dims), [self.sizes[i] for i in dims])


def reduction(E: Emitter, space: Space, ins, axes, acc: str, identity, step) -> T:
    """Reduce `axes` of `space` into an accumulator of element type `acc` filled with `identity`.
    ins: (T, iteration dims it is indexed by); step(E, scalars, acc) -> new acc."""
    kept = [i for i in range(space.rank) if i not in axes]
    out = space.sub(kept)
    init = E.filled(out.sizes, acc, identity)
    iterators = ["reduction" if i in axes else "parallel" for i in range(space.rank)]
    r = _generic(E, space, ins, kept, init, tensor_type(out.shape, acc), iterators, lambda E, a: step(E, a[:-1], a[-1]))
    return T(r, TensorType(out.shape, _dtype_of(ins)), acc)


def pointwise(E: Emitter, space: Space, ins, elt: str, fn) -> T:
    """An elementwise generic over `space`; ins: (T, iteration dims); fn(E, scalars) -> result."""
    init = E.empty(space.sizes, elt)
    r = _generic(
        E,
        space,
        ins,
        range(space.rank),
        init,
        tensor_type(space.shape, elt),
        ["parallel"] * space.rank,
        lambda E, a: fn(E, a[:-1]),
    )
    return T(r, TensorType(space.shape, _dtype_of(ins)), elt)


def _generic(E, space, ins, out_dims, init, out_ty, iterators, body) -> str:
    maps = [affine_map(space.rank, dims) for _, dims in ins] + [affine_map(space.rank, out_dims)]
    return E.generic([(t.name, t.mlir) for t, _ in ins], [(init, out_ty)], maps, iterators, lambda E, a: [body(E, a)])[
        0
    ]


def _dtype_of(ins):
    return ins[0][0].type.dtype


def count(E: Emitter, space: Space, axes, elt: str = "f32") -> str:
    """Number of elements in the reduced dims as an `elt` scalar (a runtime product if symbolic)."""
    n = E.product(space.sizes[i] for i in axes)
    if isinstance(n, int):
        return E.const(float(n), elt)
    n = E.op(f"arith.index_cast {n} : index to i64")
    return E.op(f"arith.sitofp {n} : i64 to {elt}")


def binop(fop: str, iop: str):
    """A scalar combiner with a float and an integer form: (E, a, b, elt) -> value."""

    def emit(E, a, b, t):
        return E.op(f"{fop if t in FLOAT_TYPES else iop} {a}, {b} : {t}")

    return emit


def _lowest(t, dtype):
    return float("-inf") if t in FLOAT_TYPES else dtype.limits[0]


def _highest(t, dtype):
    return float("inf") if t in FLOAT_TYPES else dtype.limits[1]


def _square(E, x, t):
    return E.op(f"arith.mulf {x}, {x} : {t}")


# name -> (identity(acc elt, graph dtype), pre(E, x, t) or None, combine(E, acc, x, t), post(E, r, n, t) or None)
REDUCTIONS = {
    "sum": (lambda t, d: 0, None, Emitter.add, None),
    "mean": (lambda t, d: 0, None, Emitter.add, lambda E, r, n, t: E.op(f"arith.divf {r}, {n} : {t}")),
    "prod": (lambda t, d: 1, None, Emitter.mul, None),
    "max": (_lowest, None, binop("arith.maximumf", "arith.maxsi"), None),
    "amax": (_lowest, None, binop("arith.maximumf", "arith.maxsi"), None),
    "min": (_highest, None, binop("arith.minimumf", "arith.minsi"), None),
    "norm1": (lambda t, d: 0, lambda E, x, t: E.op(f"math.absf {x} : {t}"), Emitter.add, None),
    "norm2": (lambda t, d: 0, _square, Emitter.add, lambda E, r, n, t: E.op(f"math.sqrt {r} : {t}")),
}


# The combiners of unsigned integers, where they differ.
def _unsigned(op: str):
    return lambda E, a, b, t: E.op(f"arith.{op} {a}, {b} : {t}")


UNSIGNED_COMBINE = {"max": _unsigned("maxui"), "amax": _unsigned("maxui"), "min": _unsigned("minui")}


def _lower_reduction(E: Emitter, node, ins, ctx):
    x = ins[0]
    identity, pre, combine, post = REDUCTIONS[node.op]
    if x.type.dtype.unsigned:
        combine = UNSIGNED_COMBINE.get(node.op, combine)
    axes, keepdims = node.attrs["axes"], node.attrs["keepdims"]
    storage = x.mlir_elt
    acc = acc_mlir(storage)
    space = Space.of(E, x)
    n = count(E, space, axes, acc) if node.op == "mean" else None

    def step(E, a, r):
        v = E.cast_scalar(a[0], storage, acc)
        return combine(E, r, pre(E, v, acc) if pre else v, acc)

    r = reduction(E, space, [(x, list(range(x.rank)))], axes, acc, identity(acc, x.type.dtype), step)
    if post is None and acc == storage and not (keepdims and axes):
        return [r]
    # keepdims: iterate over the output shape (size-1 dims in place of the reduced ones).
    out = node.outputs[0].type
    kept = [i for i in range(x.rank) if i not in axes]
    space_out = (
        Space(out.shape, [1 if i in axes else space.sizes[i] for i in range(x.rank)]) if keepdims else space.sub(kept)
    )
    dims = kept if keepdims else list(range(len(kept)))

    def finish(E, a):
        v = post(E, a[0], n, acc) if post else a[0]
        return E.cast_scalar(v, acc, storage)

    return [pointwise(E, space_out, [(r, dims)], storage, finish)]


lowering(*REDUCTIONS)(_lower_reduction)
