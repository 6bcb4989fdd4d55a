"""A Llama decoder block: RMSNorm, RoPE, grouped-query causal attention, SwiGLU MLP, residuals.

python examples/llama_block.py --demo            # compile for the CPU, run, check, time; then gfx942
rocmc compile examples/llama_block.py -t gfx942 -o out.vmfb --set hidden=1024 --dump-ir out/
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import rocmc
from rocmc import ops


def rope_tables(max_seq: int, head_dim: int, base: float = 10000.0):
    inv = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.outer(np.arange(max_seq, dtype=np.float64), inv)
    return np.cos(ang), np.sin(ang)


def build_graph(
    hidden: int = 512,
    heads: int = 8,
    kv_heads: int = 2,
    ffn: int | None = None,
    batch: int = 1,
    max_seq: int = 4096,
    dtype: str = "f32",
    seed: int = 0,
) -> rocmc.Graph:
    """The block with random weights (seeded), input x: (batch, "seq", hidden)."""
    if hidden % heads or heads % kv_heads:
        raise rocmc.GraphError(
            f"llama_block: hidden={hidden} must divide by heads={heads}, heads by kv_heads={kv_heads}"
        )
    ffn = ffn or int(8 * hidden / 3 + 255) // 256 * 256
    hd = hidden // heads
    rng = np.random.default_rng(seed)
    npd = rocmc.dtype(dtype).np

    def w(name, *shape, scale=None):
        scale = scale or 1.0 / np.sqrt(shape[0])
        return g.constant(name, (rng.standard_normal(shape) * scale).astype(npd))

    g = rocmc.Graph("llama_block")
    x = g.input("x", (batch, "seq", hidden), dtype)
    cos, sin = rope_tables(max_seq, hd)
    cos, sin = g.constant("rope_cos", cos.astype(npd)), g.constant("rope_sin", sin.astype(npd))

    h = ops.rms_norm(x, g.constant("attn_norm", (1.0 + 0.1 * rng.standard_normal(hidden)).astype(npd)), eps=1e-5)
    q = ops.reshape(ops.matmul(h, w("wq", hidden, hidden)), (batch, "seq", heads, hd))
    k = ops.reshape(ops.matmul(h, w("wk", hidden, kv_heads * hd)), (batch, "seq", kv_heads, hd))
    v = ops.reshape(ops.matmul(h, w("wv", hidden, kv_heads * hd)), (batch, "seq", kv_heads, hd))
    q = ops.permute(ops.rope(q, cos, sin, layout="bshd"), (0, 2, 1, 3))
    k = ops.permute(ops.rope(k, cos, sin, layout="bshd"), (0, 2, 1, 3))
    v = ops.permute(v, (0, 2, 1, 3))
    a = ops.sdpa(q, k, v, is_causal=True)
    a = ops.reshape(ops.permute(a, (0, 2, 1, 3)), (batch, "seq", hidden))
    x1 = x + ops.matmul(a, w("wo", hidden, hidden))

    h2 = ops.rms_norm(x1, g.constant("mlp_norm", (1.0 + 0.1 * rng.standard_normal(hidden)).astype(npd)), eps=1e-5)
    gate = ops.silu(ops.matmul(h2, w("w_gate", hidden, ffn)))
    up = ops.matmul(h2, w("w_up", hidden, ffn))
    g.output(x1 + ops.matmul(gate * up, w("w_down", ffn, hidden)))
    return g


def demo(hidden: int, seq: int, dtype: str, gpu_target: str, dump: str) -> int:
    g = build_graph(hidden=hidden, dtype=dtype)
    print(g if hidden <= 512 else f"{g.name}: {len(g.nodes)} nodes")
    t0 = time.perf_counter()
    art = rocmc.compile(g, "cpu")
    print(f"\ncompiled for cpu in {time.perf_counter() - t0:.2f} s{' (cache)' if art.cached else ''}: {art}")
    mod = rocmc.load(art)
    x = np.random.default_rng().standard_normal((1, seq, hidden)).astype(rocmc.dtype(dtype).np)
    y = mod(x)
    ref = rocmc.evaluate(g, x)
    err = np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max()
    tol = {"f32": 1e-4, "f16": 1e-2, "bf16": 5e-2}[dtype]
    print(
        f"max error vs float64 reference (relative to max |y|): {err:.2e} ({'ok' if err < tol else 'FAIL'}, tolerance {tol})"
    )
    times = []
    for _ in range(20):
        t = time.perf_counter()
        mod(x)
        times.append(time.perf_counter() - t)
    print(f"time per call on local-task (seq={seq}, hidden={hidden}, {dtype}): median {np.median(times) * 1e3:.2f} ms")
    t0 = time.perf_counter()
    gart = rocmc.compile(g, gpu_target, dump_ir=dump)
    print(f"\ncompiled for {gpu_target} in {time.perf_counter() - t0:.2f} s (compile-only: no AMD GPU here)")
    print(gart.summary())
    print(f"\nstage dumps (graph, input, flow, stream, hal, dispatch sources) are in {dump}/")
    mod.close()
    return 0 if err < tol else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", action="store_true")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--seq", type=int, default=37)
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--gpu-target", default="gfx942")
    ap.add_argument("--dump", default="out/llama_block")
    a = ap.parse_args()
    if not a.demo:
        print(build_graph(hidden=a.hidden, dtype=a.dtype))
        sys.exit(0)
    sys.exit(demo(a.hidden, a.seq, a.dtype, a.gpu_target, a.dump))
