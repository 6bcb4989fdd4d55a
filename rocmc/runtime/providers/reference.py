"""Reference provider: the extern ABI served on local CPU devices by the ops' own float64 references.

This is how CI runs the import path end to end without a GPU: the compiled module calls the same
`dnn.<op>` and `blas.matmul` imports it calls on a GPU, and each call here is the frontend
op's `@reference` (rocmc/frontend/ops), computed in float64 and rounded once to the storage type.
What this module holds is only the translation from the ABI's form (rocmc.externs: i64 scalars
such as stride_h / pad_h, symmetric padding, (outer, axis, inner) softmax views, (N, C, spatial)
norm views, flattened activations, empty tensors for absent operands, packed recurrent results) to
the op's attributes and operands, so the library path and `evaluate` share one definition of each
op. The GEMM call's own semantics (alpha, bias over columns, an epilogue) are composed from the
matmul reference and the epilogue's activation reference.
"""

from __future__ import annotations

import numpy as np

from ...externs import CONV_ACTIVATIONS, EPILOGUES
from ...frontend import ops as _ops  # noqa: F401  (registers every op and its reference)
from ...frontend.graph import Node
from ...frontend.ops.fused import LINEAR_ACTIVATIONS
from ...frontend.registry import get_op
from ..devices import upload
from .base import Provider, dtype_of


def _call(op: str, operands: list, attrs: dict) -> list:
    """The op's float64 reference on the given operands (None for an absent one)."""
    return get_op(op).reference(Node(op, [None] * len(operands), attrs), operands, attrs)


def _present(t):
    """The ABI's empty tensor is an absent operand."""
    return t if t.size else None


def _conv_attrs(a: dict, nsp: int, transpose: bool) -> dict:
    """stride_h, pad_h, ... (or stride, pad, ... in 1-D) -> the op's per-dim lists; ABI padding is symmetric."""
    axes = ("_h", "_w") if nsp == 2 else ("",)
    per_dim = lambda key: [a[key + s] for s in axes]  # noqa: E731
    out = {
        "stride": per_dim("stride"),
        "padding": [[p, p] for p in per_dim("pad")],
        "dilation": per_dim("dilation"),
        "groups": a["groups"],
    }
    if transpose:
        out["output_padding"] = per_dim("output_padding")
    return out


def _conv(op: str, nsp: int, transpose: bool = False):
    def run(t, a):
        x, w, b = t
        return _call(op, [x, w, _present(b)], _conv_attrs(a, nsp, transpose))[0]

    return run


def _fused_conv2d(t, a):
    x, w, b, r = t
    attrs = {**_conv_attrs(a, 2, False), "activation": CONV_ACTIVATIONS[a["activation"]]}
    return _call("fused_conv2d", [x, w, _present(b), _present(r)], attrs)[0]


def _pool(op: str):
    """kernel_h, stride_h, pad_h, ... -> the op's lists; the ABI's pooling has no dilation or ceil mode."""

    def run(t, a):
        attrs = {
            "kernel_size": [a["kernel_h"], a["kernel_w"]],
            "stride": [a["stride_h"], a["stride_w"]],
            "padding": [[a["pad_h"]] * 2, [a["pad_w"]] * 2],
            "dilation": [1, 1],
            "ceil_mode": False,
        }
        if op == "avg_pool2d":
            attrs["count_include_pad"] = bool(a["count_include_pad"])
        return _call(op, t, attrs)[0]

    return run


def _softmax(op: str):
    """x arrives as (outer, axis, inner)."""
    return lambda t, a: _call(op, t, {"axis": 1})[0]


def _unary(op: str):
    """Activations see x flattened; their scalars carry the op's attribute names."""
    return lambda t, a: _call(op, t, dict(a))[0]


def _batch_norm(t, a):
    x, mean, var, weight, bias = t
    return _call("batch_norm", [x, mean, var, _present(weight), _present(bias)], {"eps": a["eps"]})[0]


def _rnn(op: str):
    """The ABI's packed result: y's rows, then h_n (and c_n) along the time dim."""

    def run(t, a):
        x, w_ih, w_hh, *optional = t
        return np.concatenate(_call(op, [x, w_ih, w_hh, *map(_present, optional)], {}))

    return run


def _sdpa(t, a):
    q, k, v = t
    return _call("sdpa", [q, k, v, None], {"scale": a["scale"], "is_causal": False})[0]


def _gemm(t, a):
    """The GEMM ABI: alpha * op(a) @ op(b) over a (possibly broadcast) batch, + bias over columns, epilogue."""
    x, y, bias = t
    d = (
        a["alpha"]
        * _call("matmul", [x, y], {"transpose_a": bool(a["transpose_a"]), "transpose_b": bool(a["transpose_b"])})[0]
    )
    if bias.size:
        d = d + bias
    epilogue = EPILOGUES[a["epilogue"]]
    if epilogue == "none":
        return d
    op, attrs = LINEAR_ACTIVATIONS[epilogue]
    return _call(op, [d], attrs)[0]


# op -> fn(float64 operands in ABI order, decoded scalars) -> the result array
OPS = {
    "conv1d": _conv("conv1d", 1),
    "conv2d": _conv("conv2d", 2),
    "fused_conv2d": _fused_conv2d,
    "conv_transpose1d": _conv("conv_transpose1d", 1, transpose=True),
    "conv_transpose2d": _conv("conv_transpose2d", 2, transpose=True),
    "max_pool2d": _pool("max_pool2d"),
    "avg_pool2d": _pool("avg_pool2d"),
    "softmax": _softmax("softmax"),
    "log_softmax": _softmax("log_softmax"),
    **{op: _unary(op) for op in ("relu", "sigmoid", "tanh", "elu", "leaky_relu", "clipped_relu")},
    "batch_norm": _batch_norm,
    "lrn": lambda t, a: _call("lrn", t, dict(a))[0],
    "lstm": _rnn("lstm"),
    "gru": _rnn("gru"),
    "sdpa": _sdpa,
    "matmul": _gemm,
}


class ReferenceProvider(Provider):
    library = "the numpy reference provider"

    def run(self, op, tensors, attrs):
        from iree import runtime as rt

        x = tensors[0]
        y = OPS[op]([rt.DeviceArray(self.device, t).to_host().astype(np.float64) for t in tensors], attrs)
        dtype = dtype_of(x.element_type)
        return upload(self.device, np.asarray(y).astype(dtype.np), dtype, x.element_type)
