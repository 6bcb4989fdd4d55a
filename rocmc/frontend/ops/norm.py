"""Softmax, log-softmax, layer norm and RMS norm.

All of them compute in f32 whatever the storage type and return x's dtype. softmax/log_softmax work
along one axis; layer_norm and rms_norm normalize over the trailing dims `axis..rank-1` (ONNX's
definition; the default -1 is the last dim, as in torch and candle), so their optional weight and
bias have exactly the shape `x.shape[axis:]`.
"""
from __future__ import annotations

import numpy as np

from ...errors import GraphError
from ..graph import TensorType
from ..opdef import as_value, builder, defop, graph_of, normalize_axis, reference, require_dtype

__all__ = ["softmax", "log_softmax", "layer_norm", "rms_norm"]


# ---- shape and attribute rules ------------------------------------------------------------------

def _check_x(node, t: TensorType) -> None:
    require_dtype(node.describe(), "x", t)
    if t.rank == 0:
        raise GraphError(f"{node.describe()}: 'x' is 0-d, expected a tensor of rank >= 1")


def _check_axis(node, attrs, rank: int) -> int:
    axis = attrs.get("axis")
    if normalize_axis(node.describe(), axis, rank) != axis:
        raise GraphError(f"{node.describe()}: axis={axis!r}, expected a non-negative axis below rank {rank}")
    return axis


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
            raise GraphError(f"{node.describe()}: {arg!r} has shape [{','.join(map(str, t.shape))}], expected "
                             f"[{','.join(map(str, want))}] (x.shape[{axis}:] for x of shape {x})")


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
