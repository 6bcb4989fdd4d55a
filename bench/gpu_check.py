"""GPU correctness check (NVIDIA): pieces of the llama block and sdpa forms against float64 references.

    python bench/gpu_check.py compile [--out out/gpu_check]   # CPU machine: .vmfb per case (cuda:sm_80),
                                                              # inputs and float64 references as .npy
    python bench/gpu_check.py run [--out out/gpu_check]       # GPU machine: iree-base-runtime only

On the GPU machine (the runtime wheel from .whl/, out/gpu_check carried along):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/iree_base_runtime-*.whl
    PYTHONPATH=/tmp/site:$PWD python3 bench/gpu_check.py run

Cases grow the llama block (hidden 1024, 8 heads, 2 kv heads, f16) one stage at a time with the sequence
fixed to 2048 (static), each with the default (hand-written kernels) and the generated implementations,
so that the smallest failing piece stands out; then sdpa with symbolic sequence lengths, causal and not.
The llama weights are rebuilt on the GPU machine from the example's seed (their sum is checked against
the one recorded here); inputs (seeded random, never zeros) and references travel as .npy, references
rounded to the case's dtype (f16: 2.4e-4 relative, far under the 1e-2 tolerance) and, for the llama
stages, kept at a fixed random eighth of the sequence positions (the files must fit one transfer).
IREE allocates the outputs, so they cannot be poisoned first: every module runs twice (a result that
moves is a race) and any NaN fails. Each case is also compiled with each IREE workaround of the lowering
turned off where that changes the module (<case>@nobarrier): those rows are expected to
be WRONG while IREE 3.13 is the compiler, and show what the workaround fixes. Exit status 1 when a case
without a tag is wrong. Last run: BENCHMARKS.md, "GPU correctness regressions".
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402

TARGET = "cuda:sm_80"
SEQ = 2048
LLAMA = models.parse(f"llama_h1024_s{SEQ}_f16")
HEADS, KV = models.LLAMA_HEADS[LLAMA.hidden]
HD = LLAMA.hidden // HEADS
TOL = {"f16": 1e-2, "f32": 1e-4}
# References keep a fixed random eighth of the sequence positions (the files travel to the GPU machine).
ROWS = np.sort(np.random.default_rng(7).choice(SEQ, SEQ // 8, replace=False))


def _rows(a: np.ndarray) -> np.ndarray:
    """The sampled sequence positions of an output (its first axis of size SEQ), or all of it."""
    axis = next((i for i, d in enumerate(a.shape) if d == SEQ), None)
    return a if axis is None else np.take(a, ROWS, axis=axis)


# ---- the llama block, one stage at a time ----------------------------------------------------------

def _stage_graph(stage: str, weights: dict):
    """A prefix (or part) of the llama block with static sequence SEQ; weights are inputs by name."""
    import rocmc
    from rocmc import ops
    g = rocmc.Graph(f"llama_{stage}")
    x = g.input("x", (1, SEQ, LLAMA.hidden), "f16")
    used = {}

    def w(name):
        if name not in used:
            used[name] = g.input(name, weights[name].shape, "f16")
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
        return ops.reshape(ops.permute(a, (0, 2, 1, 3)), (1, SEQ, LLAMA.hidden))

    def mlp(x1):
        h2 = ops.rms_norm(x1, w("mlp_norm"), eps=1e-5)
        gate = ops.silu(ops.matmul(h2, w("w_gate")))
        return x1 + ops.matmul(gate * ops.matmul(h2, w("w_up")), w("w_down"))

    if stage == "mm_tt":           # the same contraction from matmul's transpose flags, no permute
        out = ops.matmul(w("wv"), x, transpose_a=True, transpose_b=True)
    elif stage == "mm_v_t":          # (x wv)^T: IREE folds the transpose into the matmul (wrong)
        out = ops.permute(ops.matmul(x, w("wv")), (0, 2, 1))
    elif stage == "mm_k":
        out = ops.matmul(x, w("wk"))
    elif stage == "mm_v_perm":
        out = ops.permute(ops.reshape(ops.matmul(x, w("wv")), (1, SEQ, KV, HD)), (0, 2, 1, 3))
    elif stage == "mm_gate":
        out = ops.matmul(x, w("w_gate"))
    elif stage == "gate_down":
        out = ops.matmul(ops.silu(ops.matmul(x, w("w_gate"))), w("w_down"))
    elif stage == "norm_mm":
        out = ops.matmul(ops.rms_norm(x, w("attn_norm"), eps=1e-5), w("wq"))
    elif stage == "norm_mm_rope":
        h = ops.rms_norm(x, w("attn_norm"), eps=1e-5)
        out = ops.rope(ops.reshape(ops.matmul(h, w("wq")), (1, SEQ, HEADS, HD)), w("rope_cos"), w("rope_sin"),
                       layout="bshd")
    elif stage == "attn_norope":
        out = attention(rope=False)
    elif stage == "attn":
        out = attention(rope=True)
    elif stage == "attn_wo":
        out = x + ops.matmul(attention(rope=True), w("wo"))
    elif stage == "mlp":
        out = mlp(x)
    elif stage == "block":
        out = mlp(x + ops.matmul(attention(rope=True), w("wo")))
    else:
        raise ValueError(stage)
    g.output(out)
    return g, list(used)


STAGES = ["mm_tt", "mm_v_t", "mm_v_perm", "norm_mm", "norm_mm_rope", "attn_norope", "attn", "attn_wo", "mlp", "block"]
IMPLS = {"kernels": None, "generated": "generated"}


# ---- sdpa with symbolic sequence lengths -----------------------------------------------------------

# name -> (heads, kv heads, s, skv, head dim, dtype, causal, mask); s/skv: "s"/"t" symbolic, int static;
# mask: None, "bool" (keep/drop, (s, skv)) or "add" (additive, q's dtype, (s, skv)); a name ending in
# _qt/_kt/_vt takes that operand with its last two dims swapped and permutes it back in the graph (IREE
# folds the permute into the attention op's indexing maps).
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
    "gqa_static_causal_vt": (HEADS, KV, SEQ, SEQ, HD, "f16", True, None),   # the block's attention, v^T
    "mha_static_vt_f32": (4, 4, 256, 256, 64, "f32", False, None),
    "mha_static_kt": (4, 4, 256, 256, 64, "f16", False, None),
    "mha_static_qt": (4, 4, 256, 256, 64, "f16", False, None),
    "mha_dyn_vt": (4, 4, "s", "s", 64, "f16", False, None),
}


def _transposed(name: str) -> str:
    m = re.search(r"_([qkv])t(_|$)", name)
    return m.group(1) if m else ""
SDPA_SEQS = (37, 300)


def _sdpa_graph(name: str):
    import rocmc
    from rocmc import ops
    h, hkv, s, skv, d, dt, causal, mask = SDPA[name]
    g = rocmc.Graph(f"sdpa_{name}")
    tr = _transposed(name)

    def operand(n, shape):
        if n != tr:
            return g.input(n, shape, dt)
        return ops.permute(g.input(n, shape[:2] + shape[:1:-1], dt), (0, 1, 3, 2))
    q, k, v = operand("q", (1, h, s, d)), operand("k", (1, hkv, skv, d)), operand("v", (1, hkv, skv, d))
    m = g.input("mask", (s, skv), "bool" if mask == "bool" else dt) if mask else None
    g.output(ops.sdpa(q, k, v, mask=m, is_causal=causal))
    return g


def _sdpa_inputs(name: str, n: int, rng):
    h, hkv, s, skv, d, dt, _, mask = SDPA[name]
    s, skv = (n if isinstance(x, str) else x for x in (s, skv))
    npd = np.dtype(np.float16 if dt == "f16" else np.float32)
    shapes = [(1, h, s, d), (1, hkv, skv, d), (1, hkv, skv, d)]
    if _transposed(name):
        i = "qkv".index(_transposed(name))
        shapes[i] = shapes[i][:2] + shapes[i][:1:-1]
    ins = [rng.standard_normal(shape).astype(npd) for shape in shapes]
    keep = rng.random((s, skv)) < 0.7
    keep[:, 0] = True                       # every query keeps a key
    if mask == "bool":
        ins.append(keep)
    elif mask == "add":
        ins.append(np.where(keep, rng.standard_normal((s, skv)), -np.inf).astype(npd))
    return ins


# ---- contractions with symbolic sizes (padded to a tile multiple on GPUs) --------------------------

def _mm_graphs():
    """name -> (graph, fn(n, rng) -> inputs): symbolic M, N and K, odd sizes, with and without bias."""
    import rocmc
    from rocmc import ops

    def mk(name, shapes, dt, build):
        g = rocmc.Graph(f"mm_{name}")
        ins = [g.input(f"x{i}", sh, dt) for i, sh in enumerate(shapes)]
        g.output(build(*ins))

        def inputs(n, rng):
            npd = np.dtype(np.float16 if dt == "f16" else np.float32)
            return [rng.standard_normal(tuple(n if isinstance(d, str) else d for d in sh)).astype(npd) for sh in shapes]
        return g, inputs
    return {
        "rows_f16": mk("rows_f16", [(1, "s", 1024), (1024, 256)], "f16", ops.matmul),
        "linear_bias_f32": mk("linear_bias_f32", [(2, "s", 96), (80, 96), (80,)], "f32", ops.linear),
        "mnk_f16": mk("mnk_f16", [(2, "s", "t"), (2, "t", "s")], "f16", ops.matmul),
        "transposed_f16": mk("transposed_f16", [("t", "s"), (72, "t")], "f16",
                             lambda a, b: ops.matmul(a, b, transpose_a=True, transpose_b=True)),
    }


# ---- compile (CPU machine) -------------------------------------------------------------------------

def compile_all(out: Path, variants: dict | None = None) -> None:
    """Modules, inputs and references. `variants` maps a tag to a context manager that changes the
    emission: each case is also compiled under each tag (module <case>@<tag>) where that changes the
    module, so one run compares the emissions."""
    import rocmc
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2026)
    block = models.rocmc_graph(LLAMA)
    weights = dict(zip([n.attrs["name"] for n in block.nodes if n.op == "constant"], models.weight_arrays(block)))
    x = rng.standard_normal((1, SEQ, LLAMA.hidden)).astype(np.float16)
    np.save(out / "x.npy", x)
    manifest = {"weights_sum": {k: float(np.asarray(v, np.float64).sum()) for k, v in weights.items()},
                "cases": []}

    def modules(graph, name, impl=None) -> list[str]:
        """Compile `graph` as it is and under each variant that changes it; the module names."""
        base = rocmc.compile(graph, TARGET, impl=impl)
        base.save(out / f"{name}.vmfb")
        names = [name]
        for tag, ctxm in (variants or {}).items():
            with ctxm():
                art = rocmc.compile(graph, TARGET, impl=impl, cache=False)
            if art.vmfb != base.vmfb:
                art.save(out / f"{name}@{tag}.vmfb")
                names.append(f"{name}@{tag}")
        print(", ".join(names), flush=True)
        return names

    for stage in STAGES:
        g, used = _stage_graph(stage, weights)
        ref = rocmc.evaluate(g, x, *[weights[n] for n in used])
        np.save(out / f"ref_{stage}.npy", _rows(np.asarray(ref)).astype(np.float16))
        for impl_name, impl in IMPLS.items():
            for full in modules(g, f"{stage}.{impl_name}", impl):
                manifest["cases"].append({"name": full, "inputs": ["file:x"] + [f"weight:{n}" for n in used],
                                          "ref": f"ref_{stage}", "tol": TOL["f16"]})
    for name in SDPA:
        g = _sdpa_graph(name)
        seqs = SDPA_SEQS if any(isinstance(x, str) for x in SDPA[name][2:4]) else (0,)
        names = modules(g, f"sdpa_{name}")
        for n in seqs:
            ins = _sdpa_inputs(name, n, rng)
            key = f"sdpa_{name}_{n}"
            for i, a in enumerate(ins):
                np.save(out / f"{key}_in{i}.npy", a)
            np.save(out / f"ref_{key}.npy", _rows(np.asarray(rocmc.evaluate(g, *ins))).astype(ins[0].dtype))
            for full in names:
                manifest["cases"].append({"name": full, "label": f"{full} n={n}" if n else full,
                                          "inputs": [f"file:{key}_in{i}" for i in range(len(ins))],
                                          "ref": f"ref_{key}", "tol": TOL[SDPA[name][5]]})
    for name, (g, inputs) in _mm_graphs().items():
        names = modules(g, f"mm_{name}")
        for n in SDPA_SEQS:
            ins = inputs(n, rng)
            key = f"mm_{name}_{n}"
            for i, a in enumerate(ins):
                np.save(out / f"{key}_in{i}.npy", a)
            np.save(out / f"ref_{key}.npy", np.asarray(rocmc.evaluate(g, *ins)).astype(ins[0].dtype))
            for full in names:
                manifest["cases"].append({"name": full, "label": f"{full} n={n}",
                                          "inputs": [f"file:{key}_in{i}" for i in range(len(ins))],
                                          "ref": f"ref_{key}", "tol": TOL[str(ins[0].dtype).replace("float", "f")]})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


# ---- run (GPU machine) -----------------------------------------------------------------------------

def run_all(out: Path) -> int:
    import rocmc
    manifest = json.loads((out / "manifest.json").read_text())
    block = models.rocmc_graph(LLAMA)
    weights = dict(zip([n.attrs["name"] for n in block.nodes if n.op == "constant"], models.weight_arrays(block)))
    for k, s in manifest["weights_sum"].items():
        got = float(np.asarray(weights[k], np.float64).sum())
        if abs(got - s) > 1e-6 * max(1.0, abs(s)):
            raise SystemExit(f"weight {k} differs from the compile machine's ({got} vs {s}): numpy drift")
    rows, failed = [], 0
    for c in manifest["cases"]:
        args = [np.load(out / f"{a[5:]}.npy") if a.startswith("file:") else weights[a[7:]] for a in c["inputs"]]
        ref = np.load(out / f"{c['ref']}.npy").astype(np.float64)
        mod = rocmc.load(out / f"{c['name']}.vmfb")
        errs = []
        for _ in range(2):          # twice: a result that moves between calls is a race
            y = _rows(np.asarray(mod(*args), np.float64))
            errs.append(float(np.linalg.norm(y - ref) / np.linalg.norm(ref)) if np.isfinite(y).all() else float("nan"))
        nan = int(np.isnan(y).sum())
        ok = all(e <= c["tol"] for e in errs)       # NaN compares false: fails
        failed += not ok and c["name"].partition("@")[2] not in WORKAROUND_OFF
        rows.append((c.get("label", c["name"]), errs, nan, ok))
        del mod
    print(f"{'case':44s} {'rel err 1':>10s} {'rel err 2':>10s} {'NaNs':>9s}  result")
    for label, errs, nan, ok in rows:
        print(f"{label:44s} {errs[0]:10.2e} {errs[1]:10.2e} {nan:9d}  {'ok' if ok else 'WRONG'}")
    (out / "result.json").write_text(json.dumps([{"case": r[0], "rel_err": r[1], "nans": r[2], "ok": r[3]}
                                                 for r in rows], indent=1))
    print(f"{sum(r[3] for r in rows)}/{len(rows)} correct; {failed} wrong without a workaround turned off")
    return 1 if failed else 0


WORKAROUND_OFF = {"nobarrier"}     # tags whose modules are expected to be wrong


def _variants() -> dict:
    """The emission with the IREE workaround turned off (PIN_CONTRACTION_TRANSPOSES in
    rocmc/lowering/generated/shape.py), and with the
    GPU sdpa's run-time switch forced to the fused attention (DECOMPOSE_UP_TO_SCORES = 0: the branch
    long sequences take), which must be right."""
    import contextlib
    from rocmc.lowering.generated import attention, shape

    def switch(module, flag, value=False):
        @contextlib.contextmanager
        def changed():
            old = getattr(module, flag)
            setattr(module, flag, value)
            try:
                yield
            finally:
                setattr(module, flag, old)
        return changed
    return {"nobarrier": switch(shape, "PIN_CONTRACTION_TRANSPOSES"),
            "fused": switch(attention, "DECOMPOSE_UP_TO_SCORES", 0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["compile", "run"])
    ap.add_argument("--out", default="out/gpu_check")
    a = ap.parse_args()
    out = Path(a.out)
    if a.mode == "compile":
        compile_all(out, variants=_variants())
        return 0
    return run_all(out)


if __name__ == "__main__":
    sys.exit(main())
