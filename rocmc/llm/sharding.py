"""Tensor parallelism for the LLM graphs: which slice of each checkpoint tensor a rank holds, and where
the ranks' partial results are combined (Megatron-style, as vLLM and sharktank split a decoder).

Every rank runs the same program on its own slices:
- column-parallel (split along axis 0, the output features): q/k/v, gate and up projections and their
  biases. Each rank computes whole heads (hq/N query heads, hkv/N kv heads, a GQA group never split)
  and an intermediate/N slice of the MLP; its KV cache holds only its kv heads.
- row-parallel (split along axis 1, the input features): o and down projections. Each rank's product is
  a partial sum over its slice of the inner dim: an `all_reduce` adds the ranks' partials, then the bias
  (held whole by every rank) is added once.
- the embedding, split along the hidden dim: each rank looks up its H/N columns of every token and an
  `all_gather` joins them; the lm_head, split along the vocabulary: each rank scores V/N tokens and an
  `all_gather` joins the logits, so every rank holds the same logits and picks the same token (greedy, or
  drawn with one shared seed). A tied lm_head reads the embedding's tensor with the vocabulary split.
- norms: every rank holds them whole.
- quantized projections (rocmc.llm.quant): split as the float ones, each rank reading its share of the packed
  checkpoint tensors and converting it to quantized_linear's layout: q/k/v and gate/up by output rows (packed
  rows, scales, zeros), o and down by input features (the packed bytes, and the scales and zeros of their
  groups, whole groups on each rank; a single group held whole).
  GPTQ act-order is refused with several ranks: its permutation of the input features spans the whole row,
  which o and down split.

Projections that read the same input are joined at load into one graph parameter (a GEMV each instead of
three or two): `self_attn.qkv_proj` is q_proj, k_proj and v_proj concatenated along the output features
(their biases likewise), `mlp.gate_up_proj` gate_proj and up_proj. A joined tensor of a rank is its slices of
each part, concatenated, so a rank's q/k/v heads and MLP slice are the same as unjoined. The checkpoint is not
changed: the join is made in host memory when the model is loaded (Parameters.shard), and only the joined
tensor reaches the device.

A decode step therefore runs 2 all-reduces per layer and 2 all-gathers. The plan is recorded in the
artifact (`info.llm.tensor_parallel`) and shown by its summary; at load each rank reads its slices of the
checkpoint (rocmc.parameters.Parameters.shard): a split along axis 0 is a contiguous range of the file,
along axis 1 one host copy per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

import numpy as np

from ..errors import InputError, ModelImportError
from .config import LlmConfig, param_names

COLUMN = ("qkv_proj", "gate_up_proj")  # q/k/v and gate/up, always joined (JOINED)
ROW = ("o_proj", "down_proj")
EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"
# A joined projection's graph name (module under the layer) -> the checkpoint modules it concatenates.
JOINED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


@dataclass(frozen=True)
class Shard:
    """One graph parameter of a rank: read from the checkpoint tensors `sources` (several: each split,
    then the rank's slices concatenated along axis 0), of full shape `shape`, split into equal parts along
    `axis` (None: held whole)."""

    name: str
    sources: tuple
    shape: tuple
    axis: int | None
    role: str
    dtype: str | None = None  # None: the compute dtype (a quantized projection's packed weight: u8; perm: i64)

    def local(self, degree: int) -> tuple:
        if self.axis is None:
            return self.shape
        return tuple(d // degree if i == self.axis else d for i, d in enumerate(self.shape))


@dataclass(frozen=True)
class Plan:
    degree: int
    shards: dict  # graph parameter name -> Shard
    quant: object = None  # the config's QuantConfig: how the QUANTIZED shards are converted from the checkpoint

    def to_json(self) -> dict:
        return {"degree": self.degree, "shards": {n: [list(s.sources), s.axis] for n, s in self.shards.items()}}

    def sources(self) -> dict:
        """{graph parameter: (checkpoint tensors, axis)}, what Parameters.shard reads a rank's tensors by."""
        return {n: (s.sources, s.axis) for n, s in self.shards.items()}

    def parameters(self, checkpoint, rank: int = 0):
        """Rank `rank`'s graph parameters from the checkpoint's tensors (a rocmc.parameters.Parameters, or
        what Parameters.open takes): its slices, the joined projections joined, and quantized projections
        converted to quantized_linear's layout. A source that already
        holds every graph parameter under its own name (a rank's tensors made elsewhere) is served as it is."""
        from ..parameters import Parameters

        source = Parameters.open(checkpoint)
        if all(n in source for n in self.shards):
            return source
        plain = {n: (s.sources, s.axis) for n, s in self.shards.items() if s.role not in QUANTIZED_ROLES}
        served = source.shard(plain, rank, self.degree)
        converted = _converted(self, source, rank) if self.quant is not None else {}
        return Parameters.open([served, converted]) if converted else served

    def describe(self) -> list[str]:
        """Summary lines: how many tensors each role splits, and where the ranks combine."""
        counts: dict = {}
        for s in self.shards.values():
            counts[s.role] = counts.get(s.role, 0) + 1
        n = self.degree
        return [f"tensor parallel: {n} ranks (one process per GPU), each holding 1/{n} of every split tensor:"] + [
            f"  {role:<46} {counts[role]} tensor(s)" for role in ROLES if role in counts
        ]


QUANTIZED = "quantized (converted at load to quantized_linear's layout)"
QUANTIZED_COLUMN = "quantized, converted at load, column-split (axis 0)"
QUANTIZED_ROW = "quantized, converted at load, row-split (axis 1)"
QUANTIZED_ROLES = (QUANTIZED, QUANTIZED_COLUMN, QUANTIZED_ROW)
ROLES = (
    "column-split (axis 0): q/k/v, gate/up (joined)",
    "row-split (axis 1) then all_reduce: o/down",
    "bias added after the all_reduce (whole)",
    "embedding hidden-split (axis 1) then all_gather",
    "lm_head vocab-split (axis 0) then all_gather",
    "whole on every rank (norms)",
    *QUANTIZED_ROLES,
)


def plan(cfg: LlmConfig, degree: int) -> Plan:
    """The sharding of `cfg`'s model over `degree` ranks; InputError naming the sizes `degree` must divide."""
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise InputError(f"tensor_parallel={degree!r}: expected a number of GPUs >= 1")
    sizes = {
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
    }
    bad = {k: v for k, v in sizes.items() if v % degree}
    if bad:
        common = 0
        for v in sizes.values():
            common = gcd(common, v)
        ok = [d for d in (1, 2, 4, 8, 16) if common % d == 0]
        k, v = next(iter(bad.items()))
        raise InputError(
            f"tensor_parallel={degree} does not divide the model's {k} ({v}): every rank holds "
            f"whole heads and equal slices; this model splits over {', '.join(map(str, ok))} GPUs"
        )
    shapes = dict(param_names(cfg))
    quantized = _quantized_shards(cfg, degree)
    for shard in quantized.values():
        for module in shard.sources:
            for n in [n for n in shapes if n.startswith(module + ".") and not n.endswith(".bias")]:
                del shapes[n]  # read by the conversion, not served as they are
    parts = {
        f"{p}{m}.{kind}": f"{p}{joined}.{kind}"
        for p in layer_prefixes(cfg)
        for joined, members in JOINED.items()
        for m in members
        for kind in ("weight", "bias")
    }
    shards, joins = {}, {}
    for name, shape in shapes.items():
        if name in parts:
            joins.setdefault(parts[name], []).append(name)
        else:
            shards[name] = _shard(name, (name,), shape)
    for name, sources in joins.items():
        shape = (sum(shapes[s][0] for s in sources),) + shapes[sources[0]][1:]
        shards[name] = _shard(name, tuple(sources), shape)
    if cfg.tie_word_embeddings:
        shards[LM_HEAD] = Shard(LM_HEAD, (EMBED,), (cfg.vocab_size, cfg.hidden_size), 0, ROLES[4])
    shards.update(quantized)
    return Plan(degree, shards, cfg.quant)


def _quantized_shards(cfg: LlmConfig, degree: int) -> dict:
    """The graph parameters of the quantized projections (their sources: the checkpoint modules converted), split
    as the float ones over `degree` ranks: q/k/v and gate/up by output rows (each member's rows, as joined float
    weights are), o and down by input features (the packed bytes, and the scales and zeros of their groups; a single
    group's held whole)."""
    from . import quant
    from .config import linear_layers, quantized

    out = {}
    for p in layer_prefixes(cfg):
        layers = {m: (n, k) for m, n, k in linear_layers(cfg, p)}
        groups = [(p + j, tuple(p + m for m in members)) for j, members in JOINED.items()]
        groups += [(p + m, (p + m,)) for m in ("self_attn.o_proj", "mlp.down_proj")]
        for name, modules in groups:
            flags = {quantized(cfg, m) for m in modules}
            if flags == {False}:
                continue
            if len(flags) > 1:
                raise InputError(f"{', '.join(modules)}: some are quantized and some not; they must be alike")
            k = layers[modules[0]][1]
            for m in modules:
                quant.check_sizes(cfg.quant, m, layers[m][0], k)
            n = sum(layers[m][0] for m in modules)
            row = name.endswith(tuple(ROW))
            if degree > 1:
                for m in modules:
                    _check_quantized_split(cfg.quant, m, layers[m][0], k, row, degree)
            for t, shape, dtype in quant.graph_tensors(cfg.quant, name, n, k, None):
                if degree == 1:
                    out[t] = Shard(t, modules, shape, None, QUANTIZED, dtype)
                    continue
                kind = t.rsplit(".", 1)[1]
                if row:  # the input features' bytes, and their groups' scales and zeros (one group: whole)
                    axis = 1 if kind == "weight_q" or shape[1] > 1 else None
                else:  # the output rows; act-order's permutation of the (whole) input, whole
                    axis = None if kind == "perm" else 0
                out[t] = Shard(t, modules, shape, axis, QUANTIZED_ROW if row else QUANTIZED_COLUMN, dtype)
    return out


def _check_quantized_split(q, module: str, n: int, k: int, row: bool, degree: int) -> None:
    """InputError when a quantized layer (n outputs, k inputs) can't be split into `degree` equal parts of whole
    packed words, groups and scale blocks: by input features (`row`) or by output features."""
    if not row:
        part = n // degree
        # GPTQ's zeros and AWQ's weights pack 32 / bits output features a word (fp8 weights are a byte each).
        unit = 1 if q.format == "e4m3fn" else 32 // q.bits
        if part % unit:
            raise InputError(
                f"tensor_parallel={degree}: {module}'s {n} output features ({q.describe()}) don't split into "
                f"{degree} parts of whole {unit}-row units"
            )
        return
    if q.desc_act:
        raise InputError(
            f"tensor_parallel={degree}: {module} is act-order ({q.describe()}): its g_idx orders the input features "
            f"across the whole row, which a row-parallel projection splits over the ranks; run it on one GPU"
        )
    part = k // degree
    g = q.groups(k)
    words_ok = q.format == "e4m3fn" or q.method != "gptq" or part % (32 // q.bits) == 0  # GPTQ packs along k
    if not words_ok or (g > 1 and (g % degree or part % q.group_size)):
        raise InputError(
            f"tensor_parallel={degree}: {module}'s {k} input features ({q.describe()}) don't split into "
            f"{degree} parts of whole groups"
        )


def _converted(plan: Plan, source, rank: int = 0) -> dict:
    """{graph parameter: array} of every quantized projection, converted from the checkpoint's tensors; with
    several ranks, rank `rank`'s: each member of a joined projection read as its slices (quant.split_axes),
    converted, then the members joined."""
    from . import quant

    q, out = plan.quant, {}
    done = set()
    for shard in plan.shards.values():
        if shard.role not in QUANTIZED_ROLES or shard.sources in done:
            continue
        done.add(shard.sources)
        name = shard.name.rsplit(".", 1)[0]
        k = plan.shards[f"{name}.weight_q"].shape[1] * 8 // q.bits
        if plan.degree == 1:
            tensors = [(m, {kind: source.array(f"{m}.{kind}") for kind in q.kinds()}) for m in shard.sources]
            out.update(quant.convert(q, tensors, name, k, tensors[0][1][q.scale_name].dtype))
            continue
        # Each member's slices read from the checkpoint (only this rank's share of the packed tensors), converted,
        # then joined along the output rows.
        row = shard.role == QUANTIZED_ROW
        axes = quant.split_axes(q, k, row)
        parts = []
        for m in shard.sources:
            mine = source.shard({kind: (f"{m}.{kind}", axis) for kind, axis in axes.items()}, rank, plan.degree)
            t = {kind: mine.array(kind) for kind in axes}
            qm = q
            if row and axes.get("g_idx") == 0 and q.groups(k) > 1:  # this rank's groups count from 0
                t["g_idx"] = t["g_idx"] - rank * (q.groups(k) // plan.degree)
            if not row and q.format == "e4m3fn" and q.block_rows > 1:  # a rank's rows may begin inside a block
                part = t["weight"].shape[0]
                rows = slice(rank * part, (rank + 1) * part)
                qm, t[q.scale_name] = quant.rows_of(q, t[q.scale_name], part * plan.degree, rows)
            parts.append(quant.convert(qm, [(m, t)], name, k // plan.degree if row else k, t[q.scale_name].dtype))
        for t in parts[0]:
            out[t] = parts[0][t] if len(parts) == 1 else np.concatenate([p[t] for p in parts], axis=0)
    return out


def layer_prefixes(cfg: LlmConfig) -> list[str]:
    return [f"model.layers.{i}." for i in range(cfg.num_hidden_layers)]


def _shard(name: str, sources: tuple, shape: tuple) -> Shard:
    module = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
    if name == EMBED:
        return Shard(name, sources, shape, 1, ROLES[3])
    if name == LM_HEAD:
        return Shard(name, sources, shape, 0, ROLES[4])
    if module in COLUMN:
        return Shard(name, sources, shape, 0, ROLES[0])
    if module in ROW:
        return (
            Shard(name, sources, shape, 1, ROLES[1])
            if name.endswith(".weight")
            else Shard(name, sources, shape, None, ROLES[2])
        )
    return Shard(name, sources, shape, None, ROLES[5])


def from_json(meta, cfg: LlmConfig) -> Plan:
    """The plan an artifact records, checked against `cfg`'s (so a rank can't read slices another way)."""
    if not isinstance(meta, dict):
        raise ModelImportError("the artifact's tensor-parallel plan is malformed")
    want = plan(cfg, meta.get("degree"))
    if want.to_json() != {
        "degree": meta.get("degree"),
        "shards": {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in meta.get("shards", {}).items()},
    }:
        raise ModelImportError(
            "the artifact's tensor-parallel plan is not the one of this checkpoint's config.json "
            "(was it compiled for another model?)"
        )
    return want
