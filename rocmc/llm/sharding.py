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

A decode step therefore runs 2 all-reduces per layer and 2 all-gathers. The plan is recorded in the
artifact (`info.llm.tensor_parallel`) and shown by its summary; at load each rank reads its slices of the
checkpoint (rocmc.parameters.Parameters.shard): a split along axis 0 is a contiguous range of the file,
along axis 1 one host copy per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from ..errors import InputError, ModelImportError
from .config import LlmConfig, param_names

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")
EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


@dataclass(frozen=True)
class Shard:
    """One graph parameter of a rank: read from checkpoint tensor `source` (full shape `shape`), split
    into equal parts along `axis` (None: held whole)."""

    name: str
    source: str
    shape: tuple
    axis: int | None
    role: str

    def local(self, degree: int) -> tuple:
        if self.axis is None:
            return self.shape
        return tuple(d // degree if i == self.axis else d for i, d in enumerate(self.shape))


@dataclass(frozen=True)
class Plan:
    degree: int
    shards: dict  # graph parameter name -> Shard

    def to_json(self) -> dict:
        return {"degree": self.degree, "shards": {n: [s.source, s.axis] for n, s in self.shards.items()}}

    def describe(self) -> list[str]:
        """Summary lines: how many tensors each role splits, and where the ranks combine."""
        counts: dict = {}
        for s in self.shards.values():
            counts[s.role] = counts.get(s.role, 0) + 1
        n = self.degree
        return [f"tensor parallel: {n} ranks (one process per GPU), each holding 1/{n} of every split tensor:"] + [
            f"  {role:<46} {counts[role]} tensor(s)" for role in ROLES if role in counts
        ]


ROLES = (
    "column-split (axis 0): q/k/v/gate/up",
    "row-split (axis 1) then all_reduce: o/down",
    "bias added after the all_reduce (whole)",
    "embedding hidden-split (axis 1) then all_gather",
    "lm_head vocab-split (axis 0) then all_gather",
    "whole on every rank (norms)",
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
    shards = {}
    for name, shape in param_names(cfg):
        shards[name] = _shard(name, name, shape)
    if cfg.tie_word_embeddings:
        shards[LM_HEAD] = Shard(LM_HEAD, EMBED, (cfg.vocab_size, cfg.hidden_size), 0, ROLES[4])
    return Plan(degree, shards)


def _shard(name: str, source: str, shape: tuple) -> Shard:
    module = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
    if name == EMBED:
        return Shard(name, source, shape, 1, ROLES[3])
    if name == LM_HEAD:
        return Shard(name, source, shape, 0, ROLES[4])
    if module in COLUMN:
        return Shard(name, source, shape, 0, ROLES[0])
    if module in ROW:
        return (
            Shard(name, source, shape, 1, ROLES[1])
            if name.endswith(".weight")
            else Shard(name, source, shape, None, ROLES[2])
        )
    return Shard(name, source, shape, None, ROLES[5])


def from_json(meta, cfg: LlmConfig) -> Plan:
    """The plan an artifact records, checked against `cfg`'s (so a rank can't read slices another way)."""
    if not isinstance(meta, dict):
        raise ModelImportError("the artifact's tensor-parallel plan is malformed")
    want = plan(cfg, meta.get("degree"))
    if want.to_json() != {
        "degree": meta.get("degree"),
        "shards": {k: list(v) for k, v in meta.get("shards", {}).items()},
    }:
        raise ModelImportError(
            "the artifact's tensor-parallel plan is not the one of this checkpoint's config.json "
            "(was it compiled for another model?)"
        )
    return want
