"""The `dnn` implementation: nodes a DNN library serves become `dnn.<op>` extern calls (extern.py).

At load time the runtime binds the calls to the role's provider: MIOpen on hip devices, cuDNN on cuda
devices and the float64 reference on the CPU; what each call takes is rocmc.externs.DNN.

LSTM/GRU return their results packed along the time dim (y's rows, then h_n, c_n) and are sliced
apart here; attention (sdpa) maps to MIOpen's MHA and stays generated on cuda targets, where the
cuDNN provider has no such call.

On rocm targets convolutions use MIOpen by default (as MIGraphX does), the fused convolution too
(activation(conv2d + bias + residual), which the graph rewrite makes of CNN chains: MIOpen runs it
as a fusion plan where it can, cuDNN as one backend graph); every other op is opt-in,
per op (`impl={"softmax": "dnn"}`) or compile-wide (`libraries=["dnn"]`). `supports` names what
MIOpen cannot do (asymmetric padding, dilated or ceil-mode pooling, ...) so the registry falls back
to the generated implementation and records why.
"""

from __future__ import annotations

from ..externs import CONV_ACTIVATIONS, DNN, RNN_STATES, to_bits
from . import extern
from .emitter import Emitter, T, tensor_type
from .extern import reshape_back
from .registry import lowering

CONV_OPS = ("conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d")
# Ops calling the DNN library without being asked on rocm targets: the convolutions, plain and fused.
DEFAULT_ON_ROCM = CONV_OPS + ("fused_conv2d",)


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


def _fused_conv_scalars(attrs) -> dict:
    """conv2d's scalars, then the epilogue's activation as its index in CONV_ACTIVATIONS."""
    return {**_conv_scalars(attrs), "activation": CONV_ACTIVATIONS.index(attrs["activation"])}


def _pool_scalars(attrs) -> dict:
    (kh, kw), (sh, sw), ((ph, _), (pw, _)) = attrs["kernel_size"], attrs["stride"], attrs["padding"]
    out = {"kernel_h": kh, "kernel_w": kw, "stride_h": sh, "stride_w": sw, "pad_h": ph, "pad_w": pw}
    if "count_include_pad" in attrs:
        out["count_include_pad"] = int(attrs["count_include_pad"])
    return out


SCALARS = {
    **{op: _conv_scalars for op in CONV_OPS},
    "fused_conv2d": _fused_conv_scalars,
    "max_pool2d": _pool_scalars,
    "avg_pool2d": _pool_scalars,
    "lrn": lambda a: {"size": a["size"], "alpha": a["alpha"], "beta": a["beta"], "k": a["k"]},
    "batch_norm": lambda a: {"eps": a["eps"]},
    "elu": lambda a: {"alpha": a["alpha"]},
    "leaky_relu": lambda a: {"negative_slope": a["negative_slope"]},
    "clipped_relu": lambda a: {"ceiling": a["ceiling"]},
    "sdpa": lambda a: {"scale": a["scale"]},
}


def scalars_of(node) -> list[int]:
    """The node's attributes as the ABI's i64 scalars, in call order."""
    sig = DNN.signatures[node.op]
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
    **{op: lambda n: _asymmetric(n.attrs) for op in DEFAULT_ON_ROCM},
    "max_pool2d": _pool_limits,
    "avg_pool2d": _pool_limits,
    "lrn": _lrn_limits,
    "sdpa": _mha_limits,
}


def supports(node, target) -> str | None:
    missing = DNN.unavailable.get(target.kind, {})
    if node.op in missing:
        return missing[node.op]  # e.g. cuda devices get the cuDNN provider, which has no such call
    dtype = node.inputs[0].dtype.name
    allowed = DNN.op_dtypes.get(node.op, DNN.dtypes)
    if dtype not in allowed:
        return f"dtype {dtype} (MIOpen {node.op} takes {', '.join(allowed)})"
    limit = LIMITS.get(node.op)
    return limit(node) if limit else None


# ---- emission ----


def _view(node, rank: int):
    """The ABI's rank-`rank` view of an operand, as `extern.operand` takes it: softmax sees
    (outer, axis, inner), norms (N, C, spatial), activations a flat vector; None where the operand
    already is that view."""
    axis = node.attrs["axis"] if node.op in ("softmax", "log_softmax") else 1

    def sizes(E: Emitter, t: T):
        if t.rank == rank and (rank != 3 or axis == 1):
            return None
        dims = E.dims(t)
        if rank == 1:
            return [E.product(dims)]
        return [E.product(dims[:axis]), dims[axis], E.product(dims[axis + 1 :])]

    return sizes


def _operand_elt(node, i: int, x_elt: str) -> str:
    # Batch-norm statistics travel in f32 whatever x's storage type (MIOpen and cuDNN want that).
    return "f32" if node.op == "batch_norm" and i > 0 else x_elt


def lower_dnn(E: Emitter, node, ins: list, ctx) -> list:
    sig = DNN.signatures[node.op]
    x_elt = ins[0].mlir_elt
    args = []
    for i, ((_, rank), t) in enumerate(zip(sig.tensors, ins)):
        view = _view(node, rank)
        args.append(extern.operand(E, ctx, node, i, t, rank, _operand_elt(node, i, x_elt), lambda t: view(E, t)))
    out_rank = sig.tensors[0][1]
    r, out_ty = extern.call(E, ctx, node, DNN, node.inputs[0].dtype.name, args, scalars_of(node), out_rank, x_elt)
    if node.op in RNN_STATES:
        return _unpack_rnn(E, node, r, out_ty, ins[0])
    out = node.outputs[0]
    want = tensor_type(out.shape, x_elt)
    if _view(node, out_rank)(E, ins[0]) is None:
        res = E.op(f"tensor.cast {r} : {out_ty} to {want}", "y")
    else:
        res = reshape_back(E, r, out_ty, ins[0], want)
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
        outs.append(
            T(E.op(f"tensor.extract_slice {r}[{first}, 0, 0] [{sizes}] [1, 1, 1] : {r_ty} to {ty}", "y"), out.type)
        )
    return outs


def _row(E: Emitter, seq, k: int):
    """Index of the k-th state row: seq + k (an int when seq is static)."""
    return E.addi(seq, k)


def _register():
    for op in DNN.signatures:
        lowering(
            op,
            impl="dnn",
            kinds=("cpu", "rocm", "cuda"),
            default_on=("rocm",) if op in DEFAULT_ON_ROCM else (),
            library="dnn",
            priority=20,
            supports=supports,
        )(lower_dnn)


_register()
