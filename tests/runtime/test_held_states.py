"""Held states: a module whose functions are issued stream-ordered (compile(asynchronous=...)) takes its states as
buffers its caller holds (the runtime's Module), updated in place, instead of globals of its own; the
stream-ordered form takes its results' buffers and its transient storage from the caller too, so a submission is
one queue submission with no allocation, free or host wait (lowering/module.py, _held_entry_points)."""

from __future__ import annotations

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.artifact import STATE_BUFFERS
from rocmc.runtime.module import reshaped


def _program():
    """step: total += x (a state of 6 rows, one row a call at `row`), its output the updated row times 2 and the
    count of calls (a second state, i64); read: the whole total plus z (reads a state, writes none); scale: no
    state."""
    step = rocmc.Graph("step")
    x = step.input("x", (1, 5), "f32")
    row = step.input("row", (), "i64")
    total = step.state("total", (6, 5), "f32")
    calls = step.state("calls", (1,), "i64")
    updated = ops.add(ops.narrow(total, 0, row, 1), x)
    step.assign("total", ops.update_slice(total, updated, row, axis=0))
    step.assign("calls", ops.add(calls, np.int64(1)))
    step.output(ops.mul(updated, np.float32(2.0)), ops.add(calls, np.int64(1)))
    read = rocmc.Graph("read")
    z = read.input("z", ("n", 5), "f32")
    read.output(ops.add(ops.sum(read.state("total", (6, 5), "f32"), axis=0, keepdims=True), z))
    scale = rocmc.Graph("scale")
    y = scale.input("y", (3,), "f32")
    scale.output(ops.mul(y, np.float32(3.0)))
    return {"step": step, "read": read, "scale": scale}


@pytest.fixture(scope="module")
def art():
    return rocmc.compile(_program(), "cpu", asynchronous=["step", "scale"])


def test_metadata_names_the_states_each_function_takes(art):
    meta = art.metadata
    assert meta["function"] == "step" and meta["held_states"] == ["total", "calls"]
    assert meta["assigned_states"] == ["total", "calls"] and meta["async_storage"] == "caller"
    read, scale = meta["functions"]
    assert (read["held_states"], read["assigned_states"]) == (["total"], [])
    assert (scale["held_states"], scale["assigned_states"], scale["async_storage"]) == ([], [], "caller")
    assert "async_storage" not in read  # not stream-ordered
    assert [s["name"] for s in meta["states"]] == ["total", "calls"]
    stream = art.ir("stream")
    assert "util.global private mutable" not in stream  # no state of the module's own
    assert STATE_BUFFERS in art.ir("input")
    summary = art.summary()
    assert "state: total f32[6,5] (on the device, held by the loaded Module" in summary
    assert "step$async: its results' buffers and transient storage come from the caller" in summary


def _reference(xs, rows):
    total, calls, outs = np.zeros((6, 5)), 0, []
    for x, r in zip(xs, rows):
        total[r] += x[0]
        calls += 1
        outs.append((2 * total[r], calls))
    return total, outs


def test_calls_and_submissions_update_the_states_in_place(art, rng):
    m = rocmc.load(art)
    xs = [rng.standard_normal((1, 5)).astype(np.float32) for _ in range(7)]
    rows = [int(r) for r in rng.integers(0, 6, 7)]
    total, want = _reference(xs, rows)
    got = []
    for i, (x, r) in enumerate(zip(xs, rows)):
        if i % 2:
            got.append(m.step(x, np.array(r, np.int64)))
        else:
            got.append(m.submit("step", x, np.array(r, np.int64)).result())
    for (y, c), (wy, wc) in zip(got, want):
        np.testing.assert_allclose(y[0], wy, rtol=1e-5, atol=1e-6)
        assert int(c[0]) == wc
    z = rng.standard_normal((3, 5)).astype(np.float32)  # a symbolic input: the synchronous form
    np.testing.assert_allclose(m.read(z), total.sum(0, keepdims=True) + z, rtol=1e-5, atol=1e-5)
    # a function without state, stream-ordered with caller storage
    y = rng.standard_normal(3).astype(np.float32)
    np.testing.assert_allclose(m.submit("scale", y).result(), 3 * y, rtol=1e-6)
    # another module of the same artifact holds states of its own, zeros at load
    other = rocmc.load(art)
    np.testing.assert_allclose(other.read(np.zeros((1, 5), np.float32)), np.zeros((1, 5)))


def test_submissions_chained_through_host_memory(art, rng):
    """The in-order path of the CUDA device (small inputs and results in host memory the device reads and writes,
    no wait on the submission before), taken here on the CPU one submission at a time."""
    m = rocmc.load(art)
    m._in_order = True
    xs = [rng.standard_normal((1, 5)).astype(np.float32) for _ in range(4)]
    total, want = _reference(xs, [2] * 4)
    prev = None
    for x, (wy, wc) in zip(xs, want):
        x_in = x if prev is None else x  # host input written into host memory the device reads
        sub = m.submit("step", x_in, np.array(2, np.int64))
        y, c = sub.result()
        np.testing.assert_allclose(y[0], wy, rtol=1e-5, atol=1e-6)
        assert int(c[0]) == wc
        prev = sub
    y = m.submit("scale", np.arange(3, dtype=np.float32)).outputs[0]
    np.testing.assert_allclose(m.submit("scale", reshaped(y, (3,))).result(), 9 * np.arange(3), rtol=1e-6)


def test_a_module_without_stream_ordered_functions_keeps_its_states():
    art = rocmc.compile(_program(), "cpu")
    assert "held_states" not in art.metadata
    assert "util.global private mutable" in art.ir("input")


def test_packed_and_bool_results_in_caller_storage(rng):
    """A stream-ordered function's 4-bit and bool results in buffers the caller gives: sized as IREE's ABI passes
    them (4-bit values two a byte, bools a byte each)."""
    g = rocmc.Graph("q")
    x = g.input("x", (6,), "f32")
    g.output(ops.cast(x, "i4"), ops.greater(x, np.float32(0.0)))
    h = rocmc.Graph("h")
    h.output(ops.add(h.state("n", (1,), "f32"), h.input("y", (1,), "f32")))
    art = rocmc.compile({"q": g, "h": h}, "cpu", asynchronous=True)
    assert art.metadata["async_storage"] == "caller"
    m = rocmc.load(art)
    v = rng.integers(-8, 8, 6).astype(np.float32)
    q, pos = m.submit("q", v).result()
    np.testing.assert_array_equal(q, v.astype(np.int8))
    np.testing.assert_array_equal(pos, v > 0)


def test_held_states_in_the_metadata_are_checked_against_the_module(art):
    """A module whose metadata names other states for a function than its entry points take is refused at load
    (the declarations of `step` and `step$async` state the states' types)."""
    from rocmc.artifact import _SEAL, seal

    module = art.vmfb[: len(art.vmfb) - _SEAL.size]
    for old, new, match in (
        ('"held_states": ["total", "calls"]', '"held_states": ["total", "callz"]', "does not declare"),
        ('"held_states": ["total", "calls"]', '"held_states": ["calls", "total"]', "the metadata does not describe"),
    ):
        assert old.encode() in module
        with pytest.raises(rocmc.ArtifactError, match=match):
            rocmc.Artifact.from_bytes(seal(module.replace(old.encode(), new.encode())))


def test_scalar_and_bool_states_start_as_zeros():
    """`rocmc$states` fills each held state with the zeros of its own type: a 0-d integer and a bool state too."""
    g = rocmc.Graph("count")
    n = g.state("n", (), "i64")
    seen = g.state("seen", (3,), "bool")
    g.assign("n", ops.add(n, np.int64(1)))
    g.assign("seen", ops.logical_or(seen, g.input("flag", (3,), "bool")))
    g.output(ops.add(n, np.int64(1)), seen)
    m = rocmc.load(rocmc.compile({"count": g}, "cpu", asynchronous=True))
    c, s = m.count(np.array([False, True, False]))
    assert int(c) == 1 and not s.any()
    c, s = m.submit("count", np.array([True, False, False])).result()
    assert int(c) == 2 and list(s) == [False, True, False]


@pytest.mark.parametrize("read", ["direct", "narrow", "reshape", "sum", "exp"])
def test_a_state_read_before_it_is_assigned_keeps_its_old_value(read, rng):
    """A function whose outputs or other ops read a state's value from before the call while it assigns the state
    gets the old value (as rocmc.evaluate does): the new value goes to another buffer, not into the one the old
    came in (IREE 3.13 does not order the reads against a write there). Calls and submissions alike."""
    g = rocmc.Graph("acc")
    s = g.state("s", (4,), "f32")
    g.assign("s", ops.add(s, g.input("x", (4,), "f32")))
    views = {
        "direct": lambda: s,
        "narrow": lambda: ops.narrow(s, 0, 1, 2),
        "reshape": lambda: ops.reshape(s, (2, 2)),
        "sum": lambda: ops.sum(s, axis=0, keepdims=True),
        "exp": lambda: ops.exp(s),
    }
    g.output(views[read]())
    art = rocmc.compile({"acc": g}, "cpu", asynchronous=True)
    assert art.metadata["states_in_place"] == []
    m = rocmc.load(art)
    state = np.zeros(4)
    for i in range(4):
        x = rng.standard_normal(4).astype(np.float32)
        want, after = rocmc.evaluate(g, x, state={"s": state})
        got = m.acc(x) if i % 2 else m.submit("acc", x).result()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        state = after["s"]


def test_the_kv_cache_store_writes_the_callers_buffer_in_place():
    """A state whose old value has one use, an op writing it in place (the KV cache's store, a slice's update), is
    consumed: the call writes the buffer the caller passed, which stays the state's."""
    g = rocmc.Graph("put")
    s = g.state("s", (6, 3), "f32")
    g.assign("s", ops.update_slice(s, g.input("x", (1, 3), "f32"), 2, axis=0))
    g.output(ops.mul(g.input("y", (2,), "f32"), np.float32(2.0)))
    art = rocmc.compile({"put": g}, "cpu", asynchronous=True)
    assert art.metadata["states_in_place"] == ["s"] and "consume" in art.ir("input")
    m = rocmc.load(art)

    def held():  # the state's values, and the address of the memory holding them (the CPU maps it)
        a = m._states["s"].get_buffer().map().asarray([6, 3], np.dtype(np.float32))
        return np.array(a), a.__array_interface__["data"][0]

    _, address = held()
    m.put(np.ones((1, 3), np.float32), np.ones(2, np.float32))
    values, after_call = held()
    np.testing.assert_array_equal(values[2], [1, 1, 1])
    m.submit("put", np.full((1, 3), 2, np.float32), np.ones(2, np.float32)).result()
    values, after_submit = held()
    np.testing.assert_array_equal(values, np.where(np.arange(6)[:, None] == 2, 2.0, 0.0) * np.ones((1, 3)))
    assert address == after_call == after_submit
