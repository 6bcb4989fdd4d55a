"""A Hugging Face causal LM as a rocmc program: `prefill`, `decode` and `sample` functions sharing the
checkpoint's weights (named parameters, so the module holds none of their bytes) and a KV cache that
stays on the device (one state holding every layer's keys and values).

Every parameter has the checkpoint's own tensor name and layout (q/k/v and gate/up joined at load): projections
stay (out, in), the layout IREE's decode GEMVs are fast with, and are `linear` (q/k/v), `fused_linear` with the
residual (o, down) and `gated_linear` (gate/up with act(gate) * up): on the GPUs a batched decode's projections are
the linear_rows kernel with those epilogues in the same dispatch.

The cache is one state, in slots (_Slots): each (layer, keys or values, slot, kv head) owns max_seq_len x
head_dim contiguous elements, so every row of a batch has its own length and position and attention reads
the cache as stored (no transpose, no copy). One state, not one per layer: IREE 3.13 stores same-typed states updated in
place in one buffer (see docs/architecture.md, "State").

decode is static: one token per slot at each slot's own position (an input); each layer's q/k/v projection
(q, k and v joined at load) is rotated and its keys and values stored in place by one rope_store_kv;
attention reads the whole slot with the positions past the row's own masked on the device, so a step is one
queue submission with no host wait, copy, fill or allocation inside it (tests/llm/test_call_structure.py).
prefill takes `rows` rows of `s` tokens each: a prompt, or a chunk of one, into each row's slot at its positions,
attending to the slot's first `kv` positions (earlier chunks and its own); the rows' tokens are one (rows x s)
row dimension for the projections.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ops
from ..frontend.graph import Graph, Value
from ..dtypes import dtype as _dtype
from . import sharding
from .config import LlmConfig, rope_tables
from .sharding import EMBED, LM_HEAD, Plan


@dataclass(frozen=True)
class Shape:
    """What a compiled model is sized for, besides its config."""

    max_seq_len: int
    max_batch: int
    dtype: str  # compute and cache dtype: "f32", "f16" or "bf16"
    sample_k: int = 64  # sampling draws from the sample_k most likely tokens (top_k <= sample_k)


CACHE = "kv_cache"


def cache_shape(cfg: LlmConfig, shape: "Shape", degree: int = 1) -> tuple[int, int, int, int]:
    """The KV cache of one rank (of `degree`, which holds 1/degree of the kv heads): see _Slots."""
    return (
        2 * cfg.num_hidden_layers * shape.max_batch,
        cfg.num_key_value_heads // degree,
        shape.max_seq_len,
        cfg.head_dim,
    )


def build(cfg: LlmConfig, shape: Shape, functions=None, plan: Plan | None = None) -> dict:
    """{function name: Graph} for `rocmc.compile` (every function of FUNCTIONS, or those named); with a
    tensor-parallel `plan` of degree > 1, the graphs of one rank (rocmc.llm.sharding)."""
    plan = plan if plan is not None else sharding.plan(cfg, 1)
    return {name: _BUILDERS[name](cfg, shape, plan) for name in functions or FUNCTIONS}


def _prefill(cfg: LlmConfig, shape: Shape, plan: Plan | None = None) -> Graph:
    """Prompts, or chunks of them, of `s` tokens in each of `rows` rows -> each row's next token (greedy), its last
    position's logits, and the logits of every position (f32, as transformers returns them; a caller that wants
    only the tokens leaves them on the device: the lm_head over every position is a few percent of a prefill).

    Row i's keys and values go to its cache slot (input `slot`, (rows,)) at `positions`; it attends to its slot's
    first `kv` positions (earlier chunks and its own), as `mask` (rows, 1, s, kv) says. A row shorter than `s`
    is padded by the caller (runtime._SlotTable.prefill_call: its last token repeated at its last position)."""
    g, w, h = _forward(cfg, shape, "prefill", plan)
    every = _lm_head(cfg, w, h)  # (rows, s, vocab)
    logits = ops.reshape(ops.gather(every, np.array([-1], dtype=np.int64), axis=1), ("rows", cfg.vocab_size))
    g.output(ops.argmax(logits, axis=-1), logits, every)
    return g


def _decode(cfg: LlmConfig, shape: Shape, plan: Plan | None = None) -> Graph:
    """One token per row, each row at its own position (its slot's length so far) -> the next token (greedy)
    and its logits. Every shape is static: the step attends to the whole slot, positions past a row's own
    masked off on the device (the host sends only tokens and positions)."""
    g, w, h = _forward(cfg, shape, "decode", plan)
    logits = ops.reshape(_lm_head(cfg, w, h), (shape.max_batch, cfg.vocab_size))
    g.output(ops.argmax(logits, axis=-1), logits)
    return g


def _sample(cfg: LlmConfig, shape: Shape, plan: Plan | None = None) -> Graph:
    """Logits (left on the device by decode) -> one token per row, drawn as transformers' sampling does:
    temperature, then top_k, then top_p (the smallest set of most likely tokens whose probability reaches
    it), then a draw (the Gumbel-max trick with counter-based noise from `key`, so a seed reproduces a
    generation on every target). Rows with temperature 0 take the most likely token, as decode's argmax
    chooses it (so a server's greedy rows can share a step with drawing ones). The candidates are the
    sample_k most likely tokens."""
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
    greedy = ops.argmax(logits, axis=-1)  # decode's own choice (the first of equal logits), not topk's
    g.output(ops.where(ops.greater(temperature, np.float32(0)), drawn, greedy))
    return g


_BUILDERS = {"prefill": _prefill, "decode": _decode, "sample": _sample}
FUNCTIONS = tuple(_BUILDERS)


class _Weights:
    """The checkpoint's tensors as graph parameters, by their own names (a rank's slices of them with a
    tensor-parallel plan: `n` ranks, each holding the plan's local shape)."""

    def __init__(self, g: Graph, cfg: LlmConfig, dtype: str, plan: Plan, positions: int = 1):
        self.g, self.dtype, self.plan = g, dtype, plan
        self.n = plan.degree
        self.shapes = {k: s.local(self.n) for k, s in plan.shards.items()}
        self.values: dict = {}
        self.positions = positions  # the most tokens per row a call takes
        self.quant = cfg.quant

    def most(self, x: Value) -> int:
        """The most elements of an activation (b, t, k) of a call: what a collective is padded to on a GPU
        when the rows are symbolic (one collective, not a loop of pieces). A prefill call takes at most
        `positions` tokens in all (its rows times its length)."""
        b, t, k = x.shape
        return (b * t if isinstance(b, int) and isinstance(t, int) else self.positions) * k

    def __call__(self, name: str) -> Value:
        if name not in self.values:  # a tied embedding is read twice, as one parameter
            dtype = self.plan.shards[name].dtype or self.dtype
            self.values[name] = self.g.parameter(name, self.shapes[name], dtype)
        return self.values[name]

    def quantized_product(self, x: Value, name: str, b: Value | None, **fused) -> Value:
        """x @ W^T + b of the quantized projection `name` (a quantized checkpoint's packed weight, the act-order
        permutation of x where it has one) as one quantized_linear, with its `fused` neighbours (norm, gate,
        residual: see the op)."""
        perm, z = (self(name + sfx) if name + sfx in self.shapes else None for sfx in (".perm", ".zeros"))
        q, s = self(name + ".weight_q"), self(name + ".scales")
        return ops.quantized_linear(x, q, s, z, b, perm, bits=self.quant.bits, format=self.quant.format, **fused)

    def quantized(self, name: str) -> bool:
        return name + ".weight_q" in self.shapes


def _forward(cfg: LlmConfig, shape: Shape, name: str, plan: Plan | None = None):
    """The decoder stack over the call's new tokens (decode: one per row of max_batch; prefill: `s` in each
    of `rows` rows): returns the graph, its weights and the final hidden states (b, t, hidden)."""
    dt = shape.dtype
    g = Graph(name)
    b, t = (shape.max_batch, 1) if name == "decode" else ("rows", "s")
    tokens = g.input("tokens", (b, t), "i64")
    positions = g.input("positions", (b, t), "i64")
    w = _Weights(g, cfg, dt, plan, positions=shape.max_seq_len if t == "s" else b * t)
    slots = _Slots(g, cfg, shape, w.n, positions)
    # The tables in the activations' dtype, as transformers casts them before rotating.
    cos, sin = (
        g.constant(n, np.asarray(a, dtype=np.float32).astype(_dtype(dt).np))
        for n, a in zip(("rope_cos", "rope_sin"), rope_tables(cfg, shape.max_seq_len))
    )
    h = _gather_last(ops.embedding(tokens, w(EMBED)), w)
    if cfg.embed_scale != 1.0:
        h = h * np.asarray(cfg.embed_scale, dtype=_dtype(dt).np)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        h = _attention(
            cfg, w, p + "self_attn.", _Normed(h, w(p + "input_layernorm.weight"), slots.decode), i, cos, sin, slots
        )
        h = _mlp(cfg, w, p + "mlp.", _Normed(h, w(p + "post_attention_layernorm.weight"), slots.decode))
    g.assign(CACHE, slots.cache)
    return g, w, _norm(cfg, h, w("model.norm.weight"))


class _Slots:
    """The KV cache of a call, in slots: the state is (2 * layers * max_batch, kv_heads, max_seq_len, head_dim),
    entry (2 * layer + kind) * max_batch + slot holding the keys (kind 0) or values (kind 1) of one slot, head by
    head, position by position, so a row of the batch lives apart from the others, each at its own length, and
    a layer's keys of every slot are one (max_batch, kv_heads, max_seq_len, head_dim) block: what attention
    reads, as stored (a reshape of a slice of the state made IREE copy the block out before attention).

    decode: slot r of the cache is batch row r; each row stores its one new position (`positions`) and
    attends to the slot's positions up to it (masked on the device: the whole slot is read, every shape
    static). prefill: `rows` rows, their slots an input (`slot`, shape (rows,)), storing `positions` and
    attending to each slot's first `kv` positions as `mask` (rows, 1, s, kv) says."""

    def __init__(self, g: Graph, cfg: LlmConfig, shape: Shape, n: int, positions: Value):
        self.g, self.cfg, self.shape = g, cfg, shape
        self.heads, self.kv_heads = cfg.num_attention_heads // n, cfg.num_key_value_heads // n
        self.cache = g.state(CACHE, cache_shape(cfg, shape, n), shape.dtype)
        self.positions = positions
        b, s = shape.max_batch, shape.max_seq_len
        self.decode = g.name == "decode"
        if self.decode:
            self.slots = None  # row r is slot r
            j = ops.reshape(ops.arange(g, 0, s), (1, s))
            keep = ops.less_equal(j, positions)  # (b, s): the slot's positions up to the new one
            self.masks = {"full_attention": ops.reshape(keep, (b, 1, 1, s))}
            if "sliding_attention" in cfg.layer_types:
                near = ops.less(positions - j, np.int64(cfg.sliding_window))
                self.masks["sliding_attention"] = ops.reshape(ops.logical_and(keep, near), (b, 1, 1, s))
        else:
            self.slots = g.input("slot", ("rows",), "i64")
            self.masks = {"full_attention": g.input("mask", ("rows", 1, "s", "kv"), "bool")}
            if "sliding_attention" in cfg.layer_types:
                self.masks["sliding_attention"] = g.input("window_mask", ("rows", 1, "s", "kv"), "bool")

    def entries(self, layer: int) -> tuple[int, int]:
        """The first entry of layer `layer`'s keys and of its values (slot 0's)."""
        b = self.shape.max_batch
        return 2 * layer * b, (2 * layer + 1) * b

    def store(self, layer: int, qkv: Value, cos: Value, sin: Value) -> Value:
        """RoPE of the call's queries and keys, `qkv` (b, t, heads + 2 kv_heads, d), and the store of its keys
        and values at their positions in layer `layer`'s entries: returns the rotated queries (b, t, heads, d)."""
        q, self.cache = ops.rope_store_kv(
            qkv,
            self.cache,
            cos,
            sin,
            self.positions,
            self.slots,
            heads=self.heads,
            kv_heads=self.kv_heads,
            entries=self.entries(layer),
            rotary_dim=2 * cos.shape[1],
        )
        return q

    def attend(self, layer: int, q: Value, mask: Value, scale: float) -> Value:
        """Attention of the call's queries q (b, heads, t, d) to layer `layer`'s keys and values. decode: every
        slot's block as stored (sdpa_cached: read in place, the mask keeping each row's positions); prefill:
        the row's slot, its first `kv` positions (sdpa_cached with the slot: read in place too)."""
        if self.decode:
            return ops.sdpa_cached(q, self.cache, self.entries(layer), mask=mask, scale=scale)
        return ops.sdpa_cached(
            q, self.cache, self.entries(layer), mask=mask, scale=scale, slots=self.slots, positions="kv"
        )


def _norm_weight(cfg: LlmConfig, weight: Value) -> Value:
    if cfg.norm_offset:
        weight = weight + np.asarray(cfg.norm_offset, dtype=weight.dtype.np)
    return weight


def _norm(cfg: LlmConfig, x: Value, weight: Value) -> Value:
    return ops.rms_norm(x, _norm_weight(cfg, weight), eps=cfg.rms_norm_eps)


class _Normed:
    """A layer's input h, to be RMS-normalized by `weight` before its projection. decode (`fused`): each
    projection is one rms_norm_linear (a few static rows: a kernel normalizes x on its way into the product, no
    dispatch of its own); prefill: rms_norm, then the projection (its rows are symbolic; the norm's own kernel)."""

    def __init__(self, h: Value, weight: Value, fused: bool):
        self.h, self.weight, self.fused = h, weight, fused

    def project(self, cfg: LlmConfig, w: "_Weights", name: str, bias: bool, gate: str = "none") -> Value:
        b = w(name + ".bias") if bias else None
        weight = _norm_weight(cfg, self.weight)
        if w.quantized(name):  # the norm, the product of the packed weight and the gate as one op
            return w.quantized_product(self.h, name, b, norm=weight, eps=cfg.rms_norm_eps, gate=gate)
        if self.fused:
            return ops.rms_norm_linear(self.h, weight, w(name + ".weight"), b, eps=cfg.rms_norm_eps, gate=gate)
        x = ops.rms_norm(self.h, weight, eps=cfg.rms_norm_eps)
        if gate == "none":
            return ops.linear(x, w(name + ".weight"), b)
        return ops.gated_linear(x, w(name + ".weight"), b, activation=gate)


def _linear(w: _Weights, name: str, x: Value, bias: bool, row: bool = False, residual: Value | None = None) -> Value:
    """x @ W^T + b (+ residual: the skip connection, added in the same op). A row-parallel projection (`row`,
    split along its input features) gives each rank a partial sum: the ranks' partials are added (all_reduce)
    before the bias, which is added once, and the residual."""
    b = w(name + ".bias") if bias else None
    if row and w.n > 1:
        y = w.quantized_product(x, name, None) if w.quantized(name) else ops.linear(x, w(name + ".weight"))
        y = ops.all_reduce(y, w.n, max_size=w.most(y))
        y = y if b is None else y + b
        return y if residual is None else residual + y
    if w.quantized(name):
        return w.quantized_product(x, name, b, residual=residual)
    if residual is None:
        return ops.linear(x, w(name + ".weight"), b)
    return ops.fused_linear(x, w(name + ".weight"), b, residual)


def _gather_last(x: Value, w: "_Weights") -> Value:
    """The ranks' (b, t, k) slices of a last axis joined in rank order: (b, t, n * k)."""
    n = w.n
    if n == 1:
        return x
    b, t, k = x.shape
    parts = ops.reshape(ops.all_gather(x, n, max_size=w.most(x)), (n, b, t, k))
    return ops.reshape(ops.permute(parts, (1, 2, 0, 3)), (b, t, n * k))


def _attention(cfg, w, p, x: _Normed, layer, cos, sin, slots: _Slots):
    b, t = x.h.shape[:2]
    hq, hkv, d = slots.heads, slots.kv_heads, cfg.head_dim
    # q, k and v as one projection (joined at load) of the normalized input, rotated and stored by one op.
    qkv = ops.reshape(x.project(cfg, w, p + "qkv_proj", cfg.attention_bias), (b, t, hq + 2 * hkv, d))
    q = slots.store(layer, qkv, cos, sin)
    a = slots.attend(layer, ops.permute(q, (0, 2, 1, 3)), slots.masks[cfg.layer_types[layer]], cfg.attention_scale)
    a = ops.reshape(ops.permute(a, (0, 2, 1, 3)), (b, t, hq * d))
    return _linear(w, p + "o_proj", a, cfg.o_proj_bias, row=True, residual=x.h)


def _mlp(cfg: LlmConfig, w: _Weights, p: str, x: _Normed) -> Value:
    # gate and up as one projection (joined at load: the gate's rows, then the up's) with act(gate) * up.
    act = "silu" if cfg.hidden_act == "silu" else "gelu_tanh"
    both = x.project(cfg, w, p + "gate_up_proj", cfg.mlp_bias, gate=act)
    return _linear(w, p + "down_proj", both, cfg.mlp_bias, row=True, residual=x.h)


def _lm_head(cfg: LlmConfig, w: _Weights, h: Value) -> Value:
    name = EMBED if cfg.tie_word_embeddings and w.n == 1 else LM_HEAD  # a rank's tied head: its own slice
    # linear (weight (vocab, hidden) as stored): the projections' kernels take it on a GPU (a prefill's tiled GEMM
    # over every position, decode's GEMV), where a matmul of a transposed weight was IREE's GEMM.
    return _gather_last(ops.cast(ops.linear(h, w(name)), "f32"), w)
