"""CNN inference chains -> one convolution: batch norm folded into the conv's weight and bias, and the
residual add and relu that follow a 2-D conv as its epilogue (fused_conv2d).

  conv_bn:       batch_norm(conv(x, w, b))                        -> conv(x, w', b')
  conv_epilogue: relu(add(c, r)), relu(c), add(c, r)              -> fused_conv2d(x, w', b', r, activation)
                 with c = conv2d(x, w, b) or batch_norm(conv2d(x, w, b)), either side of the add,
                 relu also spelled maximum(c, 0) (ONNX Clip(min=0)), r of c's exact shape and dtype.

Inference batch norm is affine per output channel: with s = gamma / sqrt(var + eps),
  w' = w * s[:, None, ...]   (w's first axis is the output channel, grouped or not)
  b' = (b - mean) * s + beta
When w, b and the statistics are all constants, w' and b' are computed here in float64 and rounded once
to the weight's dtype (new constants). Otherwise (parameters, or values the graph computes) the same
arithmetic is emitted as graph ops in f32 (f64 for f64 convs): on values known at load time IREE
hoists it into the module's initializer, so it runs once, not per call.
"""

from __future__ import annotations

import numpy as np

from .. import ops
from ..dtypes import dtype
from .patterns import Match, constant, pairs, pattern, producer, relu_input

CONVS = ("conv1d", "conv2d", "conv3d")


def _conv_under(v, convs=CONVS):
    """(conv, batch_norm or None) when v is conv(...) or batch_norm(conv(...)), else (None, None)."""
    bn = producer(v, "batch_norm")
    conv = producer(bn.inputs[0] if bn is not None else v, *convs)
    return (conv, bn) if conv is not None else (None, None)


def _folded_constants(conv, bn):
    """(w', b') in float64 from constants, rounded to the weight's dtype; None if some operand is no
    constant."""
    w = conv.inputs[1]
    named = {
        "w": w,
        "bias": conv.inputs[2],
        "mean": bn.inputs[1],
        "var": bn.inputs[2],
        "gamma": bn.inputs[3],
        "beta": bn.inputs[4],
    }
    arrays = {k: constant(v) for k, v in named.items() if v is not None}
    if any(a is None for a in arrays.values()):
        return None
    f = {k: np.asarray(a, dtype=np.float64) for k, a in arrays.items()}
    s = 1.0 / np.sqrt(f["var"] + bn.attrs["eps"])
    s = s * f["gamma"] if "gamma" in f else s
    w2 = f["w"] * s.reshape(-1, *[1] * (w.rank - 1))
    b2 = (f.get("bias", 0.0) - f["mean"]) * s + f.get("beta", 0.0)
    return w2.astype(w.dtype.np), b2.astype(w.dtype.np)


def _folded_ops(b, conv, bn):
    """(w', b') as graph ops in f32 (f64 for an f64 weight), cast to the weight's dtype."""
    w = conv.inputs[1]
    t = "f64" if w.dtype.name == "f64" else "f32"

    def value(v):
        if v is None:
            return None
        nv = b.value(v)
        return nv if nv.dtype.name == t else ops.cast(nv, t)

    wv, bias, mean, var, gamma, beta = (value(v) for v in (w, conv.inputs[2], *bn.inputs[1:]))
    one, eps = (b.constant(np.asarray(c, dtype=dtype(t).np)) for c in (1.0, bn.attrs["eps"]))
    s = one / ops.sqrt(var + eps)
    s = s * gamma if gamma is not None else s
    w2 = wv * ops.reshape(s, [w.shape[0]] + [1] * (w.rank - 1))
    b2 = (bias - mean) * s if bias is not None else -(mean * s)
    b2 = b2 + beta if beta is not None else b2
    return tuple(v if v.dtype == w.dtype else ops.cast(v, w.dtype.name) for v in (w2, b2))


def _weights(conv, bn):
    """(the values of the given graph the conv's weight and bias come from, a function of the new
    graph's Builder returning them): batch norm folded in, at compile time when it can be."""
    w, bias = conv.inputs[1], conv.inputs[2]
    if bn is None:
        return [v for v in (w, bias) if v is not None], lambda b: (b.value(w), b.value(bias))
    folded = _folded_constants(conv, bn)
    if folded is not None:
        return [], lambda b: tuple(b.constant(a) for a in folded)
    reads = [v for v in (w, bias, *bn.inputs[1:]) if v is not None]
    return reads, lambda b: _folded_ops(b, conv, bn)


@pattern("conv_bn", "batch_norm")
def _conv_bn(node, uses):
    conv, bn = _conv_under(node.outputs[0])
    if conv is None:
        return None
    reads, weights = _weights(conv, bn)

    def build(b):
        return getattr(ops, conv.op)(b.value(conv.inputs[0]), *weights(b), **conv.attrs)

    return Match(conv.op, [bn, conv], [conv.inputs[0], *reads], build)


# ---- epilogues of conv2d --------------------------------------------------------------------------


def _conv_part(v, uses, inside: list):
    """(conv, bn, nodes) when v is a float conv2d, possibly under a batch norm, whose values are read
    only by `inside` and the chain itself."""
    conv, bn = _conv_under(v, ("conv2d",))
    if conv is None or not conv.outputs[0].dtype.is_float:
        return None
    chain = [n for n in (bn, conv) if n is not None]
    ids = {id(n) for n in inside + chain}
    if not all(uses.only_inside(n.outputs[0], ids) for n in chain):
        return None
    return conv, bn, chain


def _residual_add(add, uses, inside: list):
    """(conv, bn, residual, conv nodes) when add (one of `inside`) is conv_part + residual, either side,
    with the residual of the conv's exact result type and computed outside the chain."""
    for c, r in pairs(add):
        part = _conv_part(c, uses, inside)
        if part is None or r.type != c.type or any(r.producer is n for n in part[2]):
            continue
        return part[0], part[1], r, part[2]
    return None


def _fused(nodes, conv, bn, residual, chain, activation):
    """The match of `nodes` (the anchor first) and the conv `chain` by fused_conv2d."""
    reads, weights = _weights(conv, bn)

    def build(b):
        return ops.fused_conv2d(
            b.value(conv.inputs[0]), *weights(b), b.value(residual), activation=activation, **conv.attrs
        )

    return Match("fused_conv2d", [*nodes, *chain], [conv.inputs[0], *reads, residual], build)


@pattern("conv_epilogue", "relu", "maximum", "add")
def _conv_epilogue(node, uses):
    if node.op == "add":
        found = _residual_add(node, uses, [node])
        return None if found is None else _fused([node], *found, "none")
    x = relu_input(node)
    add = producer(x, "add")
    if add is not None and uses.only_inside(x, {id(node)}):
        found = _residual_add(add, uses, [node, add])
        if found is not None:
            return _fused([node, add], *found, "relu")
    conv, bn, chain = _conv_part(x, uses, [node]) or (None, None, None)
    return None if conv is None else _fused([node], conv, bn, None, chain, "relu")
