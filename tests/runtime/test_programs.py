"""External parameters, programs of several functions, and device-resident state."""

from __future__ import annotations

import numpy as np
import pytest

import rocmc
from rocmc import ops


def _mlp(w1, w2):
    g = rocmc.Graph("mlp")
    x = g.input("x", ("n", w1.shape[1]), "f32")
    h = ops.relu(ops.matmul(x, g.constant("w1", w1), transpose_b=True))
    g.output(ops.matmul(h, g.constant("w2", w2), transpose_b=True))
    return g


def test_external_constants_run_from_memory_and_from_the_saved_irpa(rng, tmp_path):
    w1, w2 = rng.standard_normal((96, 64)).astype(np.float32), rng.standard_normal((16, 96)).astype(np.float32)
    g = _mlp(w1, w2)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    art = rocmc.compile(g, "cpu", constants="external")
    assert sorted(p["name"] for p in art.parameters) == ["w1", "w2"]
    assert all(p["from"] == "constant" for p in art.parameters)
    embedded = rocmc.compile(g, "cpu")
    assert art.size < embedded.size - w1.nbytes // 2  # the weights are not in the module
    want = rocmc.evaluate(g, x)
    np.testing.assert_allclose(rocmc.load(art)(x), want, rtol=1e-4, atol=1e-4)
    art.save(tmp_path / "mlp.vmfb")
    assert (tmp_path / "mlp.irpa").is_file()
    np.testing.assert_allclose(rocmc.load(tmp_path / "mlp.vmfb")(x), want, rtol=1e-4, atol=1e-4)
    # other weights of the same shapes: same module, other results
    v1 = rng.standard_normal((96, 64)).astype(np.float32)
    other = rocmc.load(tmp_path / "mlp.vmfb", parameters={"w1": v1, "w2": w2})(x)
    np.testing.assert_allclose(other, rocmc.evaluate(_mlp(v1, w2), x), rtol=1e-4, atol=1e-4)
    assert "w1" in art.summary() and "parameters: 2" in art.summary()


def test_the_cache_key_covers_external_constants_by_shape_not_bytes(rng):
    a = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal((64, 64)).astype(np.float32)
    first = rocmc.compile(_mlp(a, a.T.copy()), "cpu", constants="external")
    second = rocmc.compile(_mlp(b, b.T.copy()), "cpu", constants="external")
    assert second.cached and second.metadata["graph_hash"] == first.metadata["graph_hash"]
    x = rng.standard_normal((3, 64)).astype(np.float32)
    np.testing.assert_allclose(rocmc.load(second)(x), rocmc.evaluate(_mlp(b, b.T.copy()), x), rtol=1e-4, atol=1e-4)


def test_graph_parameters_are_checked_before_loading(rng):
    g = rocmc.Graph("p")
    x = g.input("x", (4,), "f32")
    g.output(x * g.parameter("layer.0.scale", (4,), "f32") + g.parameter("layer.0.bias", (4,), "f32"))
    art = rocmc.compile(g, "cpu")
    s, b, xx = (rng.standard_normal(4).astype(np.float32) for _ in range(3))
    got = rocmc.load(art, parameters={"layer.0.scale": s, "layer.0.bias": b})(xx)
    np.testing.assert_allclose(
        got, rocmc.evaluate(g, xx, parameters={"layer.0.scale": s, "layer.0.bias": b}), rtol=1e-6
    )
    with pytest.raises(rocmc.InputError, match="none were given"):
        rocmc.load(art)
    with pytest.raises(rocmc.InputError, match="layer.0.bias"):
        rocmc.load(art, parameters={"layer.0.scale": s})
    with pytest.raises(rocmc.InputError, match="layer.0.scale"):
        rocmc.load(art, parameters={"layer.0.scale": np.ones(5, np.float32), "layer.0.bias": b})
    m = rocmc.load(art, parameters={"layer.0.scale": s.astype(np.float16), "layer.0.bias": b})
    assert any("layer.0.scale" in n for n in m.parameter_notes)
    with pytest.raises(rocmc.InputError):
        rocmc.load(
            rocmc.compile(_mlp(np.ones((4, 4), np.float32), np.ones((2, 4), np.float32)), "cpu"), parameters={"w": s}
        )
    with pytest.raises(rocmc.GraphError, match="symbolic"):
        g.parameter("w", ("n", 4))


def test_program_functions_share_state_across_calls(rng):
    step = rocmc.Graph("step")
    x = step.input("x", (4,), "f32")
    total = step.state("total", (4,), "f32") + x
    step.assign("total", total)
    step.output(total * 2.0)
    read = rocmc.Graph("read")
    z = read.input("z", (1,), "f32")
    read.output(read.state("total", (4,), "f32") + z)
    art = rocmc.compile({"step": step, "read": read}, "cpu")
    m = rocmc.load(art)
    assert m.functions == ["step", "read"] and art.functions == ["step", "read"]
    a, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(m.step(a), 2 * a, rtol=1e-6)
    np.testing.assert_allclose(m.call("step", b), 2 * (a + b), rtol=1e-6)
    np.testing.assert_allclose(m.read(np.zeros(1, np.float32)), a + b, rtol=1e-6)
    out, state = rocmc.evaluate(step, a, state={"total": b.astype(np.float64)})
    np.testing.assert_allclose(state["total"], a + b) and np.testing.assert_allclose(out, 2 * (a + b))
    with pytest.raises(rocmc.InputError, match="no such function"):
        m.call("nope")
    with pytest.raises(AttributeError, match="step, read"):
        m.nope


def test_same_typed_states_are_refused(rng):
    """IREE 3.13 would keep both in one buffer once updated in place (docs/architecture.md)."""
    g = rocmc.Graph("two")
    x = g.input("x", (1, 4), "f32")
    for name in ("a", "b"):
        g.assign(name, ops.update_slice(g.state(name, (8, 4), "f32"), x, 0, axis=0))
    g.output(x * 1.0)
    with pytest.raises(rocmc.LoweringError, match="one state"):
        rocmc.compile(g, "cpu")


def test_bad_programs_and_states():
    g = rocmc.Graph("g")
    x = g.input("x", (2,), "f32")
    with pytest.raises(rocmc.GraphError, match="no state"):
        g.assign("s", x)
    s = g.state("s", (2,), "f32")
    with pytest.raises(rocmc.GraphError, match="f32\\[3\\]|is f32"):
        g.assign("s", ops.concat([x, ops.slice(x, [0], [1])], 0))
    g.assign("s", s + x)
    with pytest.raises(rocmc.GraphError, match="already assigned"):
        g.assign("s", x)
    with pytest.raises(rocmc.GraphError, match="identifier"):
        rocmc.compile({"not an id": g}, "cpu")
    with pytest.raises(rocmc.LoweringError, match="constants="):
        rocmc.compile(g, "cpu", constants="sometimes")
