"""Extern calls on an NVIDIA GPU: the `dnn.*` imports served by the cuDNN provider, against float64.

One module per op (odd sizes, a symbolic batch at two run-time sizes, f32 and f16): convolutions
(grouped, strided, dilated, transposed, 1-d), pools, softmax, log-softmax, the activations, batch norm
and LRN; fused_conv2d (a ResNet block whose conv + batch norm + residual + relu become fused calls);
LSTM and GRU (symbolic sequence length) through cuDNN's RNN API."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import rocmc
from rocmc import ops

from helpers import resnet_block
from gpu_harness import Case, ids, max_rel1

SEED = 1234
BATCHES = (2, 3)  # run-time sizes of the symbolic batch
TOL = {"f32": 1e-4, "f16": 2e-3}
DNN = {"libraries": ["dnn"]}


def _consts(name: str) -> np.random.Generator:
    """The generator of one case's constants: the same on the compile and the run machine."""
    return np.random.default_rng([SEED, zlib.crc32(name.encode())])


def _uniform(shapes, dtype, lo=-2.0, hi=2.0):
    npt = rocmc.dtype(dtype).np
    return lambda rng, n: [rng.uniform(lo, hi, (n,) + tuple(s[1:])).astype(npt) for s in shapes]


def _single(name, shape, build, dtype) -> Case:
    """One extern op on x (symbolic batch); `build(x, w)` with w(*shape) a constant maker."""
    full = f"extern.{name}_{dtype}"

    def graph():
        rng = _consts(full)
        w = lambda *s: rng.uniform(-1, 1, s).astype(rocmc.dtype(dtype).np)  # noqa: E731
        g = rocmc.Graph(name)
        x = g.input("x", ("n",) + shape[1:], dtype)
        g.output(build(x, w, rng))
        return g

    return Case(full, graph, _uniform([shape], dtype), TOL[dtype], max_rel1, sizes=BATCHES, compile=DNN, calls="dnn")


def _single_ops(dtype) -> list[Case]:
    acts = (
        ("relu", {}),
        ("sigmoid", {}),
        ("tanh", {}),
        ("elu", {"alpha": 0.7}),
        ("leaky_relu", {"negative_slope": 0.2}),
        ("clipped_relu", {"ceiling": 0.5}),
    )
    return [
        _single(
            "conv2d",
            (2, 6, 17, 15),
            lambda x, w, r: ops.conv2d(x, w(8, 3, 3, 3), w(8), stride=(2, 1), padding=1, dilation=(1, 2), groups=2),
            dtype,
        ),
        _single("conv1d", (2, 6, 19), lambda x, w, r: ops.conv1d(x, w(4, 6, 5), None, stride=2, padding=2), dtype),
        _single(
            "conv_transpose2d",
            (2, 4, 7, 9),
            lambda x, w, r: ops.conv_transpose2d(
                x, w(4, 3, 3, 2), w(6), stride=2, padding=1, output_padding=1, groups=2
            ),
            dtype,
        ),
        _single(
            "conv_transpose1d",
            (2, 4, 11),
            lambda x, w, r: ops.conv_transpose1d(x, w(4, 5, 4), None, stride=3, padding=1, dilation=2),
            dtype,
        ),
        _single("max_pool2d", (2, 3, 13, 11), lambda x, w, r: ops.max_pool2d(x, 3, stride=2, padding=1), dtype),
        _single(
            "avg_pool2d_exclude",
            (2, 3, 13, 11),
            lambda x, w, r: ops.avg_pool2d(x, (2, 3), stride=(1, 2), padding=1, count_include_pad=False),
            dtype,
        ),
        _single(
            "avg_pool2d_include",
            (2, 3, 13, 11),
            lambda x, w, r: ops.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=True),
            dtype,
        ),
        _single("softmax", (2, 5, 7, 3), lambda x, w, r: ops.softmax(x, axis=2), dtype),
        _single("log_softmax", (2, 5, 33), lambda x, w, r: ops.log_softmax(x, axis=-1), dtype),
        *[
            _single(act, (3, 5, 7), lambda x, w, r, act=act, kw=kw: getattr(ops, act)(x, **kw), dtype)
            for act, kw in acts
        ],
        _single(
            "batch_norm",
            (2, 5, 6, 7),
            lambda x, w, r: ops.batch_norm(
                x,
                w(5).astype(np.float32),
                r.uniform(0.5, 2, 5).astype(np.float32),
                w(5).astype(np.float32),
                None,
                eps=1e-3,
            ),
            dtype,
        ),
        _single("lrn", (2, 7, 5, 3), lambda x, w, r: ops.lrn(x, 5, alpha=0.3, beta=0.75, k=2.0), dtype),
    ]


def _resnet_block(cin, cout, groups, dtype) -> Case:
    """ResNet's basic block with a downsampling shortcut (stride 2, a grouped first conv), batch norms
    after every conv, and a second output conv(x) + r: fused_conv2d calls with relu, with a residual,
    and without an epilogue."""
    name = f"extern.fused_conv2d_block_{dtype}"
    h, w = 9, 11

    def graph():
        return resnet_block(_consts(name), cin, cout, groups, dtype, h, w)

    def inputs(rng, n):
        npt = rocmc.dtype(dtype).np
        return [rng.uniform(-1, 1, s).astype(npt) for s in ((n, cin, h, w), (n, cout, h, w))]

    return Case(name, graph, inputs, TOL[dtype], max_rel1, sizes=BATCHES, compile=DNN, calls="dnn.fused_conv2d")


GATES = {"lstm": 4, "gru": 3}


def _rnn(op, dtype, batch=3, inp=13, hidden=17) -> Case:
    """x (seq, batch, input) with a symbolic sequence and the initial states as inputs, weights constants."""
    name = f"extern.{op}_{dtype}"
    n_states = 2 if op == "lstm" else 1

    def graph():
        rng, npt = _consts(name), rocmc.dtype(dtype).np
        bound = 1 / np.sqrt(hidden)  # torch's init range
        w = lambda *s: rng.uniform(-bound, bound, s).astype(npt)  # noqa: E731
        g = rocmc.Graph(op)
        x = g.input("x", ("seq", batch, inp), dtype)
        states = [g.input(f"s{i}", (1, batch, hidden), dtype) for i in range(n_states)]
        gates = GATES[op] * hidden
        g.output(*getattr(ops, op)(x, w(gates, inp), w(gates, hidden), w(gates), w(gates), *states))
        return g

    def inputs(rng, seq):
        npt = rocmc.dtype(dtype).np
        return [rng.uniform(-1, 1, s).astype(npt) for s in [(seq, batch, inp)] + [(1, batch, hidden)] * n_states]

    return Case(
        name, graph, inputs, 5e-3 if dtype == "f16" else 1e-4, max_rel1, sizes=(1, 37), compile=DNN, calls=f"dnn.{op}"
    )


CASES = [
    *_single_ops("f32"),
    *_single_ops("f16"),
    _resnet_block(9, 15, 3, "f32"),
    _resnet_block(5, 7, 1, "f16"),
    *[_rnn(op, dt) for op in GATES for dt in ("f32", "f16")],
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_cudnn_extern_call(case, gpu):
    gpu(case)
