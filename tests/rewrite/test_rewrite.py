"""rocmc.rewrite: each decomposed form exporters write becomes rocmc's fused op, with the same results
(float rounding), and near misses (a second user, a wrong axis, a wrong constant) stay as they are.
The stage is visible (ir("rewrite"), summary, metadata), can be turned off, and is part of the cache key."""

import math

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.artifact import check_metadata
from rocmc.errors import ArtifactError
from rocmc.rewrite import View, rewrite
from rocmc.symbolic import dim_mul

from helpers import rand

B, S, D = 2, 5, 16


def _fused_ops(g):
    return [n.op for n in g.nodes if n.op not in ("constant", "parameter", "state")]


def _same(g, g2, *inputs, rtol=1e-6, atol=1e-6):
    want, got = rocmc.evaluate(g, *inputs), rocmc.evaluate(g2, *inputs, round_to_dtype=False)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def _expect(g, op, *inputs, count=1, tol=1e-6):
    """g rewrites to `count` nodes of `op`, computing the same (up to rounding at `tol`)."""
    g2, records = rewrite(g)
    assert [r.op for r in records] == [op] * count, _fused_ops(g2)
    assert _fused_ops(g2).count(op) == count
    _same(g, g2, *inputs, rtol=tol, atol=tol)
    return g2, records


def _unchanged(g):
    g2, records = rewrite(g)
    assert records == [] and g2 is g


# ---- RMSNorm -----------------------------------------------------------------------------------


def _rms(x, w=None, eps=1e-6, inv="rsqrt", square="pow", axis=-1, exponent=2.0):
    q = x**exponent if square == "pow" else x * x
    a = ops.mean(q, axis=axis, keepdims=True) + eps
    if inv == "rsqrt":
        n = x * ops.rsqrt(a)
    elif inv == "div":
        n = x / ops.sqrt(a)
    elif inv == "one_over":
        n = x * (1.0 / ops.sqrt(a))
    else:
        n = x * ops.reciprocal(ops.sqrt(a))
    return n if w is None else n * w


@pytest.mark.parametrize("inv", ["rsqrt", "div", "one_over", "reciprocal"])
@pytest.mark.parametrize("square", ["pow", "mul"])
def test_rms_norm_spellings(inv, square, rng):
    g = rocmc.Graph()
    x = g.input("x", (B, S, D))
    w = g.constant("w", rand(rng, (D,)))
    g.output(_rms(x, w, inv=inv, square=square))
    g2, _ = _expect(g, "rms_norm", rand(rng, (B, S, D)))
    node = next(n for n in g2.nodes if n.op == "rms_norm")
    assert node.attrs == {"eps": float(np.float32(1e-6)), "axis": 2} and node.inputs[0] is g2.inputs[0]


def test_rms_norm_llama_casts_and_gemma_weight(rng):
    # LlamaRMSNorm in f16: h = x.to(f32); h * rsqrt(h.pow(2).mean(-1) + eps); w * h.to(f16).
    g = rocmc.Graph()
    x = g.input("x", (B, S, D), "f16")
    w = g.input("w", (D,), "f16")
    h = ops.cast(x, "f32")
    g.output(w * ops.cast(_rms(h), "f16"))
    g2, _ = _expect(g, "rms_norm", rand(rng, (B, S, D), "f16"), rand(rng, (D,), "f16"), tol=2e-3)
    assert "cast" not in _fused_ops(g2)  # the widening cast was read only by the pattern
    # Gemma: (h * (1 + w.float())).to(f16): the weight is 1 + w in f32, read before its widening cast.
    g = rocmc.Graph()
    x = g.input("x", (B, S, D), "f16")
    w = g.input("w", (D,), "f16")
    g.output(ops.cast(_rms(ops.cast(x, "f32"), 1.0 + ops.cast(w, "f32")), "f16"))
    g3, _ = rewrite(g)
    assert "rms_norm" in _fused_ops(g3)
    _same(g, g3, rand(rng, (B, S, D), "f16"), rand(rng, (D,), "f16"), rtol=2e-3, atol=2e-3)


def test_rms_norm_over_trailing_axes_and_broadcast_weight(rng):
    g = rocmc.Graph()
    x = g.input("x", (B, 4, 8))
    w = g.constant("w", rand(rng, (1, 4, 8)))
    g.output(_rms(x, w, axis=(1, 2)))
    g2, _ = _expect(g, "rms_norm", rand(rng, (B, 4, 8)))
    assert next(n for n in g2.nodes if n.op == "rms_norm").attrs["axis"] == 1


def test_rms_norm_near_misses_stay(rng):
    def graph(build):
        g = rocmc.Graph()
        x = g.input("x", (B, S, D))
        g.output(*build(g, x))
        return g

    w = rand(rng, (D,))
    _unchanged(graph(lambda g, x: [_rms(x, g.constant("w", w), exponent=3.0)]))  # x^3
    _unchanged(graph(lambda g, x: [_rms(x, g.constant("w", w), axis=1)]))  # mean over axis 1
    _unchanged(graph(lambda g, x: [_rms(x, axis=(0, 2))]))  # not trailing axes
    _unchanged(graph(lambda g, x: [_rms(x, eps=g.constant("e", rand(rng, (B, S, 1))))]))  # eps varies

    def second_user(g, x):  # the mean is also an output
        m = ops.mean(x**2.0, axis=-1, keepdims=True)
        return [x * ops.rsqrt(m + 1e-6), m]

    _unchanged(graph(second_user))

    def other_tensor(g, x):  # the statistic is of another tensor
        y = x + 1.0
        return [x * ops.rsqrt(ops.mean(y * y, axis=-1, keepdims=True) + 1e-6)]

    _unchanged(graph(other_tensor))


# ---- LayerNorm ---------------------------------------------------------------------------------


def _layer(x, w, b, eps=1e-5, var_axis=-1):
    d = x - ops.mean(x, axis=-1, keepdims=True)
    return d / ops.sqrt(ops.mean(d**2.0, axis=var_axis, keepdims=True) + eps) * w + b


def test_layer_norm(rng):
    g = rocmc.Graph()
    x = g.input("x", (B, S, D))
    g.output(_layer(x, g.constant("w", rand(rng, (D,))), g.constant("b", rand(rng, (D,)))))
    g2, _ = _expect(g, "layer_norm", rand(rng, (B, S, D)))
    assert len(_fused_ops(g2)) == 1


def test_layer_norm_near_misses_stay(rng):
    g = rocmc.Graph()
    x = g.input("x", (B, S, D))
    g.output(_layer(x, g.constant("w", rand(rng, (D,))), g.constant("b", rand(rng, (D,))), var_axis=1))
    _unchanged(g)
    g = rocmc.Graph()  # x - mean(y): no layer norm of x, but an RMSNorm of d
    x, y = g.input("x", (B, S, D)), g.input("y", (B, S, D))
    d = x - ops.mean(y, axis=-1, keepdims=True)
    g.output(d / ops.sqrt(ops.mean(d * d, axis=-1, keepdims=True) + 1e-5))
    g2, _ = _expect(g, "rms_norm", rand(rng, (B, S, D)), rand(rng, (B, S, D)))
    assert next(n for n in g2.nodes if n.op == "rms_norm").inputs[0].producer.op == "sub"


# ---- GELU, SiLU ---------------------------------------------------------------------------------


def _gelu_erf(x, form):
    if form == "bert":  # (x * (1 + erf(x / sqrt2))) * 0.5
        return x * (ops.erf(x / math.sqrt(2.0)) + 1.0) * 0.5
    return (0.5 * x) * (1.0 + ops.erf(x * (1 / math.sqrt(2.0))))


def _gelu_tanh(x, c=0.044715, cube="pow"):
    x3 = x**3.0 if cube == "pow" else x * x * x
    return x * 0.5 * (1.0 + ops.tanh(math.sqrt(2 / math.pi) * (x + c * x3)))


@pytest.mark.parametrize("form", ["bert", "grouped"])
def test_gelu_erf(form, rng):
    g = rocmc.Graph()
    x = g.input("x", (B, S, D))
    g.output(_gelu_erf(x, form))
    g2, _ = _expect(g, "gelu", rand(rng, (B, S, D), low=-4, high=4))
    assert next(n for n in g2.nodes if n.op == "gelu").attrs == {"approximate": "none"}


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_gelu_tanh(cube, rng):
    g = rocmc.Graph()
    x = g.input("x", (B, S, D))
    g.output(_gelu_tanh(x, cube=cube))
    g2, _ = _expect(g, "gelu", rand(rng, (B, S, D), low=-4, high=4))
    assert next(n for n in g2.nodes if n.op == "gelu").attrs == {"approximate": "tanh"}


def test_silu_and_gelu_of_a_product(rng):
    g = rocmc.Graph()
    x, y = g.input("x", (B, D)), g.input("y", (B, D))
    p = x * y  # x itself a product: not split into factors
    g.output(p * ops.sigmoid(p), _gelu_tanh(p))
    g2, records = rewrite(g)
    assert sorted(r.op for r in records) == ["gelu", "silu"]
    _same(g, g2, rand(rng, (B, D)), rand(rng, (B, D)))
    assert [n.inputs[0].producer.op for n in g2.nodes if n.op in ("gelu", "silu")] == ["mul", "mul"]


def test_activation_near_misses_stay(rng):
    for build in (
        lambda x: _gelu_tanh(x, c=0.045),  # wrong constant
        lambda x: x * (ops.erf(x / 1.41) + 1.0) * 0.5,  # sqrt(2) rounded wrong
        lambda x: x * (ops.erf(x / math.sqrt(2.0)) + 1.0) * 0.25,  # not 0.5
        lambda x: x * ops.sigmoid(x + 1.0),
    ):  # sigmoid of another value
        g = rocmc.Graph()
        g.output(build(g.input("x", (B, D))))
        _unchanged(g)
    g = rocmc.Graph()  # erf's result has a second user
    x = g.input("x", (B, D))
    e = ops.erf(x / math.sqrt(2.0))
    g.output(x * (e + 1.0) * 0.5, e)
    _unchanged(g)


# ---- RoPE ----------------------------------------------------------------------------------------

H, T, HD = 3, 6, 8


def _angles(rng, t=T, d=HD, interleaved=False):
    theta = rng.uniform(0, 2 * np.pi, size=(t, d // 2))
    full = np.repeat(theta, 2, axis=-1) if interleaved else np.concatenate([theta, theta], -1)
    return np.cos(full).astype(np.float32), np.sin(full).astype(np.float32)


def _rotate_half(x, d):
    r = d // 2
    return ops.concat([ops.neg(ops.slice(x, [r], [d], axes=[-1])), ops.slice(x, [0], [r], axes=[-1])], axis=-1)


def _rotate_interleaved(x, d):
    shape = list(x.shape)
    odd = ops.unsqueeze(ops.neg(ops.slice(x, [1], [d], axes=[-1], steps=[2])), [-1])
    even = ops.unsqueeze(ops.slice(x, [0], [d], axes=[-1], steps=[2]), [-1])
    return ops.reshape(ops.concat([odd, even], axis=-1), shape)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope(layout, interleaved, rng):
    g = rocmc.Graph()
    shape = (B, H, T, HD) if layout == "bhsd" else (B, T, H, HD)
    x = g.input("x", shape)
    c, s = _angles(rng, interleaved=interleaved)
    table = (1, 1, T, HD) if layout == "bhsd" else (1, T, 1, HD)
    cos, sin = g.constant("cos", c.reshape(table)), g.constant("sin", s.reshape(table))
    rot = _rotate_interleaved if interleaved else _rotate_half
    g.output(x * cos + rot(x, HD) * sin)
    g2, _ = _expect(g, "rope", rand(rng, shape))
    node = next(n for n in g2.nodes if n.op == "rope")
    assert node.attrs == {"interleaved": interleaved, "layout": layout, "rotary_dim": HD}


def test_rope_partial_and_tables_from_concat(rng):
    # cos/sin computed in the graph as cos(cat(f, f)): the halves repeat by construction.
    g = rocmc.Graph()
    x = g.input("x", (B, H, T, HD))
    f = g.input("f", (T, 2))
    emb = ops.concat([f, f], axis=-1)
    cos, sin = ops.cos(emb), ops.sin(emb)
    xr, xp = ops.slice(x, [0], [4], axes=[-1]), ops.slice(x, [4], [HD], axes=[-1])
    g.output(ops.concat([xr * cos + _rotate_half(xr, 4) * sin, xp], axis=-1))
    g2, _ = _expect(g, "rope", rand(rng, (B, H, T, HD)), rand(rng, (T, 2), low=0, high=6))
    assert next(n for n in g2.nodes if n.op == "rope").attrs["rotary_dim"] == 4


def test_rope_near_misses_stay(rng):
    c, s = _angles(rng)

    def graph(cos_table, rotate):
        g = rocmc.Graph()
        x = g.input("x", (B, H, T, HD))
        g.output(x * g.constant("cos", cos_table) + rotate(x) * g.constant("sin", s))
        return g

    other = c.copy()
    other[:, HD // 2] += 0.5  # halves of the cos table differ
    _unchanged(graph(other, lambda x: _rotate_half(x, HD)))
    _unchanged(
        graph(
            c,
            lambda x: ops.concat(
                [
                    ops.slice(x, [4], [8], axes=[-1]),  # no negation
                    ops.slice(x, [0], [4], axes=[-1]),
                ],
                axis=-1,
            ),
        )
    )
    _unchanged(
        graph(
            c,
            lambda x: ops.concat(
                [
                    ops.neg(ops.slice(x, [3], [8], axes=[-1])),  # split at 3
                    ops.slice(x, [0], [3], axes=[-1]),
                ],
                axis=-1,
            ),
        )
    )
    _unchanged(
        graph(c.reshape(T, 1, HD)[:, :, :].repeat(H, 1).transpose(1, 0, 2)[None].copy(), lambda x: _rotate_half(x, HD))
    )  # a table per head: not rope's


# ---- attention -----------------------------------------------------------------------------------

HQ, HKV, SQ, SKV, HDIM = 4, 2, 5, 7, 8


def _repeat_kv(t, groups, interleave=True):
    """GQA's repeat of kv heads (transformers' repeat_kv: unsqueeze, expand, reshape); interleave=False
    tiles the heads instead (head h reads kv head h % hkv, which is not sdpa's grouping)."""
    b, h, s, d = t.shape
    if interleave:
        t = ops.broadcast_to(ops.reshape(t, [b, h, 1, s, d]), [b, h, groups, s, d])
    else:
        t = ops.broadcast_to(ops.reshape(t, [b, 1, h, s, d]), [b, groups, h, s, d])
    return ops.reshape(t, [b, h * groups, s, d])


def _merged_transpose(k):
    """k^T as the dynamo exporter spells it: batch and heads merged, a rank-3 transpose, split again."""
    b, h, s, d = k.shape
    return ops.reshape(ops.transpose(ops.reshape(k, [dim_mul(b, h), s, d]), 1, 2), [b, h, d, s])


def _attention(g, q, k, v, mask=None, guard=True, prescale=False, interleave=True, kt=None):
    scale = 1 / math.sqrt(HDIM)
    k, v = _repeat_kv(k, HQ // HKV, interleave), _repeat_kv(v, HQ // HKV, interleave)
    kt = ops.transpose(k, 2, 3) if kt is None else kt(k)
    if prescale:
        r = math.sqrt(scale)
        scores = ops.matmul(q * r, kt * r)
    else:
        scores = ops.matmul(q, kt) * scale
    if mask is not None:
        scores = scores + mask
    p = ops.softmax(scores, axis=-1)
    if guard:
        p = ops.where(ops.isnan(p), g.constant(None, np.zeros((1,), np.float32)), p)
    return ops.matmul(p, v)


def _qkv(g):
    return (g.input("q", (B, HQ, SQ, HDIM)), g.input("k", (B, HKV, SKV, HDIM)), g.input("v", (B, HKV, SKV, HDIM)))


def _qkv_values(rng):
    return rand(rng, (B, HQ, SQ, HDIM)), rand(rng, (B, HKV, SKV, HDIM)), rand(rng, (B, HKV, SKV, HDIM))


def _sdpa_node(g2):
    return next(n for n in g2.nodes if n.op == "sdpa")


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's NaN rows
@pytest.mark.parametrize("prescale", [False, True])
def test_attention_gqa_with_padding_mask_and_guard(prescale, rng):
    # A dynamic additive mask with -inf may mask a whole row: the guard's zeros must survive.
    g = rocmc.Graph()
    q, k, v = _qkv(g)
    keep = g.input("keep", (B, 1, SQ, SKV), "bool")
    mask = ops.where(
        keep, g.constant(None, np.zeros((1,), np.float32)), g.constant(None, np.full((1,), -np.inf, np.float32))
    )
    g.output(_attention(g, q, k, v, mask, prescale=prescale))
    keeps = rand(rng, (B, 1, SQ, SKV), "bool")
    keeps[0, 0, 1] = False  # a fully masked row
    g2, _ = _expect(g, "sdpa", *_qkv_values(rng), keeps)
    node = _sdpa_node(g2)
    assert node.inputs[1].shape == (B, HKV, SKV, HDIM)  # k read before the repeat
    assert node.attrs["scale"] == pytest.approx(1 / math.sqrt(HDIM))
    assert not np.isnan(rocmc.evaluate(g2, *_qkv_values(rng), keeps)).any()


def test_attention_constant_causal_mask_becomes_is_causal(rng):
    g = rocmc.Graph()
    q, k, v = _qkv(g)
    keep = np.arange(SKV)[None, :] <= np.arange(SQ)[:, None] + (SKV - SQ)
    mask = g.constant("causal", np.where(keep, 0, -np.inf).astype(np.float32)[None, None])
    g.output(_attention(g, q, k, v, mask))
    g2, _ = _expect(g, "sdpa", *_qkv_values(rng))
    node = _sdpa_node(g2)
    assert node.attrs["is_causal"] and node.inputs[3] is None and _fused_ops(g2) == ["sdpa"]


def test_attention_finite_where_mask_and_tiled_heads(rng):
    # transformers' dynamo export: where(keep, 0, finfo.min), no guard needed; heads tiled (not
    # repeat-interleaved) are not sdpa's grouping, so sdpa reads the tiled tensors with hq heads.
    g = rocmc.Graph()
    q, k, v = _qkv(g)
    keep = g.input("keep", (B, 1, 1, SKV), "bool")
    mask = ops.where(
        keep,
        g.constant(None, np.zeros((), np.float32)),
        g.constant(None, np.asarray(np.finfo(np.float32).min, np.float32)),
    )
    g.output(_attention(g, q, k, v, mask, interleave=False))
    g2, _ = _expect(g, "sdpa", *_qkv_values(rng), rand(rng, (B, 1, 1, SKV), "bool"))
    assert _sdpa_node(g2).inputs[1].shape == (B, HQ, SKV, HDIM)
    assert "amax" not in _fused_ops(g2)


def test_attention_near_misses_stay(rng):
    g = rocmc.Graph()  # softmax over the query axis
    q, k, v = _qkv(g)
    kt = ops.transpose(_repeat_kv(k, 2), 2, 3)
    g.output(ops.matmul(ops.softmax(ops.matmul(q, kt) * 0.3, axis=2), _repeat_kv(v, 2)))
    _unchanged(g)
    g = rocmc.Graph()  # the probabilities are also an output
    q, k, v = _qkv(g)
    p = ops.softmax(ops.matmul(q, ops.transpose(_repeat_kv(k, 2), 2, 3)), axis=-1)
    g.output(ops.matmul(p, _repeat_kv(v, 2)), p)
    _unchanged(g)
    g = rocmc.Graph()  # a mask that grows the scores (a leading dim of 2)
    q, k, v = _qkv(g)
    m = g.input("m", (2, B, HQ, SQ, SKV))
    s = ops.matmul(q, ops.transpose(_repeat_kv(k, 2), 2, 3)) + m
    g.output(ops.matmul(ops.softmax(s, axis=-1), _repeat_kv(v, 2)))
    _unchanged(g)


# ---- attention over symbolic dims (dynamic batch and sequence) ------------------------------------

SIZES = ((2, 5, 7), (3, 4, 4))  # (batch, seq, kv) at which a symbolic graph is run


def _sym_qkv(g):
    return (
        g.input("q", ("batch", HQ, "seq", HDIM)),
        g.input("k", ("batch", HKV, "kv", HDIM)),
        g.input("v", ("batch", HKV, "kv", HDIM)),
    )


def _sym_values(rng, b, s, kv, keep_shape):
    keep = rand(rng, (b, *keep_shape(s, kv)), "bool")
    keep[0, ..., 1, :] = False  # a fully masked query row
    return rand(rng, (b, HQ, s, HDIM)), rand(rng, (b, HKV, kv, HDIM)), rand(rng, (b, HKV, kv, HDIM)), keep


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's NaN rows
@pytest.mark.parametrize("fill", [-np.inf, float(np.finfo(np.float32).min)])
def test_attention_symbolic_dims(fill, rng):
    # What the dynamic exports spell: q (batch, hq, seq, d), GQA's repeat and k^T through merged
    # (batch*heads) dims, a padding+causal mask where(keep, 0, fill) of shape (batch, 1, seq, kv).
    g = rocmc.Graph()
    q, k, v = _sym_qkv(g)
    keep = g.input("keep", ("batch", 1, "seq", "kv"), "bool")
    mask = ops.where(
        keep, g.constant(None, np.zeros((1,), np.float32)), g.constant(None, np.full((1,), fill, np.float32))
    )
    g.output(_attention(g, q, k, v, mask, prescale=True, kt=_merged_transpose))
    g2, _ = rewrite(g)
    assert _fused_ops(g2).count("sdpa") == 1 and "softmax" not in _fused_ops(g2)
    node = _sdpa_node(g2)
    assert node.inputs[1] is g2.inputs[1] and node.inputs[2] is g2.inputs[2]  # k, v read before the repeat
    assert node.inputs[3].shape == ("batch", 1, "seq", "kv") and not node.attrs["is_causal"]
    for b, s, kv in SIZES:
        inputs = _sym_values(rng, b, s, kv, lambda s, kv: (1, s, kv))
        _same(g, g2, *inputs)
        assert not np.isnan(rocmc.evaluate(g2, *inputs)).any()


def test_attention_symbolic_dims_additive_bias_without_scale(rng):
    # T5: no 1/sqrt(d) (scale 1) and a position bias per head added to the scores: an additive mask.
    g = rocmc.Graph()
    q, k, v = (g.input(n, ("batch", HQ, "seq", HDIM)) for n in "qkv")
    bias = g.input("bias", (1, HQ, "seq", "seq"))
    p = ops.softmax(ops.matmul(q, _merged_transpose(k)) + bias, axis=-1)
    g.output(ops.matmul(p, v))
    g2, _ = rewrite(g)
    node = _sdpa_node(g2)
    assert node.attrs["scale"] == 1.0 and node.inputs[3] is g2.inputs[3] and node.inputs[1] is g2.inputs[1]
    for b, s, _ in SIZES:
        _same(g, g2, *(rand(rng, (b, HQ, s, HDIM)) for _ in range(3)), rand(rng, (1, HQ, s, s)))


def test_attention_symbolic_reshape_that_is_no_transpose(rng):
    # k (batch, h, seq, d) reshaped to (batch, h, d, seq) has k^T's shape but other elements: the chain is
    # not read through (as sizes alone would allow), sdpa reads the reshaped tensor transposed back.
    g = rocmc.Graph()
    q, k, v = (g.input(n, ("batch", HQ, "seq", HDIM)) for n in "qkv")
    kt = ops.reshape(k, ["batch", HQ, HDIM, "seq"])
    g.output(ops.matmul(ops.softmax(ops.matmul(q, kt) * 0.3, axis=-1), v))
    g2, _ = rewrite(g)
    k_in = _sdpa_node(g2).inputs[1].producer
    assert k_in.op == "transpose" and k_in.inputs[0].producer.op == "reshape"
    for b, s, _ in SIZES:
        _same(g, g2, *(rand(rng, (b, HQ, s, HDIM)) for _ in range(3)))


def test_attention_symbolic_heads_merged_with_sequence_stay_unread():
    # A "repeat" whose reshape merges the kv sequence into the heads is no GQA grouping: sdpa may not
    # read k before it.
    g = rocmc.Graph()
    q = g.input("q", ("batch", HQ, "seq", HDIM))
    k, v = (g.input(n, ("batch", HKV, "seq", HDIM)) for n in "kv")

    def spread(t):
        t = ops.broadcast_to(ops.reshape(t, ["batch", HKV, "seq", 1, HDIM]), ["batch", HKV, "seq", 2, HDIM])
        return ops.reshape(t, ["batch", HQ, "seq", HDIM])

    g.output(ops.matmul(ops.softmax(ops.matmul(q, ops.transpose(spread(k), 2, 3)), axis=-1), spread(v)))
    g2, _ = rewrite(g)
    assert all(x.shape == ("batch", HQ, "seq", HDIM) for x in _sdpa_node(g2).inputs[:3])


# ---- views -----------------------------------------------------------------------------------------


def test_view_follows_repeat_and_transpose():
    # (b, hkv, s, d) -> unsqueeze, expand, reshape -> (b, hq, s, d) -> reshape (b*hq, s, d), transpose
    v = View.dense((1, 2, 3, 4)).reshape((1, 2, 1, 3, 4)).broadcast_to((1, 2, 2, 3, 4)).reshape((4, 3, 4))
    v = v.transpose((0, 2, 1)).reshape((1, 2, 2, 4, 3))
    assert v.strides() == [0, 12, 0, 1, 4]
    assert View.dense((2, 3)).broadcast_to((3, 3)) is None and View.dense((6,)).reshape((4,)) is None


def test_view_over_symbolic_dims():
    # dynamo's GQA repeat and k^T over (batch, 2, seq, 16): strides are products of the symbols.
    v = View.dense(("batch", 2, "seq", 16)).reshape(("batch", 2, 1, "seq", 16))
    v = v.broadcast_to(("batch", 2, 2, "seq", 16)).reshape(("(batch*4)", "seq", 16)).transpose((0, 2, 1))
    assert v.reshape(("batch", 2, 2, 16, "seq")).strides() == ["(seq*32)", "(seq*16)", 0, 1, 16]
    assert View.dense(("batch", "seq")).reshape(("(batch*seq)",)).strides() == [1]
    assert View.dense(("(seq*2)", 3)).reshape((2, "seq", 3)).strides() == ["(seq*3)", 3, 1]
    assert View.dense(("batch", "(seq+1)", 4)).reshape(("batch", "((seq*4)+4)")).strides() == ["((seq*4)+4)", 1]
    # A transposed (batch, seq) is no (batch, seq) tensor, nor a single (batch*seq) run, for any sizes.
    assert View.dense(("batch", "seq")).transpose((1, 0)).reshape(("batch", "seq")) is None
    assert View.dense(("batch", "seq")).transpose((1, 0)).reshape(("(batch*seq)",)).strides() is None
    assert View.dense(("seq", 4)).broadcast_to(("kv", 4)) is None


# ---- the stage in compile ----------------------------------------------------------------------------


def _norm_and_silu(x, w):
    h = _rms(x, w)
    return h * ops.sigmoid(h)


def test_compile_records_stage_and_option(rng):
    g = rocmc.Graph()
    x = g.input("x", (B, S, D))
    g.output(_norm_and_silu(x, g.constant("w", rand(rng, (D,)))))
    xs = rand(rng, (B, S, D))
    art = rocmc.compile(g, "cpu")
    assert [r["op"] for r in art.metadata["rewrites"]] == ["rms_norm", "silu"]
    assert "rms_norm(" in art.ir("rewrite") and "pow(" in art.ir("graph") and "pow(" not in art.ir("rewrite")
    assert art.metadata["graph_hash"] == g.hash()
    summary = art.summary()
    assert "rewrite: rms_norm %" in summary and "<- 6 nodes (" in summary and " pow, " in summary
    off = rocmc.compile(g, "cpu", rewrite=False)
    assert not off.cached and "rewrites" not in off.metadata and "rewrite: off" in off.summary()
    with pytest.raises(ArtifactError, match="rewrite=False"):
        off.ir("rewrite")
    assert rocmc.compile(g, "cpu").cached  # the cache keeps both, keyed by the option
    got, plain = rocmc.load(art)(xs), rocmc.load(off)(xs)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, rocmc.evaluate(g, xs), rtol=2e-5, atol=2e-5)


def test_rewrite_metadata_survives_save_and_is_checked(rng, tmp_path):
    g = rocmc.Graph()
    x = g.input("x", (B, D))
    g.output(x * ops.sigmoid(x))
    art = rocmc.compile(g, "cpu")
    loaded = rocmc.Artifact.load(art.save(tmp_path / "m.vmfb"))
    assert loaded.metadata["rewrites"] == art.metadata["rewrites"] and "silu(" in loaded.ir("rewrite")
    assert "rewrite: silu" in loaded.summary()
    bad = dict(
        art.metadata, rewrites=[{"function": "main", "pattern": "silu", "op": "silu", "node": "%3", "replaced": "all"}]
    )
    with pytest.raises(ArtifactError, match="rewrites"):
        check_metadata(bad)
    with pytest.raises(rocmc.LoweringError, match="rewrite"):
        rocmc.compile(g, "cpu", rewrite="yes")


@pytest.mark.parametrize("family", ["rms_norm", "gelu", "rope", "sdpa"])
def test_compiled_cpu_results_match_unrewritten(family, rng):
    g = rocmc.Graph()
    if family == "sdpa":
        q, k, v = _qkv(g)
        g.output(_attention(g, q, k, v))
        inputs = _qkv_values(rng)
    elif family == "rope":
        x = g.input("x", (B, H, T, HD))
        c, s = _angles(rng)
        g.output(x * g.constant("cos", c) + _rotate_half(x, HD) * g.constant("sin", s))
        inputs = (rand(rng, (B, H, T, HD)),)
    else:
        x = g.input("x", (B, S, D))
        g.output(_rms(x, g.constant("w", rand(rng, (D,)))) if family == "rms_norm" else _gelu_erf(x, "bert"))
        inputs = (rand(rng, (B, S, D)),)
    art = rocmc.compile(g, "cpu")
    assert [r["op"] for r in art.metadata["rewrites"]] == [family]
    got = rocmc.load(art)(*inputs)
    plain = rocmc.load(rocmc.compile(g, "cpu", rewrite=False))(*inputs)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=2e-6)


# ---- a transformers export ---------------------------------------------------------------------


def test_llama_export_gets_fused_ops_and_kernels(rng, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("onnx")
    torch.manual_seed(int(rng.integers(1 << 31)))
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids, mask):
            return self.m(input_ids=ids, attention_mask=mask, use_cache=False).logits

    ids = torch.randint(0, 128, (1, 8))
    mask = torch.ones(1, 8, dtype=torch.long)
    path = tmp_path / "llama.onnx"
    torch.onnx.export(Logits(), (ids, mask), str(path), dynamo=False, opset_version=17)
    g = rocmc.import_onnx(str(path))
    art = rocmc.compile(g, "gfx942")
    ops_found = [r["op"] for r in art.metadata["rewrites"]]
    assert ops_found.count("sdpa") == 2 and ops_found.count("rope") == 4 and ops_found.count("rms_norm") == 5
    summary = art.summary()
    assert summary.count("rewrite: sdpa") == 2
    kernels = {d["name"] for d in art.dispatches() if d["kind"] == "hand-written"}
    assert any(k.startswith("rms_norm_") for k in kernels) and any(k.startswith("rope_") for k in kernels)
    # On the CPU: the same logits as the model's and as the graph compiled as given.
    pad = np.ones((1, 8), np.int64)
    pad[0, :2] = 0  # left padding: fully masked query rows
    feeds = (ids.numpy(), pad)
    cpu = rocmc.load(rocmc.compile(g, "cpu"))(*feeds)
    plain = rocmc.load(rocmc.compile(g, "cpu", rewrite=False))(*feeds)
    np.testing.assert_allclose(cpu, plain, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=torch.from_numpy(pad), use_cache=False).logits.numpy()
    np.testing.assert_allclose(cpu[:, 2:], want[:, 2:], rtol=1e-4, atol=1e-4)


def test_dynamic_llama_export_gets_one_sdpa_per_layer(rng, tmp_path):
    # transformers' llama exported by dynamo with dynamic batch and sequence: every dim of the attention
    # is symbolic, the mask is the padding+causal one transformers builds at run time, rope's tables are
    # computed from the positions. The compiled module matches torch at two sizes on the rows the mask keeps,
    # and the graph as given on every row.
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("onnx")
    import export_models as zoo

    model = zoo.build("llama", seed=int(rng.integers(1 << 31)))
    sizes = ((2, 7), (3, 12))
    path = tmp_path / "llama.onnx"
    zoo.export(model, "llama", "dynamo", True, path, zoo.FAMILIES["llama"].inputs(rng, *sizes[0]))
    graph = rocmc.import_onnx(str(path))
    art = rocmc.compile(graph, "cpu")
    summary = art.summary()
    assert summary.count("rewrite: sdpa") == 2 and summary.count("rewrite: rope") == 4
    assert summary.count("rewrite: rms_norm") == 5
    module = rocmc.load(art)
    for batch, seq in sizes:
        inputs = zoo.FAMILIES["llama"].inputs(rng, batch, seq)
        keep = zoo.valid_rows("llama", inputs)
        got, want = module(*inputs), zoo.run_torch(model, inputs)
        np.testing.assert_allclose(got[keep], want[keep], rtol=1e-4, atol=1e-4)
        # Every row, padded ones too, as the graph computes without the rewrite.
        np.testing.assert_allclose(got, rocmc.evaluate(graph, *inputs), rtol=1e-4, atol=1e-4)
