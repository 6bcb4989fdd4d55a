"""LSTM / GRU inference: torch.nn.LSTM/GRU semantics (one layer, one direction, time-major, torch's
gate order), generated lowering against the float64 reference."""

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.frontend.ops.rnn import rnn_reference

from helpers import TOL, check, compile_gpu, rand, rnn_graph as _graph


@pytest.mark.parametrize("op", ["lstm", "gru"])
@pytest.mark.parametrize("biases, states", [(True, True), (False, False)])
def test_matches_reference_f32_symbolic_seq(op, biases, states, rng):
    g, feeds = _graph(op, rng, biases=biases, states=states)
    out = check(g, *feeds)
    assert len(out) == (3 if op == "lstm" else 2)
    assert out[0].shape == (6, 3, 7) and out[1].shape == (1, 3, 7)


@pytest.mark.parametrize("op, dtype", [("lstm", "f16"), ("gru", "f16"), ("lstm", "bf16")])
def test_half_types_accumulate_in_f32(op, dtype, rng):
    g, feeds = _graph(op, rng, dtype=dtype, seq=5, inp=9, hidden=11)
    rtol, atol = TOL[dtype]
    check(g, *feeds, tol=(2 * rtol, 2 * atol))


@pytest.mark.parametrize("op", ["lstm", "gru"])
def test_symbolic_batch_and_one_step(op, rng):
    g, feeds = _graph(op, rng, seq=1, batch="b", inp=3, hidden=5)
    check(g, *feeds)


@pytest.mark.parametrize("op, dtype, states", [("gru", "f32", False), ("gru", "f16", True), ("lstm", "f16", False)])
def test_symbolic_seq_and_batch(op, dtype, states, rng):
    """Both dims symbolic: the loop carries later steps' states correctly (no zero-state reuse)."""
    g, feeds = _graph(op, rng, dtype=dtype, batch="b", inp=4, hidden=6, states=states)
    rtol, atol = TOL[dtype]
    check(g, *feeds, tol=(2 * rtol, 2 * atol))


def test_symbolic_seq_runs_any_length(rng):
    g, _ = _graph("gru", rng, states=False)
    mod = rocmc.load(rocmc.compile(g, "cpu"))
    for seq in (1, 4, 9):
        x = rand(rng, (seq, 3, 5), "f32")
        got, want = mod(x), rocmc.evaluate(g, x)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_reference_is_torch_gate_order():
    """Single-step, single-unit checks of the packed order: LSTM i,f,g,o and GRU r,z,n with the n
    gate's r * (W_hn h + b_hn)."""
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    x, h, c = np.array([[[0.5]]]), np.array([[[0.3]]]), np.array([[[-0.2]]])
    wi, wh = np.array([[1.0], [2.0], [3.0], [4.0]]), np.array([[0.5], [-1.0], [0.25], [2.0]])
    y, hn, cn = rnn_reference("lstm", x, wi, wh, h0=h, c0=c)
    i, f, gg, o = wi[:, 0] * 0.5 + wh[:, 0] * 0.3
    c_want = sig(f) * -0.2 + sig(i) * np.tanh(gg)
    assert np.isclose(cn[0, 0, 0], c_want) and np.isclose(hn[0, 0, 0], sig(o) * np.tanh(c_want))
    bh = np.array([0.1, 0.2, 0.3])
    y, hn = rnn_reference("gru", x, wi[:3], wh[:3], b_hh=bh, h0=h)
    r, z = sig(wi[0, 0] * 0.5 + wh[0, 0] * 0.3 + 0.1), sig(wi[1, 0] * 0.5 + wh[1, 0] * 0.3 + 0.2)
    n = np.tanh(wi[2, 0] * 0.5 + r * (wh[2, 0] * 0.3 + 0.3))
    assert np.isclose(hn[0, 0, 0], (1 - z) * n + z * 0.3) and y[0, 0, 0] == hn[0, 0, 0]


@pytest.mark.parametrize("op", ["lstm", "gru"])
def test_compiles_for_gpus(op, rng):
    g, _ = _graph(op, rng, dtype="f16", batch="b")
    compile_gpu(g)


def _err(fn, *match):
    with pytest.raises(rocmc.GraphError) as e:
        fn()
    for m in match:
        assert m in str(e.value), str(e.value)


def test_bad_inputs():
    g = rocmc.Graph("t")
    x = g.input("x", ("seq", 2, 5), "f32")
    f = lambda *s: np.ones(s, np.float32)  # noqa: E731
    _err(lambda: ops.lstm(x, f(28, 5), f(21, 7)), "lstm(", "'w_hh'", "[4*hidden,hidden]")
    _err(lambda: ops.gru(x, f(21, 4), f(21, 7)), "gru(", "'w_ih'", "[21,5]")
    _err(lambda: ops.lstm(x, f(28, 5), f(28, 7), b_ih=f(21)), "'b_ih'", "[28]")
    _err(lambda: ops.gru(x, f(21, 5), f(21, 7), h0=f(1, 3, 7)), "'h0'", "[1,2,7]")
    _err(lambda: ops.lstm(x, f(28, 5), f(28, 7), c0=f(2, 7)), "'c0'", "[1,2,7]")
    _err(lambda: ops.lstm(x, np.ones((28, 5), np.float16), f(28, 7)), "'w_ih'", "dtype f16")
    _err(lambda: ops.gru(g.input("y", (2, 5), "f32"), f(21, 5), f(21, 7)), "'x'", "rank-3")
    _err(lambda: ops.gru(x, f(21, 5), f(21, 7), c0=f(1, 2, 7)), "gru", "c0")
