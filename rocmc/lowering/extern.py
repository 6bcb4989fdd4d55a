"""Extern calls: library-backed nodes become calls to functions the module imports.

A node is lowered to `call @<library>.<op>(buffer views..., i64 scalars...)` against a module-level
`func.func private` declaration; iree-compile turns the declaration into a VM import, and at load
time the runtime binds it to that library's provider on the device (rocmc.runtime.providers). What
each call takes is rocmc.externs (plain data the runtime reads too); the libraries' lowerings
(dnn.py, blas.py) decide which nodes call and how their operands are viewed, and use this
module's helpers to emit the call.

Operands cross as `!hal.buffer_view`s, made explicitly (`hal.tensor.export` / `hal.tensor.import`,
which is what IREE inserts for a tensor-typed import): a graph constant passed to a call becomes a
module global exported once, when the module is loaded, rather than a tensor IREE would copy out of
its constant pool into a fresh buffer before every call (measured on an H100: 33 us per call for
147 KB of conv weights, 97 us for 2.4 MB, BENCHMARKS.md). Absent optional operands are likewise one
global empty buffer.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..externs import Library, import_name
from ..dtypes import dtype as _dtype
from .emitter import Emitter, T, tensor_type

BV = "!hal.buffer_view"


def operand(
    E: Emitter, ctx, node, i: int | None, t: T | None, rank: int, elt: str, view: Callable | None = None
) -> str:
    """Operand `i` of `node` (None: a value computed inside the lowering) as the buffer view a call
    takes: rank `rank`, element type `elt`. `view(t)` gives the sizes of the ABI's view of `t` (None:
    `t` already has the call's rank). An absent operand is an empty buffer; a graph constant a global
    exported once at load."""
    if t is None:
        return _absent(E, ctx, elt, rank)
    src = node.inputs[i] if i is not None else None
    if src is not None and src.producer is not None and src.producer.op == "constant":
        name = src.producer.attrs["name"]
        arr = np.asarray(ctx.graph.constants[name]).astype(_dtype(elt).np)
        sizes = view(T("", src.type)) if view else None  # static shape: sizes as ints, nothing emitted
        arr = np.ascontiguousarray(arr if sizes is None else arr.reshape(sizes))
        return _global_view(E, ctx, f"{name}_{elt}_{'x'.join(map(str, arr.shape))}", arr, elt)
    t = E.convert(t, elt)
    sizes = view(t) if view else None
    if sizes is None:
        v = E.op(f"tensor.cast {t.name} : {t.mlir} to {tensor_type(['?'] * rank, elt)}", "x")
    else:
        v = _reshaped(E, t, sizes, elt)
    return _export(E, v, rank, elt)


def call(
    E: Emitter,
    ctx,
    node,
    library: Library,
    dtype: str,
    args: list,
    scalars: list,
    out_rank: int,
    elt: str,
    op: str | None = None,
) -> tuple[str, str]:
    """Declare `<library>.<op>` for `dtype` (`op`: the library's function, default the node's op),
    call it on buffer views `args` and i64 `scalars`, and record the call in the module's metadata.
    Returns the result as an all-dynamic tensor of rank `out_rank` and its type."""
    operands = list(args) + [E.const(v, "i64") for v in scalars]
    types = [BV] * len(args) + ["i64"] * len(scalars)
    name = f"{library.name}.{import_name(op or node.op, dtype)}"
    sig_text = f"({', '.join(types)}) -> {BV}"
    ctx.declare(f"extern:{name}", f"func.func private @{name}{sig_text}")
    r = _import(E, E.op(f"func.call @{name}({', '.join(operands)}) : {sig_text}", "call"), out_rank, elt)
    ctx.externs.append(
        {
            "node": f"%{node.outputs[0].id}",
            "op": node.op,
            "import": name,
            "impl": library.name,
            "library": library.name,
            "dtype": dtype,
            "attrs": dict(node.attrs),
        }
    )
    return r, tensor_type(["?"] * out_rank, elt)


def reshape_back(E: Emitter, r: str, r_ty: str, like: T, want: str) -> str:
    """The call's result (as many elements as `like`) in `like`'s shape."""
    return reshaped_to(E, r, r_ty, E.dims(like), want)


def reshaped_to(E: Emitter, r: str, r_ty: str, sizes: list, want: str) -> str:
    """The call's result reshaped to `want`, whose dynamic sizes are the SSA values among `sizes`;
    the result's own sizes are read back from it, as the provider returned it."""
    rank = r_ty.count("?")
    src = [E.op(f"tensor.dim {r}, {E.index(i)} : {r_ty}", "d") for i in range(rank)]
    dst = [d for d in sizes if not isinstance(d, int)]
    return E.op(f"flow.tensor.reshape {r} : {r_ty}{_dyn_dims(src)} -> {want}{_dyn_dims(dst)}", "y")


def _dyn_dims(sizes: list) -> str:
    return "{" + ", ".join(sizes) + "}" if sizes else ""


def _reshaped(E: Emitter, t: T, sizes: list, elt: str) -> str:
    """`t` reshaped to `sizes` (ints or SSA index values), as a fully dynamic tensor. IREE's own
    reshape takes the sizes as operands, so nothing shape-like has to cross a dispatch."""
    src_dyn = [d for d in E.dims(t) if not isinstance(d, int)]
    dst = [E.as_index(s) for s in sizes]
    ty = tensor_type(["?"] * len(dst), elt)
    return E.op(f"flow.tensor.reshape {t.name} : {t.mlir}{_dyn_dims(src_dyn)} -> {ty}{_dyn_dims(dst)}", "r")


def _global_view(E: Emitter, ctx, key: str, array: np.ndarray, elt: str) -> str:
    """A module global holding `array` as a buffer view, exported once by an initializer; loaded here."""
    from .module import constant_op

    name = "rocmc_bv_" + "".join(c if c.isalnum() else "_" for c in key)
    if f"global:{name}" not in ctx.decl_keys:
        init = Emitter()
        c = constant_op(init, ctx, array, array.shape, elt, "x")
        bv = init.op(f"hal.tensor.export {c} : {tensor_type(array.shape, elt)} -> {BV}", "bv")
        body = "\n".join(init.lines)
        ctx.declare(
            f"global:{name}",
            f"util.global private @{name} : {BV}\nutil.initializer {{\n{body}\n"
            f"  util.global.store {bv}, @{name} : {BV}\n  util.return\n}}",
        )
    return E.op(f"util.global.load @{name} : {BV}", "bv")


def _absent(E: Emitter, ctx, elt: str, rank: int = 1) -> str:
    """An empty buffer of the operand's rank: how the ABI passes an absent optional operand."""
    return _global_view(E, ctx, f"absent_{elt}_{rank}", np.zeros((0,) * rank, _dtype(elt).np), elt)


def _export(E: Emitter, view: str, rank: int, elt: str) -> str:
    """A computed operand (an all-dynamic rank-`rank` tensor) as a buffer view."""
    ty = tensor_type(["?"] * rank, elt)
    dims = [E.op(f"tensor.dim {view}, {E.index(i)} : {ty}", "d") for i in range(rank)]
    return E.op(f"hal.tensor.export {view} : {ty}{{{', '.join(dims)}}} -> {BV}", "bv")


def _import(E: Emitter, bv: str, rank: int, elt: str) -> str:
    """The call's result buffer view as an all-dynamic tensor (sizes read from the view)."""
    dims = [E.op(f"hal.buffer_view.dim<{bv} : {BV}>[{i}] : index", "d") for i in range(rank)]
    return E.op(f"hal.tensor.import {bv} : {BV} -> {tensor_type(['?'] * rank, elt)}{{{', '.join(dims)}}}", "r")
