"""sdpa and sdpa_cached of a few queries per head as a hand-written kernel (custom_kernels/attention_decode.hip):
a decode step's attention, one workgroup per (batch row, kv head), reading the keys and values as stored (a KV
cache's block: no transpose, no copy) and only at the positions the mask keeps.

It takes bool masks (or none) broadcastable to (b, hq, sq, S) whose last dim is the positions', is_causal, GQA,
and head dims a wave's lanes split evenly (d / wave of 1, 2, 4 or 8 elements a lane) with few query rows per
workgroup (hq / hkv * sq, at most 16, 8 or 4 as a lane holds 1-2, 4 or 8 elements; on AMDGPU at most 4).
Anything else, prefill's many queries included, is IREE's attention; so is a batch of few workgroups (`rule`).
"""

from __future__ import annotations

from ...frontend.graph import Node
from .. import kernels
from ..emitter import Emitter
from ..module import LowerContext
from ..registry import lowering
from ..target import Target
from .dispatch import dispatch, f32_bits

FAMILY = kernels.FAMILIES["attention_decode"]
# attention_decode.hip's MAX_ROWS (query rows of a workgroup; AMDGPU: 4, more spill its scalar registers) and
# MAX_CELLS (rows x elements a lane).
MAX_ROWS = {"rocm": 4, "cuda": 16}
MAX_CELLS = 32


def wave_size(arch: str) -> int:
    """Lanes of a wave: 64 on gfx9 (CDNA), 32 on gfx10+ (RDNA, wave32) and NVIDIA."""
    return 64 if arch.startswith("gfx9") else 32


def _rows_limit(per_lane: int, kind: str) -> int:
    return min(MAX_ROWS[kind], MAX_CELLS // max(per_lane, 2))


def supports(node: Node, target: Target):
    q, k, mask = _operands(node.inputs)
    if q.dtype.name not in kernels.DTYPES:
        return f"q is {q.dtype}; the kernel is built for {', '.join(kernels.DTYPES)}"
    b, hq, sq, d = q.shape
    hkv, positions = k.shape[1], k.shape[2]
    if not isinstance(sq, int) or not all(isinstance(n, int) for n in (hq, hkv, d)):
        return f"q is {q}: the kernel takes a static few queries per head with static heads and head dim"
    wave = wave_size(target.code_arch)
    if d % wave or d // wave not in (1, 2, 4, 8):
        return f"head dim {d}: the kernel splits it over a wave's {wave} lanes, 1, 2, 4 or 8 elements a lane"
    dv = node.inputs[2].shape[3] if len(node.inputs) == 4 else d  # sdpa_cached: k and v are the cache's
    if dv != d:
        return f"v's head dim {dv} is not q's {d}; the kernel reads one head dim"
    rows, limit = hq // hkv * sq, _rows_limit(d // wave, target.kind)
    if rows > limit:
        return f"{hq // hkv} query heads a kv head x {sq} queries = {rows} rows; the kernel holds at most {limit}"
    if mask is not None:
        if mask.dtype.kind != "bool":
            return f"the mask is {mask.dtype} (additive); the kernel reads bool masks"
        if mask.rank == 0 or mask.shape[-1] != positions:
            return f"the mask is {mask}; the kernel reads one whose last dim is the positions ({positions})"
    return kernels.arch_problem(target.code_arch)


def _operands(ins):
    """(q, k, mask) of an sdpa's or sdpa_cached's operands (k: the cache for sdpa_cached)."""
    return (ins[0], ins[1], ins[3]) if len(ins) == 4 else (ins[0], ins[1], ins[2])


def lower(E: Emitter, node: Node, ins, ctx: LowerContext):
    q, k, mask = _operands(ins)
    v = ins[2] if len(ins) == 4 else k  # sdpa_cached: keys and values are entries of one cache
    kb, vb = node.attrs.get("entries", (0, 0))
    b, hq, sq, d = E.dims(q)
    hkv, positions = E.dim(k, 1), E.dim(k, 2)
    strides = {"mask_b": 0, "mask_h": 0, "mask_q": 0}
    if mask is not None:
        # The mask right-aligned to (b, hq, sq, S): a dim of size 1 (or absent) broadcasts (stride 0).
        dims = E.dims(mask)
        for axis, name in zip((0, 1, 2), ("mask_b", "mask_h", "mask_q")):
            at = axis - (4 - mask.rank)
            if at >= 0 and mask.shape[at] != 1:
                strides[name] = E.product(dims[at + 1 :])
    constants = {
        "hq": hq,
        "hkv": hkv,
        "sq": sq,
        "S": positions,
        "d": d,
        "kb": kb,
        "vb": vb,
        **strides,
        "scale": f32_bits(node.attrs["scale"]),
        "flags": FAMILY.flag_bits(mask=mask is not None, causal=node.attrs["is_causal"]),
    }
    groups = E.product([b, hkv])
    symbol = f"attention_decode_{q.type.dtype.name}"
    out = node.outputs[0].type
    return [
        dispatch(E, ctx, node, symbol, constants, {"q": q, "k": k, "v": v, "mask": mask}, out, [b, hq, sq, d], groups)
    ]


# Workgroups (batch rows x kv heads) from which the kernel is chosen by default. Measured on an H100 (7B f16
# decode, 32 kv heads, 1024 positions, bench/llm_gpu.py, BENCHMARKS.md): at 32 workgroups (1 row) IREE's
# attention took 14 us a layer against the kernel's 38 (a workgroup per (row, kv head) leaves most of the GPU
# idle); at 256 (8 rows) the kernel was ahead, at 1024 (32 rows) 2x ahead (it reads only each row's positions).
MIN_WORKGROUPS = 128


def rule(node: Node, target: Target):
    q, k, _ = _operands(node.inputs)
    b, hkv = q.shape[0], k.shape[1]
    if isinstance(b, int) and isinstance(hkv, int) and b * hkv < MIN_WORKGROUPS:
        return f"{b} x {hkv} workgroups (batch x kv heads): fewer than {MIN_WORKGROUPS}, IREE's attention is faster"
    return None


lowering("sdpa", "sdpa_cached", impl="kernel", kinds=("rocm", "cuda"), priority=10, supports=supports, rule=rule)(lower)
