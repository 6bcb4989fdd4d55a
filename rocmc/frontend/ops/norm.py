"""Softmax, log-softmax, layer norm and RMS norm; instance norm and group norm built from layer norm.

All of them compute in f32 whatever the storage type and return x's dtype. softmax/log_softmax work
along one axis; layer_norm and rms_norm normalize over the trailing dims `axis..rank-1` (ONNX's
definition; the default -1 is the last dim, as in torch and candle), so their optional weight and
bias have exactly the shape `x.shape[axis:]`.

instance_norm and group_norm (torch's semantics, layout (N, C, *spatial)) are builders: a group norm
is a layer norm over the trailing dims of x viewed as (N, G, C/G, *spatial) (an instance norm is
one group per channel), followed by the per-channel weight and bias. The statistics therefore
accumulate in f32 for f16/bf16 like layer_norm's, and the graph shows the layer_norm it runs.
"""

from __future__ import annotations

import numpy as np

from ...errors import GraphError
from ..graph import TensorType
from ..opdef import as_value, builder, check_axis, defop, graph_of, normalize_axis, reference, require_dtype
from .elementwise import add, mul
from .shape import reshape

__all__ = ["softmax", "log_softmax", "layer_norm", "rms_norm", "instance_norm", "group_norm"]


# ---- shape and attribute rules ------------------------------------------------------------------


def _check_x(node, t: TensorType) -> None:
    require_dtype(node.describe(), "x", t)
    if t.rank == 0:
        raise GraphError(f"{node.describe()}: 'x' is 0-d, expected a tensor of rank >= 1")


def _check_axis(node, attrs, rank: int) -> int:
    return check_axis(node.describe(), attrs.get("axis"), rank)


def _check_eps(node, attrs) -> None:
    eps = attrs.get("eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise GraphError(f"{node.describe()}: eps={eps!r}, expected a number >= 0")


def _check_affine(node, types, names, axis: int) -> None:
    """Weight and bias cover the normalized dims exactly: shape x.shape[axis:], a float dtype."""
    x = types[0]
    want = x.shape[axis:]
    for t, arg in zip(types[1:], names):
        if t is None:
            continue
        require_dtype(node.describe(), arg, t)
        if t.shape != want:
            raise GraphError(
                f"{node.describe()}: {arg!r} has shape [{','.join(map(str, t.shape))}], expected "
                f"[{','.join(map(str, want))}] (x.shape[{axis}:] for x of shape {x})"
            )


def _softmax_infer(node, types, attrs):
    _check_x(node, types[0])
    _check_axis(node, attrs, types[0].rank)
    return types[0]


def _norm_infer(names):
    def infer(node, types, attrs):
        _check_x(node, types[0])
        axis = _check_axis(node, attrs, types[0].rank)
        _check_eps(node, attrs)
        _check_affine(node, types, names, axis)
        return types[0]

    return infer


defop("softmax", attrs=("axis",))(_softmax_infer)
defop("log_softmax", attrs=("axis",))(_softmax_infer)
defop("layer_norm", attrs=("eps", "axis"))(_norm_infer(("weight", "bias")))
defop("rms_norm", attrs=("eps", "axis"))(_norm_infer(("weight",)))


# ---- float64 references -------------------------------------------------------------------------


def _shifted(x, axis):
    return x - np.max(x, axis=axis, keepdims=True)


@reference("softmax")
def _softmax_ref(node, ins, attrs):
    e = np.exp(_shifted(ins[0], attrs["axis"]))
    return [e / np.sum(e, axis=attrs["axis"], keepdims=True)]


@reference("log_softmax")
def _log_softmax_ref(node, ins, attrs):
    s = _shifted(ins[0], attrs["axis"])
    return [s - np.log(np.sum(np.exp(s), axis=attrs["axis"], keepdims=True))]


def _trailing(x, axis):
    return tuple(range(axis, x.ndim))


@reference("layer_norm")
def _layer_norm_ref(node, ins, attrs):
    x, w, b = ins
    axes = _trailing(x, attrs["axis"])
    d = x - np.mean(x, axis=axes, keepdims=True)
    y = d / np.sqrt(np.mean(d * d, axis=axes, keepdims=True) + attrs["eps"])
    y = y if w is None else y * w
    return [y if b is None else y + b]


@reference("rms_norm")
def _rms_norm_ref(node, ins, attrs):
    x, w = ins
    y = x / np.sqrt(np.mean(x * x, axis=_trailing(x, attrs["axis"]), keepdims=True) + attrs["eps"])
    return [y if w is None else y * w]


# ---- builders ------------------------------------------------------------------------------------


def _axis_attr(op, x, axis) -> int:
    if x.rank == 0:
        raise GraphError(f"{op}: 'x' is 0-d, expected a tensor of rank >= 1")
    return normalize_axis(op, axis, x.rank)


def _eps_attr(op, eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)):
        raise GraphError(f"{op}: eps={eps!r}, expected a number >= 0")
    return float(eps)


def _optional(op, arg, v, g, like):
    return None if v is None else as_value(op, arg, v, g, like)


@builder
def softmax(x, axis=-1):
    """exp(x - max) / sum(exp(x - max)) along `axis`, computed in f32."""
    g = graph_of("softmax", x)
    x = as_value("softmax", "x", x, g)
    return g.apply("softmax", [x], {"axis": _axis_attr("softmax", x, axis)})[0]


@builder
def log_softmax(x, axis=-1):
    """(x - max) - log(sum(exp(x - max))) along `axis`, computed in f32."""
    g = graph_of("log_softmax", x)
    x = as_value("log_softmax", "x", x, g)
    return g.apply("log_softmax", [x], {"axis": _axis_attr("log_softmax", x, axis)})[0]


@builder
def layer_norm(x, weight=None, bias=None, eps=1e-5, axis=-1):
    """(x - mean) / sqrt(var + eps) * weight + bias over dims axis..rank-1 (biased variance)."""
    g = graph_of("layer_norm", x)
    x = as_value("layer_norm", "x", x, g)
    ops = [x, _optional("layer_norm", "weight", weight, g, x), _optional("layer_norm", "bias", bias, g, x)]
    attrs = {"eps": _eps_attr("layer_norm", eps), "axis": _axis_attr("layer_norm", x, axis)}
    return g.apply("layer_norm", ops, attrs)[0]


@builder
def rms_norm(x, weight=None, eps=1e-6, axis=-1):
    """x / sqrt(mean(x^2) + eps) * weight over dims axis..rank-1."""
    g = graph_of("rms_norm", x)
    x = as_value("rms_norm", "x", x, g)
    attrs = {"eps": _eps_attr("rms_norm", eps), "axis": _axis_attr("rms_norm", x, axis)}
    return g.apply("rms_norm", [x, _optional("rms_norm", "weight", weight, g, x)], attrs)[0]


def _channels_first(op: str, x) -> int:
    """x is a float tensor (N, C, *spatial) with a static channel count: returns C."""
    if x.rank < 3 or not x.dtype.is_float:
        raise GraphError(f"{op}: 'x' is {x.type}, expected a float tensor of rank >= 3 (N, C, *spatial)")
    if not isinstance(x.shape[1], int):
        raise GraphError(f"{op}: 'x' has a symbolic channel dim ({x.type}); expected a static one")
    return x.shape[1]


def _per_channel(op: str, y, x, weight, bias):
    """y * weight + bias with weight and bias of shape [C] broadcast along dim 1 of x."""
    g, c = x.graph, x.shape[1]
    for arg, v, fn in (("weight", weight, mul), ("bias", bias, add)):
        if v is None:
            continue
        v = as_value(op, arg, v, g, x)
        if v.shape != (c,) or v.dtype != x.dtype:
            raise GraphError(f"{op}: {arg!r} is {v.type}, expected {x.dtype}[{c}] (one value per channel)")
        y = fn(y, reshape(v, (c,) + (1,) * (x.rank - 2)))
    return y


@builder
def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """(x - mean) / sqrt(var + eps) over each group of C/num_groups channels and all spatial dims
    (biased variance), then * weight + bias per channel (shape [C])."""
    g = graph_of("group_norm", x)
    x = as_value("group_norm", "x", x, g)
    c = _channels_first("group_norm", x)
    if (
        isinstance(num_groups, bool)
        or not isinstance(num_groups, (int, np.integer))
        or num_groups < 1
        or c % num_groups
    ):
        raise GraphError(
            f"group_norm: num_groups={num_groups!r}, expected a positive divisor of the {c} channels of 'x'"
        )
    grouped = reshape(x, (x.shape[0], int(num_groups), c // int(num_groups), *x.shape[2:]))
    y = reshape(layer_norm(grouped, eps=_eps_attr("group_norm", eps), axis=2), x.shape)
    return _per_channel("group_norm", y, x, weight, bias)


@builder
def instance_norm(x, weight=None, bias=None, eps=1e-5):
    """(x - mean) / sqrt(var + eps) over the spatial dims of each sample and channel (biased
    variance), then * weight + bias per channel (shape [C]); no running statistics."""
    g = graph_of("instance_norm", x)
    x = as_value("instance_norm", "x", x, g)
    _channels_first("instance_norm", x)
    y = layer_norm(x, eps=_eps_attr("instance_norm", eps), axis=2)
    return _per_channel("instance_norm", y, x, weight, bias)
