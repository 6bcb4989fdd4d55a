"""Symbolic contraction sizes padded to a multiple of a tile, so IREE can use its tiled strategies.

Why: IREE 3.13 picks its strategy for a contraction from what it knows of the sizes. On GPUs, with a
symbolic M (a sequence length), a projection matmul gets a matrix-vector strategy (VectorDistribute
with a `partial_reduction` config: no MMA, 0.3 TFLOP/s on an H100, BENCHMARKS.md); the same matmul
with a static M, or a symbolic one known to be a multiple of 16 (`util.assume.int ... udiv = 16`), gets
TileAndFuse with `NV_MMA_SYNC`/MFMA tiles. On the CPU, data tiling (mmt4d packing) fails to compile the
llama block with a symbolic sequence length ("all stack allocations need to be hoisted"); with the sizes
padded and hinted it compiles, and the block runs 2.5-6x faster (BENCHMARKS.md). A divisibility hint must
be true, so rocmc makes it true:
the operand is padded with zeros up to the next multiple (`tensor.pad`, which IREE fuses into the
contraction's dispatch), the padded size carries the hint, and the result is sliced back to the real
size. Zero rows/columns contribute nothing to the kept results, and zero-padding K adds zeros, so the
values are those of the unpadded contraction. Cost: at most multiple - 1 rows of extra work.
"""

from __future__ import annotations

from ...frontend.graph import TensorType
from ..emitter import Emitter, T, tensor_type

# The padded size's divisibility per target kind. GPUs: 64 gives IREE 3.13 its 64-row MMA workgroup
# tiles (16 already enables MMA, with 16-row tiles). CPU: 16, the row count of the AVX-512 f32 mmt4d
# tile; 8 and 64 measured the same at sequence 37-2048, and at sequence 1 (decode) a larger multiple
# costs more (64: 5.0 ms vs 2.0 ms for the llama block).
MULTIPLES = {"cpu": 16, "rocm": 64, "cuda": 64}


def multiple_for(target) -> int:
    return MULTIPLES[target.kind]


ASSUMED_MAX = 1 << 62  # the upper bound given with a divisibility hint


def padded_size(E: Emitter, d: str, multiple: int) -> str:
    """ceil(d / multiple) * multiple, with IREE told that it divides by `multiple`."""
    q = E.op(f"arith.divui {E.addi(d, multiple - 1)}, {E.index(multiple)} : index")
    p = E.muli(q, multiple)
    return E.op(f"util.assume.int {p}<umin = 0, umax = {ASSUMED_MAX}, udiv = {multiple}> : index", "d")


def pad_axes(E: Emitter, t: T, axes, multiple: int, value=0) -> T:
    """t with each symbolic dim in `axes` padded at the end with `value` (zeros by default) to a
    multiple of `multiple`. The padded dims get their own symbols; E.dim of the result gives the
    hinted sizes."""
    axes = [a for a in axes if not isinstance(t.shape[a], int)]
    if not axes:
        return t
    return E.memo(("pad", t.name, tuple(axes), multiple, value), lambda: _pad(E, t, axes, multiple, value))


def _pad(E: Emitter, t: T, axes, multiple: int, value) -> T:
    sizes = E.dims(t)
    new = list(sizes)
    high = ["0"] * t.rank
    for a in axes:
        new[a] = padded_size(E, sizes[a], multiple)
        high[a] = E.subi(new[a], sizes[a])
    shape = tuple(f"{d}__pad{multiple}" if i in axes else d for i, d in enumerate(t.shape))
    out = T("", TensorType(shape, t.type.dtype), t.elt)
    zero = E.const(value, t.mlir_elt)
    name = E.fresh("pad")
    with E.region(
        f"{name} = tensor.pad {t.name} low[{', '.join('0' * t.rank)}] high[{', '.join(map(str, high))}]",
        f": {t.mlir} to {out.mlir}",
        ["index"] * t.rank,
        "ix",
    ):
        E.emit(f"tensor.yield {zero} : {t.mlir_elt}")
    dyn = [str(new[i]) for i in range(t.rank) if not isinstance(t.shape[i], int)]
    out.name = E.op(f"flow.tensor.tie_shape {name} : {out.mlir}{{{', '.join(dyn)}}}", "pad")
    for i in range(t.rank):
        if not isinstance(t.shape[i], int):
            E.set_dim(out, i, new[i])
    return out


def slice_to(E: Emitter, t: T, like: TensorType, sizes) -> T:
    """The leading `sizes` of t (padded) as a tensor of type `like`; a size None keeps t's."""
    if tuple(t.shape) == tuple(like.shape):
        return t
    sizes = [E.dim(t, i) if s is None else s for i, s in enumerate(sizes)]
    ty = tensor_type(like.shape, t.mlir_elt)
    offsets = ", ".join("0" * t.rank)
    ones = ", ".join("1" * t.rank)
    r = E.op(
        f"tensor.extract_slice {t.name}[{offsets}] [{', '.join(str(s) for s in sizes)}] [{ones}] : {t.mlir} to {ty}"
    )
    return T(r, like, t.elt)
