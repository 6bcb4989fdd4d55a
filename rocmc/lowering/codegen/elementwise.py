"""Generated lowering of elementwise ops: one linalg.generic with numpy broadcasting.

f16/bf16 math runs in f32 and rounds once at the end, as torch does for half types; f64 runs in f64.
Integer math wraps at the type's width, as numpy's and ONNX's does. MLIR integers are signless, so
the ops whose result depends on the signedness (division, remainder, order, abs, sign) have an
unsigned form in the UNSIGNED_* tables, chosen when the operand's dtype is unsigned.
"""

from __future__ import annotations

import math

from ... import dtypes
from ...dtypes import acc_mlir, is_float_mlir
from ..emitter import Emitter
from ..registry import lowering


def _sigmoid(E, x, t):
    one = E.const(1.0, t)
    n = E.op(f"arith.negf {x} : {t}")
    e = E.op(f"math.exp {n} : {t}")
    d = E.op(f"arith.addf {one}, {e} : {t}")
    return E.op(f"arith.divf {one}, {d} : {t}")


def _fi(fop, iop):
    """A binary scalar op with a float and an integer form."""

    def emit(E, a, b, t):
        return E.op(f"{fop if is_float_mlir(t) else iop} {a}, {b} : {t}")

    return emit


def _div(E, a, b, t):
    """Float division, or signed integer division truncating toward zero (C, ONNX). An integer
    divisor of 0 divides by 1 (x / 0 = x; the module never traps) and one of -1 negates with
    wraparound (INT_MIN / -1 = INT_MIN, which divsi leaves undefined)."""
    if is_float_mlir(t):
        return E.op(f"arith.divf {a}, {b} : {t}")
    one, minus_one = E.const(1, t), E.const(-1, t)
    by_minus_one = E.op(f"arith.cmpi eq, {b}, {minus_one} : {t}")
    trivial = E.op(f"arith.ori {E.op(f'arith.cmpi eq, {b}, {E.const(0, t)} : {t}')}, {by_minus_one} : i1")
    q = E.op(f"arith.divsi {a}, {E.op(f'arith.select {trivial}, {one}, {b} : {t}')} : {t}")
    return E.op(f"arith.select {by_minus_one}, {E.sub(E.const(0, t), a, t)}, {q} : {t}")


def _divu(E, a, b, t):
    """Unsigned integer division; a divisor of 0 divides by 1, as the signed form does."""
    zero = E.op(f"arith.cmpi eq, {b}, {E.const(0, t)} : {t}")
    return E.op(f"arith.divui {a}, {E.op(f'arith.select {zero}, {E.const(1, t)}, {b} : {t}')} : {t}")


BINARY = {
    "add": lambda E, a, b, t: E.add(a, b, t),
    "sub": lambda E, a, b, t: E.sub(a, b, t),
    "mul": lambda E, a, b, t: E.mul(a, b, t),
    "div": _div,
    "pow": lambda E, a, b, t: E.op(f"math.powf {a}, {b} : {t}"),
    "maximum": _fi("arith.maximumf", "arith.maxsi"),
    "minimum": _fi("arith.minimumf", "arith.minsi"),
}
# The forms of unsigned integers, where they differ.
UNSIGNED_BINARY = {
    "div": _divu,
    "maximum": lambda E, a, b, t: E.op(f"arith.maxui {a}, {b} : {t}"),
    "minimum": lambda E, a, b, t: E.op(f"arith.minui {a}, {b} : {t}"),
}
# name -> (float predicate, signed integer predicate, unsigned integer predicate)
_PRED = {
    "equal": ("oeq", "eq", "eq"),
    "not_equal": ("une", "ne", "ne"),
    "less": ("olt", "slt", "ult"),
    "less_equal": ("ole", "sle", "ule"),
    "greater": ("ogt", "sgt", "ugt"),
    "greater_equal": ("oge", "sge", "uge"),
}
LOGICAL = {"logical_and": "arith.andi", "logical_or": "arith.ori", "logical_xor": "arith.xori"}


def _relu(E, x, t, **a):
    z = E.const(0, t)
    return E.op(f"{'arith.maximumf' if is_float_mlir(t) else 'arith.maxsi'} {x}, {z} : {t}")


def _leaky(E, x, t, negative_slope):
    z, s = E.const(0.0, t), E.const(negative_slope, t)
    m = E.op(f"arith.mulf {x}, {s} : {t}")
    c = E.op(f"arith.cmpf oge, {x}, {z} : {t}")
    return E.op(f"arith.select {c}, {x}, {m} : {t}")


def _elu(E, x, t, alpha):
    z, a, one = E.const(0.0, t), E.const(alpha, t), E.const(1.0, t)
    e = E.op(f"math.exp {x} : {t}")
    em = E.op(f"arith.subf {e}, {one} : {t}")
    m = E.op(f"arith.mulf {a}, {em} : {t}")
    c = E.op(f"arith.cmpf ogt, {x}, {z} : {t}")
    return E.op(f"arith.select {c}, {x}, {m} : {t}")


def _clipped(E, x, t, ceiling):
    z, c = E.const(0.0, t), E.const(ceiling, t)
    m = E.op(f"arith.maximumf {x}, {z} : {t}")
    return E.op(f"arith.minimumf {m}, {c} : {t}")


def _gelu(E, x, t, approximate):
    half, one = E.const(0.5, t), E.const(1.0, t)
    if approximate == "tanh":
        k, c = E.const(math.sqrt(2.0 / math.pi), t), E.const(0.044715, t)
        x3 = E.op(f"arith.mulf {x}, {x} : {t}")
        x3 = E.op(f"arith.mulf {x3}, {x} : {t}")
        inner = E.op(f"math.fma {c}, {x3}, {x} : {t}")
        inner = E.op(f"arith.mulf {k}, {inner} : {t}")
        th = _tanh(E, inner, t)
    else:
        r = E.const(1.0 / math.sqrt(2.0), t)
        xs = E.op(f"arith.mulf {x}, {r} : {t}")
        th = E.op(f"math.erf {xs} : {t}")
    s = E.op(f"arith.addf {one}, {th} : {t}")
    hx = E.op(f"arith.mulf {half}, {x} : {t}")
    return E.op(f"arith.mulf {hx}, {s} : {t}")


def _tanh(E, x, t):
    """math.tanh; for f64, which IREE's CPU backend leaves to libm (not linked into its executables),
    sign(x) * -m / (2 + m) with m = expm1(-2|x|): no cancellation near 0, exactly 1 for large |x|."""
    if t != "f64":
        return E.op(f"math.tanh {x} : {t}")
    two, minus_two = E.const(2.0, t), E.const(-2.0, t)
    ax = E.op(f"math.absf {x} : {t}")
    m = E.op(f"math.expm1 {E.op(f'arith.mulf {minus_two}, {ax} : {t}')} : {t}")
    r = E.op(f"arith.divf {E.op(f'arith.negf {m} : {t}')}, {E.op(f'arith.addf {two}, {m} : {t}')} : {t}")
    return E.op(f"math.copysign {r}, {x} : {t}")


def _math(name):
    return lambda E, x, t, **a: E.op(f"math.{name} {x} : {t}")


def _sign(E, x, t, **a):
    """-1, 0 or 1; a float keeps its own value when it is neither above nor below zero (+-0, nan)."""
    z = E.const(0, t)
    if not is_float_mlir(t):
        pos = E.op(f"arith.extui {E.op(f'arith.cmpi sgt, {x}, {z} : {t}')} : i1 to {t}")
        neg = E.op(f"arith.extui {E.op(f'arith.cmpi slt, {x}, {z} : {t}')} : i1 to {t}")
        return E.sub(pos, neg, t)
    low = E.op(f"arith.select {E.op(f'arith.cmpf olt, {x}, {z} : {t}')}, {E.const(-1.0, t)}, {x} : {t}")
    return E.op(f"arith.select {E.op(f'arith.cmpf ogt, {x}, {z} : {t}')}, {E.const(1.0, t)}, {low} : {t}")


def _sign_unsigned(E, x, t, **a):
    """1 where x is nonzero, else 0."""
    return E.op(f"arith.extui {E.op(f'arith.cmpi ne, {x}, {E.const(0, t)} : {t}')} : i1 to {t}")


UNARY = {
    "neg": lambda E, x, t, **a: E.op(f"arith.negf {x} : {t}") if is_float_mlir(t) else E.sub(E.const(0, t), x, t),
    "abs": lambda E, x, t, **a: E.op(f"math.{'absf' if is_float_mlir(t) else 'absi'} {x} : {t}"),
    "exp": _math("exp"),
    "log": _math("log"),
    "sqrt": _math("sqrt"),
    "rsqrt": _math("rsqrt"),
    "tanh": lambda E, x, t, **a: _tanh(E, x, t),
    "erf": _math("erf"),
    "sigmoid": lambda E, x, t, **a: _sigmoid(E, x, t),
    "silu": lambda E, x, t, **a: E.op(f"arith.mulf {x}, {_sigmoid(E, x, t)} : {t}"),
    "relu": _relu,
    "leaky_relu": _leaky,
    "elu": _elu,
    "clipped_relu": _clipped,
    "gelu": _gelu,
    "logical_not": lambda E, x, t, **a: E.op(f"arith.xori {x}, {E.const(True, 'i1')} : i1"),
    "cos": _math("cos"),
    "sin": _math("sin"),
    "floor": _math("floor"),
    "ceil": _math("ceil"),
    "round": _math("roundeven"),
    "sign": _sign,
    "reciprocal": lambda E, x, t, **a: E.op(f"arith.divf {E.const(1.0, t)}, {x} : {t}"),
}
# An unsigned integer is its own absolute value and relu; neg keeps the signed form (0 - x wraps, as numpy's).
UNSIGNED_UNARY = {"abs": lambda E, x, t, **a: x, "relu": lambda E, x, t, **a: x, "sign": _sign_unsigned}


def _isinf(E, x, t, detect_positive, detect_negative):
    hits = [
        E.op(f"arith.cmpf oeq, {x}, {E.const(v, t)} : {t}")
        for v, on in ((math.inf, detect_positive), (-math.inf, detect_negative))
        if on
    ]
    if not hits:
        return E.const(False, "i1")
    return hits[0] if len(hits) == 1 else E.op(f"arith.ori {hits[0]}, {hits[1]} : i1")


# Float tests with an i1 result.
PREDICATES = {
    "isnan": lambda E, x, t: E.op(f"arith.cmpf uno, {x}, {x} : {t}"),
    "isinf": _isinf,
}


def _mod(E, a, b, t, fmod, unsigned=False, libm=True):
    """ONNX Mod. fmod=0 moves a remainder whose sign differs from b's by b (floor mod). An integer
    divisor of 0 becomes 1 (remainder 0, no trap) and so does a signed -1 (remainder 0; INT_MIN % -1
    overflows). Unsigned remainders have no sign to fix."""
    if unsigned:
        zero = E.op(f"arith.cmpi eq, {b}, {E.const(0, t)} : {t}")
        return E.op(f"arith.remui {a}, {E.op(f'arith.select {zero}, {E.const(1, t)}, {b} : {t}')} : {t}")
    if is_float_mlir(t):
        r = E.op(f"arith.remf {a}, {b} : {t}") if libm or t != "f64" else _remf64(E, a, b, t)
        return r if fmod else _toward_divisor(E, r, b, t, E.const(0.0, t), ("cmpf one,", "cmpf olt,", "addf"))
    z, one = E.const(0, t), E.const(1, t)
    trivial = E.op(
        f"arith.ori {E.op(f'arith.cmpi eq, {b}, {z} : {t}')}, "
        f"{E.op(f'arith.cmpi eq, {b}, {E.const(-1, t)} : {t}')} : i1"
    )
    r = E.op(f"arith.remsi {a}, {E.op(f'arith.select {trivial}, {one}, {b} : {t}')} : {t}")
    return r if fmod else _toward_divisor(E, r, b, t, z, ("cmpi ne,", "cmpi slt,", "addi"))


def _remf64(E, a, b, t):
    """C fmod of f64 without libm (arith.remf becomes a call to fmod, which IREE's CPU executables do not
    link): a - q*b with q = trunc(a/b) in one fused multiply-add, exact while |a/b| < 2**53 (q is then the
    true quotient or one off, which the corrections by one |b| undo), and a itself for an infinite b."""

    def op(text):
        return E.op(f"{text} : {t}")

    q = op(f"math.trunc {op(f'arith.divf {a}, {b}')}")
    r = op(f"math.fma {op(f'arith.negf {q}')}, {b}, {a}")
    zero, inf = E.const(0.0, t), E.const(float("inf"), t)
    abs_a, abs_b = op(f"math.absf {a}"), op(f"math.absf {b}")
    step = op(f"math.copysign {abs_b}, {a}")  # |b| with a's sign
    too_far = op(f"arith.cmpf oge, {op(f'math.absf {r}')}, {abs_b}")
    r = op(f"arith.select {too_far}, {op(f'arith.subf {r}, {step}')}, {r}")
    signs_differ = E.op(f"arith.xori {op(f'arith.cmpf olt, {r}, {zero}')}, {op(f'arith.cmpf olt, {a}, {zero}')} : i1")
    crossed = E.op(f"arith.andi {op(f'arith.cmpf one, {r}, {zero}')}, {signs_differ} : i1")
    r = op(f"arith.select {crossed}, {op(f'arith.addf {r}, {step}')}, {r}")
    r = op(f"math.copysign {r}, {a}")  # a zero keeps a's sign
    finite_by_inf = E.op(
        f"arith.andi {op(f'arith.cmpf oeq, {abs_b}, {inf}')}, {op(f'arith.cmpf olt, {abs_a}, {inf}')} : i1"
    )
    return op(f"arith.select {finite_by_inf}, {a}, {r}")


def _toward_divisor(E, r, b, t, z, ops):
    """r + b where r is nonzero and its sign differs from b's, else r (C remainder -> floor mod); `ops`
    names the not-equal and less-than comparisons (with their comma) and the add of t's kind."""
    ne, lt, add = ops
    nonzero = E.op(f"arith.{ne} {r}, {z} : {t}")
    differ = E.op(f"arith.xori {E.op(f'arith.{lt} {r}, {z} : {t}')}, {E.op(f'arith.{lt} {b}, {z} : {t}')} : i1")
    fix = E.op(f"arith.andi {nonzero}, {differ} : i1")
    return E.op(f"arith.select {fix}, {E.op(f'arith.{add} {r}, {b} : {t}')}, {r} : {t}")


def _unsigned(node) -> bool:
    return node.inputs[0].dtype.unsigned


def _lower_binary(E: Emitter, node, ins, ctx):
    op = node.op
    storage = ins[0].mlir_elt
    t = acc_mlir(storage)
    out = node.outputs[0].type
    unsigned = _unsigned(node)
    fn = UNSIGNED_BINARY.get(op, BINARY.get(op)) if unsigned else BINARY.get(op)

    def body(E, a):
        x, y = (E.cast_scalar(v, storage, t) for v in a)
        if fn is not None:
            return E.cast_scalar(fn(E, x, y, t), t, storage)
        if op in LOGICAL:
            return E.op(f"{LOGICAL[op]} {x}, {y} : i1")
        fp, ip, up = _PRED[op]
        if is_float_mlir(t):
            return E.op(f"arith.cmpf {fp}, {x}, {y} : {t}")
        return E.op(f"arith.cmpi {up if unsigned else ip}, {x}, {y} : {t}")

    return [E.map(ins, out, body)]


def _lower_unary(E: Emitter, node, ins, ctx):
    storage = ins[0].mlir_elt
    t = acc_mlir(storage)
    fn = UNSIGNED_UNARY.get(node.op, UNARY[node.op]) if _unsigned(node) else UNARY[node.op]
    return [
        E.map(
            ins,
            node.outputs[0].type,
            lambda E, a: E.cast_scalar(fn(E, E.cast_scalar(a[0], storage, t), t, **node.attrs), t, storage),
        )
    ]


def _lower_predicate(E: Emitter, node, ins, ctx):
    storage = ins[0].mlir_elt
    t = acc_mlir(storage)
    fn = PREDICATES[node.op]
    return [E.map(ins, node.outputs[0].type, lambda E, a: fn(E, E.cast_scalar(a[0], storage, t), t, **node.attrs))]


def _lower_mod(E: Emitter, node, ins, ctx):
    storage = ins[0].mlir_elt
    t = acc_mlir(storage)

    def body(E, a):
        x, y = (E.cast_scalar(v, storage, t) for v in a)
        return E.cast_scalar(
            _mod(E, x, y, t, unsigned=_unsigned(node), libm=ctx.target.is_gpu, **node.attrs), t, storage
        )

    return [E.map(ins, node.outputs[0].type, body)]


def _lower_where(E: Emitter, node, ins, ctx):
    elt = ins[1].mlir_elt
    return [E.map(ins, node.outputs[0].type, lambda E, a: E.op(f"arith.select {a[0]}, {a[1]}, {a[2]} : {elt}"))]


def _lower_cast(E: Emitter, node, ins, ctx):
    out = node.outputs[0].dtype
    if not node.attrs.get("saturate"):
        return [E.convert(ins[0], out.mlir, node.outputs[0].type)]
    src = ins[0].mlir_elt
    wide = "f64" if src == "f64" else "f32"
    top = dtypes.float8_max(out)

    def body(E, a):
        # |x| past the largest finite value, infinities included -> that value; NaN propagates through
        # minimumf/maximumf.
        v = E.cast_scalar(a[0], src, wide)
        c = E.op(f"arith.minimumf {v}, {E.const(top, wide)} : {wide}")
        c = E.op(f"arith.maximumf {c}, {E.const(-top, wide)} : {wide}")
        return E.cast_scalar(c, wide, out.mlir)

    return [E.map(ins, node.outputs[0].type, body)]


lowering(*BINARY, *_PRED, *LOGICAL)(_lower_binary)
lowering(*UNARY)(_lower_unary)
lowering(*PREDICATES)(_lower_predicate)
lowering("mod")(_lower_mod)
lowering("where")(_lower_where)
lowering("cast")(_lower_cast)
