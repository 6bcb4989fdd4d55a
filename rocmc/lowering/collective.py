"""Lowerings of the collectives (all_reduce, all_gather) of a tensor-parallel rank's program.

`iree` (rocm, cuda): IREE's own `flow.collective.*` on the default channel. IREE enqueues them on the
device's stream as RCCL (hip) or NCCL (cuda) calls, so a collective waits on nothing on the host; the
channel spans the run's ranks because the runtime bootstraps it from rocmc's process group
(rocmc/runtime/native). What IREE 3.13 gets wrong, and how this lowering avoids it: `lower_iree`.

`host` (cpu): an extern call `collectives.<op>` served by the process group on the host (the CPU
has no collective library, and IREE's CPU devices implement no channel).
"""

from __future__ import annotations

import math

from ..externs import COLLECTIVES
from . import extern
from .emitter import Emitter, T, tensor_type
from .registry import lowering

# flow.collective's element types, by MLIR element type (an all_gather only copies, so any 16-bit type
# travels as f16 and i8/u8 as si8)
_ELEMENT = {"f32": "f32", "f16": "f16", "f64": "f64", "i32": "si32", "i64": "si64", "i8": "si8"}
_REDUCIBLE = ("f32", "f16", "bf16", "f64", "i32", "i64")


def _iree_supports(node, target) -> str | None:
    d = node.inputs[0].dtype
    ok = _REDUCIBLE if node.op == "all_reduce" else _REDUCIBLE + ("i8", "u8", "bool")
    return None if d.name in ok else f"dtype {d.name} (IREE's collectives here take {', '.join(ok)})"


# Rows (of the tensor viewed as (rows, inner)) per collective when the size is only known at run time: a
# power of two near CHUNK_ELEMENTS elements.
CHUNK_ELEMENTS = 1 << 22


def lower_iree(E: Emitter, node, ins: list, ctx) -> list:
    """One collective on the whole tensor when its size is static. A size known only at run time takes one
    collective on the tensor padded to the op's max_size when it has one (`_bounded`), else static pieces
    in host-side loops (`_pieces`; each trip waits on the device: slow, for graphs without a bound). What
    of IREE 3.13 shapes this:
    - a collective is sized from the tensor's static type: a dynamic one gets a count of 0 (all_reduce
      returns zeros, all_gather faults);
    - its CUDA all_gather passes the gathered count as NCCL's per-rank send count (reads and writes past
      the buffers), so all_gather is an all_to_all of the rank's x repeated `world` times, which delivers
      rank r's copy to slot r of every rank: the same bytes an all_gather moves;
    - its CUDA driver maps bf16 to NCCL's f64: bf16 is summed in f32 and gathered as 16-bit words (f16);
    - a channel made in a function is made on every call (`_channel`)."""
    x, out = ins[0], node.outputs[0]
    dt = node.inputs[0].dtype.name
    world = node.attrs["world"] if node.op == "all_gather" else None
    if dt == "bf16" and world is None:
        x = E.convert(x, "f32")
    elif dt == "bf16":
        x = T(_bitcast(E, x, "f16"), x.type, "f16")
    elif dt in ("u8", "bool"):
        x = T(_bitcast(E, x, "i8"), x.type, "i8")
    elt = x.mlir_elt
    dims = E.dims(x)
    src_dyn = [d for d in dims if not isinstance(d, int)]
    inner = math.prod(d for d in dims if isinstance(d, int))
    rows = E.product(src_dyn)
    view_ty = tensor_type([rows if isinstance(rows, int) else "?", inner], elt)
    view = E.op(
        f"flow.tensor.reshape {x.name} : {x.mlir}{extern._dyn_dims(src_dyn)} -> {view_ty}"
        f"{extern._dyn_dims([] if isinstance(rows, int) else [rows])}",
        "xv",
    )
    lead = [world] if world else []
    bound = node.attrs.get("max_size")
    if isinstance(rows, int):
        res = _piece(E, ctx, view, view_ty, 0, rows, inner, elt, world)
        res_ty, res_dyn = tensor_type(lead + [rows, inner], elt), []
    elif bound is not None:
        res, res_ty = _bounded(E, ctx, node, view, view_ty, rows, max(1, bound // inner), inner, elt, world)
        res_dyn = [rows]
    else:
        res, res_ty = _pieces(E, ctx, view, view_ty, rows, inner, elt, world)
        res_dyn = [rows]
    dst = [E.as_index(d) for d in _out_sizes(E, node, x) if not isinstance(d, int)]
    y = E.op(
        f"flow.tensor.reshape {res} : {res_ty}{extern._dyn_dims(res_dyn)} -> {tensor_type(out.shape, elt)}"
        f"{extern._dyn_dims(dst)}",
        "y",
    )
    if elt == out.type.dtype.mlir:
        return [T(y, out.type)]
    if world is None:  # bf16 summed in f32
        return [E.convert(T(y, out.type, elt), out.type.dtype.mlir)]
    return [T(_bitcast(E, T(y, out.type, elt), out.type.dtype.mlir), out.type)]


def _out_sizes(E: Emitter, node, x: T) -> list:
    """The result's sizes: x's, or x's with the leading one times the ranks (all_gather)."""
    dims = E.dims(x)
    return dims if node.op == "all_reduce" else [E.muli(dims[0], node.attrs["world"])] + dims[1:]


def _pad_rows(E: Emitter, view: str, view_ty: str, high, out_ty: str, elt: str) -> str:
    """The (rows, inner) view with `high` zero rows after it."""
    zero = E.const(0, elt)
    padded = E.fresh("pad")
    with E.region(
        f"{padded} = tensor.pad {view} low[0, 0] high[{high}, 0]", f": {view_ty} to {out_ty}", args=("index", "index")
    ):
        E.emit(f"tensor.yield {zero} : {elt}")
    return padded


def _cut(E: Emitter, res: str, res_ty: str, lead: list, rows: str, inner: int, elt: str) -> tuple[str, str]:
    """The first `rows` rows of a padded result ((rows, inner), or (world, rows, inner) gathered)."""
    n = len(lead) + 2
    cut_ty = tensor_type(lead + ["?", inner], elt)
    cut = E.op(
        f"tensor.extract_slice {res}[{', '.join(['0'] * n)}] [{', '.join(map(str, lead + [rows, inner]))}] "
        f"[{', '.join(['1'] * n)}] : {res_ty} to {cut_ty}",
        "cut",
    )
    return cut, cut_ty


def _bitcast(E: Emitter, x: T, elt: str) -> str:
    """x's bytes as another element type of the same width."""
    dyn = extern._dyn_dims([d for d in E.dims(x) if not isinstance(d, int)])
    return E.op(f"flow.tensor.bitcast {x.name} : {x.mlir}{dyn} -> {tensor_type(x.shape, elt)}{dyn}", "bc")


def _channel(E: Emitter, ctx) -> str:
    """The default channel, created once when the module is loaded (a module global): made inside a
    function, IREE 3.13 creates it, and so initializes NCCL/RCCL's communicator, on every call."""
    ctx.declare(
        "global:rocmc_channel",
        "util.global private @rocmc_channel : !flow.channel\nutil.initializer {\n"
        "  %ch = flow.channel.default : !flow.channel\n  util.global.store %ch, @rocmc_channel : !flow.channel\n"
        "  util.return\n}",
    )
    return E.op("util.global.load @rocmc_channel : !flow.channel", "ch")


def _piece(E: Emitter, ctx, view: str, view_ty: str, off, rows: int, inner: int, elt: str, world) -> str:
    """The collective of rows [off, off + rows) of `view`: (rows, inner) reduced, or (world, rows, inner)
    gathered."""
    ty = tensor_type([rows, inner], elt)
    whole = view_ty == ty and off == 0
    part = (
        view
        if whole
        else E.op(f"tensor.extract_slice {view}[{off}, 0] [{rows}, {inner}] [1, 1] : {view_ty} to {ty}", "part")
    )
    ch = _channel(E, ctx)
    if world is None:
        e = E.empty([rows, inner], elt)
        return E.op(
            f"flow.collective.all_reduce sum, {_ELEMENT[elt]}, {e}, {part}, {ch} : ({ty}, {ty}, "
            f"!flow.channel) -> {e} as {ty}",
            "ar",
        )
    rep_ty = tensor_type([world, rows, inner], elt)
    rep = E.generic(
        [(part, ty)],
        [(E.empty([world, rows, inner], elt), rep_ty)],
        ["affine_map<(d0, d1, d2) -> (d1, d2)>", "affine_map<(d0, d1, d2) -> (d0, d1, d2)>"],
        ["parallel"] * 3,
        lambda E2, a: [a[0]],
    )[0]
    e = E.empty([world, rows, inner], elt)
    return E.op(
        f"flow.collective.all_to_all {_ELEMENT[elt]}, {e}, {rep}, {ch} : ({rep_ty}, {rep_ty}, "
        f"!flow.channel) -> {e} as {rep_ty}",
        "ag",
    )


def _bounded(E: Emitter, ctx, node, view: str, view_ty: str, rows: str, most: int, inner: int, elt: str, world):
    """A run-time row count of at most `most` (the op's max_size): the view padded with zero rows to `most`,
    one static collective, the padding cut from the result. The module checks the bound."""
    ok = E.op(f"arith.cmpi ule, {rows}, {E.index(most)} : index", "fits")
    E.check(ok, f"{node.op} {node.describe()}: more than its max_size={node.attrs['max_size']} elements")
    static_ty = tensor_type([most, inner], elt)
    padded = _pad_rows(E, view, view_ty, E.subi(most, rows), static_ty, elt)
    lead = [world] if world else []
    res = _piece(E, ctx, padded, static_ty, 0, most, inner, elt, world)
    return _cut(E, res, tensor_type(lead + [most, inner], elt), lead, rows, inner, elt)


def _pieces(E: Emitter, ctx, view: str, view_ty: str, rows: str, inner: int, elt: str, world):
    """The collective of a (rows, inner) view whose row count is known at run time: big chunks in one
    loop, then the rest in small chunks (the view padded with zero rows to a whole number of them; the
    padding is cut from the result). Two loops: IREE 3.13's stream analysis gives up on a long chain."""
    lead = [world] if world else []
    big = 1 << max(0, (CHUNK_ELEMENTS // inner).bit_length() - 1)
    small = max(1, big // 16)
    padded_rows = E.muli(E.op(f"arith.ceildivui {rows}, {E.index(small)} : index", "n"), small)
    padded = _pad_rows(E, view, view_ty, E.subi(padded_rows, rows), view_ty, elt)
    acc_ty = tensor_type(lead + ["?", inner], elt)
    acc = E.empty(lead + [padded_rows, inner], elt)

    def loop(acc, trips, first, size: int):
        i, arg, res = E.fresh("i"), E.fresh("acc"), E.fresh("acc")
        with E.region(
            f"{res} = scf.for {i} = {E.index(0)} to {trips} step {E.index(1)} iter_args({arg} = {acc}) -> ({acc_ty})"
        ):
            off = E.addi(first, E.muli(i, size))
            piece = _piece(E, ctx, padded, view_ty, off, size, inner, elt, world)
            offs = ", ".join(["0"] * len(lead) + [off, "0"])
            put = E.op(
                f"tensor.insert_slice {piece} into {arg}[{offs}] [{', '.join(map(str, lead + [size, inner]))}] "
                f"[{', '.join(['1'] * (len(lead) + 2))}] : {tensor_type(lead + [size, inner], elt)} into {acc_ty}",
                "put",
            )
            E.emit(f"scf.yield {put} : {acc_ty}")
        return res

    full = E.op(f"arith.divui {rows}, {E.index(big)} : index", "full")
    done = E.muli(full, big)
    acc = loop(acc, full, E.index(0), big)
    acc = loop(acc, E.op(f"arith.divui {E.subi(padded_rows, done)}, {E.index(small)} : index", "trips"), done, small)
    return _cut(E, acc, acc_ty, lead, rows, inner, elt)


def _host_supports(node, target) -> str | None:
    d = node.inputs[0].dtype.name
    return None if d in COLLECTIVES.dtypes else f"dtype {d} (the host collectives take {', '.join(COLLECTIVES.dtypes)})"


def lower_host(E: Emitter, node, ins: list, ctx) -> list:
    x, out = ins[0], node.outputs[0]
    elt = x.mlir_elt
    arg = extern.operand(E, ctx, node, 0, x, 1, elt, lambda t: [E.product(E.dims(t))])
    r, r_ty = extern.call(E, ctx, node, COLLECTIVES, node.inputs[0].dtype.name, [arg], [], 1, elt)
    return [T(extern.reshaped_to(E, r, r_ty, _out_sizes(E, node, x), tensor_type(out.shape, elt)), out.type)]


lowering("all_reduce", "all_gather", impl="iree", kinds=("rocm", "cuda"), priority=10, supports=_iree_supports)(
    lower_iree
)
lowering("all_reduce", "all_gather", impl="host", kinds=("cpu",), priority=10, supports=_host_supports)(lower_host)
