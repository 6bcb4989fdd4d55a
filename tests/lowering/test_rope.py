"""rope against the float64 reference and the pair formula: every variant batched (b > 1), tables of
every form, partial rotation, position ids, dtypes, symbolic dims, errors."""

import numpy as np
import pytest

import rocmc
from rocmc import ops

from helpers import CpuBatch, check, compile_gpu, rand, run

B, H, T, D = 2, 3, 5, 10


def _x_shape(layout, t=T, d=D):
    return (B, H, t, d) if layout == "bhsd" else (B, t, H, d)


def _tables(rng, shape, dtype="f32"):
    angles = rng.uniform(0.0, 2 * np.pi, size=shape)
    return np.cos(angles).astype(rocmc.dtype(dtype).np), np.sin(angles).astype(rocmc.dtype(dtype).np)


def _graph(layout, dtype, table_shape, t="t", pos_dtype=None, table_dtype=None, **kw):
    g = rocmc.Graph("t")
    x = g.input("x", _x_shape(layout, t), dtype)
    table_dtype = table_dtype or dtype
    cos, sin = g.input("cos", table_shape, table_dtype), g.input("sin", table_shape, table_dtype)
    pos = g.input("pos", (B, t), pos_dtype) if pos_dtype else None
    g.output(ops.rope(x, cos, sin, layout=layout, position_ids=pos, **kw))
    return g


# The graphs the parametrized tests below check, as the functions of one module (helpers.CpuBatch): a compile for
# all of them, not one a test. A key is _graph's arguments (keywords as sorted pairs), in the order the tests run.
def _key(layout, dtype, table_shape, **kw):
    return layout, dtype, table_shape, tuple(sorted(kw.items()))


CHECKED = [
    *(_key(layout, "f32", (9, D // 2), interleaved=i) for i in (True, False) for layout in ("bhsd", "bshd")),
    *(
        _key(layout, dtype, (T, D // 2), table_dtype=table_dtype, interleaved=layout == "bhsd")
        for dtype, layout, table_dtype in (("f16", "bhsd", "f16"), ("bf16", "bshd", "bf16"), ("f16", "bshd", "f32"))
    ),
    *(_key("bshd", "f32", (B, "t", D // 2), interleaved=i) for i in (True, False)),
    *(_key(layout, "f32", (7, 3), interleaved=i, rotary_dim=6) for i, layout in ((True, "bhsd"), (False, "bshd"))),
    *(
        _key(layout, "f32", (32, 3), pos_dtype=pos, interleaved=i, rotary_dim=6)
        for pos, i, layout in (("i64", False, "bhsd"), ("i32", True, "bshd"))
    ),
]
BATCH = CpuBatch(lambda layout, dtype, table_shape, kw: _graph(layout, dtype, table_shape, **dict(kw)), CHECKED)


def _batched(layout, dtype, table_shape, **kw):
    """(graph, its compiled function) of _graph(...) from BATCH."""
    return BATCH(*_key(layout, dtype, table_shape, **kw))


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_variants_batched(layout, interleaved, rng):
    # b > 1 in every variant: candle once had the interleaved batch stride wrong (t*d/2, not h*t*d).
    g, module = _batched(layout, "f32", (9, D // 2), interleaved=interleaved)  # T = 9 >= t: rows 0..t-1 used
    check(g, rand(rng, _x_shape(layout)), *_tables(rng, (9, D // 2)), module=module)


def test_rope_matches_pair_formula(rng):
    # The reference itself, checked against op-semantics written out as loops (interleaved, b = 2).
    g = _graph("bhsd", "f32", (T, D // 2), t=T, interleaved=True)
    x, (cos, sin) = rand(rng, _x_shape("bhsd")), _tables(rng, (T, D // 2))
    x64, c, s = (a.astype(np.float64) for a in (x, cos, sin))
    want = np.empty_like(x64)
    for b, h, p, i in np.ndindex(B, H, T, D // 2):
        x0, x1 = x64[b, h, p, 2 * i], x64[b, h, p, 2 * i + 1]
        want[b, h, p, 2 * i] = x0 * c[p, i] - x1 * s[p, i]
        want[b, h, p, 2 * i + 1] = x0 * s[p, i] + x1 * c[p, i]
    np.testing.assert_allclose(rocmc.evaluate(g, x, cos, sin), want, rtol=1e-12)
    np.testing.assert_allclose(run(g, x, cos, sin), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "dtype,layout,table_dtype", [("f16", "bhsd", "f16"), ("bf16", "bshd", "bf16"), ("f16", "bshd", "f32")]
)
def test_rope_half_types(dtype, layout, table_dtype, rng):
    g, module = _batched(layout, dtype, (T, D // 2), table_dtype=table_dtype, interleaved=layout == "bhsd")
    check(g, rand(rng, _x_shape(layout), dtype), *_tables(rng, (T, D // 2), table_dtype), module=module)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_per_batch_tables(interleaved, rng):
    g, module = _batched("bshd", "f32", (B, "t", D // 2), interleaved=interleaved)
    check(g, rand(rng, _x_shape("bshd")), *_tables(rng, (B, T, D // 2)), module=module)


@pytest.mark.parametrize("interleaved,layout", [(True, "bhsd"), (False, "bshd")])
def test_rope_partial_rotary_dim(interleaved, layout, rng):
    # Only the first 6 of 10 dims rotate (r = 3 pairs); the last 4 pass through unchanged.
    g, module = _batched(layout, "f32", (7, 3), interleaved=interleaved, rotary_dim=6)
    x = rand(rng, _x_shape(layout))
    (y,) = check(g, x, *_tables(rng, (7, 3)), module=module)
    np.testing.assert_array_equal(y[..., 6:], x[..., 6:])


@pytest.mark.parametrize("pos_dtype,interleaved,layout", [("i64", False, "bhsd"), ("i32", True, "bshd")])
def test_rope_position_ids(pos_dtype, interleaved, layout, rng):
    g, module = _batched(layout, "f32", (32, 3), pos_dtype=pos_dtype, interleaved=interleaved, rotary_dim=6)
    pos = rng.permutation(32)[: B * T].reshape(B, T).astype(rocmc.dtype(pos_dtype).np)  # distinct rows per batch
    check(g, rand(rng, _x_shape(layout)), *_tables(rng, (32, 3)), pos, module=module)


def test_gpu_targets_compile():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 8, "s", 64), "f16")
    cos, sin = g.input("cos", (4096, 32), "f16"), g.input("sin", (4096, 32), "f16")
    cos_p, sin_p = g.input("cos_p", (4096, 16), "f16"), g.input("sin_p", (4096, 16), "f16")
    pos = g.input("pos", (2, "s"), "i64")
    g.output(
        ops.rope(x, cos, sin),
        ops.rope(x, cos, sin, interleaved=True),
        ops.rope(x, cos_p, sin_p, rotary_dim=32, position_ids=pos, interleaved=True),
    )
    xt = g.input("xt", (2, "s", 8, 64), "bf16")
    g.output(ops.rope(xt, ops.cast(cos, "bf16"), ops.cast(sin, "bf16"), layout="bshd"))
    compile_gpu(g)


@pytest.mark.parametrize(
    "x_shape,table,kw,message",
    [
        ((2, 3, 5, 9), (5, 4), {}, r"head dim of 'x' is 9, expected a static even size"),
        ((2, 3, 5, 8), (5, 4), {"rotary_dim": 5}, r"rotary_dim=5, expected an even int in \[2, 8\]"),
        ((2, 3, 5, 8), (5, 4), {"rotary_dim": 10}, r"rotary_dim=10, expected an even int"),
        ((2, 3, 5, 8), (5, 3), {}, r"'cos' has shape f32\[5,3\], expected \(T, 4\)"),
        ((2, 3, 5, 8), (4, 4), {}, r"'cos' has 4 rows, expected at least t = 5"),
        ((2, 3, 5, 8), (3, 5, 4), {}, r"expected \(2, 5, 4\) to match 'x'"),
        ((2, 3, 5, 8), (5, 4), {"layout": "sbhd"}, r"layout='sbhd', expected one of 'bhsd', 'bshd'"),
        ((2, 3, 5), (5, 4), {}, r"'x' is f32\[2,3,5\], expected a rank-4 float tensor"),
    ],
)
def test_bad_inputs_are_graph_errors(x_shape, table, kw, message):
    g = rocmc.Graph("t")
    x, cos, sin = g.input("x", x_shape, "f32"), g.input("cos", table, "f32"), g.input("sin", table, "f32")
    with pytest.raises(rocmc.GraphError, match=r"rope\(%0, %1, %2, _\): .*" + message):
        ops.rope(x, cos, sin, **kw)


def test_cos_sin_mismatch_and_bad_position_ids():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 3, 5, 8), "f32")
    cos, sin = g.input("cos", (5, 4), "f32"), g.input("sin", (6, 4), "f32")
    with pytest.raises(rocmc.GraphError, match=r"'cos' is f32\[5,4\] and 'sin' is f32\[6,4\]"):
        ops.rope(x, cos, sin)
    with pytest.raises(rocmc.GraphError, match=r"'position_ids' is f32\[2,5\], expected an int32/int64"):
        ops.rope(x, cos, cos, position_ids=g.input("p", (2, 5), "f32"))
    with pytest.raises(rocmc.GraphError, match=r"'position_ids' has shape i64\[2,4\], expected \(2, 5\)"):
        ops.rope(x, cos, cos, position_ids=g.input("q", (2, 4), "i64"))
