"""quantized_linear as hand-written kernels: a decode step's projections over 4- or 8-bit weights, the packed bytes
streamed once and dequantized in registers, with the op's bias, gate or residual in the same dispatch; and a
prefill's, dequantized on their way into shared memory. linear_q (custom_kernels/linear_q.hip) takes 1 to VEC_MAX_M
rows on the vector units, with the norm fused (linear_vec's prologue), on every GPU; on GPUs with the matrix
instructions linear_rows uses (NVIDIA sm_80+, AMD gfx90a / gfx94x), linear_qm (linear_qm.hip) takes VEC_MAX_M + 1 to
MAX_M rows on the matrix units, and linear_qmm (linear_qmm.hip: linear_mm's tiled product) more rows or a symbolic
number of them, a norm being rms_norm's kernel before them; a module for Hopper (cuda:sm_90) takes linear_qwgmma
(linear_qwgmma.hip: linear_wgmma's tiles over the packed bytes) there instead, where in-features and the group size
are multiples of its chunk of 64. (At one row on an H100, 7B: linear_qm took 3.9 ms a step
for 4-bit weights and 5.7 for 8-bit, plus 0.24 ms of norms, against linear_q's 3.9 and 4.8 with the norms fused:
BENCHMARKS.md.)

They take f16/bf16 x, scales and zeros in x's type, and in-features and group sizes that whole 16-byte pieces of
packed values cover (multiples of 128 / bits: 32 for 4 bits, 16 for 8; linear_qmm: multiples of 32). act-order's
permutation of x is a gather before them (generated code, after the norm: the norm comes first). Anything else
(f32, other group sizes) is the generated lowering (the dequantization fused into IREE's product), with the reason
in the summary.
"""

from __future__ import annotations


from ...frontend.graph import Node
from .. import kernels
from ..codegen.quant import permuted
from ..emitter import Emitter
from ..module import LowerContext
from ..registry import lowering
from ..target import Target
from .dispatch import dispatch, f32_bits
from .attention import wave_size
from .linear import MM_BM, MM_BN, matrix_problem, rows, tiled_kernel, tiled_on_rocm
from .norm import norm_kernel

FAMILY = kernels.FAMILIES["linear_q"]
MATRIX = kernels.FAMILIES["linear_qm"]
TILED = kernels.FAMILIES["linear_qmm"]
TILED_K = 32  # linear_qmm's BK (mm.h): K and group sizes it takes are multiples of it
WGMMA_K = 64  # linear_qwgmma's chunk (wgmma.h): K and group sizes of multiples of it take it on Hopper
MAX_M = 32  # linear_qm.hip's MAX_M (linear.h): x rows it takes
TILE = 16  # its TILE: rows of w a workgroup
VEC_MAX_M = 2  # linear_q.hip's QMAX_M: x rows it takes
WAVE_ROWS = 4  # its QWR: rows of w a wave (a workgroup: that times its waves; gated: half of them gate rows)
DTYPES = ("f16", "bf16")


def hopper_tiles(target: Target, k: int, groups: int) -> bool:
    """Whether a prefill's quantized projection takes linear_qwgmma (wgmma.h: Hopper's warpgroup instructions, a
    cuda:sm_90 module) rather than linear_qmm: in-features and group size multiples of its chunk of 64."""
    return tiled_kernel(target) == "linear_wgmma" and k % WGMMA_K == 0 and (k // groups) % WGMMA_K == 0


def supports(node: Node, target: Target):
    x, w, scales = node.inputs[:3]
    if x.dtype.name not in DTYPES:
        return f"x is {x.dtype}; the kernels take {', '.join(DTYPES)}"
    m = rows(node)
    most = MAX_M if matrix_problem(target) is None else VEC_MAX_M
    if m is None or m > MAX_M:  # a prefill: linear_qmm, on the matrix units
        if matrix_problem(target) is not None:
            return f"{'a symbolic number of' if m is None else m} rows of x: linear_qmm needs {matrix_problem(target)}"
        k, groups = x.shape[-1], scales.shape[1]
        if k % TILED_K or (k // groups) % TILED_K:
            return f"in-features {k} in groups of {k // groups}: linear_qmm takes multiples of {TILED_K} for both"
    elif not 1 <= m <= most:
        why = "" if most == MAX_M else f" ({matrix_problem(target)}: linear_qm's {MAX_M} rows need them)"
        return f"{m} rows of x; the kernel takes 1 to {most}{why}"
    if node.attrs.get("format", "uint") != "uint":
        return f"{node.attrs['format']} weights: the kernels take unsigned integers"
    if scales.dtype != x.dtype:
        return f"scales are {scales.dtype}, x {x.dtype}: the kernels take them in one dtype"
    if node.inputs[3] is None:
        return "no zeros: the kernels read a zero point a group"
    bits, k, groups = node.attrs["bits"], x.shape[-1], scales.shape[1]
    piece = 128 // bits  # values of 16 bytes
    if (k // groups) % piece:
        return f"groups of {k // groups} values; the kernels take multiples of {piece} ({bits} bits: 16-byte pieces)"
    return kernels.arch_problem(target.code_arch)


def lower(E: Emitter, node: Node, ins, ctx: LowerContext):
    x, w, scales, zeros, bias, perm, residual, norm = ins
    gate, eps = node.attrs.get("gate", "none"), node.attrs.get("eps", 0.0)
    m = rows(node)
    tiled = m is None or m > MAX_M
    matrix = tiled or m > VEC_MAX_M  # supports admits more rows only where linear_qm / linear_qmm run
    if norm is not None and (matrix or perm is not None):  # the norm comes first, over x as given
        x, norm = norm_kernel(E, ctx, node, "rms_norm", x, [norm], eps, x.type.rank - 1), None
    if perm is not None:
        x = permuted(E, x, perm)
    out = node.outputs[0].type
    n, gated = out.shape[-1], gate != "none"
    fam = TILED if tiled else MATRIX if matrix else FAMILY
    flags = fam.flag_bits(
        bias=bias is not None,
        residual=residual is not None,
        gated=gated,
        relu=False,
        silu=gate == "silu",
        gelu_tanh=gate == "gelu_tanh",
        norm=norm is not None,
    )
    lead = E.dims(x)[:-1]
    constants = {
        "M": E.product(lead),
        "N": n,
        "K": x.shape[-1],
        "G": scales.shape[1],
        "bits": node.attrs["bits"],
        "flags": flags,
        "eps": f32_bits(eps),
    }
    operands = {"x": x, "w": w, "scales": scales, "zeros": zeros, "bias": bias, "residual": residual, "norm": norm}
    if tiled:  # linear_qwgmma tiles as linear_qmm does
        tiles_n = -(-n // (MM_BN // 2 if gated else MM_BN))
        kernel = "linear_qwgmma" if hopper_tiles(ctx.target, x.shape[-1], scales.shape[1]) else "linear_qmm"
        symbol, groups = f"{kernel}_{x.type.dtype.name}", E.product([E.ceildivui(constants["M"], MM_BM), tiles_n])
    elif matrix:
        symbol, groups = f"linear_qm_{x.type.dtype.name}", -(-n // TILE)
    else:
        wrows = WAVE_ROWS * FAMILY.block // wave_size(ctx.target.code_arch)
        symbol, groups = f"linear_q_{x.type.dtype.name}", -(-n // (wrows // 2 if gated else wrows))
    return [dispatch(E, ctx, node, symbol, constants, operands, out, [*lead, n], groups)]


def rule(node: Node, target: Target):
    """Where the kernels are the default: a few rows everywhere; a prefill's (linear_qmm) on NVIDIA, where it ran.
    On ROCm IREE's own code keeps a prefill's quantized projections until linear_qmm's AMD code (linear_mm's, which
    has not run on an AMD GPU either) has run there; impl={"quantized_linear": "kernel"} asks for it."""
    return tiled_on_rocm(node, target, "the tiled kernel (linear_qmm)")


lowering("quantized_linear", impl="kernel", kinds=("rocm", "cuda"), priority=10, supports=supports, rule=rule)(lower)
