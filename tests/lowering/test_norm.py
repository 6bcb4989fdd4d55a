"""softmax, log_softmax, layer_norm and rms_norm against the float64 reference."""

import numpy as np
import pytest

import rocmc
from rocmc import ops

from helpers import CpuBatch, check, compile_gpu, rand

DTYPES = ["f32", "f16", "bf16"]


def _softmax_axes_graph(dtype):
    g = rocmc.Graph("t")
    x = g.input("x", (2, "seq", 37), dtype)
    g.output(*(f(x, axis=a) for f in (ops.softmax, ops.log_softmax) for a in (0, 1, -1)))
    return g


def _large_logits_graph(dtype):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 4097), dtype)
    g.output(ops.softmax(x), ops.log_softmax(x))
    return g


def _layer_norm_graph(dtype):
    g = rocmc.Graph("t")
    x = g.input("x", (2, "seq", 37), dtype)
    w, b = g.input("w", (37,), dtype), g.input("b", (37,), dtype)
    w2 = g.input("w2", ("seq", 37), dtype)
    g.output(
        ops.layer_norm(x, w, b),
        ops.layer_norm(x, w2, axis=1, eps=1e-3),
        ops.layer_norm(x, axis=0),
        ops.layer_norm(x, bias=b),
    )
    return g


def _large_mean_graph(n):
    g = rocmc.Graph("t")
    x = g.input("x", ("rows", n), "f32")
    w = g.input("w", (n,), "f32")
    g.output(ops.layer_norm(x, w, eps=1e-6))
    return g


def _rms_norm_graph(dtype):
    g = rocmc.Graph("t")
    x = g.input("x", (2, "seq", 37), dtype)
    w, w2 = g.input("w", (37,), dtype), g.input("w2", ("seq", 37), dtype)
    g.output(ops.rms_norm(x, w), ops.rms_norm(x, w2, axis=-2, eps=1e-2), ops.rms_norm(x))
    return g


# The parametrized tests' graphs below as the functions of one module (helpers.CpuBatch): a compile for all of them,
# not one a test. Keys (builder, argument) in the order the tests run.
GRAPHS = {
    "softmax_axes": _softmax_axes_graph,
    "large_logits": _large_logits_graph,
    "layer_norm": _layer_norm_graph,
    "large_mean": _large_mean_graph,
    "rms_norm": _rms_norm_graph,
}
BATCH = CpuBatch(
    lambda name, arg: GRAPHS[name](arg),
    [
        *(("softmax_axes", d) for d in DTYPES),
        *(("large_logits", d) for d in ("f32", "f16")),
        *(("layer_norm", d) for d in DTYPES),
        *(("large_mean", n) for n in (37, 4097)),
        *(("rms_norm", d) for d in DTYPES),
    ],
)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_every_axis_symbolic(dtype, rng):
    g, module = BATCH("softmax_axes", dtype)
    check(g, rand(rng, (2, 5, 37), dtype, -4, 4), module=module)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_softmax_large_logits_subtract_the_max(dtype, rng):
    """exp(100) overflows f32 and f16: only max subtraction keeps these rows finite."""
    g, module = BATCH("large_logits", dtype)
    got = check(g, rand(rng, (3, 4097), dtype, 90, 100), module=module)
    assert all(np.isfinite(o.astype(np.float32)).all() for o in got)


def test_softmax_odd_sizes(rng):
    g = rocmc.Graph("t")
    a, b = g.input("a", (1, 1), "f32"), g.input("b", (3, 4097), "bf16")
    g.output(ops.softmax(a), ops.log_softmax(a, axis=0), ops.softmax(b, axis=0), ops.log_softmax(b))
    check(g, rand(rng, (1, 1), "f32"), rand(rng, (3, 4097), "bf16"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_symbolic(dtype, rng):
    """Last dim with weight and bias, trailing two dims (one symbolic), without parameters, bias only."""
    g, module = BATCH("layer_norm", dtype)
    inputs = rand(rng, (2, 5, 37), dtype), rand(rng, (37,), dtype), rand(rng, (37,), dtype), rand(rng, (5, 37), dtype)
    check(g, *inputs, module=module)


@pytest.mark.parametrize("n", [37, 4097])
def test_layer_norm_large_mean(n, rng):
    """Rows with |mean| >> std: E[x^2] - E[x]^2 in f32 would lose the variance entirely."""
    g, module = BATCH("large_mean", n)
    offsets = np.array([[1000.0], [-3.0e4], [1.0e4], [0.5]])
    xs = (rng.uniform(-1, 1, (4, n)) + offsets).astype(np.float32)
    check(g, xs, rand(rng, (n,), "f32"), tol=(1e-4, 1e-4), module=module)


def test_layer_norm_odd_sizes_and_mixed_weight_dtype(rng):
    """Size-1 normalized dim (output is the bias), a 4097 row, f32 weights on a bf16 input."""
    g = rocmc.Graph("t")
    a, b = g.input("a", (5, 1), "f16"), g.input("b", (2, 4097), "bf16")
    wa, ba = g.input("wa", (1,), "f16"), g.input("ba", (1,), "f16")
    wb = g.input("wb", (4097,), "f32")
    g.output(ops.layer_norm(a, wa, ba), ops.layer_norm(b, wb))
    check(
        g,
        rand(rng, (5, 1), "f16"),
        rand(rng, (2, 4097), "bf16"),
        rand(rng, (1,), "f16"),
        rand(rng, (1,), "f16"),
        rand(rng, (4097,), "f32"),
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_symbolic(dtype, rng):
    g, module = BATCH("rms_norm", dtype)
    check(g, rand(rng, (2, 5, 37), dtype), rand(rng, (37,), dtype), rand(rng, (5, 37), dtype), module=module)


def test_rms_norm_odd_sizes(rng):
    g = rocmc.Graph("t")
    a, b = g.input("a", (3, 4097), "f16"), g.input("b", ("n", 1), "f32")
    g.output(ops.rms_norm(a, g.constant("w", rand(rng, (4097,), "f16"))), ops.rms_norm(b, axis=0))
    check(g, rand(rng, (3, 4097), "f16"), rand(rng, (7, 1), "f32"))


def test_eps_matters(rng):
    """eps is applied inside the root: rows of tiny values are damped, not blown up to unit RMS."""
    g = rocmc.Graph("t")
    x = g.input("x", (4, 64), "f32")
    g.output(ops.rms_norm(x, eps=1e-2), ops.layer_norm(x, eps=1e-2))
    got = check(g, rand(rng, (4, 64), "f32", -1e-3, 1e-3))
    assert all(np.abs(o).max() < 0.05 for o in got)


def test_attributes_are_normalized():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 3, 4), "f32")
    assert ops.softmax(x).producer.attrs == {"axis": 2}
    assert ops.log_softmax(x, axis=-3).producer.attrs == {"axis": 0}
    assert ops.layer_norm(x, axis=-2).producer.attrs == {"eps": 1e-5, "axis": 1}
    node = ops.rms_norm(x, eps=1).producer
    assert node.attrs == {"eps": 1.0, "axis": 2} and isinstance(node.attrs["eps"], float)
    assert ops.layer_norm(x).producer.inputs[1:] == [None, None]


@pytest.mark.parametrize("target", ["gfx942", "cuda:sm_80"])
def test_gpu_targets_compile(target):
    """Compile-only, generated lowering (hand-written kernels off): every op in f16/bf16 with
    symbolic dims, several axes."""
    g = rocmc.Graph("t")
    x = g.input("x", (2, "seq", 64), "f16")
    y = g.input("y", ("seq", 37), "bf16")
    w, w2 = g.input("w", (64,), "f16"), g.input("w2", ("seq", 64), "f16")
    g.output(
        ops.softmax(x),
        ops.softmax(x, axis=1),
        ops.log_softmax(x),
        ops.log_softmax(y, axis=0),
        ops.layer_norm(x, w, w),
        ops.layer_norm(x, w2, axis=1),
        ops.layer_norm(y),
        ops.rms_norm(x, w),
        ops.rms_norm(x, w2, axis=1),
        ops.rms_norm(y),
    )
    compile_gpu(g, targets=(target,), impl="generated")


@pytest.mark.parametrize("op,want", [("rms_norm", 1), ("softmax", 1), ("layer_norm", 2), ("log_softmax", 2)])
def test_few_dispatches_on_gfx942(op, want):
    """Generated lowering: row statistics and the result fuse into one dispatch, two where a
    reduction feeds a reduction."""
    g = rocmc.Graph("t")
    x = g.input("x", ("rows", 4096), "f16")
    g.output(getattr(ops, op)(x))
    art = rocmc.compile(g, "gfx942", impl="generated")
    assert len(art.dispatches()) == want, art.summary()


# ---- errors ---------------------------------------------------------------------------------------


def test_bad_axis():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 3), "f32")
    with pytest.raises(rocmc.GraphError, match=r"softmax: axis=2 is out of range for rank 2; expected -2\.\.1"):
        ops.softmax(x, axis=2)
    with pytest.raises(rocmc.GraphError, match=r"layer_norm: axis=-3 is out of range"):
        ops.layer_norm(x, axis=-3)
    with pytest.raises(rocmc.GraphError, match=r"log_softmax: axis=\(0, 1\) must be an int"):
        ops.log_softmax(x, axis=(0, 1))
    with pytest.raises(rocmc.GraphError, match=r"rms_norm: 'x' is 0-d, expected a tensor of rank >= 1"):
        ops.rms_norm(ops.sum(x))


def test_weight_shape_mismatch():
    g = rocmc.Graph("t")
    x = g.input("x", (2, "seq", 8), "f32")
    with pytest.raises(rocmc.GraphError, match=r"layer_norm\(%0, %1, _\): 'weight' has shape \[7\], expected \[8\]"):
        ops.layer_norm(x, g.input("w", (7,), "f32"))
    with pytest.raises(rocmc.GraphError, match=r"'bias' has shape \[8\], expected \[seq,8\]"):
        ops.layer_norm(x, bias=g.input("b", (8,), "f32"), axis=1)
    with pytest.raises(rocmc.GraphError, match=r"rms_norm\(%0, %\d+\): 'weight' has shape \[1,8\], expected \[8\]"):
        ops.rms_norm(x, g.input("w2", (1, 8), "f32"))


def test_int_dtype_rejected():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 8), "i32")
    for fn in (ops.softmax, ops.log_softmax, ops.layer_norm, ops.rms_norm):
        with pytest.raises(rocmc.GraphError, match=rf"{fn.__name__}\(%0[, _]*\): 'x' has dtype i32, expected a float"):
            fn(x)
    y = g.input("y", (2, 8), "f32")
    with pytest.raises(rocmc.GraphError, match=r"rms_norm\(%\d+, %\d+\): 'weight' has dtype i64, expected a float"):
        ops.rms_norm(y, g.constant("w", np.arange(8)))


def test_bad_eps():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 8), "f32")
    with pytest.raises(rocmc.GraphError, match=r"rms_norm: eps='1e-5', expected a number >= 0"):
        ops.rms_norm(x, eps="1e-5")
    with pytest.raises(rocmc.GraphError, match=r"layer_norm\(%0, _, _\): eps=-1.0, expected a number >= 0"):
        ops.layer_norm(x, eps=-1.0)


def test_unknown_keyword_and_attribute():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 8), "f32")
    with pytest.raises(rocmc.GraphError, match=r"rms_norm: .*'epsilon'.*expected arguments \(x, weight, eps, axis\)"):
        ops.rms_norm(x, epsilon=1e-5)
    with pytest.raises(rocmc.GraphError, match=r"softmax: unknown attribute 'dim'; expected axis"):
        g.apply("softmax", [x], {"axis": 1, "dim": 1})
    with pytest.raises(
        rocmc.GraphError, match=r"layer_norm\(%0, _, _\): axis=-1 is out of range for rank 2; expected 0\.\.1"
    ):
        g.apply("layer_norm", [x, None, None], {"axis": -1, "eps": 1e-5})
