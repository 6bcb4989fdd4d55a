"""linear, fused_linear and gated_linear of a few rows as a hand-written kernel (custom_kernels/linear_rows.hip):
a decode step's projections on the matrix units, each weight read once whatever the rows, with the bias, the
residual add, the activation or the gate's act(gate) * up in the same dispatch.

It takes f16/bf16 x whose rows (every dim but the last, static) number at most MAX_M, a static (N, K) weight, on
NVIDIA sm_80+ (mma.sync) and AMD gfx90a / gfx94x (MFMA). Anything else (prefill's symbolic rows, f32, gfx11's
WMMA, older GPUs) is IREE's code, with the reason in the summary; so is one row (`rule`: IREE's matrix-vector
code is faster there), unless the kernel is asked for by name.
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
from .dispatch import dispatch

FAMILY = kernels.FAMILIES["linear_rows"]
MAX_M = 32  # linear_rows.hip's MAX_M: x rows a workgroup holds
TILE = 16  # its TILE: rows of w a workgroup
DTYPES = ("f16", "bf16")  # what the matrix instructions take (tf32 would change f32's results)
MFMA_ARCHS = ("gfx90a", "gfx940", "gfx941", "gfx942")


def _arch_problem(target: Target) -> str | None:
    arch = target.code_arch
    if target.kind == "cuda":
        sm = re.fullmatch(r"sm_(\d+)a?", arch)
        if sm is None or int(sm.group(1)) < 80:
            return f"{arch}: the kernel uses mma.sync m16n8k16 of sm_80 and newer"
    elif arch not in MFMA_ARCHS:
        return f"{arch}: the kernel uses the MFMA instructions of {', '.join(MFMA_ARCHS)} (gfx11's WMMA: not written)"
    return kernels.arch_problem(arch)


def rows(node: Node):
    """x's row count (every dim but the last): an int, or None when symbolic."""
    lead = node.inputs[0].shape[:-1]
    return math.prod(lead) if all(isinstance(d, int) for d in lead) else None


def supports(node: Node, target: Target):
    x, w = node.inputs[0], node.inputs[1]
    if x.dtype.name not in DTYPES:
        return f"x is {x.dtype}; the kernel's matrix instructions take {', '.join(DTYPES)}"
    m = rows(node)
    if m is None:
        return f"x is {x}: the kernel takes a static few rows (at most {MAX_M})"
    if not 1 <= m <= MAX_M:
        return f"{m} rows of x; the kernel takes 1 to {MAX_M}"
    if not all(isinstance(d, int) and d > 0 for d in w.shape):
        return f"weight is {w}; the kernel takes a static, non-empty one"
    return _arch_problem(target)


def lower(E: Emitter, node: Node, ins, ctx: LowerContext):
    x, w, bias = ins[:3]
    residual = ins[3] if len(ins) > 3 else None
    out = node.outputs[0].type
    gated = node.op == "gated_linear"
    act = node.attrs.get("activation", "none")
    n, k = out.shape[-1], w.shape[1]
    flags = FAMILY.flag_bits(
        bias=bias is not None,
        residual=residual is not None,
        gated=gated,
        relu=act == "relu",
        silu=act == "silu",
        gelu_tanh=act == "gelu_tanh",
    )
    constants = {"M": rows(node), "N": n, "K": k, "flags": flags}
    operands = {"x": x, "w": w, "bias": bias, "residual": residual}
    symbol = f"linear_rows_{x.type.dtype.name}"
    return [dispatch(E, ctx, node, symbol, constants, operands, out, list(out.shape), -(-n // TILE))]


# Rows from which the kernel is chosen by default. Measured on an H100 (7B f16 decode, bench/llm_gpu.py,
# BENCHMARKS.md): at 8 and 32 rows the kernel's projections took 5.4 and 8.5 ms a step against IREE's 11.2 and
# 12.5 (IREE's small-M GEMMs stream the weights up to 4x slower than its GEMVs); at one row IREE's GEMVs took
# 4.5 ms against the kernel's 5.3, so one row stays IREE's.
MIN_ROWS = 2


def rule(node: Node, target: Target):
    m = rows(node)
    if m is not None and m < MIN_ROWS:
        return f"{m} row: IREE's matrix-vector code streams the weights faster than the kernel"
    return None


# Every activation the ops name is one the kernel computes.
assert set(LINEAR_ACTIVATIONS) | set(GATE_ACTIVATIONS) <= {"none", "relu", "silu", "gelu_tanh"}

lowering(
    "linear",
    "fused_linear",
    "gated_linear",
    impl="kernel",
    kinds=("rocm", "cuda"),
    priority=10,
    supports=supports,
    rule=rule,
)(lower)
