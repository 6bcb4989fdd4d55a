"""Linear algebra: matmul (numpy semantics, with transpose flags) and linear (torch's x @ W^T + b).

Float matmuls accumulate in f32 whatever the storage type; integer matmuls accumulate in their own type.
"""
from __future__ import annotations

import numpy as np

from ...errors import GraphError
from ..graph import TensorType, Value
from ..opdef import as_value, broadcast_shapes, builder, defop, graph_of, reference, same_dtype

__all__ = ["matmul", "linear"]

KINDS = ("float", "int")


def _check_operands(node, types, names):
    desc = node.describe()
    for t, n in zip(types, names):
        if t is not None and t.dtype.kind not in KINDS:
            raise GraphError(f"{desc}: {n!r} has dtype {t.dtype}, expected a float or int tensor")
    present = [(t, n) for t, n in zip(types, names) if t is not None]
    same_dtype(desc, [t for t, _ in present], [n for _, n in present])


def _inner_dims(node, ka, kb) -> None:
    if ka != kb:
        raise GraphError(f"{node.describe()}: inner dims differ: {ka} vs {kb}")


def matmul_shape(node, a: TensorType, b: TensorType, transpose_a: bool, transpose_b: bool) -> tuple:
    """numpy.matmul's result shape after the optional swap of each operand's last two dims."""
    desc = node.describe()
    for t, arg, flag in ((a, "a", transpose_a), (b, "b", transpose_b)):
        if t.rank == 0:
            raise GraphError(f"{desc}: {arg!r} is a scalar, expected rank >= 1")
        if flag and t.rank < 2:
            raise GraphError(f"{desc}: transpose_{arg}=True needs {arg!r} of rank >= 2, got {t}")
    sa, sb = swap_last(a.shape, transpose_a), swap_last(b.shape, transpose_b)
    _inner_dims(node, sa[-1], sb[-2] if len(sb) >= 2 else sb[0])
    batch = broadcast_shapes(desc, sa[:-2], sb[:-2])
    return batch + sa[-2:-1] + (sb[-1:] if len(sb) >= 2 else ())


def swap_last(shape: tuple, flag: bool) -> tuple:
    return shape[:-2] + (shape[-1], shape[-2]) if flag else shape


@defop("matmul", attrs=("transpose_a", "transpose_b"))
def _matmul(node, types, attrs):
    a, b = types
    _check_operands(node, types, ("a", "b"))
    return TensorType(matmul_shape(node, a, b, attrs["transpose_a"], attrs["transpose_b"]), a.dtype)


@reference("matmul")
def _matmul_ref(node, ins, attrs):
    a, b = ins
    if attrs["transpose_a"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["transpose_b"]:
        b = np.swapaxes(b, -1, -2)
    return [np.matmul(a, b)]


@defop("linear")
def _linear(node, types, attrs):
    x, w, bias = types
    _check_operands(node, types, ("x", "weight", "bias"))
    desc = node.describe()
    if x.rank < 1:
        raise GraphError(f"{desc}: 'x' is a scalar, expected rank >= 1 (..., in_features)")
    if w.rank != 2:
        raise GraphError(f"{desc}: 'weight' has rank {w.rank} ({w}), expected rank 2 (out_features, in_features)")
    _inner_dims(node, x.shape[-1], w.shape[1])
    if bias is not None and bias.shape != (w.shape[0],):
        raise GraphError(f"{desc}: 'bias' has shape {bias}, expected [{w.shape[0]}] (out_features)")
    return TensorType(x.shape[:-1] + (w.shape[0],), x.dtype)


@reference("linear")
def _linear_ref(node, ins, attrs):
    x, w, bias = ins
    y = np.matmul(x, w.T)
    return [y if bias is None else y + bias]


@builder
def matmul(a, b, transpose_a=False, transpose_b=False):
    """numpy.matmul (1-D operands and batch broadcasting included); a transpose flag swaps the last
    two dims of its operand first. f16/bf16 accumulate in f32."""
    g = graph_of("matmul", a, b)
    like = a if isinstance(a, Value) else b
    operands = [as_value("matmul", "a", a, g, like), as_value("matmul", "b", b, g, like)]
    return g.apply("matmul", operands, {"transpose_a": _flag("matmul", "transpose_a", transpose_a),
                                        "transpose_b": _flag("matmul", "transpose_b", transpose_b)})[0]


@builder
def linear(x, weight, bias=None):
    """torch.nn.functional.linear: x @ weight^T + bias, weight of shape (out_features, in_features)."""
    g = graph_of("linear", x)
    x = as_value("linear", "x", x, g)
    weight = as_value("linear", "weight", weight, g, x)
    bias = None if bias is None else as_value("linear", "bias", bias, g, x)
    return g.apply("linear", [x, weight, bias])[0]


def _flag(op, name, v) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise GraphError(f"{op}: {name}={v!r}, expected a bool")
    return bool(v)
