"""The depthwise implementation of conv1d/conv2d (groups == input channels, CPU) against the float64
reference: odd sizes, strides, asymmetric padding, dilation, channel multipliers, symbolic dims, half
types; and where the registry chooses it."""

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.inspect import describe, format_description
from rocmc.lowering import registry
from rocmc.lowering.codegen.depthwise import MAX_TAPS
from rocmc.lowering.target import Target

from helpers import TOL, CpuBatch, rand

SIZES = {"n": 3, "h": 13, "w": 10, "l": 21}  # run-time values of symbolic dims


def _conv_graph(op, xs, ws, kw, bias=True, dtype="f32"):
    g = rocmc.Graph("dw")
    x, w = g.input("x", xs, dtype), g.input("w", ws, dtype)
    b = g.input("b", (ws[0],), dtype) if bias else None
    g.output(getattr(ops, op)(x, w, b, groups=xs[1], **kw))
    return g


def _impls(art, op):
    return [c["impl"] for c in art.implementations if c["op"] == op]


def _check(rng, op, xs, ws, kw, bias=True, dtype="f32", impl=None, batched=None):
    """Compile for the CPU (or take the graph and its compiled function from `batched`: (CpuBatch, key)), check
    which implementation lowered the conv, compare with the reference."""
    if batched is None:
        g = _conv_graph(op, xs, ws, kw, bias, dtype)
        art = rocmc.compile(g, "cpu", impl=impl)
        impls, module = _impls(art, op), rocmc.load(art)
    else:
        batch, key = batched
        (g, module), impls = batch(*key), [c["impl"] for c in batch.implementations(*key) if c["op"] == op]
    assert impls == [impl or "depthwise"]
    shapes = [xs, ws] + ([(ws[0],)] if bias else [])
    inputs = [rand(rng, tuple(SIZES.get(d, d) for d in s), dtype) for s in shapes]
    got = module(*inputs)
    want = rocmc.evaluate(g, *inputs)
    assert got.shape == want.shape
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)


CONV2D = [
    # x shape, weight shape, keyword arguments
    (("n", 5, 11, 9), (5, 1, 3, 3), dict(stride=2, padding=1)),  # MobileNet's stride 2
    (("n", 7, 12, 15), (7, 1, 3, 3), dict(padding=1)),  # stride 1, odd channels
    (("n", 4, 10, 7), (8, 1, 3, 3), dict(stride=(1, 2), padding=((1, 0), (2, 1)))),  # multiplier 2
    (("n", 3, 13, 12), (9, 1, 5, 3), dict(stride=(2, 3), padding=(2, 1), dilation=(1, 2))),  # multiplier 3
    ((2, 6, "h", "w"), (6, 1, 3, 3), dict(stride=2, padding=1)),  # symbolic spatial
    (("n", 1, 9, 8), (4, 1, 2, 2), dict(stride=3)),  # one channel
]


# The parametrization's graphs as the functions of one module (helpers.CpuBatch): one compile, not one a test.
CONV2D_BATCH = CpuBatch(
    lambda i, bias: _conv_graph("conv2d", *CONV2D[i], bias),
    [(i, bias) for i in range(len(CONV2D)) for bias in (True, False)],
)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xs,ws,kw", CONV2D)
def test_depthwise_conv2d(xs, ws, kw, bias, rng):
    _check(rng, "conv2d", xs, ws, kw, bias, batched=(CONV2D_BATCH, (CONV2D.index((xs, ws, kw)), bias)))


@pytest.mark.parametrize("kw", [dict(stride=2, padding=2), dict(padding=((3, 1),), dilation=2)])
def test_depthwise_conv1d(kw, rng):
    _check(rng, "conv1d", ("n", 6, "l"), (12, 1, 5), kw)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_depthwise_half_accumulates_in_f32(dtype, rng):
    _check(rng, "conv2d", ("n", 8, 15, 11), (16, 1, 3, 3), dict(stride=2, padding=1), dtype=dtype)


def test_generated_is_still_available(rng):
    _check(rng, "conv2d", ("n", 5, 11, 9), (10, 1, 3, 3), dict(stride=2, padding=1), impl="generated")


def test_inspect_shows_the_choice():
    g = rocmc.Graph("mixed")
    x = g.input("x", (1, 8, 14, 14))
    y = ops.conv2d(x, np.ones((8, 1, 3, 3), np.float32), padding=1, groups=8)
    g.output(ops.conv2d(y, np.ones((4, 8, 1, 1), np.float32)))
    art = rocmc.compile(g, "cpu")
    assert _impls(art, "conv2d") == ["depthwise", "generated"]
    text = format_description(describe(art))
    rows = [line for line in text.splitlines() if "conv2d" in line]
    assert "depthwise" in rows[0] and "generated" in rows[1]
    assert "not depthwise" in rows[1]  # the skipped reason is shown


def _node(xs, ws, groups):
    g = rocmc.Graph("t")
    ops.conv2d(g.input("x", xs), g.input("w", ws), groups=groups)
    return g.nodes[-1]


def test_registry_declines_what_it_does_not_take():
    cpu = Target.parse("cpu")
    assert registry.choose(_node((1, 8, 9, 9), (8, 4, 3, 3), 2), cpu).impl.name == "generated"
    big = _node((1, 4, 20, 20), (4, 1, 9, 9), 4)
    choice = registry.choose(big, cpu)
    assert choice.impl.name == "generated"
    assert any(f"up to {MAX_TAPS}" in r for _, r in choice.skipped)
    for gpu in ("gfx942", "cuda:sm_80"):
        assert registry.choose(_node((1, 8, 9, 9), (8, 1, 3, 3), 8), Target.parse(gpu)).impl.name != "depthwise"
