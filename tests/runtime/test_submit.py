"""Module.submit: calls issued without waiting, ordered on the device after the calls before them, their
outputs passed on as device arrays (the stream-ordered form of a function, IREE's coarse-fences ABI)."""

from __future__ import annotations

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.artifact import _SEAL, seal
from rocmc.runtime.module import reshaped


def _step_graph(n: int = 37):
    """One step of a recurrence with state: s' = tanh(s @ w + x * 0.5), its state as a (n, 1) input, and the
    new state both as (n,) and as a sum, so that a step's output feeds the next step in another shape."""
    g = rocmc.Graph("step")
    s = g.input("s", (n, 1), "f32")
    x = g.input("x", ("k",), "f32")
    w = g.input("w", (1, 1), "f32")
    mixed = ops.tanh(ops.add(ops.matmul(s, w), ops.reshape(ops.mul(ops.sum(x), np.float32(0.5)), (1, 1))))
    g.output(ops.reshape(mixed, (n,)), ops.sum(mixed))
    return g


@pytest.fixture(scope="module")
def art():
    return rocmc.compile({"step": _step_graph(), "other": _step_graph(5)}, "cpu", asynchronous=["step"])


def _reference(s, xs, w):
    for x in xs:
        s = np.tanh(s.astype(np.float64) * w + 0.5 * x.astype(np.float64).sum())
    return s


def test_submissions_chain_on_the_device_and_equal_calls(art, rng):
    m = rocmc.load(art)
    assert m.can_submit("step") and not m.can_submit("other")
    s0 = rng.standard_normal((37, 1)).astype(np.float32)
    xs = [rng.standard_normal(int(k)).astype(np.float32) for k in rng.integers(1, 9, 6)]
    w = np.array([[0.8]], np.float32)
    subs, s = [], s0
    for x in xs:  # each step issued before the one before it is read: its state input is that step's output
        subs.append(m.submit("step", s, x=x, w=w))
        s = reshaped(subs[-1].outputs[0], (37, 1))
    last, total = subs[-1].result()
    np.testing.assert_allclose(last, _reference(s0[:, 0], xs, 0.8), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(total, last.astype(np.float64).sum(), rtol=1e-4, atol=1e-5)
    assert all(sub.ready for sub in subs)
    # the same steps as synchronous calls
    s = s0
    for x in xs:
        s = m.step(s, x, w)[0].reshape(37, 1)
    np.testing.assert_array_equal(s[:, 0], last)
    assert np.array_equal(subs[2].output(0), m.step(reshaped(subs[1].outputs[0], (37, 1)), xs[2], w)[0])


def test_a_call_after_submissions_sees_their_results(art, rng):
    """A synchronous call is ordered after the submissions before it (the runtime waits for them)."""
    m = rocmc.load(art)
    s0 = rng.standard_normal((37, 1)).astype(np.float32)
    x = rng.standard_normal(3).astype(np.float32)
    w = np.array([[1.1]], np.float32)
    sub = m.submit("step", s0, x, w)
    for _ in range(3):
        sub = m.submit("step", reshaped(sub.outputs[0], (37, 1)), x, w)
    got = m.step(reshaped(sub.outputs[0], (37, 1)), x, w)[0]
    np.testing.assert_allclose(got, _reference(s0[:, 0], [x] * 5, 1.1), rtol=1e-5, atol=1e-6)


def test_inputs_uploaded_once_serve_calls_and_submissions(art, rng):
    m = rocmc.load(art)
    w = np.array([[0.7]], np.float32)
    on = m.on_device("step", w=w)
    assert list(on) == ["w"] and np.array_equal(on["w"].to_host(), w)
    s = rng.standard_normal((37, 1)).astype(np.float32)
    x = rng.standard_normal(4).astype(np.float32)
    want = _reference(s[:, 0], [x], 0.7)
    np.testing.assert_allclose(m.step(s, x, **on)[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.submit("step", s, x=x, **on).result()[0], want, rtol=1e-5, atol=1e-6)
    with pytest.raises(rocmc.InputError, match=r"step has no input 'v' \(it takes s, x, w\)"):
        m.on_device("step", v=w)
    with pytest.raises(rocmc.InputError, match=r"input 'w' is float64\[1, 1\]; step takes f32\[1, 1\]"):
        m.on_device("step", w=w.astype(np.float64))  # never converted behind the caller's back
    with pytest.raises(rocmc.InputError, match=r"input 's' is float32\[36, 1\]"):
        m.on_device("step", s=s[:36])
    with pytest.raises(rocmc.InputError, match=r"on_device\('nope'\): the module has no such function"):
        m.on_device("nope", w=w)


def test_submit_bad_input(art, rng):
    m = rocmc.load(art)
    with pytest.raises(
        rocmc.InputError, match=r"submit\('other'\): the function was compiled without its stream-ordered form"
    ):
        m.submit("other", np.zeros((5, 1), np.float32), np.ones(2, np.float32), np.ones((1, 1), np.float32))
    with pytest.raises(rocmc.InputError, match=r"submit\('nope'\): the module has no such function"):
        m.submit("nope")
    with pytest.raises(rocmc.InputError, match=r"input .s.: dim 0 is 36, expected 37"):
        m.submit("step", np.zeros((36, 1), np.float32), np.ones(2, np.float32), np.ones((1, 1), np.float32))
    sub = m.submit("step", np.zeros((37, 1), np.float32), np.ones(2, np.float32), np.ones((1, 1), np.float32))
    with pytest.raises(rocmc.InputError, match=r"reshaped: \[37\] has 37 elements, \[36, 1\] has 36"):
        reshaped(sub.outputs[0], (36, 1))
    with pytest.raises(rocmc.InputError, match="expected 'numpy' or 'device'"):
        sub.result(output="host")
    with pytest.raises(rocmc.GraphError, match="'later' is not a function of the program"):
        rocmc.compile({"step": _step_graph()}, "cpu", asynchronous=["later"])
    with pytest.raises(rocmc.GraphError, match="expected True, False or a list of function names"):
        rocmc.compile({"step": _step_graph()}, "cpu", asynchronous="step")


def _edited(data: bytes, old: str, new: str) -> bytes:
    """The module with a same-length edit of its metadata JSON, resealed as an attacker could."""
    module = data[: len(data) - _SEAL.size]
    assert len(old) == len(new) and old.encode() in module
    return seal(module.replace(old.encode(), new.encode()))


def test_the_stream_ordered_form_is_checked_against_the_module(art):
    data = art.vmfb
    assert rocmc.Artifact.from_bytes(data).metadata["asynchronous"] == "step$async"
    with pytest.raises(rocmc.ArtifactError, match=r"names 'stex\$async' as the stream-ordered form of 'step'"):
        rocmc.Artifact.from_bytes(_edited(data, '"asynchronous": "step$async"', '"asynchronous": "stex$async"'))
