"""Quantized checkpoints (GPTQ 4/8-bit with and without act-order, v1 and v2 zeros; AWQ 4-bit GEMM packing; float8
e4m3fn weights of Hugging Face's fp8 (block scales) and compressed-tensors (tensor, channel and block scales)) on the
CPU: each written here from the formats' public descriptions (not by rocmc), then loaded by rocmc.llm.load_hf; its
prompt logits and greedy tokens against transformers running the dequantized weights in float32. Also the bad
input: packed tensors of the wrong shape, zero or non-finite scales, g_idx that are not groups, tensor
parallelism."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import rocmc
from llm_models import PROMPT_IDS, greedy_with_gaps, hf_logits, llm_checkpoint, _load  # noqa: F401

safetensors = pytest.importorskip("safetensors.numpy")

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's GEMM packing: bits 4i of a word hold column 8c + AWQ_ORDER[i]


def _rtn(w: np.ndarray, bits: int, gs: int, g_idx: np.ndarray, sym: bool):
    """Round-to-nearest of w (N, K) by the groups g_idx gives each input feature: q (K, N), scales and zeros (G, N)."""
    n, k = w.shape
    groups = int(g_idx.max()) + 1
    top = (1 << bits) - 1
    scales, zeros = np.zeros((groups, n), np.float32), np.zeros((groups, n), np.int64)
    q = np.zeros((k, n), np.int64)
    for g in range(groups):
        cols = w[:, g_idx == g]
        lo, hi = np.minimum(cols.min(1), 0), np.maximum(cols.max(1), 0)
        if sym:
            s = np.maximum(np.abs(lo), np.abs(hi)) * 2 / top
            z = np.full(n, (top + 1) // 2)
        else:
            s = (hi - lo) / top
            z = np.clip(np.round(-lo / s), 0, top)
        s = s.astype(np.float16).astype(np.float32)  # as stored
        scales[g], zeros[g] = s, z
        q[g_idx == g] = np.clip(np.round(cols / s[:, None]) + z[:, None], 0, top).T
    return q, scales, zeros


def _pack_rows(v: np.ndarray, bits: int) -> np.ndarray:
    """GPTQ: values (R, C) packed along R into int32 words (R * bits / 32, C), value i of a word at bits * i."""
    per = 32 // bits
    out = np.zeros((v.shape[0] // per, v.shape[1]), np.uint32)
    for i in range(per):
        out |= (v[i::per].astype(np.uint32) & ((1 << bits) - 1)) << np.uint32(bits * i)
    return out.view(np.int32)


def _pack_awq(v: np.ndarray) -> np.ndarray:
    """AWQ: values (R, C) packed along C into int32 words (R, C / 8) in AWQ_ORDER."""
    out = np.zeros((v.shape[0], v.shape[1] // 8), np.uint32)
    for i in range(8):
        out |= v[:, AWQ_ORDER[i] :: 8].astype(np.uint32) << np.uint32(4 * i)
    return out.view(np.int32)


def _copies(src, dst, ref):
    """src copied to dst and ref; (dst's tensors and ref's, both the checkpoint's but for its linear layers' weights,
    [(weight name, module, weight as float32)] of those)."""
    shutil.copytree(src, dst)
    shutil.copytree(src, ref)
    out, deq, linears = {}, {}, []
    for name, t in safetensors.load_file(str(src / "model.safetensors")).items():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in LINEARS:
            linears.append((name, module, t.astype(np.float32)))
        else:
            out[name] = deq[name] = t
    return out, deq, linears


def quantize_checkpoint(src, dst, ref, method: str, bits: int, gs: int, act_order=False, sym=False, v2=False):
    """Write `src` quantized as `method` into `dst`, and the dequantized float32 weights into `ref` (a float
    checkpoint transformers loads)."""
    rng = np.random.default_rng(7)
    out, deq, linears = _copies(src, dst, ref)
    orders = {}
    for name, module, w in linears:
        n, k = w.shape
        size = k if gs == -1 else gs
        # GPTQ's act-order sorts a layer's input features by its Hessian's diagonal, which depends on the input
        # alone: q/k/v share one order, gate/up another.
        kind = module.rsplit(".", 1)[-1]
        shared = module.rsplit(".", 1)[0] + {"k_proj": ".q_proj", "v_proj": ".q_proj", "up_proj": ".gate_proj"}.get(
            kind, "." + kind
        )
        if shared not in orders:
            orders[shared] = rng.permutation(k) if act_order else np.arange(k)
        order = orders[shared]
        g_idx = np.empty(k, np.int64)
        g_idx[order] = np.arange(k) // size  # the act-order: groups of features taken in `order`
        q, s, z = _rtn(w, bits, size, g_idx, sym)
        deq[name] = np.ascontiguousarray(((q - z[g_idx]) * s[g_idx]).T, np.float32)
        if method == "gptq":
            stored = z if v2 else z - 1  # v1 stores each zero minus one
            out[module + ".qweight"] = _pack_rows(q, bits)
            out[module + ".qzeros"] = _pack_rows(stored.T, bits).T.copy()
            out[module + ".g_idx"] = g_idx.astype(np.int32)
        else:
            out[module + ".qweight"] = _pack_awq(q)
            out[module + ".qzeros"] = _pack_awq(z)
        out[module + ".scales"] = s.astype(np.float16)
    safetensors.save_file(out, str(dst / "model.safetensors"))
    safetensors.save_file(deq, str(ref / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    qc = {"quant_method": method, "bits": bits, "group_size": gs}
    if method == "gptq":
        qc.update(desc_act=act_order, sym=sym, checkpoint_format="gptq_v2" if v2 else "gptq")
    else:
        qc.update(version="gemm", zero_point=True)
    (dst / "config.json").write_text(json.dumps({**cfg, "quantization_config": qc}))
    return dst


def _save_safetensors(tensors: dict, path) -> None:
    """A .safetensors file by the format's description (an 8-byte little-endian header length, the JSON header of
    each tensor's dtype, shape and byte range, the bytes), float8 e4m3fn arrays as F8_E4M3 (safetensors' numpy API
    has no float8)."""
    import ml_dtypes

    names = {np.dtype(t): n for t, n in ((np.float32, "F32"), (np.float16, "F16"), (ml_dtypes.bfloat16, "BF16"),
             (ml_dtypes.float8_e4m3fn, "F8_E4M3"), (np.int64, "I64"), (np.int32, "I32"))}  # fmt: skip
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {
            "dtype": names[np.dtype(a.dtype)],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(b)],
        }
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def fp8_checkpoint(src, dst, ref, method: str, strategy: str, block=(16, 32), scale_dtype=np.float32, tamper=None):
    """Write `src` with float8 e4m3fn linear weights into `dst`: Hugging Face's `fp8` (block scales
    `weight_scale_inv`, float32) or compressed-tensors' float quantization (`weight_scale` a tensor, a row or a
    block); each scale the block's largest magnitude over 448 (e4m3fn's largest), the weight rounded to e4m3fn by
    ml_dtypes. The dequantized float32 weights go to `ref`; `tamper(tensors)` may change what `dst` stores."""
    import ml_dtypes

    out, deq, linears = _copies(src, dst, ref)
    bn, bk = {"tensor": (None, None), "channel": (1, None)}.get(strategy, block)
    for name, module, w in linears:
        n, k = w.shape
        rn, ck = bn or n, bk or k
        s = np.zeros((-(-n // rn), -(-k // ck)), np.float32)
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                s[i, j] = np.abs(w[i * rn : (i + 1) * rn, j * ck : (j + 1) * ck]).max() / 448
        s = s.astype(scale_dtype)
        wide = np.repeat(np.repeat(s.astype(np.float32), rn, 0)[:n], ck, 1)[:, :k]
        q = (w / wide).astype(ml_dtypes.float8_e4m3fn)
        deq[name] = q.astype(np.float32) * wide
        out[module + ".weight"] = q
        key = "weight_scale_inv" if method == "fp8" else "weight_scale"
        out[module + "." + key] = s.reshape(1) if strategy == "tensor" else s
    if tamper is not None:
        tamper(out)
    _save_safetensors(out, dst / "model.safetensors")
    safetensors.save_file(deq, str(ref / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    if method == "fp8":
        qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(block)}
    else:
        weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}
        if strategy == "block":
            weights["block_structure"] = list(block)
        qc = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                            "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}},
              "ignore": ["lm_head"]}  # fmt: skip
    (dst / "config.json").write_text(json.dumps({**cfg, "quantization_config": qc}))
    return dst


CASES = {
    "gptq4_g32": dict(method="gptq", bits=4, gs=32),
    "gptq4_act_order_sym": dict(method="gptq", bits=4, gs=16, act_order=True, sym=True),
    "gptq8_one_group_v2": dict(method="gptq", bits=8, gs=-1, v2=True),
    "awq4_g32": dict(method="awq", bits=4, gs=32),
    "fp8_block": dict(method="fp8", strategy="block"),
    "ct_fp8_channel": dict(method="compressed-tensors", strategy="channel"),
    "ct_fp8_tensor_bf16_scale": dict(method="compressed-tensors", strategy="tensor", scale_dtype="bf16"),
    "ct_fp8_block": dict(method="compressed-tensors", strategy="block", block=(32, 64)),
}


@pytest.fixture(scope="module")
def quantized(llm_checkpoint, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("quantized")
    made = {}

    def get(case):
        if case not in made:
            src = llm_checkpoint("llama3")
            kw = dict(CASES[case])
            if kw["method"] in ("fp8", "compressed-tensors"):
                import ml_dtypes

                kw["scale_dtype"] = ml_dtypes.bfloat16 if kw.get("scale_dtype") == "bf16" else np.float32
                path = fp8_checkpoint(src, root / case, root / (case + "-ref"), **kw)
            else:
                path = quantize_checkpoint(src, root / case, root / (case + "-ref"), **kw)
            made[case] = (path, root / (case + "-ref"))
        return made[case]

    return get


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_greedy_tokens_match_transformers_on_the_dequantized_weights(quantized, case, tmp_path):
    path, ref = quantized(case)
    lm = rocmc.llm.load_hf(path, "cpu", max_seq_len=64)
    assert lm.config.quant is not None
    want = hf_logits(ref, PROMPT_IDS)
    got = lm.logits(list(PROMPT_IDS))[0].astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-3
    tokens, gaps = greedy_with_gaps(_load(str(ref)), PROMPT_IDS, 12)
    mine = lm.generate([list(PROMPT_IDS)], 12, do_sample=False, stop_tokens=())[0]
    for t, w, gap in zip(mine, tokens, gaps):
        if gap < 1e-3:
            break  # a top-2 tie within rounding: the paths may part here
        assert t == w
    # The summary of a module compiled here also lists what each call issues, from IREE's stage dumps: one more
    # compile of the module, made for the first case; the others read the summary of their module saved and loaded,
    # which says the same of the quantized projections.
    described = lm if case == "gptq4_g32" else rocmc.llm.load(lm.artifact.save(tmp_path / "m.vmfb"), path)
    assert "quantized_linear" in described.summary()


def test_the_packed_projections_are_converted_once_into_quantized_linear_s_layout(quantized):
    """q/k/v and gate/up joined as for float checkpoints: one packed weight each, read as stored."""
    path, _ = quantized("gptq4_act_order_sym")
    cfg = rocmc.llm.config.load_config(path)
    plan = rocmc.llm.sharding.plan(cfg, 1)
    qkv = "model.layers.0.self_attn.qkv_proj"
    assert plan.shards[qkv + ".weight_q"].shape == (cfg.q_dim + 2 * cfg.kv_dim, cfg.hidden_size // 2)
    assert plan.shards[qkv + ".perm"].shape == (cfg.hidden_size,)
    assert "model.layers.0.self_attn.q_proj.qweight" not in plan.shards


def _rewrite(path, dst, name, fn):
    shutil.copytree(path, dst)
    tensors = safetensors.load_file(str(dst / "model.safetensors"))
    tensors[name] = fn(tensors[name])
    safetensors.save_file(tensors, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize(
    "case,tensor,fn,needle",
    [
        ("gptq4_g32", "model.layers.1.mlp.down_proj.scales", lambda s: s * 0, "down_proj.scales[0, 0] is 0"),
        (
            "awq4_g32",
            "model.layers.0.self_attn.q_proj.scales",
            lambda s: np.where(np.arange(s.size).reshape(s.shape) == 5, np.float16(np.inf), s),
            "q_proj.scales[0, 5] is inf",
        ),
        ("gptq4_g32", "model.layers.0.mlp.up_proj.qweight", lambda q: q[:-1], "up_proj.qweight"),
        (
            "gptq4_act_order_sym",
            "model.layers.0.mlp.gate_proj.g_idx",
            lambda g: np.zeros_like(g),
            "gate_proj.g_idx: its groups are not 4 groups of 16",
        ),
        (
            "gptq4_act_order_sym",
            "model.layers.0.self_attn.k_proj.g_idx",
            lambda g: g[::-1].copy(),
            "self_attn.v_proj: their g_idx orders differ",
        ),
    ],
)
def test_bad_packed_tensors_are_typed_errors_naming_the_tensor(quantized, tmp_path, case, tensor, fn, needle):
    path, _ = quantized(case)
    bad = _rewrite(path, tmp_path / "bad", tensor, fn)
    with pytest.raises(rocmc.InputError, match=needle.replace("[", r"\[")):
        rocmc.llm.load_hf(bad, "cpu", max_seq_len=64)


TP_SHAPE = dict(max_seq_len=16, max_batch=2)


@pytest.mark.parametrize(
    "case",
    [
        "gptq4_g32",
        "gptq8_one_group_v2",
        "awq4_g32",
        "fp8_block",
        "ct_fp8_channel",
        "ct_fp8_tensor_bf16_scale",
        "ct_fp8_block",
    ],
)
def test_each_rank_of_a_quantized_checkpoint_computes_the_unsharded_graph(quantized, case):
    """Tensor parallelism over 2 ranks (threads exchanging numpy arrays through rocmc.evaluate): q/k/v and gate/up
    split by output rows, o and down by input features (packed bytes, scales and zeros of whole groups; a single
    group held whole), each rank's partial sums all-reduced: the unsharded graph's logits and next token."""
    from rocmc.llm import sharding
    from rocmc.llm.config import load_config
    from rocmc.llm.model import CACHE, Shape, build, cache_shape
    from rocmc.llm.runtime import _SlotTable
    from rocmc.parameters import Parameters
    from rocmc.runtime import distributed

    path, _ = quantized(case)
    cfg, params = load_config(path), Parameters.open(path)
    shape = Shape(dtype="f32", **TP_SHAPE)
    (feeds,) = _SlotTable(shape, cfg).prefill(1, list(PROMPT_IDS))

    def run(degree, r, from_rank=None):
        plan = sharding.plan(cfg, degree)
        mine = plan.parameters(params, r if from_rank is None else from_rank)
        return rocmc.evaluate(
            build(cfg, shape, ["prefill"], plan)["prefill"],
            **feeds,
            parameters={n: mine.array(n) for n in plan.shards},
            state={CACHE: np.zeros(cache_shape(cfg, shape, degree))},
        )

    (want, _) = run(1, 0)
    plan = sharding.plan(cfg, 2)
    # each rank reads and converts its slices only: they are the slices of the whole conversion
    whole, mine = sharding.plan(cfg, 1).parameters(params), plan.parameters(params, 1)
    for name, s in plan.shards.items():
        if s.role == sharding.QUANTIZED_ROW and s.axis is not None:
            a = whole.array(name)
            np.testing.assert_array_equal(mine.array(name), a[:, a.shape[1] // 2 :])
    roles = {s.role for s in plan.shards.values()}
    assert {sharding.QUANTIZED_COLUMN, sharding.QUANTIZED_ROW} <= roles
    o = "model.layers.0.self_attn.o_proj."
    assert plan.shards[o + "weight_q"].axis == 1 and plan.shards["model.layers.0.mlp.gate_up_proj.weight_q"].axis == 0
    scale = np.abs(want[2]).max()
    for got, _ in distributed.simulate(2, lambda r: run(2, r)):
        np.testing.assert_array_equal(got[0], want[0])
        assert np.abs(got[2] - want[2]).max() <= 1e-9 * scale
    # the check can fail: both ranks holding rank 0's slices compute another model
    wrong = distributed.simulate(2, lambda r: run(2, r, from_rank=0))
    assert np.abs(wrong[0][0][2] - want[2]).max() > 1e-3 * scale


def test_a_quantized_checkpoint_in_two_processes_gives_the_tokens_of_one(quantized, tmp_path):
    """Compiled for the CPU and run as 2 ranks under `rocmc launch`, each converting and keeping its slices of the
    GPTQ checkpoint: the greedy, sampled and batched tokens of one process."""
    from tp_ranks import RANK_SCRIPT, launch, results

    path, _ = quantized("gptq4_g32")
    for degree in (1, 2):
        rocmc.llm.compile_hf(path, "cpu", tensor_parallel=degree, max_seq_len=32, max_batch=2).save(
            tmp_path / f"tp{degree}.vmfb"
        )
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    one = launch(1, str(script), str(tmp_path / "tp1.vmfb"), str(path), "1", str(tmp_path / "one"))
    two = launch(2, str(script), str(tmp_path / "tp2.vmfb"), str(path), "2", str(tmp_path / "two"))
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    (ref,), ranks = results(tmp_path / "one"), results(tmp_path / "two")
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert (r["greedy"], r["sampled"], r["batch"]) == (ref["greedy"], ref["sampled"], ref["batch"])
    assert "quantized, converted at load, row-split" in ranks[0]["summary"]


def test_tensor_parallel_refuses_what_does_not_split(quantized):
    path, _ = quantized("gptq4_act_order_sym")
    with pytest.raises(rocmc.InputError, match=r"tensor_parallel=2: .*o_proj is act-order .*run it on one GPU"):
        rocmc.llm.compile_hf(path, "cuda:sm_80", tensor_parallel=2)


def test_tensor_parallel_refuses_groups_the_ranks_cant_share(llm_checkpoint):  # noqa: F811
    from dataclasses import replace

    from rocmc.llm import sharding
    from rocmc.llm.config import load_config
    from rocmc.llm.quant import QuantConfig

    cfg = load_config(llm_checkpoint("llama"))  # 4 heads and 4 kv heads: 4 ranks divide them
    cfg = replace(cfg, quant=QuantConfig("gptq", 4, 32, False, 1, ()))
    assert sharding.plan(cfg, 2).degree == 2
    # groups of 32 over o_proj's 64 input features: 2 groups, which 4 ranks can't share out whole
    with pytest.raises(rocmc.InputError, match=r"tensor_parallel=4: .*o_proj's 64 input features .* parts of whole"):
        sharding.plan(cfg, 4)


@pytest.mark.parametrize("method,v2", [("gptq", True), ("gptq", False), ("awq", False)])
def test_zero_points_at_the_range_ends(rng, method, v2):
    """Zeros of 0 and 15 (GPTQ v1 stores 15 as 14; a v1 zero of 0 can't be stored: its writers wrap it), odd
    group counts, values 0 and 15: one layer converted, against the dequantization of the values it packs."""
    from rocmc.frontend.ops.quant import dequantize
    from rocmc.llm import quant

    n, k, gs = 16, 48, 16  # 3 groups
    q = rng.integers(0, 16, (k, n))
    q[0, 0], q[1, 0] = 0, 15
    z = rng.integers(0 if v2 or method == "awq" else 1, 16, (k // gs, n))
    z[0, :2] = (15, 0) if v2 or method == "awq" else (15, 1)
    s = rng.uniform(0.01, 0.1, (k // gs, n)).astype(np.float16)
    if method == "gptq":
        t = {"qweight": _pack_rows(q, 4), "qzeros": _pack_rows((z if v2 else z - 1).T, 4).T.copy(), "scales": s}
        t["g_idx"] = (np.arange(k) // gs).astype(np.int32)
        cfg = {"quant_method": "gptq", "bits": 4, "group_size": gs, "checkpoint_format": "gptq_v2" if v2 else "gptq"}
    else:
        t = {"qweight": _pack_awq(q), "qzeros": _pack_awq(z), "scales": s}
        cfg = {"quant_method": "awq", "bits": 4, "group_size": gs}
    out = quant.convert(quant.parse(cfg, "test"), [("layer", t)], "x", k, np.float32)
    got = dequantize(out["x.weight_q"], out["x.scales"], out["x.zeros"], 4)
    g_idx = np.arange(k) // gs
    want = ((q - z[g_idx]) * s[g_idx].astype(np.float64)).T
    np.testing.assert_array_equal(got, want)


def test_rocmc_generate_runs_a_quantized_checkpoint(quantized, tmp_path, capsys):
    """The command line as a user runs it (token ids: the tiny checkpoint has no tokenizer); a packed tensor of
    the wrong shape is caught by the checkpoint's check, before anything compiles, naming it."""
    from rocmc.cli import main

    path, ref = quantized("awq4_g32")
    assert main(["generate", str(path), "--ids", "-p", ", ".join(map(str, PROMPT_IDS)), "-n", "6"]) == 0
    out = [int(t) for t in capsys.readouterr().out.split()]
    tokens, gaps = greedy_with_gaps(_load(str(ref)), PROMPT_IDS, 6)
    ends = [i for i, t in enumerate(tokens) if t in (2, 3)]  # llama3's eos ids
    want = tokens[: ends[0] + 1] if ends else tokens
    assert out == want or min(gaps[: len(out)]) < 1e-3
    bad = _rewrite(path, tmp_path / "bad", "model.layers.1.mlp.down_proj.qzeros", lambda z: z[:, :-1].copy())
    assert main(["generate", str(bad), "--ids", "-p", "5, 6", "-n", "2"]) != 0
    assert "model.layers.1.mlp.down_proj.qzeros" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["cuda:sm_80", "gfx942"])
def test_on_the_gpus_each_projection_reads_its_packed_weight_in_its_own_product(quantized, target):
    """Compiled here (compile-only for ROCm). decode (one row): each of a layer's four projections is one
    linear_q kernel (the norm, the gate and the residual in it); prefill (symbolic rows): on CUDA each is one
    linear_qmm kernel (the packed bytes dequantized into its tiles); on ROCm, where that kernel is asked for,
    one generated dispatch whose product reads the packed weight by group (N x groups x group size), with no
    dispatch of its own unpacking a weight."""
    path, _ = quantized("gptq4_g32")
    art = rocmc.llm.compile_hf(path, target, max_seq_len=64, dtype="f16", max_batch=1)
    cfg = rocmc.llm.config.load_config(path)
    symbols = [k["symbol"] for k in art.metadata["kernels"] if k["symbol"].startswith("linear_")]
    # The lm_head (not quantized): decode's GEMV kernel, and on CUDA prefill's tiled one.
    head = sorted(s for s in symbols if s in ("linear_vec_f16", "linear_mm_f16"))
    assert head == (["linear_mm_f16", "linear_vec_f16"] if target.startswith("cuda") else ["linear_vec_f16"]), symbols
    symbols = [s for s in symbols if s not in head]
    tiled = [s for s in symbols if s == "linear_qmm_f16"]
    assert [s for s in symbols if s != "linear_qmm_f16"] == ["linear_q_f16"] * 4 * cfg.num_hidden_layers, symbols
    if target.startswith("cuda"):
        assert len(tiled) == 4 * cfg.num_hidden_layers, symbols  # prefill's
        return
    assert not tiled
    names = [d["name"] for d in art.dispatches() if d["name"].startswith("prefill")]
    products = {n.split("matmul_like_")[1].split("_")[0] for n in names if "matmul_like" in n}
    h, inter, gs = cfg.hidden_size, cfg.intermediate_size, 32
    want = {f"{cfg.q_dim + 2 * cfg.kv_dim}x{h // gs}x{gs}", f"{h}x{cfg.q_dim // gs}x{gs}",
            f"{2 * inter}x{h // gs}x{gs}", f"{h}x{inter // gs}x{gs}"}  # fmt: skip
    assert want <= {p.split("x", 1)[1] for p in products}, names  # (after the rows; the layers share them)
    assert not [n for n in names if "i4" in n or ("matmul" not in n and any(w in n for w in want))], names


def _read_gptq(directory, module):
    """A GPTQ v1 layer read back by the format's description: its dequantized (N, K) weight."""
    t = safetensors.load_file(str(directory / "model.safetensors"))
    qw, qz = t[module + ".qweight"].view(np.uint32), t[module + ".qzeros"].view(np.uint32)
    s, g_idx = t[module + ".scales"].astype(np.float64), t[module + ".g_idx"]
    bits = 32 * qw.shape[0] // g_idx.size
    per, mask = 32 // bits, (1 << bits) - 1
    q = np.stack([(qw >> (bits * i)) & mask for i in range(per)], axis=1).reshape(g_idx.size, -1)  # (K, N)
    z = np.stack([(qz >> (bits * i)) & mask for i in range(per)], axis=2).reshape(qz.shape[0], -1) + 1
    return ((q.astype(np.int64) - z.astype(np.int64)[g_idx]) * s[g_idx]).T


@pytest.mark.parametrize("bits,gs,asym", [(4, 32, False), (8, -1, True)])
def test_quantize_writes_a_gptq_checkpoint_that_round_trips(llm_checkpoint, tmp_path, capsys, bits, gs, asym):  # noqa: F811
    """`rocmc quantize`: its GPTQ tensors read back by the format's description are the float weights to within
    half a step; rocmc runs the written checkpoint as transformers runs those dequantized weights."""
    from rocmc.cli import main

    src = llm_checkpoint("llama3")
    dst = tmp_path / "q"
    args = ["quantize", str(src), str(dst), "--bits", str(bits), "--group-size", str(gs)] + ["--asym"] * asym
    assert main(args) == 0 and "wrote" in capsys.readouterr().out
    float_w = safetensors.load_file(str(src / "model.safetensors"))
    ref = tmp_path / "ref"
    shutil.copytree(src, ref)
    deq = dict(float_w)
    for name, w in float_w.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in LINEARS:
            deq[name] = np.ascontiguousarray(_read_gptq(dst, module), np.float32)
            step = (
                np.abs(w).max() * 2 / ((1 << bits) - 1) if not asym else (w.max() - min(w.min(), 0)) / ((1 << bits) - 1)
            )
            assert np.abs(deq[name] - w).max() <= step  # every value within a step of its group's grid
    safetensors.save_file(deq, str(ref / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "gptq" and cfg["bits"] == bits and cfg["checkpoint_format"] == "gptq"
    lm = rocmc.llm.load_hf(dst, "cpu", max_seq_len=64)
    want = hf_logits(ref, PROMPT_IDS)
    got = lm.logits(list(PROMPT_IDS))[0].astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-3
    with pytest.raises(rocmc.InputError, match="quantized already"):
        rocmc.llm.quantize(dst, tmp_path / "again")
    with pytest.raises(rocmc.InputError, match="exists and is not empty"):
        rocmc.llm.quantize(src, dst)


def _set(name, fn):
    def tamper(t):
        t[name] = fn(t[name])

    return tamper


@pytest.mark.parametrize(
    "tamper,needle",
    [
        (_set("model.layers.0.mlp.up_proj.weight", lambda w: _with_byte(w, 0x7F)), "up_proj.weight[0, 0] is NaN"),
        (
            _set("model.layers.1.self_attn.k_proj.weight_scale_inv", lambda s: s * 0),
            "k_proj.weight_scale_inv[0, 0] is 0",
        ),
        (_set("model.layers.0.mlp.down_proj.weight_scale_inv", lambda s: s[:-1]), "down_proj.weight_scale_inv"),
    ],
)
def test_bad_fp8_tensors_are_typed_errors_naming_the_tensor(llm_checkpoint, tmp_path, tamper, needle):  # noqa: F811
    path = fp8_checkpoint(llm_checkpoint("llama3"), tmp_path / "q", tmp_path / "ref", "fp8", "block", tamper=tamper)
    with pytest.raises((rocmc.InputError, rocmc.ModelImportError), match=needle.replace("[", r"\[")):
        rocmc.llm.load_hf(path, "cpu", max_seq_len=64)  # the module of case fp8_block (the compile cache's)


def _with_byte(w, byte):
    import ml_dtypes

    raw = np.ascontiguousarray(w).view(np.uint8).copy()
    raw[0, 0] = byte
    return raw.view(ml_dtypes.float8_e4m3fn)


@pytest.mark.parametrize(
    "qc,needle",
    [
        ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size"),
        ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, "format = 'pack-quantized'"),
        ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"targets":
          ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "group"}}}}, "strategy = 'group'"),
        ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"targets":
          ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "channel"}}}}, "8-bit float weights"),
        ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"targets":
          ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}, "ignore": ["re:.*"]},
         "'re:' patterns"),
    ],
)  # fmt: skip
def test_fp8_configs_rocmc_does_not_read_are_refused_naming_the_field(qc, needle):
    with pytest.raises(rocmc.ModelImportError, match=needle):
        rocmc.llm.quant.parse(qc, "config.json")


@pytest.mark.parametrize("target", ["cuda:sm_80", "gfx942"])
def test_fp8_weights_compile_for_the_gpus_with_the_decoding_in_the_product(quantized, target):
    """Compiled here (compile-only): float8 weights are decoded inside each projection's generated product (the
    kernels take integers, the summary says so); no dispatch of its own over a weight."""
    path, _ = quantized("fp8_block")
    art = rocmc.llm.compile_hf(path, target, max_seq_len=64, dtype="f16", max_batch=1)
    assert not [k for k in art.metadata["kernels"] if k["op"] == "quantized_linear"]
    assert "e4m3fn weights: the kernels take unsigned integers" in art.summary()
    cfg = rocmc.llm.config.load_config(path)
    names = [d["name"] for d in art.dispatches() if d["name"].startswith("decode")]
    h, inter = cfg.hidden_size, cfg.intermediate_size
    want = {f"{h}x{inter // 32}x32", f"{2 * inter}x{h // 32}x32"}  # down and gate/up, by groups of 32
    assert all(any(w in n for n in names) for w in want), names
