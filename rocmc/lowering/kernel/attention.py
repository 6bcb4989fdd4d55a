"""sdpa and sdpa_cached as hand-written kernels, reading the keys and values as stored (a KV cache's block: no
transpose, no copy) and only at the positions the mask keeps. Both take bool masks (or none) broadcastable to
(b, hq, sq, S) whose last dim is the positions', is_causal and GQA.

- A few queries per head (a decode step; custom_kernels/attention_decode.hip): one workgroup per (batch row, kv
  head), head dims a wave's lanes split evenly (d / wave of 1, 2, 4 or 8 elements a lane: an entry each, and one
  for at most 2 query rows a workgroup, one for more), at most 16, 8 or 4 query rows per workgroup (hq / hkv * sq)
  as a lane holds 1-2, 4 or 8 elements (on AMDGPU at most 4). Where the (batch row, kv head) pairs are fewer than
  MIN_WORKGROUPS the positions are split over several workgroups (attention_split.hip) whose partial results a
  second dispatch combines (attention_combine.hip): `splits`. A batch of few workgroups is IREE's attention by
  default (`rule`).
- More, or a symbolic number (a prefill; custom_kernels/attention_prefill.hip): flash attention on the matrix
  units, a workgroup per (batch row, query head, 16 query rows a wave), f16/bf16 and head dims 64, 128 and 256,
  on NVIDIA sm_80+ and AMD gfx90a / gfx94x. The default on NVIDIA; on ROCm asked for by name (`rule` says why).

Anything else is IREE's attention, with the reason in the summary.
"""

from __future__ import annotations

from ...frontend.graph import Node
from .. import kernels
from ..emitter import Emitter
from ..module import LowerContext
from ..registry import lowering
from ..target import Target
from .dispatch import dispatch, f32_bits
from ..codegen.index import _size
from .linear import DTYPES as PREFILL_DTYPES, matrix_problem

FAMILY = kernels.FAMILIES["attention_decode"]
COMBINE = kernels.FAMILIES["attention_combine"]
PREFILL = kernels.FAMILIES["attention_prefill"]
# attention_prefill.hip's entry points, one a head dim (attention_prefill_{dtype}_d{head dim}).
PREFILL_HEAD_DIMS = tuple(sorted({int(s.rsplit("_d", 1)[1]) for s in PREFILL.symbols}))
# attention_decode.hip's MAX_ROWS (query rows of a workgroup; AMDGPU: 4, more spill its scalar registers) and
# MAX_CELLS (rows x elements a lane).
MAX_ROWS = {"rocm": 4, "cuda": 16}
MAX_CELLS = 32
FEW_ROWS = 2  # attention_decode.h's FEW_ROWS: its few-rows entries' query rows a workgroup
# A split decode attention (attention_split.hip, then attention_combine.hip): at most MAX_SPLITS workgroups a
# (batch row, kv head), about SPLIT_WORKGROUPS in all (see `splits`).
MAX_SPLITS = 8
SPLIT_WORKGROUPS = 256


def wave_size(arch: str) -> int:
    """Lanes of a wave: 64 on gfx9 (CDNA), 32 on gfx10+ (RDNA, wave32) and NVIDIA."""
    return 64 if arch.startswith("gfx9") else 32


def _rows_limit(per_lane: int, kind: str) -> int:
    return min(MAX_ROWS[kind], MAX_CELLS // max(per_lane, 2))


def _mask_problem(node: Node) -> str | None:
    q, k, _, mask, _ = _operands(node)
    if mask is not None:
        if mask.dtype.kind != "bool":
            return f"the mask is {mask.dtype} (additive); the kernels read bool masks"
        if mask.rank == 0 or mask.shape[-1] != _positions(node):
            return f"the mask is {mask}; the kernels read one whose last dim is the positions ({_positions(node)})"
    return None


def _decode_problem(node: Node, target: Target) -> str | None:
    """Why attention_decode does not take the op (None: it does)."""
    q, k, _, _, slots = _operands(node)
    if slots is not None or _positions(node) != k.shape[2]:
        return "slots or positions: the decode kernel reads row i's entries at all their positions"
    if q.dtype.name not in kernels.DTYPES:
        return f"q is {q.dtype}; the kernel is built for {', '.join(kernels.DTYPES)}"
    b, hq, sq, d = q.shape
    hkv = k.shape[1]
    if not isinstance(sq, int) or not all(isinstance(n, int) for n in (hq, hkv, d)):
        return f"q is {q}: the decode kernel takes a static few queries per head with static heads and head dim"
    wave = wave_size(target.code_arch)
    if d % wave or d // wave not in (1, 2, 4, 8):
        return f"head dim {d}: the decode kernel splits it over a wave's {wave} lanes, 1, 2, 4 or 8 elements a lane"
    dv = _operands(node)[2].shape[3]
    if dv != d:
        return f"v's head dim {dv} is not q's {d}; the kernels read one head dim"
    rows, limit = hq // hkv * sq, _rows_limit(d // wave, target.kind)
    if rows > limit:
        return (
            f"{hq // hkv} query heads a kv head x {sq} queries = {rows} rows; the decode kernel holds at most {limit}"
        )
    return None


def _prefill_problem(node: Node, target: Target) -> str | None:
    """Why attention_prefill does not take the op (None: it does)."""
    q, k, *_ = _operands(node)
    if q.dtype.name not in PREFILL_DTYPES:
        return f"q is {q.dtype}; the prefill kernel takes {', '.join(PREFILL_DTYPES)}"
    hq, d, hkv = q.shape[1], q.shape[3], k.shape[1]
    if not all(isinstance(n, int) for n in (hq, hkv)):
        return f"q is {q}, k {k}: the prefill kernel takes static heads"
    if d not in PREFILL_HEAD_DIMS:
        return f"head dim {d}: the prefill kernel is built for {', '.join(map(str, PREFILL_HEAD_DIMS))}"
    dv = _operands(node)[2].shape[3]
    if dv != d:
        return f"v's head dim {dv} is not q's {d}; the kernels read one head dim"
    return matrix_problem(target)


def _form(node: Node, target: Target) -> tuple[str, str | None]:
    """("decode" or "prefill", why that kernel does not take the op): the decode kernel where it takes the op; the
    prefill kernel for the rest (many queries, a symbolic number, or a head dim the decode kernel can't split)."""
    decode = _decode_problem(node, target)
    if decode is None:
        return "decode", None
    prefill = _prefill_problem(node, target)
    if prefill is None:
        return "prefill", None
    sq = node.inputs[0].shape[2]
    few = isinstance(sq, int) and node.inputs[0].shape[1] // node.inputs[1].shape[1] * sq <= MAX_ROWS[target.kind]
    return ("decode", decode) if few else ("prefill", f"{prefill} (decode kernel: {decode})")


def supports(node: Node, target: Target):
    problem = _mask_problem(node)
    if problem is None:
        problem = _form(node, target)[1]
    return problem or kernels.arch_problem(target.code_arch)


def _operands(node: Node, ins=None):
    """(q, k, v, mask, slots) of an sdpa's or sdpa_cached's operands (`ins`, by default the node's inputs); k and
    v are the cache for sdpa_cached."""
    ins = node.inputs if ins is None else ins
    if node.op == "sdpa":
        return ins[0], ins[1], ins[2], ins[3], None
    return ins[0], ins[1], ins[1], ins[2], ins[3] if len(ins) > 3 else None


def _positions(node: Node):
    """The positions attended: k's (sdpa), or sdpa_cached's `positions` (by default the cache's)."""
    return node.attrs.get("positions", node.inputs[1].shape[2])


def lower(E: Emitter, node: Node, ins, ctx: LowerContext):
    q, k, v, mask, slots = _operands(node, ins)
    kb, vb = node.attrs.get("entries", (0, 0))
    b, hq, sq, d = E.dims(q)
    hkv, stored = E.dim(k, 1), E.dim(k, 2)
    positions = node.attrs.get("positions")
    positions = stored if positions is None else _size(E, positions, ctx)
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
    }
    operands = {"q": q, "k": k, "v": v, "mask": mask}
    dt = q.type.dtype.name
    flags = {"mask": mask is not None, "causal": node.attrs["is_causal"]}
    if _form(node, ctx.target)[0] == "prefill":
        rows = 16 * (PREFILL.block // wave_size(ctx.target.code_arch))  # query rows of a workgroup: 16 a wave
        groups = E.product([b, hq, E.ceildivui(sq, rows)])
        symbol = f"attention_prefill_{dt}_d{node.inputs[0].shape[3]}"
        wide = slots is not None and slots.type.dtype.name == "i64"
        constants |= {
            "flags": PREFILL.flag_bits(**flags, slots=slots is not None, slots_i64=wide),
            "stride": stored,
            "E": E.dim(k, 0),
        }
        operands["slots"] = slots
        out = node.outputs[0].type
        return [dispatch(E, ctx, node, symbol, constants, operands, out, [b, hq, sq, d], groups)]
    q_type = node.inputs[0].type
    hd, rows = q_type.shape[3], q_type.shape[1] // node.inputs[1].shape[1] * q_type.shape[2]
    entry = f"{'' if rows <= FEW_ROWS else 'rows_'}{dt}_e{hd // wave_size(ctx.target.code_arch)}"
    constants["flags"] = FAMILY.flag_bits(**flags)
    n = splits(node)
    if n == 1:
        groups = E.product([b, hkv])
        return [
            dispatch(
                E,
                ctx,
                node,
                f"attention_decode_{entry}",
                constants,
                operands,
                node.outputs[0].type,
                [b, hq, sq, d],
                groups,
            )
        ]
    # The positions split over n workgroups a (batch row, kv head); their partial results combined.
    count = q_type.shape[0] * q_type.shape[1] * q_type.shape[2]
    part_type = q_type.with_dtype("f32").with_shape((count * n * (hd + 2),))
    part = dispatch(
        E,
        ctx,
        node,
        f"attention_split_{entry}",
        constants | {"splits": n},
        operands,
        part_type,
        [count * n * (hd + 2)],
        E.product([b, hkv, n]),
    )
    groups = -(-count * hd // COMBINE.block)
    return [
        dispatch(
            E,
            ctx,
            node,
            f"attention_combine_{dt}",
            {"rows": count, "d": hd, "splits": n},
            {"part": part},
            node.outputs[0].type,
            [b, hq, sq, d],
            groups,
        )
    ]


def splits(node: Node) -> int:
    """Workgroups a (batch row, kv head) takes the positions of: 1 where the pairs fill the GPU
    (MIN_WORKGROUPS), else enough for about SPLIT_WORKGROUPS in all, at most MAX_SPLITS (and 1 where the batch
    is symbolic). Measured on an H200 (bench/attn_sweep.py, BENCHMARKS.md): at 32 pairs (7B, one row) 4-8 splits
    took half the time of one; at 64 (GQA 4, 8 rows) 2-4; from 256 one split was fastest."""
    q, k = node.inputs[0], node.inputs[1]
    b, hkv = q.shape[0], k.shape[1]
    if not isinstance(b, int) or b * hkv >= MIN_WORKGROUPS:
        return 1
    return min(MAX_SPLITS, -(-SPLIT_WORKGROUPS // (b * hkv)))


# (Batch row, kv head) pairs from which the kernel is chosen by default, a workgroup each. Measured (7B f16 decode,
# 32 kv heads, 1024 positions, bench/llm_gpu.py, BENCHMARKS.md): on an H100 at 32 pairs (1 row) IREE's attention
# took 14 us a layer against the unsplit kernel's 38; at 256 (8 rows) the kernel was ahead, at 1024 (32 rows) 2x
# ahead (it reads only each row's positions). On an H200, split over 8 workgroups a pair (`splits`) the kernel took
# 9.3 + 3.4 us (the combine) a layer at one row against IREE's 15.5, but its 32 more launches a step left the step
# where it was (173.6 and 184.3 tok/s against 181.3 and 182.4 in two runs): below this, IREE's attention by default
# and the split kernel when asked for by name.
MIN_WORKGROUPS = 128


def rule(node: Node, target: Target):
    if _form(node, target)[0] == "prefill":
        # On an H200 (7B f16 prefill, bench/llm_gpu.py, BENCHMARKS.md) IREE's sm_80 attention took 23 ms of 62.
        if target.kind == "rocm":
            return (
                "many queries: on ROCm the flash-attention kernel (attention_prefill) is taken when asked for (its "
                "AMD code has not run on an AMD GPU); impl={'sdpa': 'kernel'} asks for it"
            )
        return None
    q, k, *_ = _operands(node)
    b, hkv = q.shape[0], k.shape[1]
    if isinstance(b, int) and isinstance(hkv, int) and b * hkv < MIN_WORKGROUPS:
        return (
            f"{b} x {hkv} workgroups (batch x kv heads): fewer than {MIN_WORKGROUPS}, IREE's attention (the kernel, "
            "its positions split over workgroups, is taken when asked for: impl={'sdpa_cached': 'kernel'})"
        )
    return None


lowering("sdpa", "sdpa_cached", impl="kernel", kinds=("rocm", "cuda"), priority=10, supports=supports, rule=rule)(lower)
