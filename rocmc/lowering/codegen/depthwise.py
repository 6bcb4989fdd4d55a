"""Depthwise convolution (groups == input channels) on the CPU, as a sum of shifted windows.

The grouped path of conv.py (`conv_2d_ngchw_gfchw` with one channel per group) reaches IREE 3.13's
CPU backend as a generic with a k x k reduction, which it tiles with a 16-wide vector over the
3-wide kernel dim: MobileNetV2's 144x56x56 3x3 layer took 1.6-2.5 ms, 55% of the whole model.
Here the output is one elementwise linalg.generic whose operands are the k x k shifted windows of
the padded input (tensor.extract_slice, which IREE folds into the dispatch's loads), each window's
per-channel weight and the bias: it vectorizes along the output row (0.17 ms for that layer).

- stride > 1: a strided window is a strided load (measured slower than the named conv). The padded
  input is first split into its stride phases, x[.., h*s + a, ..] -> p[.., a, .., h, ..] (one
  transpose), after which every window is a contiguous slice of one phase.
- channel multiplier m = F / C > 1: computed as (N, C, m, spatial) and collapsed to (N, F, spatial).
- f16/bf16 accumulate in f32 and round once, as conv.py does.
Batch and spatial dims may be symbolic: sizes are index arithmetic that folds when static.
"""

from __future__ import annotations

import math

import numpy as np

from ...dtypes import acc_mlir
from ..emitter import Emitter, T, affine_map, tensor_type
from ..registry import lowering
from .conv import _csv, _pad, _result, _typed

# Index arithmetic on sizes (ints fold here, SSA values become arith ops), ceildivsi included.
_FOLD = {
    "addi": lambda a, b: a + b,
    "subi": lambda a, b: a - b,
    "muli": lambda a, b: a * b,
    "divsi": lambda a, b: a // b,
    "ceildivsi": lambda a, b: -(-a // b),
}


def _ix(E: Emitter, op: str, a, b):
    if isinstance(a, int) and isinstance(b, int):
        return _FOLD[op](a, b)
    return E.op(f"arith.{op} {E.as_index(a)}, {E.as_index(b)} : index", "s")


# Every kernel tap is two operands of the generic: past this many taps a kernel is left to the
# grouped convolution (compile time and operand count grow with the taps).
MAX_TAPS = 64


def _reshape(E: Emitter, t: T, sizes, assoc, expand: bool) -> T:
    """tensor.expand_shape (to `sizes`) or collapse_shape with the reassociation `assoc`."""
    out = _typed(E.fresh("r"), sizes, t)
    groups = "[" + ", ".join("[" + _csv(g) + "]" for g in assoc) + "]"
    if expand:
        E.emit(
            f"{out.name} = tensor.expand_shape {t.name} {groups} output_shape [{_csv(sizes)}] "
            f": {t.mlir} into {out.mlir}"
        )
    else:
        E.emit(f"{out.name} = tensor.collapse_shape {t.name} {groups} : {t.mlir} into {out.mlir}")
    return out


def _slice(E: Emitter, t: T, offsets, sizes, keep) -> T:
    """A unit-stride slice of t, keeping the dims in `keep` (the others have size 1 and are dropped)."""
    kept = [sizes[i] for i in keep]
    out = _typed(E.fresh("s"), kept, t)
    E.emit(
        f"{out.name} = tensor.extract_slice {t.name}[{_csv(offsets)}] [{_csv(sizes)}] "
        f"[{_csv([1] * t.rank)}] : {t.mlir} to {out.mlir}"
    )
    return out


def _phases(E: Emitter, xp: T, strides) -> T:
    """(N, C, P0, P1, ..) with each P_i a multiple of s_i -> (N, C, s0, s1, .., P0/s0, P1/s1, ..)."""
    nsp = len(strides)
    dims = E.dims(xp)
    split = dims[:2]
    for p, s in zip(dims[2:], strides):
        split += [_ix(E, "divsi", p, s), s]
    assoc = [[0], [1]] + [[2 + 2 * i, 3 + 2 * i] for i in range(nsp)]
    xe = _reshape(E, xp, split, assoc, expand=True)
    perm = [0, 1] + [3 + 2 * i for i in range(nsp)] + [2 + 2 * i for i in range(nsp)]
    sizes = [split[i] for i in perm]
    out = _typed(E.fresh("ph"), sizes, xp)
    init = E.empty(sizes, xp.mlir_elt)
    E.emit(
        f"{out.name} = linalg.transpose ins({xe.name} : {xe.mlir}) outs({init} : {out.mlir}) "
        f"permutation = [{_csv(perm)}]"
    )
    return out


def _windows(E: Emitter, x: T, kernel, strides, dilations, padding) -> tuple[list, list]:
    """The input window of every kernel tap, each (N, C, *out), and the output's spatial sizes."""
    dims = E.dims(x)
    padded = [_ix(E, "addi", d, lo + hi) for d, (lo, hi) in zip(dims[2:], padding)]
    out = [
        _ix(E, "addi", _ix(E, "divsi", _ix(E, "subi", p, d * (k - 1) + 1), s), 1)
        for p, k, s, d in zip(padded, kernel, strides, dilations)
    ]
    # Round each padded size up to a multiple of its stride, so the phases have equal sizes.
    extra = [_ix(E, "subi", _ix(E, "muli", _ix(E, "ceildivsi", p, s), s), p) for p, s in zip(padded, strides)]
    highs = [_ix(E, "addi", hi, e) for (_, hi), e in zip(padding, extra)]
    xp = _pad(E, x, [0, 0] + [lo for lo, _ in padding], [0, 0] + highs, 0.0)
    nsp = len(kernel)
    phased = any(s > 1 for s in strides)
    src = _phases(E, xp, strides) if phased else xp
    windows = []
    for tap in _taps(kernel):
        at = [t * d for t, d in zip(tap, dilations)]
        if phased:
            offsets = [0, 0] + [a % s for a, s in zip(at, strides)] + [a // s for a, s in zip(at, strides)]
            sizes = dims[:2] + [1] * nsp + out
            keep = [0, 1] + list(range(2 + nsp, 2 + 2 * nsp))
        else:
            offsets, sizes, keep = [0, 0] + at, dims[:2] + out, list(range(2 + nsp))
        windows.append(_slice(E, src, offsets, sizes, keep))
    return windows, out


def _taps(kernel) -> list:
    """Kernel offsets in row-major order: the order of the generic's window and weight operands."""
    return [tuple(t) for t in np.ndindex(*kernel)]


def _per_channel(E: Emitter, w: T, channels: int, mult: int) -> list:
    """The weight (F, 1, *k) as one (C, m) tensor per kernel tap."""
    nsp = w.rank - 2
    kernel = list(w.shape[2:])
    assoc = [[0, 1]] + [[i + 1] for i in range(1, w.rank)]
    we = _reshape(E, w, [channels, mult, 1, *kernel], assoc, expand=True)
    return [_slice(E, we, [0, 0, 0, *tap], [channels, mult, 1] + [1] * nsp, [0, 1]) for tap in _taps(kernel)]


def _lower_depthwise(E: Emitter, node, ins, ctx):
    x, w, b = ins
    a = node.attrs
    channels, nsp = x.shape[1], x.rank - 2
    mult = w.shape[0] // channels
    windows, out = _windows(E, x, list(w.shape[2:]), a["stride"], a["dilation"], a["padding"])
    weights = _per_channel(E, w, channels, mult)
    bias = [_reshape(E, b, [channels, mult], [[0, 1]], expand=True)] if b is not None else []
    rank = nsp + 3  # (n, c, j, *spatial), j the channel multiplier
    sizes = [E.dim(x, 0), channels, mult, *out]
    store, acc = x.mlir_elt, acc_mlir(x.mlir_elt)
    init = E.empty(sizes, store)
    x_map = affine_map(rank, [0, 1, *range(3, rank)])
    c_map = affine_map(rank, [1, 2])
    operands = windows + weights + bias
    maps = [x_map] * len(windows) + [c_map] * (len(weights) + len(bias)) + [affine_map(rank, range(rank))]

    def body(E, v):
        n = len(windows)
        total = E.cast_scalar(v[2 * n], b.mlir_elt, acc) if b is not None else None
        for xv, wv in zip(v[:n], v[n : 2 * n]):
            p = E.op(f"arith.mulf {E.cast_scalar(xv, store, acc)}, {E.cast_scalar(wv, w.mlir_elt, acc)} : {acc}")
            total = p if total is None else E.op(f"arith.addf {total}, {p} : {acc}")
        return [E.cast_scalar(total, acc, store)]

    r = E.generic(
        [(t.name, t.mlir) for t in operands], [(init, tensor_type(sizes, store))], maps, ["parallel"] * rank, body
    )
    y = _reshape(
        E,
        _typed(r[0], sizes, x),
        [sizes[0], channels * mult, *out],
        [[0], [1, 2]] + [[i] for i in range(3, rank)],
        expand=False,
    )
    return _result(E, node, y)


def _is_depthwise(node, target):
    """None when the node is a depthwise conv this form takes, else why not."""
    x, w = node.inputs[0].type, node.inputs[1].type
    groups = node.attrs["groups"]
    if groups != x.shape[1]:
        return f"groups ({groups}) differ from the input channels ({x.shape[1]}): not depthwise"
    taps = math.prod(w.shape[2:])
    if taps > MAX_TAPS:
        return f"kernel of {taps} taps (this form takes up to {MAX_TAPS})"
    return None


lowering("conv1d", "conv2d", impl="depthwise", kinds=("cpu",), priority=50, supports=_is_depthwise)(_lower_depthwise)
