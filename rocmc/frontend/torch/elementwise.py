"""Elementwise ATen ops, casts, tensor creation, reductions and softmax, onto rocmc's ops.

Arithmetic computes in torch's promoted dtype (`Node.promoted`: int tensor + float scalar is a float
tensor, a 0-d tensor does not widen a tensor); comparisons compare in it and give bool.
"""

from __future__ import annotations

import math

from .importer import Missing, Node, Unsupported, _ops, aten_exists, converts, is_size

_BINARY = {
    "add": "add",
    "sub": "sub",
    "mul": "mul",
    "maximum": "maximum",
    "minimum": "minimum",
    "eq": "equal",
    "ne": "not_equal",
    "lt": "less",
    "le": "less_equal",
    "gt": "greater",
    "ge": "greater_equal",
    "logical_and": "logical_and",
    "logical_or": "logical_or",
    "logical_xor": "logical_xor",
}
_COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
_LOGICAL = {"logical_and", "logical_or", "logical_xor"}


def _names(ops, overloads):
    """The overloads torch has of each op."""
    return [name for op in ops for o in overloads if aten_exists(name := f"aten.{op}.{o}")]


@converts(*_names(_BINARY, ("Tensor", "Scalar", "default")))
def _binary(n: Node):
    R = _ops()
    op = n.fx.target._schema.name.split("::")[1]
    if op in _LOGICAL:
        a, b = n.value("self", "bool"), n.value("other", "bool")
    else:
        dt = n.promoted("self", "other")
        a, b = n.value("self", dt), n.value("other", dt)
    alpha = n.a.get("alpha", 1)
    if op in ("add", "sub") and alpha != 1:
        b = R.mul(b, n.imp.tensor(alpha, b.dtype.name, "alpha"))
    return getattr(R, _BINARY[op])(a, b)


@converts(*_names(("bitwise_and", "bitwise_or", "bitwise_xor"), ("Tensor", "Scalar")))
def _bitwise(n: Node):
    if n.promoted("self", "other") != "bool":
        raise Unsupported("bitwise ops on integers are not supported (only on bool tensors)")
    op = n.fx.target._schema.name.split("::")[1].replace("bitwise", "logical")
    return getattr(_ops(), op)(n.value("self", "bool"), n.value("other", "bool"))


@converts("aten.bitwise_not.default", "aten.logical_not.default")
def _not(n: Node):
    if n.fx.target._schema.name.endswith("bitwise_not") and n.out_dtype() != "bool":
        raise Unsupported("bitwise_not of integers is not supported (only of bool tensors)")
    return _ops().logical_not(n.value("self", "bool"))


@converts("aten.rsub.Tensor", "aten.rsub.Scalar")
def _rsub(n: Node):
    R = _ops()
    dt = n.promoted("self", "other")
    a, b = n.value("self", dt), n.value("other", dt)
    alpha = n.a.get("alpha", 1)
    return R.sub(b, a if alpha == 1 else R.mul(a, n.imp.tensor(alpha, dt, "alpha")))


@converts("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div(n: Node):
    R = _ops()
    mode = n.a.get("rounding_mode")
    if mode is None:  # true division, in torch's float result dtype
        return R.div(n.value("self", n.out_dtype()), n.value("other", n.out_dtype()))
    if mode not in ("floor", "trunc"):
        raise Unsupported(f"rounding_mode={mode!r}")
    dt = n.promoted("self", "other")
    a, b = n.value("self", dt), n.value("other", dt)
    if a.dtype.is_float:
        q = R.div(a, b)
        return R.floor(q) if mode == "floor" else R.mul(R.sign(q), R.floor(R.abs(q)))
    # integers: subtract the remainder (floored or truncated), then the division is exact
    return R.div(R.sub(a, R.mod(a, b, fmod=int(mode == "trunc"))), b)


@converts("aten.remainder.Tensor", "aten.remainder.Scalar", "aten.fmod.Tensor", "aten.fmod.Scalar")
def _remainder(n: Node):
    dt = n.promoted("self", "other")
    fmod = int(n.fx.target._schema.name.endswith("fmod"))
    return _ops().mod(n.value("self", dt), n.value("other", dt), fmod=fmod)


@converts("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(n: Node):
    dt = n.promoted("self", "exponent")
    return _ops().pow(n.value("self", dt), n.value("exponent", dt))


_UNARY = {
    "neg": "neg",
    "abs": "abs",
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "erf": "erf",
    "relu": "relu",
    "cos": "cos",
    "sin": "sin",
    "sign": "sign",
    "floor": "floor",
    "ceil": "ceil",
    "round": "round",
    "reciprocal": "reciprocal",
}
_FLOAT_RESULT = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "cos", "sin", "reciprocal"}


@converts(*_names(_UNARY, ("default",)))
def _unary(n: Node):
    op = n.fx.target._schema.name.split("::")[1]
    dt = n.out_dtype() if op in _FLOAT_RESULT else None  # integer inputs compute in torch's float dtype
    return getattr(_ops(), _UNARY[op])(n.value("self", dt))


_COMPOSITE = {
    "log1p": lambda R, x: R.log(R.add(x, 1.0)),
    "expm1": lambda R, x: R.sub(R.exp(x), 1.0),
    "log2": lambda R, x: R.div(R.log(x), math.log(2.0)),
    "log10": lambda R, x: R.div(R.log(x), math.log(10.0)),
    "exp2": lambda R, x: R.exp(R.mul(x, math.log(2.0))),
    "tan": lambda R, x: R.div(R.sin(x), R.cos(x)),
    "trunc": lambda R, x: R.mul(R.sign(x), R.floor(R.abs(x))),
    "silu": lambda R, x: R.silu(x),
    "hardsigmoid": lambda R, x: R.clipped_relu(R.add(R.div(x, 6.0), 0.5), ceiling=1.0),
    "hardswish": lambda R, x: R.mul(x, R.clipped_relu(R.add(R.div(x, 6.0), 0.5), ceiling=1.0)),
}


@converts(*_names(_COMPOSITE, ("default",)))
def _composite(n: Node):
    op = n.fx.target._schema.name.split("::")[1]
    x = n.value("self", n.out_dtype())
    return _COMPOSITE[op](_ops(), x)


@converts("aten.isnan.default")
def _isnan(n: Node):
    return _ops().isnan(n.value("self"))


@converts("aten.isinf.default")
def _isinf(n: Node):
    return _ops().isinf(n.value("self"))


@converts("aten.gelu.default")
def _gelu(n: Node):
    return _ops().gelu(n.value("self"), approximate=n.a.get("approximate", "none"))


@converts("aten.leaky_relu.default")
def _leaky_relu(n: Node):
    return _ops().leaky_relu(n.value("self"), negative_slope=float(n.a.get("negative_slope", 0.01)))


@converts("aten.elu.default")
def _elu(n: Node):
    if n.a.get("scale", 1) != 1 or n.a.get("input_scale", 1) != 1:
        raise Unsupported("elu with scale or input_scale other than 1")
    return _ops().elu(n.value("self"), alpha=float(n.a.get("alpha", 1.0)))


@converts(
    "aten.clamp.default",
    "aten.clamp.Tensor",
    "aten.hardtanh.default",
    "aten.clamp_min.default",
    "aten.clamp_max.default",
)
def _clamp(n: Node):
    R = _ops()
    op = n.fx.target._schema.name.split("::")[1]
    keys = {"hardtanh": ("min_val", "max_val"), "clamp_min": ("min", None), "clamp_max": (None, "max")}
    lo_key, hi_key = keys.get(op, ("min", "max"))
    dt = n.out_dtype()
    x = n.value("self", dt)
    lo = n.a.get(lo_key) if lo_key else None
    hi = n.a.get(hi_key) if hi_key else None
    if op == "hardtanh" and lo == 0 and isinstance(hi, (int, float)):
        return R.clipped_relu(x, ceiling=float(hi))  # relu6: the activation form
    if lo is not None:
        x = R.maximum(x, n.imp.tensor(lo, dt, "min"))
    if hi is not None:
        x = R.minimum(x, n.imp.tensor(hi, dt, "max"))
    return x


@converts("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(n: Node):
    dt = n.promoted("self", "other")
    return _ops().where(n.value("condition", "bool"), n.value("self", dt), n.value("other", dt))


# ---- casts and identities ------------------------------------------------------------------------------


@converts("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout")
def _to_copy(n: Node):
    return n.value("self", n.out_dtype())


@converts(
    "aten.clone.default",
    "aten.alias.default",
    "aten.detach.default",
    "aten.lift_fresh_copy.default",
    "aten.contiguous.default",
    "aten.dropout.default",
)
def _identity(n: Node):
    if n.name == "aten.dropout.default" and n.a.get("train") and n.a.get("p"):
        raise Unsupported("dropout in training mode")
    return n.value("input" if "input" in n.a else "self")


@converts("aten.native_dropout.default")
def _native_dropout(n: Node):
    if n.a.get("train") is not False and n.a.get("p"):
        raise Unsupported("dropout in training mode (random) is not supported")
    return [n.value("input"), Missing("native_dropout's mask is not computed")]


@converts(
    "aten._assert_tensor_metadata.default",
    "aten._assert_scalar.default",
    "aten.sym_constrain_range_for_size.default",
    "aten.sym_constrain_range.default",
)
def _assertion(n: Node):
    """torch's own checks of the traced program: the types rocmc infers and the Dims' ranges (graph
    assumptions) cover them."""
    return None


# ---- creation -----------------------------------------------------------------------------------


def _filled(n: Node, shape, fill, dt: str):
    R = _ops()
    if not is_size(fill) and not isinstance(fill, (bool, float)):
        raise Unsupported(f"fill value {fill!r} is not a number")
    scalar = n.imp.tensor(fill, dt, "fill_value")
    return scalar if not shape else R.broadcast_to(scalar, tuple(shape))


@converts("aten.full.default", "aten.new_full.default")
def _full(n: Node):
    return _filled(n, n.size_list("size"), n.a["fill_value"], n.out_dtype())


@converts("aten.full_like.default")
def _full_like(n: Node):
    return _filled(n, list(n.a["self"].shape), n.a["fill_value"], n.out_dtype())


@converts("aten.zeros.default", "aten.ones.default", "aten.new_zeros.default", "aten.new_ones.default")
def _zeros_ones(n: Node):
    return _filled(n, n.size_list("size"), int("ones" in n.name), n.out_dtype())


@converts("aten.zeros_like.default", "aten.ones_like.default")
def _zeros_ones_like(n: Node):
    return _filled(n, list(n.a["self"].shape), int("ones" in n.name), n.out_dtype())


@converts("aten.scalar_tensor.default")
def _scalar_tensor(n: Node):
    return n.imp.tensor(n.a["s"], n.out_dtype(), "s")


# ---- reductions -----------------------------------------------------------------------------------


def _dims(n: Node, key: str, rank: int) -> tuple:
    dims = n.a.get(key)
    if dims is None or dims == []:
        return tuple(range(rank))
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(sorted(n.axis(d, rank, key) for d in dims))


def _reduce_input(n: Node):
    """The input in torch's accumulation dtype: an explicit dtype=, else bool/int sums in int64."""
    x = n.a["self"]
    return n.value("self", n.out_dtype() if n.out_dtype() != x.dtype.name else None)


@converts(
    "aten.sum.dim_IntList",
    "aten.sum.default",
    "aten.mean.dim",
    "aten.mean.default",
    "aten.prod.dim_int",
    "aten.prod.default",
    "aten.amax.default",
    "aten.amin.default",
)
def _reduce(n: Node):
    R = _ops()
    op = n.fx.target._schema.name.split("::")[1]
    x = _reduce_input(n)
    key = "dim" if "dim" in n.a else None
    axes = _dims(n, key, x.rank) if key else tuple(range(x.rank))
    keep = bool(n.a.get("keepdim", False))
    if x.rank == 0:
        return x
    if x.dtype.name == "bool" and op in ("amax", "amin"):
        return R.cast(getattr(R, op[1:])(R.cast(x, "i32"), axis=axes, keepdims=keep), "bool")
    fn = {"sum": R.sum, "mean": R.mean, "prod": R.prod, "amax": R.max, "amin": R.min}[op]
    return fn(x, axis=axes, keepdims=keep)


@converts("aten.any.dim", "aten.any.dims", "aten.any.default", "aten.all.dim", "aten.all.dims", "aten.all.default")
def _any_all(n: Node):
    R = _ops()
    x = R.cast(n.value("self", "bool"), "i32")
    axes = _dims(n, "dim", x.rank) if "dim" in n.a else tuple(range(x.rank))
    fn = R.max if "any" in n.name else R.min
    return R.cast(fn(x, axis=axes, keepdims=bool(n.a.get("keepdim", False))), "bool")


@converts("aten.max.dim", "aten.min.dim")
def _max_dim(n: Node):
    R = _ops()
    x = n.value("self")
    axis, keep = n.axis(n.a["dim"], x.rank), bool(n.a.get("keepdim", False))
    big = "max" in n.name
    values = (R.max if big else R.min)(x, axis=axis, keepdims=keep)
    return [values, (R.argmax if big else R.argmin)(x, axis=axis, keepdims=keep)]


@converts("aten.max.default", "aten.min.default")
def _max_all(n: Node):
    R = _ops()
    x = n.value("self")
    return (R.max if "max" in n.name else R.min)(x, axis=tuple(range(x.rank)))


@converts("aten.argmax.default", "aten.argmin.default")
def _argmax(n: Node):
    R = _ops()
    x = n.value("self")
    fn = R.argmax if "argmax" in n.name else R.argmin
    if n.a.get("dim") is None:
        return (
            fn(R.reshape(x, (-1,)), axis=0, keepdims=False)
            if not n.a.get("keepdim")
            else R.reshape(fn(R.reshape(x, (-1,)), axis=0), (1,) * x.rank)
        )
    return fn(x, axis=n.axis(n.a["dim"], x.rank), keepdims=bool(n.a.get("keepdim", False)))


@converts("aten.var.correction", "aten.var.dim", "aten.std.correction", "aten.std.dim", "aten.var_mean.correction")
def _var(n: Node):
    R = _ops()
    x = n.value("self")
    axes = _dims(n, "dim", x.rank)
    keep = bool(n.a.get("keepdim", False))
    correction = n.a.get("correction")
    if correction is None:
        correction = 1 if n.a.get("unbiased", True) else 0
    count = 1
    for a in axes:
        if not isinstance(x.shape[a], int):
            raise Unsupported(f"variance over the symbolic dim {x.shape[a]}")
        count *= x.shape[a]
    mean = R.mean(x, axis=axes, keepdims=True)
    centered = R.sub(x, mean)
    var = R.mul(R.mean(R.mul(centered, centered), axis=axes, keepdims=keep), count / max(count - correction, 0))
    if "var_mean" in n.name:
        return [var, mean if keep else R.mean(x, axis=axes, keepdims=False)]
    return R.sqrt(var) if ".std." in n.name else var


@converts("aten._softmax.default", "aten.softmax.int", "aten._log_softmax.default", "aten.log_softmax.int")
def _softmax(n: Node):
    R = _ops()
    x = n.value("self", n.out_dtype())
    fn = R.log_softmax if "log_softmax" in n.name else R.softmax
    return fn(x, axis=n.axis(n.a["dim"], x.rank))


@converts("aten.cumsum.default")
def _cumsum(n: Node):
    x = n.value("self", n.out_dtype())
    return _ops().cumsum(x, n.axis(n.a["dim"], x.rank))


@converts("aten.triu.default", "aten.tril.default")
def _triu(n: Node):
    R = _ops()
    fn = R.triu if "triu" in n.name else R.tril
    return fn(n.value("self"), int(n.a.get("diagonal", 0)))
