"""ONNX elementwise ops: arithmetic, comparisons and logic (Add ... Xor), unary math (Neg ... IsNaN),
activations (LeakyRelu, Gelu, HardSwish, Mish, ...), Clip, Max/Min/Sum/Mean, Where, Cast/CastLike,
Identity and inference-mode Dropout.

Integer arrays known at import are folded with numpy; over symbolic sizes (Shape arithmetic of
exporters: seq+1, batch*seq, seq//2, min(seq, 512), seq == 1) they are computed with rocmc.symbolic's
arithmetic, and a comparison is decided by the importer (SizeReasoning), recording what it assumed.
Other elementwise nodes whose inputs are all known are folded with rocmc's own references
(REFERENCE_FOLDS).
"""

from __future__ import annotations

import numpy as np

from ... import symbolic
from .importer import REFERENCE_FOLDS, converts, folds
from .values import Node, Tensor, Unsupported, _check_folded, _known_array, _ops, _rocmc_dtype, _static, _sym_values

_BINARY = {
    "Add": "add",
    "Sub": "sub",
    "Mul": "mul",
    "Div": "div",
    "Equal": "equal",
    "Less": "less",
    "LessOrEqual": "less_equal",
    "Greater": "greater",
    "GreaterOrEqual": "greater_equal",
    "And": "logical_and",
    "Or": "logical_or",
    "Xor": "logical_xor",
}
_NUMPY_BINARY = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Equal": np.equal,
    "Less": np.less,
    "LessOrEqual": np.less_equal,
    "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and,
    "Or": np.logical_or,
    "Xor": np.logical_xor,
}
_UNARY = {
    "Neg": "neg",
    "Abs": "abs",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Tanh": "tanh",
    "Sigmoid": "sigmoid",
    "Erf": "erf",
    "Relu": "relu",
    "Not": "logical_not",
    "Cos": "cos",
    "Sin": "sin",
    "Sign": "sign",
    "Floor": "floor",
    "Ceil": "ceil",
    "Round": "round",
    "Reciprocal": "reciprocal",
    "IsNaN": "isnan",
}


@converts(*_BINARY)
def _binary(n: Node):
    if n.version < 7 and n.attr("broadcast", 0):
        raise Unsupported("legacy broadcast attribute (opset < 7)")
    return getattr(_ops(), _BINARY[n.proto.op_type])(n.value(0), n.value(1))


@folds(*_NUMPY_BINARY, broadcasting=True)
def _fold_binary(n: Node):
    a, b = n.known(0, "A"), n.known(1, "B")
    if _sym_values((a, b)):
        return _sym_elementwise(n, [a, b])
    arithmetic = n.proto.op_type in ("Add", "Sub", "Mul")
    return [_NUMPY_BINARY[n.proto.op_type](a, b).astype(a.dtype if arithmetic else bool)]


def _sym_elementwise(n: Node, arrays) -> list:
    """An elementwise node over sizes (some symbolic), computed with rocmc.symbolic's arithmetic:
    the shape arithmetic of exporters (seq+1, batch*seq, seq//2, min(seq, 512), seq == 1)."""
    op = n.proto.op_type
    if not all(np.asarray(a).dtype.kind in "Oiu" for a in arrays):
        raise Unsupported(f"{op} mixes symbolic sizes with non-integer values")
    shape = np.broadcast_shapes(*(np.shape(a) for a in arrays))
    out = [_sym_scalar(n, op, list(xs)) for xs in np.broadcast(*arrays)]
    if op in _SIZE_COMPARISONS:
        return [np.asarray(out, dtype=bool).reshape(shape)]
    res = np.empty(len(out), dtype=object)
    res[:] = out
    return [res.reshape(shape)]


_SIZE_COMPARISONS = {"Equal": "==", "Less": "<", "LessOrEqual": "<=", "Greater": ">", "GreaterOrEqual": ">="}


def _sym_scalar(n: Node, op: str, xs: list):
    xs = [x if isinstance(x, str) else int(x) for x in xs]
    S = symbolic
    if op in _SIZE_COMPARISONS:
        return n.imp.decide(xs[0], _SIZE_COMPARISONS[op], xs[1])
    if op in ("Max", "Min"):
        assumed: dict = {}
        acc = xs[0]
        for x in xs[1:]:
            acc = (S.dim_max if op == "Max" else S.dim_min)(acc, x, assumed)
        n.imp.assume_symbols(assumed)
        return acc
    if op in ("Div", "Mod"):
        a, b = xs
        if not (n.imp.decide(b, ">", 0) and n.imp.decide(a, ">=", 0)):
            raise Unsupported(f"{op} of sizes {a} and {b}: only non-negative by positive is supported")
        return S.dim_floordiv(a, b) if op == "Div" else S.dim_mod(a, b)
    fn = {"Add": S.dim_add, "Sub": S.dim_sub, "Mul": S.dim_mul}.get(op)
    if fn is None:
        raise Unsupported(f"{op} of symbolic sizes")
    return fn(*xs)


@folds("Mod", broadcasting=True)
def _fold_mod(n: Node):
    a, b = n.known(0, "A"), n.known(1, "B")
    if _sym_values((a, b)):
        return _sym_elementwise(n, [a, b])
    return [(np.fmod(a, b) if n.attr("fmod", 0) else np.mod(a, b)).astype(a.dtype)]


@folds("Div", broadcasting=True)
def _fold_div(n: Node):
    a, b = n.known(0, "A"), n.known(1, "B")
    if _sym_values((a, b)):
        return _sym_elementwise(n, [a, b])
    if a.dtype.kind in "iu":
        q = np.abs(a) // np.maximum(np.abs(b), 1)
        return [np.where((a < 0) ^ (b < 0), -q, q).astype(a.dtype)]
    return [(a / b).astype(a.dtype)]


@converts("Pow")
def _pow(n: Node):
    x, y = n.value(0), n.value(1)
    if y.dtype != x.dtype:  # ONNX allows an exponent of another type; rocmc's pow wants one dtype
        y = _ops().cast(y, x.dtype)
    return _ops().pow(x, y)


@converts(*_UNARY)
def _unary(n: Node):
    return getattr(_ops(), _UNARY[n.proto.op_type])(n.value(0))


@converts("IsInf")
def _isinf(n: Node):
    return _ops().isinf(
        n.value(0), detect_positive=int(n.attr("detect_positive", 1)), detect_negative=int(n.attr("detect_negative", 1))
    )


@converts("Mod")
def _mod(n: Node):
    return _ops().mod(n.value(0), n.value(1), fmod=int(n.attr("fmod", 0)))


_NUMPY_UNARY = {
    "Neg": np.negative,
    "Abs": np.abs,
    "Not": np.logical_not,
    "Sqrt": np.sqrt,
    "Exp": np.exp,
    "Log": np.log,
    "Relu": lambda a: np.maximum(a, 0),
}


@folds(*_NUMPY_UNARY)
def _fold_unary(n: Node):
    a = n.known(0, "X")
    if a.dtype == object:
        if n.proto.op_type != "Neg":
            return None
        return [_known_array(np.vectorize(lambda d: symbolic.dim_sub(0, d), otypes=[object])(a))]
    return [np.asarray(_NUMPY_UNARY[n.proto.op_type](a)).astype(a.dtype)]


_ACTIVATIONS = {
    "LeakyRelu": lambda R, x, n: R.leaky_relu(x, negative_slope=float(n.attr("alpha", 0.01))),
    "Elu": lambda R, x, n: R.elu(x, alpha=float(n.attr("alpha", 1.0))),
    "Gelu": lambda R, x, n: R.gelu(x, approximate=n.attr("approximate", "none")),
    "Softsign": lambda R, x, n: R.div(x, R.add(R.abs(x), 1.0)),
    # relu(x) + log(1 + exp(-|x|)): no overflow for large |x|
    "Softplus": lambda R, x, n: _softplus(R, x),
    "HardSigmoid": lambda R, x, n: R.clipped_relu(
        R.add(R.mul(x, float(n.attr("alpha", 0.2))), float(n.attr("beta", 0.5))), ceiling=1.0
    ),
    "HardSwish": lambda R, x, n: R.mul(x, R.clipped_relu(R.add(R.mul(x, 1.0 / 6.0), 0.5), ceiling=1.0)),
    "Selu": lambda R, x, n: R.mul(
        R.elu(x, alpha=float(n.attr("alpha", 1.67326319217681884765625))),
        float(n.attr("gamma", 1.05070102214813232421875)),
    ),
    # celu(x) = alpha * elu(x / alpha)
    "Celu": lambda R, x, n: R.mul(R.elu(R.div(x, float(n.attr("alpha", 1.0)))), float(n.attr("alpha", 1.0))),
    "ThresholdedRelu": lambda R, x, n: R.where(R.greater(x, float(n.attr("alpha", 1.0))), x, R.mul(x, 0.0)),
    "Mish": lambda R, x, n: R.mul(x, R.tanh(_softplus(R, x))),
}


def _softplus(R, x):
    return R.add(R.relu(x), R.log(R.add(R.exp(R.neg(R.abs(x))), 1.0)))


@converts(*_ACTIVATIONS)
def _activation(n: Node):
    if n.proto.op_type == "Gelu":
        n.reject_attr("approximate", ("none", "tanh"), "none")
    return _ACTIVATIONS[n.proto.op_type](_ops(), n.value(0), n)


@converts("PRelu")
def _prelu(n: Node):
    R = _ops()
    x, slope = n.value(0), n.value(1)
    return R.where(R.less(x, 0), R.mul(x, slope), x)


@converts("Clip")
def _clip(n: Node):
    R = _ops()
    x = n.value(0)
    if n.version < 11:
        lo, hi = n.attr("min"), n.attr("max")
        lo = None if lo is None else np.asarray(lo, dtype=x.dtype.np)
        hi = None if hi is None else np.asarray(hi, dtype=x.dtype.np)
    else:
        lo, hi = n.value(1), n.value(2)
    if lo is not None:
        x = R.maximum(x, lo)
    if hi is not None:
        x = R.minimum(x, hi)
    return x


@converts("Max", "Min", "Sum", "Mean")
def _variadic(n: Node):
    R = _ops()
    fn = {"Max": R.maximum, "Min": R.minimum, "Sum": R.add, "Mean": R.add}[n.proto.op_type]
    vals = [n.value(i) for i in range(len(n.inputs))]
    acc = vals[0]
    for v in vals[1:]:
        acc = fn(acc, v)
    if n.proto.op_type == "Mean":
        acc = R.div(acc, float(len(vals)))
    return acc


@folds("Max", "Min", broadcasting=True)
def _fold_minmax(n: Node):
    arrs = [n.known(i, "data_0") for i in range(len(n.inputs))]
    if _sym_values(arrs):
        return _sym_elementwise(n, arrs)
    fn = np.maximum if n.proto.op_type == "Max" else np.minimum
    acc = arrs[0]
    for a in arrs[1:]:
        acc = fn(acc, a)
    return [acc]


@converts("Where")
def _where(n: Node):
    return _ops().where(n.value(0), n.value(1), n.value(2))


@folds("Where", broadcasting=True)
def _fold_where(n: Node):
    c, a, b = n.known(0, "condition"), n.known(1, "X"), n.known(2, "Y")
    return [np.where(c, a, b)]


REFERENCE_FOLDS.update(
    _UNARY, _BINARY, _ACTIVATIONS, ("IsInf", "Mod", "Pow", "PRelu", "Clip", "Max", "Min", "Sum", "Mean", "Where")
)


@converts("Cast", "CastLike")
def _cast(n: Node):
    from ...dtypes import FLOAT8, dtype
    from ..ops.elementwise import saturated

    to = n.inputs[1].dtype_name() if n.proto.op_type == "CastLike" else _rocmc_dtype(n.attr("to"), "target type 'to'")
    # To a float8 type, out-of-range values saturate unless saturate=0 (opset 19 on).
    saturate = dtype(to) in FLOAT8 and bool(n.attr("saturate", 1))
    src = n.inputs[0]
    if src.known is not None and src.known.dtype != object:  # e.g. a constant cast like a runtime tensor
        a = src.known
        if saturate:
            a = saturated(a.astype(np.float64), dtype(to))
        with np.errstate(over="ignore", invalid="ignore"):
            return [a.astype(dtype(to).np)]
    return _ops().cast(n.value(0), to, saturate=saturate)


@folds("Cast")
def _fold_cast(n: Node):
    a = n.known(0, "input")
    to = n.attr("to")
    if a.dtype == object:  # sizes stay sizes as integers; as floats they become data (Importer.value)
        return [Tensor(known=a, int_type="i32" if to == 6 else "i64")] if to in (6, 7) else None
    import onnx.helper

    if to in _FLOAT8_TYPES:  # saturation: the converter's
        return None
    return [a.astype(onnx.helper.tensor_dtype_to_np_dtype(to))]


_FLOAT8_TYPES = (17, 18, 19, 20)  # TensorProto's FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ


@converts("Identity", "Dropout")
def _identity(n: Node):
    if n.proto.op_type == "Dropout":
        training = n.known(2, "training_mode") if n.version >= 12 else None
        if training is not None and bool(np.asarray(training).reshape(-1)[0]):
            ratio = n.known(1, "ratio", np.asarray(0.5)) if n.version >= 12 else n.attr("ratio", 0.5)
            if float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
                raise Unsupported("training_mode=true with a nonzero ratio (random dropout) is not supported")
        if n.wants_output(1):  # the mask of an inference dropout keeps everything
            shape = _static(n.inputs[0].shape, "Dropout's mask output")
            _check_folded(shape, bool, "Dropout's mask output")
            return [n.inputs[0], np.ones(shape, dtype=bool)]
    return [n.inputs[0]]
