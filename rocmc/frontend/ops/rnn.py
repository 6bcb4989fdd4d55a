"""Recurrent family: single-layer, unidirectional LSTM and GRU inference with torch.nn.LSTM/GRU
semantics and torch's packed gate order (LSTM: i, f, g, o; GRU: r, z, n).

Layout is time-major: x (seq, batch, input); the weights are torch's `weight_ih_l0` (G*hidden,
input) and `weight_hh_l0` (G*hidden, hidden), G = 4 (LSTM) or 3 (GRU); the biases (G*hidden,) and
the initial states (1, batch, hidden) are optional (zeros). The outputs are y (seq, batch, hidden),
h_n (1, batch, hidden) and, for the LSTM, c_n. seq and batch may be symbolic; input and hidden
sizes come from the weights and must be static.
"""

from __future__ import annotations

import numpy as np

from ...errors import GraphError
from ..graph import TensorType
from ..opdef import as_value, builder, defop, graph_of, reference

__all__ = ["lstm", "gru"]

GATES = {"lstm": 4, "gru": 3}
# Operand names in graph order; the states each op takes after the biases.
OPERANDS = {
    "lstm": ("x", "w_ih", "w_hh", "b_ih", "b_hh", "h0", "c0"),
    "gru": ("x", "w_ih", "w_hh", "b_ih", "b_hh", "h0"),
}


def _shape(s) -> str:
    return "[" + ",".join(map(str, s)) + "]"


def _expect(node, arg: str, t: TensorType, shape, dtype) -> None:
    if t.dtype != dtype:
        raise GraphError(f"{node.describe()}: {arg!r} has dtype {t.dtype}, expected {dtype} like 'x'")
    if tuple(t.shape) != tuple(shape):
        raise GraphError(f"{node.describe()}: {arg!r} has shape {_shape(t.shape)}, expected {_shape(shape)}")


def _rnn_infer(node, types, attrs):
    op = node.op
    g = GATES[op]
    x, w_ih, w_hh = types[:3]
    desc = node.describe()
    if x.rank != 3 or not x.dtype.is_float:
        raise GraphError(f"{desc}: 'x' is {x}, expected a rank-3 float tensor (seq, batch, input)")
    seq, batch, inp = x.shape
    if not isinstance(inp, int):
        raise GraphError(f"{desc}: 'x' has shape {x}; the input size (dim 2) must be static")
    if w_hh.rank != 2 or not all(isinstance(d, int) for d in w_hh.shape) or w_hh.shape[0] != g * w_hh.shape[1]:
        raise GraphError(
            f"{desc}: 'w_hh' has shape {_shape(w_hh.shape)}, expected static [{g}*hidden,hidden] ({g} gates)"
        )
    hidden = w_hh.shape[1]
    _expect(node, "w_hh", w_hh, (g * hidden, hidden), x.dtype)
    _expect(node, "w_ih", w_ih, (g * hidden, inp), x.dtype)
    for arg, t in zip(OPERANDS[op][3:], types[3:]):
        if t is not None:
            want = (g * hidden,) if arg.startswith("b") else (1, batch, hidden)
            _expect(node, arg, t, want, x.dtype)
    state = TensorType((1, batch, hidden), x.dtype)
    return [TensorType((seq, batch, hidden), x.dtype)] + [state] * (2 if op == "lstm" else 1)


defop("lstm")(_rnn_infer)
defop("gru")(_rnn_infer)


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _lstm_step(gx, gh, h, c):
    i, f, g, o = np.split(gx + gh, 4, axis=-1)
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    return _sigmoid(o) * np.tanh(c), c


def _gru_step(gx, gh, h, c):
    xr, xz, xn = np.split(gx, 3, axis=-1)
    hr, hz, hn = np.split(gh, 3, axis=-1)
    r, z = _sigmoid(xr + hr), _sigmoid(xz + hz)
    n = np.tanh(xn + r * hn)
    return (1.0 - z) * n + z * h, c


STEPS = {"lstm": _lstm_step, "gru": _gru_step}


def rnn_reference(op: str, x, w_ih, w_hh, b_ih=None, b_hh=None, h0=None, c0=None):
    """Plain time loop in float64: (y, h_n[, c_n])."""
    seq, batch, _ = x.shape
    hidden = w_hh.shape[1]
    zeros = np.zeros((batch, hidden))
    b_ih = 0.0 if b_ih is None else b_ih
    b_hh = 0.0 if b_hh is None else b_hh
    h = zeros if h0 is None else h0[0]
    c = zeros if c0 is None else c0[0]
    y = np.zeros((seq, batch, hidden))
    for t in range(seq):
        h, c = STEPS[op](x[t] @ w_ih.T + b_ih, h @ w_hh.T + b_hh, h, c)
        y[t] = h
    return [y, h[None]] + ([c[None]] if op == "lstm" else [])


@reference("lstm", "gru")
def _rnn_ref(node, ins, attrs):
    return rnn_reference(node.op, *ins)


def _rnn(op, x, w_ih, w_hh, optional):
    g = graph_of(op, x)
    xv = as_value(op, "x", x, g)
    operands = [xv, as_value(op, "w_ih", w_ih, g, like=xv), as_value(op, "w_hh", w_hh, g, like=xv)]
    operands += [None if v is None else as_value(op, arg, v, g, like=xv) for arg, v in zip(OPERANDS[op][3:], optional)]
    return tuple(g.apply(op, operands, {}))


@builder
def lstm(x, w_ih, w_hh, b_ih=None, b_hh=None, h0=None, c0=None):
    """torch.nn.LSTM (one layer, one direction, time-major) inference: returns (y, h_n, c_n)."""
    return _rnn("lstm", x, w_ih, w_hh, (b_ih, b_hh, h0, c0))


@builder
def gru(x, w_ih, w_hh, b_ih=None, b_hh=None, h0=None):
    """torch.nn.GRU (one layer, one direction, time-major) inference: returns (y, h_n)."""
    return _rnn("gru", x, w_ih, w_hh, (b_ih, b_hh, h0))
