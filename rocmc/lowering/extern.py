"""The `miopen` implementation: library-backed nodes become calls to imported functions.

Each node is lowered to `call @miopen.<op>(tensors..., i64 scalars...)` against a module-level
`func.func private` declaration; iree-compile turns the declaration into a VM import, and at load
time the runtime binds it to the provider of the device (MIOpen on hip, cuDNN on cuda, numpy on the
CPU). The ABI (operand order, ranks, scalar encoding) is defined once, in
rocmc.runtime.providers.abi, and read by both sides.

Operands cross as `!hal.buffer_view`s, made explicitly (`hal.tensor.export` / `hal.tensor.import`,
which is what IREE inserts for a tensor-typed import): a graph constant passed to a call becomes a
module global exported once, when the module is loaded, rather than a tensor IREE would copy out of
its constant pool into a fresh buffer before every call (measured on an H100: 33 us per call for
147 KB of conv weights, 97 us for 2.4 MB, BENCHMARKS.md). Absent optional operands are likewise one
global empty buffer.

LSTM/GRU return their results packed along the time dim (y's rows, then h_n, c_n) and are sliced
apart here; attention (sdpa) maps to MIOpen's MHA and stays generated on cuda targets, where the
cuDNN provider has no such call.

On rocm targets convolutions use MIOpen by default (as MIGraphX does); every other op is opt-in,
per op (`impl={"softmax": "miopen"}`) or compile-wide (`libraries=["miopen"]`). `supports` names what
MIOpen cannot do (asymmetric padding, dilated or ceil-mode pooling, ...) so the registry falls back
to the generated implementation and records why.
"""
from __future__ import annotations

import numpy as np

from ..frontend.dtypes import dtype as _dtype
from ..runtime.providers.abi import DTYPES, NAMESPACE, NO_CUDNN_CALL, RNN_STATES, SIGNATURES, import_name, to_bits
from .emitter import Emitter, T, tensor_type
from .registry import lowering

BV = "!hal.buffer_view"

CONV_OPS = ("conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d")
# Storage types MIOpen accepts per op (its batch-norm, LRN and RNN kernels have no bf16 variant).
OP_DTYPES = {"batch_norm": ("f32", "f16"), "lrn": ("f32", "f16"), "lstm": ("f32", "f16"), "gru": ("f32", "f16")}


# ---- attributes -> the ABI's i64 scalars ---------------------------------------------------------

def _conv_scalars(attrs) -> dict:
    n = len(attrs["stride"])
    axes = ("h", "w") if n == 2 else ("",)
    out = {}
    for i, a in enumerate(axes):
        sfx = f"_{a}" if a else ""
        out["stride" + sfx] = attrs["stride"][i]
        out["pad" + sfx] = attrs["padding"][i][0]
        out["dilation" + sfx] = attrs["dilation"][i]
        if "output_padding" in attrs:
            out["output_padding" + sfx] = attrs["output_padding"][i]
    out["groups"] = attrs["groups"]
    return out


def _pool_scalars(attrs) -> dict:
    (kh, kw), (sh, sw), ((ph, _), (pw, _)) = attrs["kernel_size"], attrs["stride"], attrs["padding"]
    out = {"kernel_h": kh, "kernel_w": kw, "stride_h": sh, "stride_w": sw, "pad_h": ph, "pad_w": pw}
    if "count_include_pad" in attrs:
        out["count_include_pad"] = int(attrs["count_include_pad"])
    return out


SCALARS = {
    **{op: _conv_scalars for op in CONV_OPS},
    "max_pool2d": _pool_scalars, "avg_pool2d": _pool_scalars,
    "lrn": lambda a: {"size": a["size"], "alpha": a["alpha"], "beta": a["beta"], "k": a["k"]},
    "batch_norm": lambda a: {"eps": a["eps"]},
    "elu": lambda a: {"alpha": a["alpha"]},
    "leaky_relu": lambda a: {"negative_slope": a["negative_slope"]},
    "clipped_relu": lambda a: {"ceiling": a["ceiling"]},
    "sdpa": lambda a: {"scale": a["scale"]},
}


def scalars_of(node) -> list[int]:
    """The node's attributes as the ABI's i64 scalars, in call order."""
    sig = SIGNATURES[node.op]
    values = SCALARS.get(node.op, lambda a: {})(node.attrs)
    return [to_bits(values[n]) if n in sig.floats else int(values[n]) for n in sig.scalars]


# ---- what MIOpen can't do ------------------------------------------------------------------------

def _asymmetric(attrs) -> str | None:
    pads = attrs["padding"]
    if any(lo != hi for lo, hi in pads):
        return f"asymmetric padding {pads} (MIOpen pads both sides of a dim equally)"
    return None


def _pool_limits(node) -> str | None:
    a = node.attrs
    if any(d != 1 for d in a.get("dilation", [1, 1])):
        return f"dilation {a['dilation']} (MIOpen pooling has no dilation)"
    if a["ceil_mode"]:
        return "ceil_mode=True (MIOpen pooling rounds the output size down)"
    if any(p[0] > k // 2 for p, k in zip(a["padding"], a["kernel_size"])):
        return f"padding {a['padding']} beyond half the kernel {a['kernel_size']}"
    return _asymmetric(a)


def _lrn_limits(node) -> str | None:
    if node.attrs["size"] % 2 == 0:
        return f"even size {node.attrs['size']} (the library's window is centred; torch's is not for even sizes)"
    return None


def _mha_limits(node) -> str | None:
    """MIOpen's MHA forward takes q, k, v of one head count, no mask tensor and no causal mode."""
    q, k = node.inputs[0], node.inputs[1]
    if node.inputs[3] is not None:
        return "a mask tensor (MIOpen's MHA forward takes none)"
    if node.attrs["is_causal"]:
        return "is_causal=True (MIOpen's MHA forward has no causal mode)"
    if q.shape[1] != k.shape[1]:
        return f"grouped kv heads ({q.shape[1]} q heads, {k.shape[1]} kv heads; MIOpen's MHA needs equal counts)"
    return None


LIMITS = {
    **{op: lambda n: _asymmetric(n.attrs) for op in CONV_OPS},
    "max_pool2d": _pool_limits, "avg_pool2d": _pool_limits,
    "lrn": _lrn_limits,
    "sdpa": _mha_limits,
}


def supports(node, target) -> str | None:
    if target.kind == "cuda" and node.op in NO_CUDNN_CALL:
        return NO_CUDNN_CALL[node.op]    # cuda devices get the cuDNN provider, which has no such call
    dtype = node.inputs[0].dtype.name
    allowed = OP_DTYPES.get(node.op, DTYPES)
    if dtype not in allowed:
        return f"dtype {dtype} (MIOpen {node.op} takes {', '.join(allowed)})"
    limit = LIMITS.get(node.op)
    return limit(node) if limit else None


# ---- emission -------------------------------------------------------------------------------------

def _dyn_dims(sizes: list) -> str:
    return "{" + ", ".join(sizes) + "}" if sizes else ""


def _reshaped(E: Emitter, t: T, sizes: list, elt: str) -> str:
    """`t` reshaped to `sizes` (ints or SSA index values), as a fully dynamic tensor. IREE's own
    reshape takes the sizes as operands, so nothing shape-like has to cross a dispatch."""
    src_dyn = [d for d in E.dims(t) if not isinstance(d, int)]
    dst = [E.as_index(s) for s in sizes]
    ty = tensor_type(["?"] * len(dst), elt)
    return E.op(f"flow.tensor.reshape {t.name} : {t.mlir}{_dyn_dims(src_dyn)} -> {ty}{_dyn_dims(dst)}", "r")


def _product(E: Emitter, sizes: list):
    """Product of static and dynamic sizes: an int when all are static, else an SSA index."""
    const = 1
    dyn = None
    for s in sizes:
        if isinstance(s, int):
            const *= s
        else:
            dyn = s if dyn is None else E.op(f"arith.muli {dyn}, {s} : index")
    if dyn is None:
        return const
    return dyn if const == 1 else E.op(f"arith.muli {dyn}, {E.index(const)} : index")


def _view_sizes(E: Emitter, node, t: T, rank: int):
    """Sizes of the ABI's rank-`rank` view of operand `t`, or None when `t` already is that view:
    softmax sees (outer, axis, inner), norms (N, C, spatial), activations a flat vector."""
    axis = node.attrs["axis"] if node.op in ("softmax", "log_softmax") else 1
    if t.rank == rank and (rank != 3 or axis == 1):
        return None
    dims = E.dims(t)
    if rank == 1:
        return [_product(E, dims)]
    return [_product(E, dims[:axis]), dims[axis], _product(E, dims[axis + 1:])]


def _abi_view(E: Emitter, node, t: T, rank: int, elt: str) -> str:
    sizes = _view_sizes(E, node, t, rank)
    if sizes is None:
        return E.op(f"tensor.cast {t.name} : {t.mlir} to {tensor_type(['?'] * rank, elt)}", "x")
    return _reshaped(E, t, sizes, elt)


def _global_view(E: Emitter, ctx, key: str, array: np.ndarray, elt: str) -> str:
    """A module global holding `array` as a buffer view, exported once by an initializer; loaded here."""
    from .module import constant_op
    name = "rocmc_bv_" + "".join(c if c.isalnum() else "_" for c in key)
    if f"global:{name}" not in ctx.decl_keys:
        init = Emitter()
        c = constant_op(init, ctx, array, array.shape, elt, "x")
        bv = init.op(f"hal.tensor.export {c} : {tensor_type(array.shape, elt)} -> {BV}", "bv")
        body = "\n".join(init.lines)
        ctx.declare(f"global:{name}", f"util.global private @{name} : {BV}\nutil.initializer {{\n{body}\n"
                                      f"  util.global.store {bv}, @{name} : {BV}\n  util.return\n}}")
    return E.op(f"util.global.load @{name} : {BV}", "bv")


def _absent(E: Emitter, ctx, elt: str, rank: int = 1) -> str:
    """An empty buffer of the operand's rank: how the ABI passes an absent optional operand."""
    return _global_view(E, ctx, f"absent_{elt}_{rank}", np.zeros((0,) * rank, _dtype(elt).np), elt)


def _constant_view(E: Emitter, ctx, node, i: int, rank: int, elt: str) -> str | None:
    """Operand i as a global buffer view when it is a graph constant, else None."""
    src = node.inputs[i]
    if src is None or src.producer is None or src.producer.op != "constant":
        return None
    name = src.producer.attrs["name"]
    arr = np.asarray(ctx.graph.constants[name]).astype(_dtype(elt).np)
    view = _view_sizes(E, node, T("", src.type), rank)    # static shape: sizes as ints, nothing emitted
    arr = np.ascontiguousarray(arr if view is None else arr.reshape(view))
    return _global_view(E, ctx, f"{name}_{elt}_{'x'.join(map(str, arr.shape))}", arr, elt)


def _export(E: Emitter, view: str, rank: int, elt: str) -> str:
    """A computed operand (an all-dynamic rank-`rank` tensor) as a buffer view."""
    ty = tensor_type(["?"] * rank, elt)
    dims = [E.op(f"tensor.dim {view}, {E.index(i)} : {ty}", "d") for i in range(rank)]
    return E.op(f"hal.tensor.export {view} : {ty}{{{', '.join(dims)}}} -> {BV}", "bv")


def _import(E: Emitter, bv: str, rank: int, elt: str) -> str:
    """The call's result buffer view as an all-dynamic tensor (sizes read from the view)."""
    dims = [E.op(f"hal.buffer_view.dim<{bv} : {BV}>[{i}] : index", "d") for i in range(rank)]
    return E.op(f"hal.tensor.import {bv} : {BV} -> {tensor_type(['?'] * rank, elt)}{{{', '.join(dims)}}}", "r")


def _operand_elt(node, i: int, x_elt: str) -> str:
    # Batch-norm statistics travel in f32 whatever x's storage type (MIOpen and cuDNN want that).
    return "f32" if node.op == "batch_norm" and i > 0 else x_elt


def lower_extern(E: Emitter, node, ins: list, ctx) -> list:
    sig = SIGNATURES[node.op]
    x_elt = ins[0].mlir_elt
    args, types = [], []
    for i, ((_, rank), t) in enumerate(zip(sig.tensors, ins)):
        elt = _operand_elt(node, i, x_elt)
        if t is None:
            args.append(_absent(E, ctx, elt, rank))
        else:
            args.append(_constant_view(E, ctx, node, i, rank, elt)
                        or _export(E, _abi_view(E, node, E.convert(t, elt), rank, elt), rank, elt))
        types.append(BV)
    for v in scalars_of(node):
        args.append(E.const(v, "i64"))
        types.append("i64")
    out_rank = sig.tensors[0][1]
    out_ty = tensor_type(["?"] * out_rank, x_elt)
    name = f"{NAMESPACE}.{import_name(node.op, node.inputs[0].dtype.name)}"
    sig_text = f"({', '.join(types)}) -> {BV}"
    ctx.declare(f"extern:{name}", f"func.func private @{name}{sig_text}")
    r = _import(E, E.op(f"func.call @{name}({', '.join(args)}) : {sig_text}", "call"), out_rank, x_elt)
    out = node.outputs[0]
    ctx.externs.append({"node": f"%{out.id}", "op": node.op, "import": name, "impl": "miopen",
                        "dtype": node.inputs[0].dtype.name, "attrs": dict(node.attrs)})
    if node.op in RNN_STATES:
        return _unpack_rnn(E, node, r, out_ty, ins[0])
    want = tensor_type(out.shape, x_elt)
    if _view_sizes(E, node, ins[0], sig.tensors[0][1]) is None:
        res = E.op(f"tensor.cast {r} : {out_ty} to {want}", "y")
    else:
        res = _reshape_back(E, r, out_ty, ins[0], want)
    return [T(res, out.type)]


def _unpack_rnn(E: Emitter, node, r: str, r_ty: str, x: T) -> list:
    """y, h_n[, c_n] sliced out of the packed (seq + states, batch, hidden) result."""
    seq, batch = E.dim(x, 0), E.dim(x, 1)
    hidden = node.outputs[0].shape[2]
    outs = []
    for i, out in enumerate(node.outputs):
        first, rows = (0, seq) if i == 0 else (_row(E, seq, i - 1), 1)
        sizes = ", ".join(str(s) for s in (rows, batch, hidden))
        ty = tensor_type(out.shape, x.mlir_elt)
        outs.append(T(E.op(f"tensor.extract_slice {r}[{first}, 0, 0] [{sizes}] [1, 1, 1] : {r_ty} to {ty}", "y"),
                      out.type))
    return outs


def _row(E: Emitter, seq, k: int):
    """Index of the k-th state row: seq + k (an int when seq is static)."""
    if isinstance(seq, int):
        return seq + k
    return seq if k == 0 else E.op(f"arith.addi {seq}, {E.index(k)} : index")


def _reshape_back(E: Emitter, r: str, r_ty: str, like: T, want: str) -> str:
    """The call's result (as many elements as `like`) in `like`'s shape; its dynamic sizes are read
    back from the result, as the provider returned it."""
    rank = r_ty.count("?")
    src = [E.op(f"tensor.dim {r}, {E.index(i)} : {r_ty}", "d") for i in range(rank)]
    dst = [d for d in E.dims(like) if not isinstance(d, int)]
    return E.op(f"flow.tensor.reshape {r} : {r_ty}{_dyn_dims(src)} -> {want}{_dyn_dims(dst)}", "y")


def _register():
    for op in SIGNATURES:
        lowering(op, impl="miopen", kinds=("cpu", "rocm", "cuda"),
                 default_on=("rocm",) if op in CONV_OPS else (), library="miopen", priority=20,
                 supports=supports)(lower_extern)


_register()
