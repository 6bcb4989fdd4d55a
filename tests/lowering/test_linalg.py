"""matmul and linear against the float64 reference: numpy shape semantics, transposes, dtypes, errors."""

import pytest

import rocmc
from rocmc import ops

from helpers import CpuBatch, check, compile_gpu, rand


def _concrete(shape, sizes):
    return tuple(sizes.get(d, d) for d in shape)


# (a shape, b shape, transpose_a, transpose_b); symbolic dims take the sizes of SIZES.
SIZES = {"m": 5, "n": 3, "b": 2}
MATMULS = [
    ((7, 9), (9, 5), False, False),  # plain 2-D, odd sizes
    (("m", 9), (9, 4), False, False),  # symbolic rows
    ((2, "m", 6), (6, 3), False, False),  # batched @ 2-D (weights shared)
    (("b", 1, 4, 6), (3, 6, 5), False, False),  # batch broadcast both ways
    ((6, "m"), (4, 6), True, True),  # both transposed
    ((3, 6, 4), (3, 5, 4), False, True),  # q @ k^T form
    ((6,), (2, 6, 5), False, False),  # 1-D @ batched
    ((2, 5, 6), (6,), False, False),  # batched @ 1-D
    ((6,), (6,), False, False),  # dot product -> scalar
]


def _matmul_graph(a_shape, b_shape, ta, tb):
    g = rocmc.Graph("t")
    a, b = g.input("a", a_shape, "f32"), g.input("b", b_shape, "f32")
    g.output(ops.matmul(a, b, transpose_a=ta, transpose_b=tb))
    return g


# The parametrization's graphs as the functions of one module (helpers.CpuBatch): one compile, not one a test.
MATMUL_BATCH = CpuBatch(_matmul_graph, MATMULS)


@pytest.mark.parametrize("a_shape,b_shape,ta,tb", MATMULS)
def test_matmul_numpy_semantics(a_shape, b_shape, ta, tb, rng):
    g, module = MATMUL_BATCH(a_shape, b_shape, ta, tb)
    check(g, rand(rng, _concrete(a_shape, SIZES)), rand(rng, _concrete(b_shape, SIZES)), module=module)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_matmul_half_types(dtype, rng):
    g = rocmc.Graph("t")
    a, b = g.input("a", (2, "m", 33), dtype), g.input("b", (1, 17, 33), dtype)
    g.output(ops.matmul(a, b, transpose_b=True))
    check(g, rand(rng, (2, 5, 33), dtype, -1, 1), rand(rng, (1, 17, 33), dtype, -1, 1))


def test_matmul_f16_long_k_accumulates_in_f32(rng):
    # Positive terms make the sum grow to ~1000, where f16 spacing is 0.5-1: an f16 accumulator
    # would be off by tens; an f32 one leaves only the final rounding (~5e-4 relative).
    g = rocmc.Graph("t")
    a, b = g.input("a", (4, 4096), "f16"), g.input("b", (4096, 3), "f16")
    g.output(a @ b)
    check(g, rand(rng, (4, 4096), "f16", 0.0, 1.0), rand(rng, (4096, 3), "f16", 0.0, 1.0), tol=(1e-3, 0.0))


@pytest.mark.parametrize("dtype", ["i32", "i64"])
def test_matmul_int(dtype, rng):
    g = rocmc.Graph("t")
    a, b = g.input("a", ("m", 7), dtype), g.input("b", (2, 7, 3), dtype)
    g.output(ops.matmul(a, b))
    check(g, rand(rng, (5, 7), dtype, -20, 20), rand(rng, (2, 7, 3), dtype, -20, 20))


LINEARS = [("f32", True), ("f32", False), ("f16", True), ("bf16", True)]


def _linear_graph(dtype, with_bias):
    g = rocmc.Graph("t")
    x, w = g.input("x", (2, "s", 24), dtype), g.input("w", (11, 24), dtype)
    bias = g.input("bias", (11,), dtype) if with_bias else None
    g.output(ops.linear(x, w, bias))
    return g


LINEAR_BATCH = CpuBatch(_linear_graph, LINEARS)


@pytest.mark.parametrize("dtype,with_bias", LINEARS)
def test_linear(dtype, with_bias, rng):
    g, module = LINEAR_BATCH(dtype, with_bias)
    inputs = [rand(rng, (2, 7, 24), dtype, -1, 1), rand(rng, (11, 24), dtype, -1, 1)]
    check(g, *inputs, *([rand(rng, (11,), dtype)] if with_bias else []), module=module)


def test_linear_1d_input_and_constant_weights(rng):
    g = rocmc.Graph("t")
    x = g.input("x", (9,), "f32")
    g.output(ops.linear(x, rand(rng, (4, 9)), rand(rng, (4,))))
    check(g, rand(rng, (9,)))


def test_gpu_targets_compile():
    g = rocmc.Graph("t")
    x, w = g.input("x", (2, "s", 64), "f16"), g.input("w", (32, 64), "f16")
    y = ops.linear(x, w, g.input("bias", (32,), "f16"))
    g.output(ops.matmul(y, x, transpose_a=True), ops.matmul(x, g.input("i", (64,), "f16")))
    compile_gpu(g)


def test_a_batch_of_sequences_is_one_gemm_over_their_rows(rng):
    """x (b, s, k) against a 2-D weight (linear, and matmul with transpose_b as an lm_head is): the leading dims are
    folded into one row dim, so IREE plans one GEMM (its dispatch has one dynamic row dim), not a loop over a
    broadcast weight; against float64 with both dims symbolic, and static."""
    for shape in (("b", "s", 40), (3, "s", 40), (3, 13, 40)):  # (39 static rows: IREE's code, not linear_rows)
        g = rocmc.Graph("t")
        x = g.input("x", shape, "f16")
        w, w2 = g.input("w", (24, 40), "f16"), g.input("w2", (17, 40), "f16")
        g.output(ops.linear(x, w, g.input("bias", (24,), "f16")), ops.matmul(x, w2, transpose_b=True))
        inputs = [rand(rng, (3, 13, 40), "f16", -1, 1), rand(rng, (24, 40), "f16", -1, 1)]
        check(g, *inputs, rand(rng, (17, 40), "f16", -1, 1), rand(rng, (24,), "f16"))
        names = [d["name"] for d in rocmc.compile(g, "gfx942").dispatches() if "matmul" in d["name"]]
        rows = "D" if isinstance(shape[1], str) else "39"
        assert len(names) == 2 and all(f"matmul_like_{rows}x" in n and "DxD" not in n for n in names), names
    # On a GPU a 2-D x of symbolic rows is contracted as (1, rows, k) too (IREE plans it with matrix-unit tiles);
    # on the CPU it stays 2-D.
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 40), "f16")
    g.output(ops.linear(x, g.input("w", (24, 40), "f16")))
    check(g, rand(rng, (37, 40), "f16", -1, 1), rand(rng, (24, 40), "f16", -1, 1))
    assert "tensor<1x?x40xf16>" in rocmc.compile(g, "cuda:sm_80", impl={"linear": "generated"}).ir("input")
    assert "tensor<1x?x40xf16>" not in rocmc.compile(g, "cpu").ir("input")


def test_matmul_inner_dim_mismatch_names_node_and_dims():
    g = rocmc.Graph("t")
    a, b = g.input("a", (8, 4096), "f16"), g.input("b", (1024, 8), "f16")
    with pytest.raises(rocmc.GraphError, match=r"^matmul\(%0, %1\): inner dims differ: 4096 vs 1024$"):
        ops.matmul(a, b)


@pytest.mark.parametrize(
    "build,message",
    [
        (
            lambda g: ops.matmul(g.input("a", (3,), "f32"), g.input("b", (3, 2), "f32"), transpose_a=True),
            r"transpose_a=True needs 'a' of rank >= 2",
        ),
        (lambda g: ops.matmul(g.input("a", (3, 4), "f32"), g.input("b", (4, 2), "f16")), r"matmul.*f32.*f16"),
        (
            lambda g: ops.matmul(g.input("a", (3, 4), "bool"), g.input("b", (4, 2), "bool")),
            r"'a' has dtype bool, expected a float or int",
        ),
        (lambda g: ops.matmul(g.input("a", (2, 3, 4), "f32"), g.input("b", (3, 4, 2), "f32")), r"do not broadcast"),
        (
            lambda g: ops.matmul(g.input("a", (3, 4), "f32"), g.input("b", (4, 2), "f32"), transpose_b=1),
            r"transpose_b=1, expected a bool",
        ),
        (lambda g: ops.linear(g.input("x", (3, 4), "f32"), g.input("w", (5, 6), "f32")), r"inner dims differ: 4 vs 6"),
        (lambda g: ops.linear(g.input("x", (3, 4), "f32"), g.input("w", (4,), "f32")), r"'weight' has rank 1"),
        (
            lambda g: ops.linear(g.input("x", (3, 4), "f32"), g.input("w", (5, 4), "f32"), g.input("b", (4,), "f32")),
            r"'bias' has shape f32\[4\], expected \[5\]",
        ),
    ],
)
def test_bad_inputs_are_graph_errors(build, message):
    with pytest.raises(rocmc.GraphError, match=message):
        build(rocmc.Graph("t"))


def test_bf16_constant_weights_and_bias_over_symbolic_rows(rng):
    """bf16 constants large enough to be module globals: IREE 3.13's constant evaluation once made their
    f32 conversion an `arith.constant` of bf16 bytes typed f32 (held as i16 bits now)."""
    g = rocmc.Graph("lin")
    x = g.input("x", ("b", "n", 16), "bf16")
    g.output(ops.linear(x, g.constant("w", rand(rng, (37, 16), "bf16")), g.constant("b", rand(rng, (37,), "bf16"))))
    check(g, rand(rng, (2, 3, 16), "bf16"), rewrite=False)
