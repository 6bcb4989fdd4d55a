"""Generated lowering of random_uniform: splitmix64 in i64 arithmetic (muli wraps as the reference's uint64
does; shifts are logical), the top 24 bits to an f32 in (0, 1)."""

from __future__ import annotations

from ...frontend.ops.random import GOLDEN, MIX1, MIX2, SHIFTS
from ..emitter import Emitter, T, affine_map, tensor_type
from ..registry import lowering


def _i64(E: Emitter, c: int) -> str:
    return E.const(c - (1 << 64) if c >= 1 << 63 else c, "i64")


@lowering("random_uniform")
def _lower_random_uniform(E: Emitter, node, ins, ctx):
    key, out = ins[0], node.outputs[0].type
    r = out.rank

    def body(E, a):
        def op(name, x, y):
            return E.op(f"arith.{name} {x}, {y} : i64")

        k = E.cast_scalar(a[0], key.mlir_elt, "i64", unsigned_src=key.type.dtype.unsigned)
        index = E.op(f"linalg.index {r - 1} : index")
        j = E.op(f"arith.index_cast {index} : index to i64")
        z = op("addi", op("muli", k, _i64(E, GOLDEN)), op("muli", op("addi", j, E.const(1, "i64")), _i64(E, MIX1)))
        for shift, mul in zip(SHIFTS, (MIX1, MIX2, None)):
            z = op("xori", z, op("shrui", z, E.const(shift, "i64")))
            if mul is not None:
                z = op("muli", z, _i64(E, mul))
        top = E.op(f"arith.uitofp {op('shrui', z, E.const(40, 'i64'))} : i64 to f32")
        half = E.op(f"arith.addf {top}, {E.const(0.5, 'f32')} : f32")
        return [E.op(f"arith.mulf {half}, {E.const(2.0**-24, 'f32')} : f32")]

    sizes = E.dims(key) + [out.shape[-1]]
    res = E.generic(
        [(key.name, key.mlir)],
        [(E.empty(sizes, "f32"), tensor_type(out.shape, "f32"))],
        [affine_map(r, range(r - 1)), affine_map(r, range(r))],
        ["parallel"] * r,
        body,
    )
    return [T(res[0], out)]
