"""A Hugging Face causal LM as a rocmc program: `prefill`, `decode` and `sample` functions sharing the
checkpoint's weights (named parameters, so the module holds none of their bytes) and a KV cache that
stays on the device (one state holding every layer's keys and values).

Every parameter has the checkpoint's own tensor name and layout: projections stay (out, in) and are
applied with `matmul(x, w, transpose_b=True)`, the layout IREE's decode GEMVs are fast with.

The cache is one state of shape (2 * layers * max_seq_len, max_batch * kv_heads * head_dim): the keys of
layer i are rows [2i * max_seq_len, (2i + 1) * max_seq_len), its values the next max_seq_len rows, a row
holding one position of every batch row and kv head. A call writes its new positions with
`update_slice` (rows, so one contiguous copy per layer and kind) and attends to the first `kv`
positions through `narrow`, so a decode step reads what attention needs and writes one position: IREE
updates the state in place. One state, not one per layer: IREE 3.13 stores same-typed states updated
in place in one buffer (see docs/architecture.md, "State").

Batches are left-padded by the caller (rocmc.llm.runtime): rows share cache slots, a row's positions
start at its first real token, and the masks (inputs, bool, true = attend) hide the padding and, for
sliding-window layers, the positions outside the window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ops
from ..frontend.graph import Graph, Value
from ..dtypes import dtype as _dtype
from .config import LlmConfig, param_names, rope_tables
from .sharding import EMBED, LM_HEAD, Plan


@dataclass(frozen=True)
class Shape:
    """What a compiled model is sized for, besides its config."""

    max_seq_len: int
    max_batch: int
    dtype: str  # compute and cache dtype: "f32", "f16" or "bf16"
    sample_k: int = 64  # sampling draws from the sample_k most likely tokens (top_k <= sample_k)


CACHE = "kv_cache"


def cache_shape(cfg: LlmConfig, shape: "Shape", degree: int = 1) -> tuple[int, int]:
    """The KV cache of one rank (of `degree`, which holds 1/degree of the kv heads)."""
    return (
        2 * cfg.num_hidden_layers * shape.max_seq_len,
        shape.max_batch * cfg.num_key_value_heads // degree * cfg.head_dim,
    )


def build(cfg: LlmConfig, shape: Shape, functions=None, plan: Plan | None = None) -> dict:
    """{function name: Graph} for `rocmc.compile` (every function of FUNCTIONS, or those named); with a
    tensor-parallel `plan` of degree > 1, the graphs of one rank (rocmc.llm.sharding)."""
    plan = plan if plan is not None and plan.degree > 1 else None
    return {name: _BUILDERS[name](cfg, shape, plan) for name in functions or FUNCTIONS}


def _prefill(cfg: LlmConfig, shape: Shape, plan: Plan | None = None) -> Graph:
    """Prompt of `s` tokens per row -> the next token (greedy), the last position's logits, and the logits of
    every position (f32, as transformers returns them; a caller that wants only the token leaves them on
    the device: the lm_head over every position is a few percent of a prefill)."""
    g, w, h = _forward(cfg, shape, "prefill", "s", "s", plan)
    every = _lm_head(cfg, w, h)  # (b, s, vocab)
    logits = ops.reshape(ops.gather(every, np.array([-1], dtype=np.int64), axis=1), (shape.max_batch, cfg.vocab_size))
    g.output(ops.argmax(logits, axis=-1), logits, every)
    return g


def _decode(cfg: LlmConfig, shape: Shape, plan: Plan | None = None) -> Graph:
    """One token per row at cache slot kv-1 -> the next token (greedy) and its logits."""
    g, w, h = _forward(cfg, shape, "decode", 1, "kv", plan)
    logits = ops.reshape(_lm_head(cfg, w, h), (shape.max_batch, cfg.vocab_size))
    g.output(ops.argmax(logits, axis=-1), logits)
    return g


def _sample(cfg: LlmConfig, shape: Shape, plan: Plan | None = None) -> Graph:
    """Logits (left on the device by decode) -> one token per row, drawn as transformers' sampling does:
    temperature, then top_k, then top_p (the smallest set of most likely tokens whose probability reaches
    it), then a draw (the Gumbel-max trick with counter-based noise from `key`, so a seed reproduces a
    generation on every target). Rows with temperature 0 take the most likely token. The candidates are
    the sample_k most likely tokens."""
    b, k = shape.max_batch, min(shape.sample_k, cfg.vocab_size)
    g = Graph("sample")
    logits = g.input("logits", (b, cfg.vocab_size), "f32")
    temperature, top_k = g.input("temperature", (b,), "f32"), g.input("top_k", (b,), "i64")
    top_p, key = g.input("top_p", (b,), "f32"), g.input("key", (b,), "i64")
    values, ids = ops.topk(logits, k, axis=-1)  # (b, k), most likely first
    t = ops.reshape(temperature, (b, 1))
    scaled = values / ops.maximum(t, np.float32(1e-30))
    rank = ops.reshape(ops.arange(g, 0, k), (1, k))
    keep = ops.less(rank, ops.reshape(top_k, (b, 1)))
    probs = ops.softmax(ops.where(keep, scaled, np.float32(-np.inf)), axis=-1)
    before = ops.cumsum(probs, axis=1, exclusive=True)
    keep = ops.logical_and(keep, ops.less(before, ops.reshape(top_p, (b, 1))))
    gumbel = -ops.log(-ops.log(ops.random_uniform(key, k)))
    choice = ops.argmax(ops.where(keep, scaled + gumbel, np.float32(-np.inf)), axis=-1, keepdims=True)
    drawn = ops.sum(ops.where(ops.equal(rank, choice), ids, np.int64(0)), axis=-1)
    greedy = ops.reshape(ops.narrow(ids, 1, 0, 1), (b,))
    g.output(ops.where(ops.greater(temperature, np.float32(0)), drawn, greedy))
    return g


_BUILDERS = {"prefill": _prefill, "decode": _decode, "sample": _sample}
FUNCTIONS = tuple(_BUILDERS)


class _Weights:
    """The checkpoint's tensors as graph parameters, by their own names (a rank's slices of them with a
    tensor-parallel plan: `n` ranks, each holding the plan's local shape)."""

    def __init__(self, g: Graph, cfg: LlmConfig, dtype: str, plan: Plan | None = None, positions: int = 1):
        self.g, self.dtype, self.plan = g, dtype, plan
        self.n = plan.degree if plan else 1
        self.shapes = {k: s.local(self.n) for k, s in plan.shards.items()} if plan else dict(param_names(cfg))
        self.values: dict = {}
        self.positions = positions  # the most tokens per row a call takes

    def most(self, x: Value) -> int:
        """The most elements of an activation (b, t, k) of a call: what a collective is padded to on a GPU
        when t is symbolic (one collective, not a loop of pieces)."""
        b, _, k = x.shape
        return b * self.positions * k

    def __call__(self, name: str) -> Value:
        if name not in self.values:  # a tied embedding is read twice, as one parameter
            self.values[name] = self.g.parameter(name, self.shapes[name], self.dtype)
        return self.values[name]


def _forward(cfg: LlmConfig, shape: Shape, name: str, t, kv, plan: Plan | None = None):
    """The decoder stack over `t` new tokens per row whose keys go to cache slots [kv - t, kv): returns
    the graph, its weights and the final hidden states (b, t, hidden)."""
    b, dt = shape.max_batch, shape.dtype
    g = Graph(name)
    tokens = g.input("tokens", (b, t), "i64")
    positions = g.input("positions", (b, t), "i64")
    masks = {"full_attention": g.input("mask", (b, 1, t, kv), "bool")}
    if "sliding_attention" in cfg.layer_types:
        masks["sliding_attention"] = g.input("window_mask", (b, 1, t, kv), "bool")
    w = _Weights(g, cfg, dt, plan, positions=shape.max_seq_len if t == "s" else t)
    cos, sin = (np.asarray(a, dtype=np.float32) for a in rope_tables(cfg, shape.max_seq_len))
    cos, sin = g.constant("rope_cos", cos), g.constant("rope_sin", sin)
    # The first cache slot this call writes: 0 for a prompt, kv - 1 for one decoded token (a size expression:
    # the host knows it from the mask's shape, so nothing is read back from the device to place the write).
    start = 0 if t == "s" else f"{kv}-1"

    cache = [g.state(CACHE, cache_shape(cfg, shape, w.n), dt)]  # the latest value, updated layer by layer
    h = _gather_last(ops.embedding(tokens, w(EMBED)), w)
    if cfg.embed_scale != 1.0:
        h = h * np.asarray(cfg.embed_scale, dtype=_dtype(dt).np)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        x = _norm(cfg, h, w(p + "input_layernorm.weight"))
        a = _attention(
            cfg,
            w,
            p + "self_attn.",
            x,
            i,
            cos,
            sin,
            positions,
            masks[cfg.layer_types[i]],
            cache,
            start,
            kv,
            t,
            shape.max_seq_len,
        )
        h = h + a
        x = _norm(cfg, h, w(p + "post_attention_layernorm.weight"))
        h = h + _mlp(cfg, w, p + "mlp.", x)
    g.assign(CACHE, cache[0])
    return g, w, _norm(cfg, h, w("model.norm.weight"))


def _norm(cfg: LlmConfig, x: Value, weight: Value) -> Value:
    if cfg.norm_offset:
        weight = weight + np.asarray(cfg.norm_offset, dtype=weight.dtype.np)
    return ops.rms_norm(x, weight, eps=cfg.rms_norm_eps)


def _linear(w: _Weights, name: str, x: Value, bias: bool, row: bool = False) -> Value:
    """x @ W^T + b. A row-parallel projection (`row`, split along its input features) gives each rank a
    partial sum: the ranks' partials are added (all_reduce) before the bias, which is added once."""
    y = ops.matmul(x, w(name + ".weight"), transpose_b=True)
    if row and w.n > 1:
        y = ops.all_reduce(y, w.n, max_size=w.most(y))
    return y + w(name + ".bias") if bias else y


def _gather_last(x: Value, w: "_Weights") -> Value:
    """The ranks' (b, t, k) slices of a last axis joined in rank order: (b, t, n * k)."""
    n = w.n
    if n == 1:
        return x
    b, t, k = x.shape
    parts = ops.reshape(ops.all_gather(x, n, max_size=w.most(x)), (n, b, t, k))
    return ops.reshape(ops.permute(parts, (1, 2, 0, 3)), (b, t, n * k))


def _attention(cfg, w, p, x, layer, cos, sin, positions, mask, cache, start, kv, t, max_seq_len):
    b = x.shape[0]
    hq, hkv, d = cfg.num_attention_heads // w.n, cfg.num_key_value_heads // w.n, cfg.head_dim
    q = ops.reshape(_linear(w, p + "q_proj", x, cfg.attention_bias), (b, t, hq, d))
    k = ops.reshape(_linear(w, p + "k_proj", x, cfg.attention_bias), (b, t, hkv, d))
    v = ops.reshape(_linear(w, p + "v_proj", x, cfg.attention_bias), (b, t, hkv, d))
    q = ops.rope(q, cos, sin, layout="bshd", position_ids=positions)
    k = ops.rope(k, cos, sin, layout="bshd", position_ids=positions)
    # Both writes, then both reads: a read of the cache that a later write could overtake makes IREE copy
    # the whole cache to keep it (the reads here feed attention, which the next layer's writes wait for).
    rows_of = []
    for j, new in ((2 * layer, k), (2 * layer + 1, v)):
        rows = ops.reshape(ops.permute(new, (1, 0, 2, 3)), (t, b * hkv * d))  # (t, b*hkv*d)
        base = j * max_seq_len
        at = base if isinstance(start, int) else f"{start}+{base}"
        cache[0] = ops.update_slice(cache[0], rows, at, axis=0)
        rows_of.append(base)
    read = []
    if t != "s":  # a prompt attends to its own keys: no need to read the cache back
        for base in rows_of:
            past = ops.reshape(ops.narrow(cache[0], 0, base, kv), (kv, b, hkv, d))
            read.append(ops.permute(past, (1, 2, 0, 3)))  # (b, hkv, kv, d)
    q = ops.permute(q, (0, 2, 1, 3))
    keys, values = read or (ops.permute(k, (0, 2, 1, 3)), ops.permute(v, (0, 2, 1, 3)))
    a = ops.sdpa(q, keys, values, mask=mask, scale=cfg.attention_scale)
    a = ops.reshape(ops.permute(a, (0, 2, 1, 3)), (b, t, hq * d))
    return _linear(w, p + "o_proj", a, cfg.o_proj_bias, row=True)


def _mlp(cfg: LlmConfig, w: _Weights, p: str, x: Value) -> Value:
    gate = _linear(w, p + "gate_proj", x, cfg.mlp_bias)
    act = ops.silu(gate) if cfg.hidden_act == "silu" else ops.gelu(gate, approximate="tanh")
    return _linear(w, p + "down_proj", act * _linear(w, p + "up_proj", x, cfg.mlp_bias), cfg.mlp_bias, row=True)


def _lm_head(cfg: LlmConfig, w: _Weights, h: Value) -> Value:
    name = EMBED if cfg.tie_word_embeddings and w.n == 1 else LM_HEAD  # a rank's tied head: its own slice
    return _gather_last(ops.cast(ops.matmul(h, w(name), transpose_b=True), "f32"), w)
