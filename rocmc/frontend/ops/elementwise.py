"""Elementwise ops: arithmetic, comparisons, activations, float predicates, where, cast.

Each op is one row of a table: name, which dtypes it accepts, and its float64 reference. Builders
broadcast operands numpy-style; Python scalars take the dtype of the tensor operand.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import GraphError
from ... import dtypes as dt
from ..graph import TensorType, Value, value_operator
from ..opdef import as_value, broadcast_shapes, builder, defop, graph_of, reference, same_dtype

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _gelu(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _quiet(fn, *args):
    """fn without numpy's warnings: 1/0 = inf, 0/0 and cos(inf) = nan are the IEEE results the module computes too."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return fn(*args)


def _isinf(x, detect_positive, detect_negative):
    return (np.isposinf(x) & bool(detect_positive)) | (np.isneginf(x) & bool(detect_negative))


def _mod(a, b, fmod):
    """ONNX Mod: fmod=0 takes the sign of the divisor (Python %), fmod=1 that of the dividend (C fmod).
    An integer remainder by zero is defined as 0 (the compiled module computes the same, it does not trap)."""
    r = _quiet(np.fmod if fmod else np.mod, a, b)
    if a.dtype.kind == "f":
        return r
    return np.where(b == 0, 0, r).astype(np.result_type(a, b))


def _int_div(a, b):
    """Integer division truncating toward zero (C, ONNX), in the operands' own type: a divisor of 0
    gives a (as 1 would: the module never traps) and a signed -1 gives -a, wrapping (INT_MIN / -1 =
    INT_MIN), as the compiled module computes."""
    t = np.result_type(a, b)
    a, b = np.asarray(a, t), np.asarray(b, t)
    by_minus_one = b == -1 if t.kind == "i" else np.zeros(b.shape, bool)
    safe = np.where((b == 0) | by_minus_one, np.ones((), t), b)
    q = a // safe  # floor; one more toward zero where inexact and signs differ
    if t.kind == "i":
        q = q + (((a % safe) != 0) & ((a < 0) != (safe < 0))).astype(t)
    return np.where(by_minus_one, -a, q).astype(t)


# name -> (accepted dtype kinds, reference(a, b))
BINARY = {
    "add": (("float", "int"), lambda a, b: a + b),
    "sub": (("float", "int"), lambda a, b: a - b),
    "mul": (("float", "int"), lambda a, b: a * b),
    "div": (("float", "int"), lambda a, b: a / b if a.dtype.kind == "f" else _int_div(a, b)),
    "pow": (("float",), lambda a, b: np.power(a, b)),
    "maximum": (("float", "int"), np.maximum),
    "minimum": (("float", "int"), np.minimum),
}
COMPARE = {
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
}
LOGICAL = {"logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor}
# name -> (accepted kinds, attribute names, reference(x, **attrs)); defaults are the builders'
UNARY = {
    "neg": (("float", "int"), (), lambda x: -x),
    "abs": (("float", "int"), (), np.abs),
    "exp": (("float",), (), np.exp),
    "log": (("float",), (), np.log),
    "sqrt": (("float",), (), np.sqrt),
    "rsqrt": (("float",), (), lambda x: 1.0 / np.sqrt(x)),
    "tanh": (("float",), (), np.tanh),
    "sigmoid": (("float",), (), _sigmoid),
    "erf": (("float",), (), _erf),
    "relu": (("float", "int"), (), lambda x: np.maximum(x, 0)),
    "leaky_relu": (("float",), ("negative_slope",), lambda x, negative_slope: np.where(x >= 0, x, x * negative_slope)),
    "elu": (("float",), ("alpha",), lambda x, alpha: np.where(x > 0, x, alpha * (np.exp(x) - 1.0))),
    "clipped_relu": (("float",), ("ceiling",), lambda x, ceiling: np.minimum(np.maximum(x, 0.0), ceiling)),
    "gelu": (("float",), ("approximate",), _gelu),
    "silu": (("float",), (), lambda x: x * _sigmoid(x)),
    "logical_not": (("bool",), (), np.logical_not),
    "cos": (("float",), (), lambda x: _quiet(np.cos, x)),
    "sin": (("float",), (), lambda x: _quiet(np.sin, x)),
    "sign": (("float", "int"), (), np.sign),
    "floor": (("float",), (), np.floor),
    "ceil": (("float",), (), np.ceil),
    "round": (("float",), (), np.rint),  # half to even, as ONNX Round
    "reciprocal": (("float",), (), lambda x: _quiet(np.reciprocal, x)),
}
# Ops without an f64 lowering: IREE's CPU backend leaves f64 erf, sin and cos to libm, which its
# executables do not link (gelu's exact form uses erf). They take f32, f16 and bf16.
NO_F64 = {"erf": None, "sin": None, "cos": None, "gelu": "none"}  # name -> the attribute value concerned

# Float tests with a bool result: name -> (attribute names, reference(x, **attrs)).
PREDICATES = {
    "isnan": ((), np.isnan),
    "isinf": (("detect_positive", "detect_negative"), _isinf),
}


def _check_kinds(op, node, types, kinds):
    for v, t in zip(node.inputs, types):
        if t.dtype.kind not in kinds:
            raise GraphError(
                f"{node.describe()}: operand %{v.id} has dtype {t.dtype}, {op} expects {' or '.join(kinds)} tensors"
            )


def _binary_infer(op, kinds, out_dtype=None):
    def infer(node, types, attrs):
        d = same_dtype(node.describe(), types, [f"%{v.id}" for v in node.inputs])
        _check_kinds(op, node, types, kinds)
        return TensorType(broadcast_shapes(node.describe(), *(t.shape for t in types)), out_dtype or d)

    return infer


for _name, (_kinds, _ref) in BINARY.items():
    defop(_name)(_binary_infer(_name, _kinds))
    reference(_name)(lambda node, ins, attrs, _f=_ref: [_f(*ins)])
for _name, _ref in COMPARE.items():
    defop(_name)(_binary_infer(_name, ("float", "int", "bool"), dt.bool_))
    reference(_name)(lambda node, ins, attrs, _f=_ref: [_f(*ins)])
for _name, _ref in LOGICAL.items():
    defop(_name)(_binary_infer(_name, ("bool",), dt.bool_))
    reference(_name)(lambda node, ins, attrs, _f=_ref: [_f(*ins)])


def _check_f64(op, node, types, attrs):
    if op in NO_F64 and types[0].dtype == dt.f64 and NO_F64[op] in (None, attrs.get("approximate")):
        raise GraphError(
            f"{node.describe()}: operand %{node.inputs[0].id} has dtype f64, which {op} does not "
            f"take (no f64 {op} lowering); it takes f32, f16 or bf16"
        )


def _unary_infer(op, kinds):
    def infer(node, types, attrs):
        _check_kinds(op, node, types, kinds)
        _check_f64(op, node, types, attrs)
        if op == "gelu" and attrs.get("approximate") not in ("none", "tanh"):
            raise GraphError(f"{node.describe()}: approximate={attrs.get('approximate')!r}, expected 'none' or 'tanh'")
        for k, v in attrs.items():
            if k != "approximate" and not isinstance(v, (int, float)):
                raise GraphError(f"{node.describe()}: {k}={v!r}, expected a number")
        return types[0]

    return infer


for _name, (_kinds, _attrs, _ref) in UNARY.items():
    defop(_name, attrs=_attrs)(_unary_infer(_name, _kinds))
    reference(_name)(lambda node, ins, attrs, _f=_ref: [_f(ins[0], **attrs)])


def _predicate_infer(op):
    def infer(node, types, attrs):
        _check_kinds(op, node, types, ("float",))
        for k, v in attrs.items():
            if v not in (0, 1) or isinstance(v, float):
                raise GraphError(f"{node.describe()}: {k}={v!r}, expected 0 or 1")
        return types[0].with_dtype(dt.bool_)

    return infer


for _name, (_attrs, _ref) in PREDICATES.items():
    defop(_name, attrs=_attrs)(_predicate_infer(_name))
    reference(_name)(lambda node, ins, attrs, _f=_ref: [_f(ins[0], **attrs)])


@defop("mod", attrs=("fmod",))
def _mod_infer(node, types, attrs):
    if attrs.get("fmod") not in (0, 1) or isinstance(attrs.get("fmod"), float):
        raise GraphError(f"{node.describe()}: fmod={attrs.get('fmod')!r}, expected 0 or 1")
    return _binary_infer("mod", ("float", "int"))(node, types, attrs)


@reference("mod")
def _mod_ref(node, ins, attrs):
    return [_mod(*ins, **attrs)]


@defop("where")
def _where(node, types, attrs):
    c, a, b = types
    if c.dtype != dt.bool_:
        raise GraphError(f"{node.describe()}: condition has dtype {c.dtype}, expected bool")
    d = same_dtype(node.describe(), [a, b], [f"%{node.inputs[1].id}", f"%{node.inputs[2].id}"])
    return TensorType(broadcast_shapes(node.describe(), c.shape, a.shape, b.shape), d)


@reference("where")
def _where_ref(node, ins, attrs):
    return [np.where(*ins)]


@defop("cast", attrs=("dtype", "saturate"))
def _cast(node, types, attrs):
    if attrs.get("saturate") and dt.dtype(attrs["dtype"]) not in dt.FLOAT8:
        raise GraphError(f"{node.describe()}: saturate=True applies to the float8 types, not {attrs['dtype']}")
    return types[0].with_dtype(attrs["dtype"])


def saturated(x: np.ndarray, d: "dt.DType") -> np.ndarray:
    """x (float64) with its magnitudes past float8 type d's largest finite value, infinities included, clamped to
    it; NaN stays NaN (ONNX's Cast with saturate=1, as onnx.reference and ONNX Runtime compute it)."""
    top = dt.float8_max(d)
    return np.clip(x, -top, top)


@reference("cast")
def _cast_ref(node, ins, attrs):
    d = dt.dtype(attrs["dtype"])
    x = ins[0]
    if attrs.get("saturate"):
        x = saturated(np.asarray(x, np.float64), d)
    if d.kind == "float":
        # Round through the storage type so the reference sees what the tensor holds (past a type's range:
        # infinity, or NaN in the float8 types without one, as the conversion itself gives).
        with np.errstate(over="ignore", invalid="ignore"):
            return [np.asarray(x).astype(d.np).astype(np.float64)]
    if d.kind == "int":
        x = np.asarray(x)
        if x.dtype.kind == "f":
            return [np.trunc(x).astype(d.np)]
        # ml_dtypes' 4-bit types convert only through a wider integer (wrapping, as the module's cast does)
        return [x.astype(np.int64).astype(d.np) if d.packed or x.dtype.kind == "V" else x.astype(d.np)]
    return [np.asarray(x) != 0]


# ---- builders -------------------------------------------------------------------------------


def _binary(name, a, b):
    """Add `name` on two operands broadcast numpy-style; a Python scalar takes the tensor's dtype."""
    g = graph_of(name, a, b)
    like = a if isinstance(a, Value) else b
    return g.apply(name, [as_value(name, "a", a, g, like), as_value(name, "b", b, g, like)])[0]


def _unary(name, x, **attrs):
    """Add `name` on one operand with its attributes."""
    g = graph_of(name, x)
    return g.apply(name, [as_value(name, "x", x, g)], attrs)[0]


@value_operator
@builder
def add(a, b):
    """Elementwise a + b with numpy broadcasting."""
    return _binary("add", a, b)


@value_operator
@builder
def sub(a, b):
    """Elementwise a - b with numpy broadcasting."""
    return _binary("sub", a, b)


@value_operator
@builder
def mul(a, b):
    """Elementwise a * b with numpy broadcasting."""
    return _binary("mul", a, b)


@value_operator
@builder
def div(a, b):
    """Elementwise a / b with numpy broadcasting; integers truncate toward zero."""
    return _binary("div", a, b)


@value_operator
@builder
def pow(a, b):
    """Elementwise a ** b (floats) with numpy broadcasting."""
    return _binary("pow", a, b)


@builder
def maximum(a, b):
    """Elementwise maximum with numpy broadcasting."""
    return _binary("maximum", a, b)


@builder
def minimum(a, b):
    """Elementwise minimum with numpy broadcasting."""
    return _binary("minimum", a, b)


@builder
def equal(a, b):
    """Elementwise a == b (a bool tensor) with numpy broadcasting."""
    return _binary("equal", a, b)


@builder
def not_equal(a, b):
    """Elementwise a != b (a bool tensor) with numpy broadcasting."""
    return _binary("not_equal", a, b)


@builder
def less(a, b):
    """Elementwise a < b (a bool tensor) with numpy broadcasting."""
    return _binary("less", a, b)


@builder
def less_equal(a, b):
    """Elementwise a <= b (a bool tensor) with numpy broadcasting."""
    return _binary("less_equal", a, b)


@builder
def greater(a, b):
    """Elementwise a > b (a bool tensor) with numpy broadcasting."""
    return _binary("greater", a, b)


@builder
def greater_equal(a, b):
    """Elementwise a >= b (a bool tensor) with numpy broadcasting."""
    return _binary("greater_equal", a, b)


@builder
def logical_and(a, b):
    """Elementwise a and b of bool tensors with numpy broadcasting."""
    return _binary("logical_and", a, b)


@builder
def logical_or(a, b):
    """Elementwise a or b of bool tensors with numpy broadcasting."""
    return _binary("logical_or", a, b)


@builder
def logical_xor(a, b):
    """Elementwise a xor b of bool tensors with numpy broadcasting."""
    return _binary("logical_xor", a, b)


@value_operator
@builder
def neg(x):
    """Elementwise -x."""
    return _unary("neg", x)


@builder
def abs(x):
    """Elementwise |x|."""
    return _unary("abs", x)


@builder
def exp(x):
    """Elementwise e ** x."""
    return _unary("exp", x)


@builder
def log(x):
    """Elementwise natural logarithm."""
    return _unary("log", x)


@builder
def sqrt(x):
    """Elementwise square root."""
    return _unary("sqrt", x)


@builder
def rsqrt(x):
    """Elementwise 1 / sqrt(x)."""
    return _unary("rsqrt", x)


@builder
def tanh(x):
    """Elementwise hyperbolic tangent."""
    return _unary("tanh", x)


@builder
def sigmoid(x):
    """Elementwise 1 / (1 + e ** -x)."""
    return _unary("sigmoid", x)


@builder
def erf(x):
    """Elementwise error function."""
    return _unary("erf", x)


@builder
def relu(x):
    """Elementwise max(x, 0)."""
    return _unary("relu", x)


@builder
def leaky_relu(x, negative_slope=0.01):
    """Elementwise x where x >= 0, else x * negative_slope."""
    return _unary("leaky_relu", x, negative_slope=negative_slope)


@builder
def elu(x, alpha=1.0):
    """Elementwise x where x > 0, else alpha * (e ** x - 1)."""
    return _unary("elu", x, alpha=alpha)


@builder
def clipped_relu(x, ceiling=6.0):
    """Elementwise min(max(x, 0), ceiling)."""
    return _unary("clipped_relu", x, ceiling=ceiling)


@builder
def gelu(x, approximate="none"):
    """Elementwise GELU: exact (erf) with approximate='none', the tanh form with 'tanh'."""
    return _unary("gelu", x, approximate=approximate)


@builder
def silu(x):
    """Elementwise x * sigmoid(x)."""
    return _unary("silu", x)


@builder
def logical_not(x):
    """Elementwise not of a bool tensor."""
    return _unary("logical_not", x)


@builder
def cos(x):
    """Elementwise cosine."""
    return _unary("cos", x)


@builder
def sin(x):
    """Elementwise sine."""
    return _unary("sin", x)


@builder
def sign(x):
    """Elementwise -1, 0 or 1 by the sign of x."""
    return _unary("sign", x)


@builder
def floor(x):
    """Elementwise round down."""
    return _unary("floor", x)


@builder
def ceil(x):
    """Elementwise round up."""
    return _unary("ceil", x)


@builder
def round(x):
    """Elementwise round half to even (ONNX Round)."""
    return _unary("round", x)


@builder
def reciprocal(x):
    """Elementwise 1 / x."""
    return _unary("reciprocal", x)


@builder
def isnan(x):
    """Elementwise x is NaN (a bool tensor)."""
    return _unary("isnan", x)


@builder
def isinf(x, detect_positive=1, detect_negative=1):
    """Elementwise x is +inf (with detect_positive=1) or -inf (with detect_negative=1) (a bool tensor)."""
    return _unary("isinf", x, detect_positive=detect_positive, detect_negative=detect_negative)


__all__ = ["where", "cast", "mod", *BINARY, *COMPARE, *LOGICAL, *UNARY, *PREDICATES]


@builder
def mod(a, b, fmod=0):
    """Remainder with numpy broadcasting: fmod=0 has the sign of b (numpy/Python %), fmod=1 that of a
    (C fmod). An integer remainder by zero is 0; a float one is nan."""
    g = graph_of("mod", a, b)
    like = a if isinstance(a, Value) else b
    return g.apply("mod", [as_value("mod", "a", a, g, like), as_value("mod", "b", b, g, like)], {"fmod": fmod})[0]


@builder
def where(condition, a, b):
    """Select a where condition is true, else b (broadcasting)."""
    g = graph_of("where", condition, a, b)
    like = a if isinstance(a, Value) else b if isinstance(b, Value) else None
    return g.apply(
        "where",
        [
            as_value("where", "condition", condition, g),
            as_value("where", "a", a, g, like),
            as_value("where", "b", b, g, like),
        ],
    )[0]


@builder
def cast(x, dtype, saturate: bool = False):
    """Convert to another dtype (float->int truncates toward zero; ->bool tests != 0; to float8, rounded to nearest
    even: a magnitude past the type's largest becomes NaN, or infinity in e5m2, as ml_dtypes converts; torch's
    float8_e4m3fn conversion saturates, and its importer says so).
    saturate=True (float8 only, ONNX Cast's default): such magnitudes, infinities included, become the largest
    finite value."""
    g = graph_of("cast", x)
    if not isinstance(saturate, bool):
        raise GraphError(f"cast: saturate={saturate!r}: expected True or False")
    attrs = {"dtype": dt.dtype(dtype).name, **({"saturate": True} if saturate else {})}
    return g.apply("cast", [as_value("cast", "x", x, g)], attrs)[0]
