"""The hand-written kernels (rms_norm, layer_norm, rope, rope_store_kv, attention_decode, linear_rows) on an
NVIDIA GPU against float64: odd and tiny rows, very long rows, symbolic rows and columns, reductions over trailing
axes, no affine terms, shifted and outlier rows (the one-pass LayerNorm's cancellation), rope's half/interleaved
forms, layouts, partial rotation, batched and broadcast tables and position ids, and rope_store_kv's GQA ratios
(1, 4, 8), head dims (64, 128, 256 and odd ones), token counts (1, 17, 513, 4095), tables of another dtype and
slots given or implied. The norm, rope and linear_rows modules run on NaN inputs first, so an output element a
kernel fails to write keeps the NaN and fails the test; rope_store_kv's whole cache is compared (the places not
stored keep their values). linear_rows: 1 to 32 rows (odd counts, several matrix-instruction blocks), odd N and K
(element loads, partial tiles), K 11008, bias, residual, relu / gelu_tanh and gated silu / gelu_tanh; linear_mm:
symbolic rows at 1 to 513 (partial and several tiles), 33 and 300 static rows, the same odd sizes and epilogues;
linear_wgmma (cuda:sm_90 modules: H100 / H200 only): linear_mm's cases, K 4096 gated, K 100 (element loads);
linear_qwgmma: linear_qmm's cases and 8-bit gated groups of 64."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import rocmc
from rocmc import ops

from gpu_harness import Case, ids, rel_l2

DTYPES = ("f32", "f16", "bf16")
# Relative L2 error bound per storage type (outputs rounded once from f32).
TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.5e-2}


def _rand(rng, shape, dtype, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(rocmc.dtype(dtype).np)


def _with_first(x, first):
    """x with the first element of every row set to `first` (None: unchanged)."""
    if first is not None:
        x = x.copy()
        x.reshape(-1, x.shape[-1])[:, 0] = first
    return x


def _loose(case: Case, tol: float | None) -> Case:
    """The case with a wider tolerance (None: its own)."""
    return case if tol is None else replace(case, tol=tol)


def norm_case(name, op, dtype, shape, sym=None, axis=-1, weight=True, bias=True, shift=0.0, first=None) -> Case:
    """rms_norm / layer_norm over x.shape[axis:]; `sym` makes dim 0 symbolic ("all": every dim); `first`: the
    value of every row's first element (an outlier: the one-pass LayerNorm shifts by that element)."""
    xs = tuple(f"d{i}" for i in range(len(shape))) if sym == "all" else (sym,) + tuple(shape[1:]) if sym else shape
    ax = axis % len(shape)
    affine = [weight, op == "layer_norm" and bias]

    def graph():
        g = rocmc.Graph("n")
        x = g.input("x", xs, dtype)
        w = g.input("w", xs[ax:], dtype) if affine[0] else None
        b = g.input("b", xs[ax:], dtype) if affine[1] else None
        g.output(
            ops.layer_norm(x, w, b, eps=1e-5, axis=axis)
            if op == "layer_norm"
            else ops.rms_norm(x, w, eps=1e-6, axis=axis)
        )
        return g

    def inputs(rng, _):
        out = [_with_first(_rand(rng, shape, dtype, -2 + shift, 2 + shift), first)]
        if affine[0]:
            out.append(_rand(rng, shape[ax:], dtype, 0.5, 1.5))
        if affine[1]:
            out.append(_rand(rng, shape[ax:], dtype))
        return out

    return Case(name, graph, inputs, TOL[dtype], rel_l2, poison=True, calls="kernels")


def rope_case(
    name, dtype, b, h, t, d, interleaved=False, layout="bhsd", rot=None, table="shared", pos=None, T=None
) -> Case:
    """rope of x (b,h,t,d) or (b,t,h,d); table: "shared" (T, r), "batched" (b, t, r), "one" (1, t, r);
    pos: None, "int32" or "int64" position ids (b, t) into a (T, r) table."""
    rot = rot or d
    T = T or t + 3
    xs = (b, h, t, d) if layout == "bhsd" else (b, t, h, d)
    tshape = {"shared": (T, rot // 2), "batched": (b, t, rot // 2), "one": (1, t, rot // 2)}[table]

    def graph():
        g = rocmc.Graph("r")
        x = g.input("x", xs, dtype)
        c, s = g.input("cos", tshape, dtype), g.input("sin", tshape, dtype)
        p = g.input("pos", (b, t), pos) if pos else None
        g.output(ops.rope(x, c, s, interleaved=interleaved, layout=layout, rotary_dim=rot, position_ids=p))
        return g

    def inputs(rng, _):
        npt = rocmc.dtype(dtype).np
        angles = rng.uniform(0, 6.3, tshape)
        out = [_rand(rng, xs, dtype), np.cos(angles).astype(npt), np.sin(angles).astype(npt)]
        if pos:
            out.append(rng.integers(0, T, size=(b, t)).astype(pos))
        return out

    return Case(name, graph, inputs, TOL[dtype], rel_l2, poison=True, calls="kernels")


def store_case(
    name, dtype, b, t, hq, hkv, d, interleaved=False, rot=None, table=None, slots="i64", pos="int64", sym=False
) -> Case:
    """rope_store_kv of qkv (b, t, hq + 2 hkv, d) into a cache of 2 * (b + 1) entries (keys of slot s at entry s,
    values at b + 1 + s) of t + 7 positions; each row at its own distinct slot and positions (random); slots
    None: row i is slot i. The whole cache is compared: the places not stored must keep their values."""
    rot, table, n = rot or d, table or dtype, b + 1
    S = t + 7

    def graph():
        g = rocmc.Graph("kv")
        x = g.input("qkv", (b, "t" if sym else t, hq + 2 * hkv, d), dtype)
        cache = g.input("cache", (2 * n, hkv, S, d), dtype)
        c, s = g.input("cos", (S, rot // 2), table), g.input("sin", (S, rot // 2), table)
        p = g.input("pos", (b, "t" if sym else t), pos)
        sl = g.input("slots", (b,), slots) if slots else None
        g.output(
            *ops.rope_store_kv(
                x, cache, c, s, p, sl, heads=hq, kv_heads=hkv, entries=(0, n), interleaved=interleaved, rotary_dim=rot
            )
        )
        return g

    def inputs(rng, _):
        angles = rng.uniform(0, 6.3, (S, rot // 2))
        tab = rocmc.dtype(table).np
        out = [_rand(rng, (b, t, hq + 2 * hkv, d), dtype), _rand(rng, (2 * n, hkv, S, d), dtype)]
        out += [np.cos(angles).astype(tab), np.sin(angles).astype(tab)]
        out.append(np.stack([rng.permutation(S)[:t] for _ in range(b)]).astype(pos))
        if slots:
            out.append(rng.permutation(n)[:b].astype(rocmc.dtype(slots).np))
        return out

    return Case(name, graph, inputs, TOL[dtype], rel_l2, sizes=(t,) if sym else (None,), calls="kernels")


def _store_cases() -> list[Case]:
    return [
        store_case("store_f16_decode_gqa8", "f16", 4, 1, 32, 4, 128),
        store_case("store_f16_t17_mha", "f16", 1, 17, 4, 4, 64, table="f32", sym=True),
        store_case("store_bf16_t513_gqa4_d256", "bf16", 1, 513, 16, 4, 256, table="bf16"),
        store_case("store_f16_inter_implied", "f16", 3, 1, 8, 1, 64, interleaved=True, slots=None),
        store_case("store_f32_t4095", "f32", 1, 4095, 8, 2, 64, slots="i32", pos="int32", sym=True),
        store_case("store_f16_partial", "f16", 2, 5, 4, 2, 96, rot=32),
        store_case("store_f16_odd", "f16", 2, 3, 6, 3, 20, rot=6),
        store_case("store_bf16_inter_f16tab", "bf16", 2, 17, 8, 2, 128, interleaved=True, table="f16"),
        store_case("store_f32_inter_odd", "f32", 2, 3, 2, 1, 10, interleaved=True),
    ]


def attention_case(name, dtype, b, hq, hkv, d, S, keep="prefix", sq=1, cached=True, causal=False) -> Case:
    """Attention of sq queries per head (decode: 1) by the attention_decode kernel: sdpa_cached of a cache of
    2 * b + 1 entries (keys from entry 1, values from b + 1: the cache as stored) or plain sdpa. keep: each row's
    mask (b, 1, sq, S), "prefix" (a random length), "window" (the last 5 of a random length) or "heads" (a
    random mask per query head, (b, hq, sq, S)); None: no mask."""
    mshape = (b, hq if keep == "heads" else 1, sq, S)

    def graph():
        g = rocmc.Graph("att")
        q = g.input("q", (b, hq, sq, d), dtype)
        m = g.input("mask", mshape, "bool") if keep else None
        if cached:
            cache = g.input("cache", (2 * b + 1, hkv, S, d), dtype)
            g.output(ops.sdpa_cached(q, cache, (1, b + 1), mask=m, is_causal=causal))
        else:
            k, v = g.input("k", (b, hkv, S, d), dtype), g.input("v", (b, hkv, S, d), dtype)
            g.output(ops.sdpa(q, k, v, mask=m, is_causal=causal))
        return g

    def inputs(rng, _):
        out = [_rand(rng, (b, hq, sq, d), dtype)]
        if keep:
            j = np.arange(S)
            if keep == "heads":
                m = rng.random(mshape) < 0.5
                m[..., -1] = True
            else:
                length = rng.integers(1, S + 1, size=(b, 1, 1, 1))
                m = np.broadcast_to((j < length) & ((j >= length - 5) if keep == "window" else True), mshape)
            out.append(np.ascontiguousarray(m))
        kv = [(2 * b + 1, hkv, S, d)] if cached else [(b, hkv, S, d)] * 2
        return out + [_rand(rng, shape, dtype) for shape in kv]

    # Asked for by name: by default the kernel takes only batches of many workgroups (kernel/attention.py).
    impl = {"sdpa_cached" if cached else "sdpa": "kernel"}
    return Case(name, graph, inputs, TOL[dtype], rel_l2, compile={"impl": impl}, calls="kernels")


def prefill_case(name, dtype, hq, hkv, d, sizes, prefix=0, keep="causal", b=1, cached=False) -> Case:
    """Attention of a prompt's t queries per head to its t + prefix positions (a cached prefix first) by the
    attention_prefill kernel, t symbolic (one run per size): plain sdpa of k, v (b, hkv, "kv", d), or sdpa_cached of
    a cache of 2 b + 1 entries of a static size (sizes: one). keep: "causal" (is_causal, no mask), "mask" (the
    prefill's bool mask: j <= i + prefix), "window" (that and the last 100 positions), "heads" (a random mask per
    query head, each row keeping its last position)."""
    mshape = (b, hq if keep == "heads" else 1, "s", "kv")

    def graph():
        g = rocmc.Graph("prefill")
        t = sizes[0] if cached else "s"
        q = g.input("q", (b, hq, t, d), dtype)
        m = None
        if keep != "causal":
            m = g.input(
                "mask", tuple(t if x == "s" else (t + prefix if x == "kv" and cached else x) for x in mshape), "bool"
            )
        if cached:
            cache = g.input("cache", (2 * b + 1, hkv, t + prefix, d), dtype)
            g.output(ops.sdpa_cached(q, cache, (1, b + 1), mask=m, is_causal=keep == "causal"))
        else:
            k, v = g.input("k", (b, hkv, "kv", d), dtype), g.input("v", (b, hkv, "kv", d), dtype)
            g.output(ops.sdpa(q, k, v, mask=m, is_causal=keep == "causal"))
        return g

    def inputs(rng, n):
        t = sizes[0] if cached else n
        S = t + prefix
        out = [_rand(rng, (b, hq, t, d), dtype)]
        if keep != "causal":
            i, j = np.arange(t)[:, None], np.arange(S)[None, :]
            if keep == "heads":
                m = rng.random((b, hq, t, S)) < 0.5
                m[..., -1] = True
            else:
                m = np.broadcast_to(
                    (j <= i + prefix) & ((j > i + prefix - 100) if keep == "window" else True), (b, 1, t, S)
                )
            out.append(np.ascontiguousarray(m))
        kv = [(2 * b + 1, hkv, S, d)] if cached else [(b, hkv, S, d)] * 2
        return out + [_rand(rng, shape, dtype) for shape in kv]

    return Case(name, graph, inputs, TOL[dtype], rel_l2, sizes=(None,) if cached else sizes, calls="kernels")


def _prefill_cases() -> list[Case]:
    return [
        prefill_case("pf_f16_gqa4_d128_causal", "f16", 32, 8, 128, (1, 17, 513)),
        prefill_case("pf_bf16_gqa8_d128_prefix", "bf16", 32, 4, 128, (17, 300), prefix=211, keep="mask"),
        prefill_case("pf_f16_mha_d64_window", "f16", 8, 8, 64, (513,), keep="window"),
        prefill_case("pf_f16_gqa2_d256_heads", "f16", 4, 2, 256, (77,), keep="heads", b=2),
        prefill_case("pf_bf16_mha_d256_causal", "bf16", 2, 2, 256, (130,)),
        prefill_case("pf_f16_cached_prefix", "f16", 16, 4, 128, (65,), prefix=135, keep="mask", b=2, cached=True),
        prefill_case("pf_bf16_gqa4_d64_causal_4095", "bf16", 4, 1, 64, (4095,)),
    ]


def _attention_cases() -> list[Case]:
    return [
        attention_case("att_f16_gqa8_d128_s513", "f16", 4, 32, 4, 128, 513),
        attention_case("att_bf16_mha_d256_s17_window", "bf16", 2, 4, 4, 256, 17, keep="window"),
        attention_case("att_f16_gqa4_d64_s4095", "f16", 2, 8, 2, 64, 4095),
        attention_case("att_f32_mha_d128_s1_nomask", "f32", 3, 2, 2, 128, 1, keep=None),
        attention_case("att_f16_sdpa_causal_sq3", "f16", 2, 8, 2, 64, 50, keep=None, sq=3, cached=False, causal=True),
        attention_case("att_f16_sdpa_mask_per_head", "f16", 2, 4, 2, 128, 37, keep="heads", cached=False),
        attention_case("att_bf16_gqa4_d128_s1000", "bf16", 8, 16, 4, 128, 1000),
        # The cases above have fewer than 128 (batch row, kv head) pairs: their positions are split over workgroups
        # (attention_split, then attention_combine; a window of 5 leaves most splits empty). These have 128: one
        # workgroup a pair (attention_decode).
        attention_case("att_f16_mha_d128_s513_whole", "f16", 4, 32, 32, 128, 513),
        attention_case("att_bf16_gqa4_d64_s300_whole", "bf16", 32, 16, 4, 64, 300),
        attention_case("att_f16_gqa8_d128_s77_whole_window", "f16", 16, 64, 8, 128, 77, keep="window"),
        attention_case("att_f16_mha_d128_s4095_one_row", "f16", 1, 32, 32, 128, 4095),
    ]


def linear_case(name, dtype, lead, n, k, op="linear", act="none", bias=False, residual=False, sizes=(None,)) -> Case:
    """The linear kernels (linear_vec for 1 and 2 rows, linear_rows for 3 to 32, linear_mm for more or a symbolic
    number): linear, fused_linear (activation and residual), gated_linear (weight (2n, k)) or rms_norm_linear (gated
    when `act` is not "none") of x (*lead, k) against float64; a dim of `lead` named by a string is symbolic, run at
    each of `sizes`."""
    rows = 2 * n if op == "gated_linear" or (op == "rms_norm_linear" and act != "none") else n

    def graph():
        g = rocmc.Graph("lin")
        x = g.input("x", (*lead, k), dtype)
        nw = g.input("nw", (k,), dtype) if op == "rms_norm_linear" else None
        w = g.input("w", (rows, k), dtype)
        b = g.input("b", (rows,), dtype) if bias else None
        r = g.input("r", (*lead, n), dtype) if residual else None
        if op == "rms_norm_linear":
            g.output(ops.rms_norm_linear(x, nw, w, b, eps=1e-5, gate=act))
        elif op == "gated_linear":
            g.output(ops.gated_linear(x, w, b, activation=act))
        elif op == "fused_linear":
            g.output(ops.fused_linear(x, w, b, r, activation=act))
        else:
            g.output(ops.linear(x, w, b))
        return g

    def inputs(rng, size):
        scale = 1.0 / np.sqrt(k)  # outputs of order 1, where the activations bend
        dims = tuple(size if isinstance(d, str) else d for d in lead)
        out = [_rand(rng, (*dims, k), dtype)]
        if op == "rms_norm_linear":
            out.append(_rand(rng, (k,), dtype, 0.5, 1.5))
        out.append(_rand(rng, (rows, k), dtype, -2.0 * scale, 2.0 * scale))
        if bias:
            out.append(_rand(rng, (rows,), dtype))
        if residual:
            out.append(_rand(rng, (*dims, n), dtype))
        return out

    return Case(
        name,
        graph,
        inputs,
        TOL[dtype],
        rel_l2,
        sizes=sizes,
        compile={"impl": {op: "kernel"}},
        calls="kernels",
        poison=True,
    )


def _linear_cases() -> list[Case]:
    return [
        linear_case("lin_f16_1x4096x4096", "f16", (1, 1), 4096, 4096),
        linear_case("lin_bf16_8_gated_silu_bias", "bf16", (8, 1), 688, 4096, "gated_linear", "silu", bias=True),
        linear_case("lin_f16_32_residual", "f16", (32, 1), 4096, 1024, "fused_linear", residual=True),
        linear_case("lin_f16_13_odd", "f16", (13,), 37, 77, "fused_linear", "gelu_tanh", bias=True, residual=True),
        linear_case("lin_bf16_3_odd_relu", "bf16", (3, 1), 50, 100, "fused_linear", "relu"),
        linear_case("lin_f16_17_gated_gelu", "f16", (17, 1), 129, 264, "gated_linear", "gelu_tanh"),
        linear_case("lin_bf16_2_k11008", "bf16", (2, 1), 256, 11008, "fused_linear", residual=True),
        linear_case("lin_f16_1_norm_gated_silu_bias", "f16", (1, 1), 1376, 4096, "rms_norm_linear", "silu", bias=True),
        linear_case("lin_bf16_1_norm_k11008", "bf16", (1,), 300, 11008, "rms_norm_linear"),
        linear_case("lin_f16_2_norm_odd_gelu", "f16", (2, 1), 37, 77, "rms_norm_linear", "gelu_tanh"),
        linear_case("lin_bf16_1_odd_residual", "bf16", (1,), 45, 100, "fused_linear", "gelu_tanh", True, True),
        linear_case("lin_f16_8_norm_bias", "f16", (8, 1), 384, 4096, "rms_norm_linear", bias=True),
        linear_case("lin_bf16_32_norm_gated_gelu", "bf16", (32, 1), 129, 264, "rms_norm_linear", "gelu_tanh"),
        linear_case("lin_f16_5_norm_odd", "f16", (5,), 50, 77, "rms_norm_linear"),
        linear_case("lin_f16_19_norm_gated_silu", "f16", (19, 1), 688, 4096, "rms_norm_linear", "silu"),
        # linear_mm: symbolic rows (one, partial and several 128-row tiles), the 7B shapes' K, odd N and K (element
        # loads, partial tiles), 33 static rows (the first past linear_rows), the norm's kernel before it.
        linear_case(
            "mm_f16_sym_residual", "f16", (1, "s"), 4096, 4096, "fused_linear", residual=True, sizes=(1, 77, 513)
        ),
        linear_case(
            "mm_bf16_sym_gated_silu_bias", "bf16", ("s",), 688, 1024, "gated_linear", "silu", True, sizes=(33, 200)
        ),
        linear_case("mm_f16_300_odd", "f16", (300,), 37, 77, "fused_linear", "gelu_tanh", bias=True, residual=True),
        linear_case("mm_bf16_sym_k11008", "bf16", (1, "s"), 256, 11008, "fused_linear", residual=True, sizes=(129,)),
        linear_case(
            "mm_f16_sym_norm_gated_gelu", "f16", ("s",), 129, 264, "rms_norm_linear", "gelu_tanh", sizes=(40, 257)
        ),
        linear_case("mm_f16_33_relu", "f16", (33,), 130, 64, "fused_linear", "relu"),
        linear_case("mm_bf16_sym_lm_head", "bf16", (1, "s"), 32000, 512, sizes=(17,)),
    ]


def _wgmma_cases() -> list[Case]:
    """linear_mm's cases compiled for cuda:sm_90, where linear_wgmma takes them (Hopper's warpgroup instructions;
    the sm_90a PTX needs an H100 / H200), and the 7B prefill's K with an odd N at 2 tiles and a partial one."""
    cases = [replace(c, name=c.name.replace("mm_", "wgmma_", 1), target="cuda:sm_90") for c in _linear_cases()]
    quantized = [
        replace(c, name="qwg" + c.name[1:], target="cuda:sm_90") for c in _quantized_cases() if c.name[2] == "m"
    ]
    cases += quantized + [
        replace(
            quantized_case("q8wg_f16_rows_gated_g64", "f16", ("t",), 2 * 100, 320, 8, 5, gate="silu", sizes=(200,)),
            target="cuda:sm_90",
        )
    ]
    return [c for c in cases if c.name.startswith(("wgmma_", "qwg", "q8wg"))] + [
        replace(
            linear_case(
                "wgmma_f16_sym_gate_up_k4096", "f16", (1, "s"), 1000, 4096, "gated_linear", "silu", sizes=(300,)
            ),
            target="cuda:sm_90",
        ),
        replace(
            linear_case("wgmma_bf16_130_k100_odd", "bf16", (130,), 77, 100, "fused_linear", residual=True),
            target="cuda:sm_90",
        ),
    ]


def quantized_case(
    name,
    dtype,
    lead,
    n,
    k,
    bits,
    groups,
    perm=False,
    bias=False,
    sizes=(None,),
    norm=False,
    gate="none",
    residual=False,
    fmt="uint",
    fraction=False,
) -> Case:
    """quantized_linear of x (*lead, k) against float64: packed random integers, scales, zeros at any integer of
    the range; with `norm` (RMSNorm first), `gate` (n rows: the gate's n / 2, then the up's) or `residual`. A few
    static rows take the linear_q kernel; the rest is generated code (the dequantization fused into the
    product's dispatch). fmt "e4m3fn": the bytes are float8 values (NaN codes left out), no zeros, f32 scales
    (as fp8 checkpoints load). `fraction`: zeros between the integers (within 0.4 of one)."""
    n_out = n // 2 if gate != "none" else n
    fp8 = fmt == "e4m3fn"

    def graph():
        g = rocmc.Graph("qlin")
        x = g.input("x", (*lead, k), dtype)
        w, s, z = (
            g.input("w", (n, k * bits // 8), "u8"),
            g.input("s", (n, groups), "f32" if fp8 else dtype),
            None if fp8 else g.input("z", (n, groups), dtype),
        )
        b = g.input("b", (n,), dtype) if bias else None
        p = g.input("p", (k,), "i64") if perm else None
        r = g.input("r", (*lead, n_out), dtype) if residual else None
        nw = g.input("nw", (k,), dtype) if norm else None
        g.output(
            ops.quantized_linear(x, w, s, z, b, p, bits=bits, norm=nw, eps=1e-5, gate=gate, residual=r, format=fmt)
        )
        return g

    def inputs(rng, t):
        shape = tuple(t if isinstance(d, str) else d for d in lead)
        step = 2.0 / ((1 << bits) * np.sqrt(k))  # outputs of order 1
        q = rng.integers(0, 256, (n, k * bits // 8)).astype(np.uint8)
        if fp8:
            q[(q & 0x7F) == 0x7F] = 0x38  # NaN codes -> 1.0
            step = 2.0 / (100.0 * np.sqrt(k))  # float8 values reach 448
        out = [
            _rand(rng, (*shape, k), dtype),
            q,
            _rand(rng, (n, groups), "f32" if fp8 else dtype, 0.5 * step, 1.5 * step),
        ]
        if not fp8:
            z = rng.integers(0, 1 << bits, (n, groups)) + (rng.uniform(-0.4, 0.4, (n, groups)) if fraction else 0)
            out += [z.astype(rocmc.dtype(dtype).np)]
        if bias:
            out.append(_rand(rng, (n,), dtype))
        if perm:
            out.append(rng.permutation(k).astype(np.int64))
        if residual:
            out.append(_rand(rng, (*shape, n_out), dtype))
        if norm:
            out.append(_rand(rng, (k,), dtype, 0.5, 1.5))
        return out

    return Case(name, graph, inputs, TOL[dtype], rel_l2, sizes=sizes, poison=True)


def _quantized_cases() -> list[Case]:
    return [
        quantized_case("q4_f16_1x4096x4096_g128", "f16", (1, 1), 4096, 4096, 4, 32),
        # fp8 (e4m3fn) weights: generated code, one row and symbolic rows, block scales.
        quantized_case("fp8_bf16_1_block", "bf16", (1, 1), 512, 1024, 8, 8, fmt="e4m3fn", norm=True, gate="silu"),
        quantized_case("fp8_f16_rows", "f16", ("t",), 300, 256, 8, 1, fmt="e4m3fn", bias=True, sizes=(1, 45)),
        quantized_case("q4_f16_rows_perm_odd", "f16", ("t", 1), 37, 96, 4, 3, perm=True, bias=True, sizes=(1, 7, 33)),
        quantized_case("q8_bf16_one_group", "bf16", (3, 1), 300, 1000, 8, 1, bias=True),
        quantized_case("q4_bf16_8_k11008", "bf16", (8, 1), 256, 11008, 4, 86),
        # The linear_q kernel (1 or 2 static rows): its norm, gate, residual, bias and act-order forms.
        quantized_case("q4k_f16_1_norm_silu", "f16", (1, 1), 600, 4096, 4, 32, norm=True, gate="silu", bias=True),
        quantized_case("q4k_f16_2_residual_odd", "f16", (2, 1), 37, 96, 4, 3, bias=True, residual=True),
        quantized_case("q4k_f16_2_fraction", "f16", (2, 1), 300, 1024, 4, 8, bias=True, fraction=True),
        quantized_case("q4k_bf16_1_fraction_norm", "bf16", (1, 1), 96, 512, 4, 4, norm=True, fraction=True),
        quantized_case("q4k_f16_1_down", "f16", (1, 1), 4096, 11008, 4, 86, residual=True),
        quantized_case("q8k_bf16_1_norm", "bf16", (1, 1), 129, 1008, 8, 7, norm=True),
        quantized_case("q8k_f16_2_one_group", "f16", (2,), 300, 4096, 8, 1),
        quantized_case("q4k_f16_1_perm_norm", "f16", (1, 1), 64, 256, 4, 2, perm=True, norm=True),
        quantized_case("q8k_bf16_2_gelu", "bf16", (2,), 100, 11008, 8, 86, norm=True, gate="gelu_tanh"),
        # two rows of 11008 4-bit values: x staged in two passes
        quantized_case("q4k_bf16_2_passes_gated", "bf16", (2, 1), 100, 11008, 4, 86, norm=True, gate="silu"),
        # linear_qm's row blocks (NVIDIA: 8 rows a block; AMD: 16).
        quantized_case("q4k_f16_8_norm_gated", "f16", (8, 1), 2 * 688, 4096, 4, 32, norm=True, gate="silu", bias=True),
        quantized_case("q4k_f16_17_residual", "f16", (17,), 4096, 11008, 4, 86, residual=True),
        quantized_case("q8k_bf16_32_odd", "bf16", (32, 1), 77, 1008, 8, 7, bias=True),
        quantized_case("q4k_bf16_5_perm", "bf16", (5,), 48, 384, 4, 3, perm=True, norm=True),
        # linear_qmm (a prefill's rows, symbolic or more than 32): 128 x 128 tiles, edges in both, gate, norm first.
        quantized_case(
            "q4m_f16_rows_norm_gated",
            "f16",
            ("t",),
            2 * 688,
            4096,
            4,
            32,
            norm=True,
            gate="silu",
            bias=True,
            sizes=(77, 300),
        ),
        quantized_case("q8m_bf16_rows_residual", "bf16", ("t", 1), 300, 1024, 8, 8, residual=True, sizes=(1, 129)),
        quantized_case("q4m_bf16_rows_fraction", "bf16", ("t",), 37, 256, 4, 2, fraction=True, sizes=(130,)),
        quantized_case("q4m_f16_rows_down", "f16", ("t",), 4096, 11008, 4, 86, residual=True, sizes=(64, 257)),
        quantized_case("q8m_f16_40_perm", "f16", (40,), 200, 512, 8, 4, perm=True, bias=True),
    ]


def _cases() -> list[Case]:
    out = []
    for dt in DTYPES:
        for op in ("rms_norm", "layer_norm"):
            out += [
                norm_case(f"{op}_{dt}_4096", op, dt, (6, 4096), sym="n"),
                norm_case(f"{op}_{dt}_odd", op, dt, (7, 1001)),
                norm_case(f"{op}_{dt}_1x1", op, dt, (1, 1)),
                norm_case(f"{op}_{dt}_short", op, dt, (300, 24), sym="n"),
                norm_case(f"{op}_{dt}_20000", op, dt, (3, 20000)),
                norm_case(f"{op}_{dt}_axis1", op, dt, (2, 3, 40), axis=1, weight=dt != "f16"),
                norm_case(f"{op}_{dt}_dyncols", op, dt, (5, 3000), sym="all"),
                norm_case(f"{op}_{dt}_noaffine", op, dt, (5, 777), weight=False, bias=False),
            ]
        out += [
            # f32 rows centred on 300: each element keeps 8 fewer bits of its deviation from the mean than an
            # unshifted row (300 / 1.15), so the kernel's f32 error is ~1e-5 (1.002e-5 on a 2026-11-27 seed)
            _loose(
                norm_case(f"layer_norm_{dt}_shifted", "layer_norm", dt, (4, 2048), shift=300.0 if dt == "f32" else 8.0),
                3e-5 if dt == "f32" else None,
            ),
            norm_case(f"layer_norm_{dt}_outlier", "layer_norm", dt, (4, 2048), first=1000.0 if dt == "f32" else 200.0),
            norm_case(f"layer_norm_{dt}_nobias", "layer_norm", dt, (4, 512), bias=False),
        ]
        for inter in (False, True):
            v = f"rope_{'i' if inter else 'h'}_{dt}"
            out += [
                rope_case(f"{v}_bhsd", dt, 2, 3, 5, 64, interleaved=inter),
                rope_case(f"{v}_bshd", dt, 3, 4, 7, 128, interleaved=inter, layout="bshd"),
                rope_case(f"{v}_partial", dt, 2, 2, 9, 96, interleaved=inter, rot=32, table="batched"),
                rope_case(f"{v}_pos32", dt, 2, 3, 6, 64, interleaved=inter, pos="int32", T=50),
                rope_case(f"{v}_pos64", dt, 2, 5, 3, 6, interleaved=inter, pos="int64", T=9, layout="bshd"),
                rope_case(f"{v}_pair", dt, 2, 1, 3, 2, interleaved=inter, table="one"),
                rope_case(f"{v}_oddrot", dt, 2, 3, 5, 20, interleaved=inter, rot=6),
            ]
    out += _store_cases() + _attention_cases() + _prefill_cases() + _linear_cases() + _quantized_cases()
    out += _wgmma_cases()
    return [replace(c, name=f"kernel.{c.name}") for c in out]


CASES = _cases()


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_hand_written_kernel(case, gpu):
    gpu(case)
