"""Regressions of IREE's GPU code generation on the llama block and sdpa, on an NVIDIA GPU.

The llama block (hidden 1024, 8 heads, 2 kv heads, f16, sequence 2048 static) grows one stage at a time,
with the hand-written kernels (default) and the generated implementations, so the smallest failing
piece stands out; then sdpa in many forms (symbolic query/key lengths, GQA, causal, boolean and additive
masks, f32, operands transposed in the graph that IREE folds into the attention op), through the GEMM
library (`libraries=["blas"]`) and IREE's own attention (the default), and that one also with its run-time switch
forced to the fused attention (the branch long sequences take); and contractions with symbolic M, N, K.
Outputs are allocated by IREE, so they cannot be poisoned: every module runs twice (a result that moves
between calls is a race) and a non-finite element fails. Weights are inputs, fresh random on each run."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import rocmc
from rocmc import ops

from gpu_harness import Case, ids, rel_l2

SEQ, HIDDEN, HEADS, KV = 2048, 1024, 8, 2
HD = HIDDEN // HEADS
FFN = int(8 * HIDDEN / 3 + 255) // 256 * 256
TOL = {"f16": 1e-2, "f32": 1e-4}
SEQS = (37, 300)  # run-time sizes of symbolic sequence lengths
IREE_ATTENTION = {"impl": {"sdpa": "generated"}}
WEIGHTS = {
    "attn_norm": (HIDDEN,),
    "wq": (HIDDEN, HIDDEN),
    "wk": (HIDDEN, KV * HD),
    "wv": (HIDDEN, KV * HD),
    "wo": (HIDDEN, HIDDEN),
    "mlp_norm": (HIDDEN,),
    "w_gate": (HIDDEN, FFN),
    "w_up": (HIDDEN, FFN),
    "w_down": (FFN, HIDDEN),
    "rope_cos": (SEQ, HD // 2),
    "rope_sin": (SEQ, HD // 2),
}


def _fused_attention():
    """IREE's attention with the run-time switch forced to the fused form (DECOMPOSE_UP_TO_SCORES = 0)."""
    from rocmc.lowering.codegen import attention

    @contextlib.contextmanager
    def forced():
        old, attention.DECOMPOSE_UP_TO_SCORES = attention.DECOMPOSE_UP_TO_SCORES, 0
        try:
            yield
        finally:
            attention.DECOMPOSE_UP_TO_SCORES = old

    return forced()


# ---- the llama block, one stage at a time ----------------------------------------------------------


def _stage_graph(stage: str) -> rocmc.Graph:
    """A prefix (or part) of the llama block with static sequence SEQ; the weights it uses are inputs."""
    g = rocmc.Graph(f"llama_{stage}")
    x = g.input("x", (1, SEQ, HIDDEN), "f16")
    used = {}

    def w(name):
        if name not in used:
            used[name] = g.input(name, WEIGHTS[name], "f16")
        return used[name]

    def attention(rope: bool):
        h = ops.rms_norm(x, w("attn_norm"), eps=1e-5)
        q = ops.reshape(ops.matmul(h, w("wq")), (1, SEQ, HEADS, HD))
        k = ops.reshape(ops.matmul(h, w("wk")), (1, SEQ, KV, HD))
        v = ops.reshape(ops.matmul(h, w("wv")), (1, SEQ, KV, HD))
        if rope:
            q, k = (ops.rope(t, w("rope_cos"), w("rope_sin"), layout="bshd") for t in (q, k))
        q, k, v = (ops.permute(t, (0, 2, 1, 3)) for t in (q, k, v))
        a = ops.sdpa(q, k, v, is_causal=True)
        return ops.reshape(ops.permute(a, (0, 2, 1, 3)), (1, SEQ, HIDDEN))

    def mlp(x1):
        h2 = ops.rms_norm(x1, w("mlp_norm"), eps=1e-5)
        return x1 + ops.matmul(ops.silu(ops.matmul(h2, w("w_gate"))) * ops.matmul(h2, w("w_up")), w("w_down"))

    stages = {
        "mm_tt": lambda: ops.matmul(w("wv"), x, transpose_a=True, transpose_b=True),
        "mm_v_t": lambda: ops.permute(ops.matmul(x, w("wv")), (0, 2, 1)),  # IREE folded the transpose (wrong)
        "mm_v_perm": lambda: ops.permute(ops.reshape(ops.matmul(x, w("wv")), (1, SEQ, KV, HD)), (0, 2, 1, 3)),
        "norm_mm": lambda: ops.matmul(ops.rms_norm(x, w("attn_norm"), eps=1e-5), w("wq")),
        "norm_mm_rope": lambda: ops.rope(
            ops.reshape(ops.matmul(ops.rms_norm(x, w("attn_norm"), eps=1e-5), w("wq")), (1, SEQ, HEADS, HD)),
            w("rope_cos"),
            w("rope_sin"),
            layout="bshd",
        ),
        "attn_norope": lambda: attention(rope=False),
        "attn": lambda: attention(rope=True),
        "attn_wo": lambda: x + ops.matmul(attention(rope=True), w("wo")),
        "mlp": lambda: mlp(x),
        "block": lambda: mlp(x + ops.matmul(attention(rope=True), w("wo"))),
    }
    g.output(stages[stage]())
    return g


def _weight(rng, name) -> np.ndarray:
    """A fresh random weight of the block's scale: norms near 1, projections 1/sqrt(fan-in), rope tables."""
    shape = WEIGHTS[name]
    if name.endswith("norm"):
        return rng.uniform(0.5, 1.5, shape).astype(np.float16)
    if name.startswith("rope"):
        angles = np.arange(SEQ)[:, None] * rng.uniform(1e-4, 1.0, shape[1])
        return (np.cos(angles) if name == "rope_cos" else np.sin(angles)).astype(np.float16)
    return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float16)


def _stage_case(stage: str, impl: str, fused=False) -> Case:
    def inputs(rng, _):
        names = [v.name for v in _stage_graph(stage).inputs[1:]]
        return [rng.standard_normal((1, SEQ, HIDDEN)).astype(np.float16)] + [_weight(rng, n) for n in names]

    return Case(
        f"llama.{stage}.{impl}{'.fused' if fused else ''}",
        lambda: _stage_graph(stage),
        inputs,
        TOL["f16"],
        rel_l2,
        compile={"impl": "generated"} if impl == "generated" else {},
        runs=2,
        variant=_fused_attention if fused else None,
    )


STAGES = ("mm_tt", "mm_v_t", "mm_v_perm", "norm_mm", "norm_mm_rope", "attn_norope", "attn", "attn_wo", "mlp", "block")
WITH_ATTENTION = ("attn_norope", "attn", "attn_wo", "block")


# ---- sdpa in many forms -------------------------------------------------------------------------------

# name -> (heads, kv heads, s, skv, head dim, dtype, causal, mask); s/skv: "s"/"t" symbolic, int static;
# mask: None, "bool" (keep/drop, (s, skv)) or "add" (additive, q's dtype); a name with _qt/_kt/_vt takes that
# operand with its last two dims swapped and permutes it back in the graph.
SDPA = {
    "gqa_dyn": (8, 2, "s", "s", 128, "f16", False, None),
    "gqa_dyn_causal": (8, 2, "s", "s", 128, "f16", True, None),
    "mha_dyn": (4, 4, "s", "s", 64, "f16", False, None),
    "mha_dyn_f32": (4, 4, "s", "s", 64, "f32", False, None),
    "dyn_q_static_kv": (4, 4, "s", 256, 64, "f16", False, None),
    "static_q_dyn_kv": (4, 4, 256, "t", 64, "f16", False, None),
    "mha_dyn_boolmask": (4, 4, "s", "s", 64, "f16", False, "bool"),
    "mha_dyn_addmask": (4, 4, "s", "s", 64, "f16", False, "add"),
    "mha_static": (4, 4, 256, 256, 64, "f16", False, None),
    "gqa_dyn_causal_vt": (HEADS, KV, "s", "s", HD, "f16", True, None),
    "mha_static_vt": (4, 4, 256, 256, 64, "f16", False, None),
    "gqa_static_causal_vt": (HEADS, KV, SEQ, SEQ, HD, "f16", True, None),  # the block's attention, v^T
    "mha_static_vt_f32": (4, 4, 256, 256, 64, "f32", False, None),
    "mha_static_kt": (4, 4, 256, 256, 64, "f16", False, None),
    "mha_static_qt": (4, 4, 256, 256, 64, "f16", False, None),
    "mha_dyn_vt": (4, 4, "s", "s", 64, "f16", False, None),
}


def _transposed(name: str) -> str:
    for t in "qkv":
        if f"_{t}t_" in name + "_":
            return t
    return ""


def _sdpa_shapes(name, n):
    """q, k, v shapes (as the graph takes them) and (s, skv), with symbolic lengths at n (None: kept)."""
    h, hkv, s, skv, d = SDPA[name][:5]
    s, skv = (n if isinstance(x, str) and n is not None else x for x in (s, skv))
    shapes = [(1, h, s, d), (1, hkv, skv, d), (1, hkv, skv, d)]
    return [sh[:2] + sh[:1:-1] if t == _transposed(name) else sh for t, sh in zip("qkv", shapes)], (s, skv)


def _sdpa_graph(name: str) -> rocmc.Graph:
    _, _, s, skv, _, dt, causal, mask = SDPA[name]
    g = rocmc.Graph(f"sdpa_{name}")
    shapes, _ = _sdpa_shapes(name, None)
    qkv = [g.input(t, sh, dt) for t, sh in zip("qkv", shapes)]
    qkv = [ops.permute(v, (0, 1, 3, 2)) if t == _transposed(name) else v for t, v in zip("qkv", qkv)]
    m = g.input("mask", (s, skv), "bool" if mask == "bool" else dt) if mask else None
    g.output(ops.sdpa(*qkv, mask=m, is_causal=causal))
    return g


def _sdpa_inputs(name):
    def inputs(rng, n):
        dt, mask = SDPA[name][5], SDPA[name][7]
        npd = rocmc.dtype(dt).np
        shapes, (s, skv) = _sdpa_shapes(name, n)
        ins = [rng.standard_normal(sh).astype(npd) for sh in shapes]
        keep = rng.random((s, skv)) < 0.7
        keep[:, 0] = True  # every query keeps a key
        if mask == "bool":
            ins.append(keep)
        elif mask == "add":
            ins.append(np.where(keep, rng.standard_normal((s, skv)), -np.inf).astype(npd))
        return ins

    return inputs


def _sdpa_case(name: str, impl: str) -> Case:
    symbolic = any(isinstance(x, str) for x in SDPA[name][2:4])
    return Case(
        f"sdpa.{name}.{impl}",
        lambda: _sdpa_graph(name),
        _sdpa_inputs(name),
        TOL[SDPA[name][5]],
        rel_l2,
        sizes=SEQS if symbolic else (None,),
        runs=2,
        compile=IREE_ATTENTION if impl != "library" else {"libraries": ["blas"]},
        variant=_fused_attention if impl == "iree_fused" else None,
    )


# ---- contractions with symbolic sizes (padded to a tile multiple on GPUs) --------------------------------

MM = {
    "rows_f16": ([(1, "s", 1024), (1024, 256)], "f16", ops.matmul),
    "linear_bias_f32": ([(2, "s", 96), (80, 96), (80,)], "f32", ops.linear),
    "mnk_f16": ([(2, "s", "t"), (2, "t", "s")], "f16", ops.matmul),
    "transposed_f16": (
        [("t", "s"), (72, "t")],
        "f16",
        lambda a, b: ops.matmul(a, b, transpose_a=True, transpose_b=True),
    ),
}


def _mm_case(name: str) -> Case:
    shapes, dt, build = MM[name]

    def graph():
        g = rocmc.Graph(f"mm_{name}")
        g.output(build(*[g.input(f"x{i}", sh, dt) for i, sh in enumerate(shapes)]))
        return g

    def inputs(rng, n):
        return [
            rng.standard_normal(tuple(n if isinstance(d, str) else d for d in sh)).astype(rocmc.dtype(dt).np)
            for sh in shapes
        ]

    return Case(f"mm.{name}", graph, inputs, TOL[dt], rel_l2, sizes=SEQS, runs=2)


CASES = (
    [_stage_case(s, impl) for s in STAGES for impl in ("kernels", "generated")]
    + [_stage_case(s, "generated", fused=True) for s in WITH_ATTENTION]
    + [_sdpa_case(n, impl) for n in SDPA for impl in ("library", "iree", "iree_fused")]
    + [_mm_case(n) for n in MM]
)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_llama_and_attention_regression(case, gpu):
    gpu(case)
