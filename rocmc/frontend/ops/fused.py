"""Fused ops the graph rewrite puts in place of chains (rocmc.rewrite): a 2-D convolution with its
epilogue, y = activation(conv2d(x, w, b) + residual), a linear layer with its activation and residual,
y = activation(linear(x, w, b) + residual), and the gated MLP's first projection, y = act(x @ gate^T + b_gate) *
(x @ up^T + b_up) with gate and up joined in one weight, and either projection of an RMS-normalized x
(rms_norm_linear: a decoder's q/k/v or gate/up after its norm).

A CNN's conv -> (batch norm, folded into w and b) -> residual add -> relu is one op here, so a
lowering computes the epilogue on the conv's output before it is stored (IREE fuses the elementwise
tail into the conv's dispatch; a library call can take the whole op). The convolution part is
conv2d's: the same attributes, shape rule and reference. Likewise a transformer MLP's first
projection and its relu / tanh-approximated GELU: a GEMM library applies them as its epilogue.
"""

from __future__ import annotations

import numpy as np

from ...errors import GraphError
from ..graph import TensorType
from .conv import CONV_ATTRS, _conv_infer, _conv_ref, _operands, conv_attrs
from .linalg import _linear, _linear_ref
from .norm import _check_eps, _eps_attr
from ..opdef import as_value, builder, defop, graph_of, reference, require_dtype
from ..registry import OPS

__all__ = ["fused_conv2d", "fused_linear", "gated_linear", "rms_norm_linear"]

ACTIVATIONS = {"none": lambda y: y, "relu": lambda y: np.maximum(y, 0.0)}


@defop("fused_conv2d", attrs=(*CONV_ATTRS, "activation"))
def _fused_conv2d_infer(node, types, attrs):
    """conv2d's rule for (x, w, b); the residual is added elementwise, so it has the result's type."""
    y = _conv_infer(node, types[:3], attrs)
    r = types[3]
    if r is not None and r != y:
        raise GraphError(f"{node.describe()}: 'residual' is {r}, expected the convolution's result type {y}")
    if attrs.get("activation") not in ACTIVATIONS:
        raise GraphError(
            f"{node.describe()}: attribute activation={attrs.get('activation')!r}, expected one of "
            f"{', '.join(map(repr, ACTIVATIONS))}"
        )
    return y


@reference("fused_conv2d")
def _fused_conv2d_ref(node, ins, attrs):
    x, w, b, r = ins
    y = _conv_ref(node, [x, w, b], attrs)[0]
    return [ACTIVATIONS[attrs["activation"]](y if r is None else y + r)]


@builder
def fused_conv2d(x, weight, bias=None, residual=None, *, stride=1, padding=0, dilation=1, groups=1, activation="none"):
    """activation(conv2d(x, weight, bias, ...) + residual): conv2d's keywords; `residual` (optional) has
    the convolution's result shape and dtype; activation is "none" or "relu"."""
    g, operands = _operands("fused_conv2d", x, weight, bias)
    rv = None if residual is None else as_value("fused_conv2d", "residual", residual, g, like=operands[0])
    attrs = {**conv_attrs("fused_conv2d", 2, operands[1], stride, padding, dilation, groups), "activation": activation}
    return g.apply("fused_conv2d", [*operands, rv], attrs)[0]


# fused_linear's activations (the GEMM library's epilogue names): the elementwise op each one is, with
# its attributes, so the reference and the generated lowering are that op's own ("none": no activation).
LINEAR_ACTIVATIONS = {"none": None, "relu": ("relu", {}), "gelu_tanh": ("gelu", {"approximate": "tanh"})}
# gated_linear's: the gate's activation (SwiGLU's silu, GeGLU's tanh GELU).
GATE_ACTIVATIONS = {"silu": ("silu", {}), "gelu_tanh": ("gelu", {"approximate": "tanh"})}


def _activation_attr(node, attrs, table) -> None:
    if attrs.get("activation") not in table:
        raise GraphError(
            f"{node.describe()}: attribute activation={attrs.get('activation')!r}, expected one of "
            f"{', '.join(map(repr, table))}"
        )


def _float_linear(node, types, attrs):
    """linear's rule for (x, weight, bias), for a float x."""
    y = _linear(node, types[:3], attrs)
    if not y.dtype.is_float:
        raise GraphError(f"{node.describe()}: 'x' has dtype {y.dtype}, expected a float tensor")
    return y


def activate(node, y, table, name):
    """The elementwise op `table[name]` on y, by its own reference (None: y)."""
    if table[name] is None:
        return y
    op, act_attrs = table[name]
    return OPS[op].reference(node, [y], act_attrs)[0]


@defop("fused_linear", attrs=("activation",))
def _fused_linear_infer(node, types, attrs):
    """linear's rule; the residual (optional) has the result's type; the activations are float functions."""
    y = _float_linear(node, types, attrs)
    _activation_attr(node, attrs, LINEAR_ACTIVATIONS)
    r = types[3] if len(types) > 3 else None
    if r is not None and r != y:
        raise GraphError(f"{node.describe()}: 'residual' is {r}, expected the linear layer's result type {y}")
    return y


@reference("fused_linear")
def _fused_linear_ref(node, ins, attrs):
    y = _linear_ref(node, ins[:3], {})[0]
    r = ins[3] if len(ins) > 3 else None
    return [activate(node, y if r is None else y + r, LINEAR_ACTIVATIONS, attrs["activation"])]


@builder
def fused_linear(x, weight, bias=None, residual=None, *, activation="none"):
    """activation(linear(x, weight, bias) + residual): linear's operands; `residual` (optional) has the result's
    shape and dtype (a transformer's skip connection); activation is "none", "relu" or "gelu_tanh" (gelu with
    approximate="tanh")."""
    g = graph_of("fused_linear", x)
    x = as_value("fused_linear", "x", x, g)
    weight = as_value("fused_linear", "weight", weight, g, x)
    bias = None if bias is None else as_value("fused_linear", "bias", bias, g, x)
    operands = [x, weight, bias]
    if residual is not None:
        operands.append(as_value("fused_linear", "residual", residual, g, x))
    return g.apply("fused_linear", operands, {"activation": activation})[0]


@defop("gated_linear", attrs=("activation",))
def _gated_linear_infer(node, types, attrs):
    """linear's rule on the joined weight (2n, k), whose halves give n outputs each: (..., n)."""
    y = _float_linear(node, types, attrs)
    _activation_attr(node, attrs, GATE_ACTIVATIONS)
    out = y.shape[-1]
    if not isinstance(out, int) or out % 2:
        raise GraphError(
            f"{node.describe()}: 'weight' has {out} rows, expected a static even count (the gate's rows, then the up's)"
        )
    half = out // 2
    return TensorType(y.shape[:-1] + (half,), y.dtype)


@reference("gated_linear")
def _gated_linear_ref(node, ins, attrs):
    both = _linear_ref(node, ins, {})[0]
    n = both.shape[-1] // 2
    gate = activate(node, both[..., :n], GATE_ACTIVATIONS, attrs["activation"])
    return [gate * both[..., n:]]


@builder
def gated_linear(x, weight, bias=None, *, activation="silu"):
    """activation(x @ gate^T + bias_gate) * (x @ up^T + bias_up), the gated MLP's first projection (SwiGLU with
    "silu", GeGLU with "gelu_tanh"): weight is gate's (n, k) rows then up's (n, k) rows, joined (2n, k), bias
    likewise (2n,); the result has n features."""
    g = graph_of("gated_linear", x)
    x = as_value("gated_linear", "x", x, g)
    weight = as_value("gated_linear", "weight", weight, g, x)
    bias = None if bias is None else as_value("gated_linear", "bias", bias, g, x)
    return g.apply("gated_linear", [x, weight, bias], {"activation": activation})[0]


# rms_norm_linear's gates: "none" (a linear layer) or gated_linear's activations.
NORM_GATES = ("none", *GATE_ACTIVATIONS)


@defop("rms_norm_linear", attrs=("eps", "gate"))
def _rms_norm_linear_infer(node, types, attrs):
    """rms_norm over x's last dim (the contraction's), then linear's rule, or gated_linear's with a gate."""
    x, norm = types[0], types[1]
    _check_eps(node, attrs)
    gate = attrs.get("gate")
    if gate not in NORM_GATES:
        names = ", ".join(map(repr, NORM_GATES))
        raise GraphError(f"{node.describe()}: attribute gate={gate!r}, expected one of {names}")
    if x.rank == 0:
        raise GraphError(f"{node.describe()}: 'x' is 0-d, expected a tensor of rank >= 1")
    require_dtype(node.describe(), "norm_weight", norm)
    if norm.shape != x.shape[-1:]:
        want = list(x.shape[-1:])
        raise GraphError(f"{node.describe()}: 'norm_weight' is {norm}, expected shape {want} (x's last dim)")
    rest = [x, *types[2:]]
    if gate == "none":
        return _float_linear(node, rest, attrs)
    return _gated_linear_infer(node, rest, {"activation": gate})


@reference("rms_norm_linear")
def _rms_norm_linear_ref(node, ins, attrs):
    x, norm, w, b = ins
    h = OPS["rms_norm"].reference(node, [x, norm], {"eps": attrs["eps"], "axis": x.ndim - 1})[0]
    if attrs["gate"] == "none":
        return _linear_ref(node, [h, w, b], {})
    return _gated_linear_ref(node, [h, w, b], {"activation": attrs["gate"]})


@builder
def rms_norm_linear(x, norm_weight, weight, bias=None, *, eps=1e-6, gate="none"):
    """linear(rms_norm(x, norm_weight, eps), weight, bias), or with gate "silu" / "gelu_tanh" gated_linear's
    act(gate) * up over the joined weight: a decoder layer's projection of its normalized input as one op, so
    a kernel normalizes x on its way into the product (rms_norm over x's last dim; norm_weight has its size)."""
    g = graph_of("rms_norm_linear", x)
    x = as_value("rms_norm_linear", "x", x, g)
    norm_weight = as_value("rms_norm_linear", "norm_weight", norm_weight, g, x)
    weight = as_value("rms_norm_linear", "weight", weight, g, x)
    bias = None if bias is None else as_value("rms_norm_linear", "bias", bias, g, x)
    attrs = {"eps": _eps_attr("rms_norm_linear", eps), "gate": gate}
    return g.apply("rms_norm_linear", [x, norm_weight, weight, bias], attrs)[0]
