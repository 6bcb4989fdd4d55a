"""linear, fused_linear, gated_linear and rms_norm_linear as hand-written kernels, with the bias, the residual
add, the activation or the gate's act(gate) * up in the same dispatch.

- A few rows (a decode step's projections; custom_kernels/linear_rows.hip), each weight read once whatever the
  rows: `linear_vec` on the vector units (1 to VEC_MAX_M rows, where a matrix instruction's tile would be mostly
  empty), normalizing x on its way into the product (rms_norm_linear); `linear_rows` on the matrix units
  (VEC_MAX_M + 1 to MAX_M rows) after rms_norm's own kernel.
- Many rows, or a symbolic number (a prefill's projections; custom_kernels/linear_mm.hip): `linear_mm`, a tiled
  GEMM on the matrix units through shared memory, after rms_norm's kernel for rms_norm_linear. The default on
  NVIDIA (measured against IREE's GEMMs); on ROCm asked for by name (impl={op: "kernel"}): `rule` says why. A
  module for Hopper (cuda:sm_90) takes `linear_wgmma` instead (custom_kernels/linear_wgmma.hip: the same tiles and
  epilogue on the warpgroup matrix instructions, which mma.sync code can't reach on those GPUs).

They take f16/bf16 x and a static (N, K) weight; linear_vec on every GPU, linear_rows and linear_mm on NVIDIA
sm_80+ (mma.sync) and AMD gfx90a / gfx94x (MFMA). Anything else (f32, more rows on gfx11 (WMMA: not written) or
older GPUs) is IREE's code, with the reason in the summary.
"""

from __future__ import annotations

import math
import re

from ...frontend.graph import Node
from ...frontend.ops.fused import GATE_ACTIVATIONS, LINEAR_ACTIVATIONS
from .. import kernels
from ..emitter import Emitter
from ..module import LowerContext
from ..registry import lowering
from ..target import Target
from .dispatch import dispatch, f32_bits
from .norm import norm_kernel

FAMILY = kernels.FAMILIES["linear_rows"]
MAX_M = 32  # linear_rows.hip's MAX_M: x rows a workgroup holds (more: linear_mm)
TILE = 16  # its TILE: rows of w a workgroup
VEC_MAX_M = 2  # its VMAX_M: x rows linear_vec takes
VROWS = 8  # its VROWS: rows of w a linear_vec workgroup (gated: half of them gate rows, half up rows)
MM_BM, MM_BN = 128, 128  # linear_mm.hip's BM, BN: x rows and w rows a workgroup (gated: BN / 2 outputs)
DTYPES = ("f16", "bf16")  # what the matrix instructions take (tf32 would change f32's results); linear_vec too
MFMA_ARCHS = ("gfx90a", "gfx940", "gfx941", "gfx942")
# Targets whose prefill projections take linear_wgmma (custom_kernels/linear_wgmma.hip, built for sm_90a): on an
# H200 a 7B layer's four projections 1.42-1.48x faster than linear_mm's mma.sync at 512 and 2048 rows
# (bench/mm_sweep.py, BENCHMARKS.md).
WGMMA_ARCHS = ("sm_90",)


def matrix_problem(target: Target) -> str | None:
    """Why `target` lacks the matrix instructions the kernels of mma.h are written for (None: it has them)."""
    arch = target.code_arch
    if target.kind == "cuda":
        sm = re.fullmatch(r"sm_(\d+)a?", arch)
        if sm is None or int(sm.group(1)) < 80:
            return f"{arch}: the kernel uses mma.sync m16n8k16 of sm_80 and newer"
    elif arch not in MFMA_ARCHS:
        return f"{arch}: the kernel uses the MFMA instructions of {', '.join(MFMA_ARCHS)} (gfx11's WMMA: not written)"
    return kernels.arch_problem(arch)


def tiled_kernel(target: Target) -> str:
    """The tiled GEMM of many rows for `target`: linear_wgmma (Hopper's warpgroup matrix instructions) where the
    module is for Hopper (cuda:sm_90; the artifact then needs an sm_90 GPU), linear_mm (mma.sync / MFMA) elsewhere."""
    return "linear_wgmma" if target.kind == "cuda" and target.arch in WGMMA_ARCHS else "linear_mm"


def rows(node: Node):
    """x's row count (every dim but the last): an int, or None when symbolic."""
    lead = node.inputs[0].shape[:-1]
    return math.prod(lead) if all(isinstance(d, int) for d in lead) else None


def supports(node: Node, target: Target):
    x, w = node.inputs[0], node.inputs[1]
    if x.dtype.name not in DTYPES:
        return f"x is {x.dtype}; the kernels take {', '.join(DTYPES)}"
    m = rows(node)
    if m is not None and m < 1:
        return f"{m} rows of x; the kernels take at least 1"
    if node.op == "rms_norm_linear":
        w = node.inputs[2]
        if node.inputs[1].dtype != x.dtype:
            return f"norm_weight is {node.inputs[1].dtype}, x {x.dtype}: the kernel takes them in one dtype"
    if not all(isinstance(d, int) and d > 0 for d in w.shape):
        return f"weight is {w}; the kernel takes a static, non-empty one"
    # linear_vec runs on any GPU the kernels build for; linear_rows and linear_mm need the matrix instructions
    # they are written for.
    if m is not None and m <= VEC_MAX_M:
        return kernels.arch_problem(target.code_arch)
    return matrix_problem(target)


def lower(E: Emitter, node: Node, ins, ctx: LowerContext):
    norm, eps, act = None, 0.0, node.attrs.get("activation", "none")
    if node.op == "rms_norm_linear":
        x, norm, w, bias = ins
        eps, act = node.attrs["eps"], node.attrs["gate"]
    else:
        x, w, bias = ins[:3]
    residual = ins[3] if node.op == "fused_linear" and len(ins) > 3 else None
    out = node.outputs[0].type
    gated = node.op == "gated_linear" or (norm is not None and act != "none")
    n, k, m = out.shape[-1], w.shape[1], rows(node)
    if norm is not None and (m is None or m > VEC_MAX_M):
        # linear_rows takes x as it is: the norm is rms_norm's kernel, a dispatch of its own (normalizing x inside
        # linear_rows cost more than that dispatch at 32 rows: BENCHMARKS.md).
        x, norm = norm_kernel(E, ctx, node, "rms_norm", x, [norm], eps, x.type.rank - 1), None
    flags = FAMILY.flag_bits(
        bias=bias is not None,
        residual=residual is not None,
        gated=gated,
        relu=act == "relu",
        silu=act == "silu",
        gelu_tanh=act == "gelu_tanh",
        norm=norm is not None,
    )
    lead = E.dims(x)[:-1]
    rows_x = E.product(lead)
    constants = {"M": rows_x, "N": n, "K": k, "flags": flags, "eps": f32_bits(eps)}
    operands = {"x": x, "w": w, "bias": bias, "residual": residual, "norm": norm}
    dt = x.type.dtype.name
    if m is not None and m <= VEC_MAX_M:
        symbol, groups = f"linear_vec_{dt}", -(-n // (VROWS // 2 if gated else VROWS))
    elif m is not None and m <= MAX_M:
        symbol, groups = f"linear_rows_{dt}", -(-n // TILE)
    else:  # linear_wgmma tiles as linear_mm does
        tiles_n = -(-n // (MM_BN // 2 if gated else MM_BN))
        symbol, groups = f"{tiled_kernel(ctx.target)}_{dt}", E.product([E.ceildivui(rows_x, MM_BM), tiles_n])
    return [dispatch(E, ctx, node, symbol, constants, operands, out, [*lead, n], groups)]


# Measured on an H100 (7B f16 decode, bench/llm_gpu.py, BENCHMARKS.md): at 8 and 32 rows linear_rows' projections
# took 5.4 and 8.5 ms a step against IREE's 11.2 and 12.5 (IREE's small-M GEMMs stream the weights up to 4x slower
# than its GEMVs); at one row linear_vec took 4.77 ms a step for all four projections (the two norms and
# silu(gate) * up included) against 4.83 for IREE's GEMVs, norms and gate, and 1.53 ms against IREE's 1.54 for o
# and down alone: so the kernels are the default at every row count they take.


def rule(node: Node, target: Target):
    """Where the kernels are the default: a few rows everywhere; more rows (or a symbolic number: linear_mm) on
    NVIDIA, where linear_mm was measured against IREE's GEMMs. On ROCm IREE's own MFMA GEMMs keep prefill's
    projections until linear_mm's AMD code (a path of its own: register-staged, MFMA) has run on an AMD GPU;
    impl={op: "kernel"} asks for it there."""
    return tiled_on_rocm(node, target, "the tiled GEMM (linear_mm)")


def tiled_on_rocm(node: Node, target: Target, kernel: str):
    """The reason a prefill's rows (more than MAX_M, or symbolic) keep IREE's code on ROCm by default: the tiled
    kernels' AMD code has not run on an AMD GPU. None elsewhere."""
    m = rows(node)
    if (m is None or m > MAX_M) and target.kind == "rocm":
        return (
            f"{'a symbolic number of' if m is None else m} rows: on ROCm {kernel} is taken when asked for (its AMD "
            f"code has not run on an AMD GPU); impl={{{node.op!r}: 'kernel'}} asks for it"
        )
    return None


# linear_mm on an H200 (bench/prefill_gpu.py, BENCHMARKS.md): a 7B prefill's projections at 512 and 2048 rows
# 2.3-3.3x faster than IREE's sm_80 GEMMs (the 4096^3 GEMM 216 against 120 TFLOP/s); at 128 rows from 0.84x
# (down + residual: 32 workgroups for 132 multiprocessors) to 2.6x.


def priority(node: Node, target: Target) -> int:
    """Ahead of a library the compile opts into (blas: 20) for a few rows, where a synchronous call per GEMM would
    cost a decode step more; behind it for more (linear_mm), where the library was asked for and pays."""
    m = rows(node)
    return 10 if m is not None and m <= MAX_M else 30


# Every activation the ops name is one the kernel computes.
assert set(LINEAR_ACTIVATIONS) | set(GATE_ACTIVATIONS) <= {"none", "relu", "silu", "gelu_tanh"}

lowering(
    "linear",
    "fused_linear",
    "gated_linear",
    "rms_norm_linear",
    impl="kernel",
    kinds=("rocm", "cuda"),
    priority=10,
    priority_for=priority,
    supports=supports,
    rule=rule,
)(lower)
