"""The convolution planner of the DNN providers: conv1d/2d, their transposes and fused_conv2d.

Convolutions go through each library's plan API, the one that keeps a chosen kernel as an object
run on a list of (tensor id, device pointer): cuDNN's backend graph (an execution plan run by
cudnnBackendExecute with a variant pack) and MIOpen's Find 2.0 (a solution run by
miopenRunSolution with tensor arguments). The planner describes the problem (`ConvProblem`)
and binds the ABI's pointers to the library's tensor roles x, w, y (b); the vendor module builds
the `TensorOp` (the provider's `conv_builder`). The legacy algorithm-enum path remains for a
provider without a builder and for a problem the plan API rejects. fused_conv2d is a convolution
with an epilogue (+ residual, then an activation): what the vendor's plan doesn't fuse runs after
it as legacy calls.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...errors import DeviceError
from ...externs import CONV_ACTIVATIONS
from ...symbolic import INT, conv_size, conv_transpose_size
from .capi import P, _ints
from .plans import Plan, Replays, _release, _size, itemsize

if TYPE_CHECKING:
    from .dnn import DnnProvider


def _as4d(shape):
    """Rank-3 (N, C, L) -> (N, C, 1, L): 1D ops run as 2D with a unit height."""
    return tuple(shape) if len(shape) == 4 else (shape[0], shape[1], 1, shape[2])


def _conv_geometry(attrs, nsp, transpose):
    axes = ["_h", "_w"] if nsp == 2 else [""]
    get = lambda k, unit: [a for a in ([unit] if nsp == 1 else []) + [attrs[k + s] for s in axes]]  # noqa: E731
    return (get("stride", 1), get("pad", 0), get("dilation", 1), get("output_padding", 0) if transpose else [0, 0])


@dataclass(frozen=True)
class ConvProblem:
    """A convolution in the library's terms: `forward` computes y from x and w; `backward_data`
    (a transposed convolution) computes x from y and w, so there x is the ABI's result and y its
    input. Shapes are 4-d NCHW (1-d convolutions run with a unit height)."""

    direction: str  # "forward" | "backward_data"
    x: tuple
    w: tuple
    y: tuple
    pad: tuple
    stride: tuple
    dilation: tuple
    groups: int
    dtype: str
    bias: bool  # a (1, C_out, 1, 1) bias is added to the result
    residual: bool = False  # then a tensor of the result's shape (fused_conv2d's epilogue)
    activation: str = "none"  # then this activation (CONV_ACTIVATIONS)

    @property
    def out(self) -> str:
        """The role the ABI's result binds to."""
        return "y" if self.direction == "forward" else "x"

    @property
    def epilogue(self) -> bool:
        """Whether anything follows the bias: a residual add, an activation."""
        return self.residual or self.activation != "none"


@dataclass
class TensorOp:
    """A library plan run on device pointers bound to tensor roles: `run(pointers, ws)` takes one
    pointer per role of `roles`, in that order, and a workspace of `workspace` bytes (None when
    0). `fused_bias`: the plan adds the bias itself; `fused_epilogue`: the residual and the
    activation too."""

    roles: tuple
    run: object
    workspace: int = 0
    fused_bias: bool = False
    fused_epilogue: bool = False
    info: dict = field(default_factory=dict)


def _conv_problem(op, dtype, shapes, attrs, has_bias, residual=False) -> ConvProblem:
    """The ABI's convolution call in the library's terms; fused_conv2d's epilogue (`residual`, the
    `activation` scalar) rides along."""
    transpose = op.startswith("conv_transpose")
    nsp = 1 if op.endswith("1d") else 2
    xs, ws = _as4d(shapes[0]), _as4d(shapes[1])
    stride, pad, dil, opad = _conv_geometry(attrs, nsp, transpose)
    g = attrs["groups"]
    if transpose:
        spatial = [
            conv_transpose_size(INT, xs[2 + i], ws[2 + i], stride[i], pad[i], pad[i], dil[i], opad[i]) for i in range(2)
        ]
        out = (xs[0], ws[1] * g, *spatial)
        return ConvProblem("backward_data", out, ws, xs, tuple(pad), tuple(stride), tuple(dil), g, dtype, has_bias)
    spatial = [conv_size(INT, xs[2 + i], ws[2 + i], stride[i], pad[i], pad[i], dil[i]) for i in range(2)]
    out = (xs[0], ws[0], *spatial)
    activation = CONV_ACTIVATIONS[attrs["activation"]] if "activation" in attrs else "none"
    return ConvProblem(
        "forward", xs, ws, out, tuple(pad), tuple(stride), tuple(dil), g, dtype, has_bias, residual, activation
    )


# ABI pointer index of each tensor role but the one the ABI's result binds to (the residual is
# fused_conv2d's fourth operand)
_CONV_SOURCES = {"w": 1, "b": 2, "r": 3}


def _conv_plan(p: DnnProvider, op, dtype, shapes, attrs, ptrs) -> Plan:
    """A convolution through the vendor's plan API (`conv_builder`), the legacy calls where the
    provider has none or the plan API has no engine for the problem. What the plan leaves out of
    fused_conv2d's epilogue (the bias, the residual add, the activation) runs after it as legacy
    calls on the result."""
    prob = _conv_problem(op, dtype, shapes, attrs, ptrs[2] is not None, len(ptrs) > 3 and ptrs[3] is not None)
    out_rank = len(shapes[0])
    out_shape = getattr(prob, prob.out)
    out_shape = out_shape if out_rank == 4 else (out_shape[0], out_shape[1], out_shape[3])
    builder = getattr(p, "conv_builder", None)
    if builder is None:
        return _legacy_conv_plan(p, prob, ptrs, out_shape)
    # The search runs on the real inputs and a scratch result.
    scratch = p._malloc(_size(getattr(prob, prob.out)) * itemsize(dtype))
    keep: list = []
    try:
        bound = {
            prob.out: scratch,
            ("x" if prob.out == "y" else "y"): ptrs[0],
            **{r: ptrs[i] for r, i in _CONV_SOURCES.items() if i < len(ptrs)},
        }
        top = builder(p, prob, bound, keep)
    finally:
        p.rt.call("free", ptr=scratch)
    if top is None:  # no engine of the plan API takes this problem
        _release(p, keep)
        plan = _legacy_conv_plan(p, prob, ptrs, out_shape)
        plan.info["api"] = "legacy (the plan API had no engine)"
        return plan
    # ABI pointer (input 0, weights, bias, residual, or the result) of each role, in the op's order
    source = {**_CONV_SOURCES, prob.out: -1, ("x" if prob.out == "y" else "y"): 0}
    slots = tuple(source[r] for r in top.roles)
    execute, need, workspace = top.run, top.workspace, p.workspace
    bias = _bias_add(p, prob, keep) if prob.bias and not top.fused_bias else None
    epilogue = _epilogue(p, prob, keep) if prob.epilogue and not top.fused_epilogue else None
    out_slot = top.roles.index(prob.out)

    def launch(key):
        """key: the roles' pointers, the bias and the residual (or None), the workspace (or None)."""
        *args, b, r, ws = key
        execute(tuple(args), ws)
        if bias is not None:
            bias(b, args[out_slot])
        if epilogue is not None:
            epilogue(r, args[out_slot])

    replays = Replays(p, launch) if p.table.graph_launch else None
    if replays is not None:
        keep.append(replays)
    start = replays or launch

    def run(ptrs, y):
        start(
            tuple(y if i < 0 else ptrs[i] for i in slots)
            + (
                (ptrs[2] if bias is not None else None),
                (ptrs[3] if epilogue is not None else None),
                workspace(need) if need else None,
            )
        )

    info = {
        "api": p.table.conv_api,
        **top.info,
        "bias": ("fused" if top.fused_bias else "add") if prob.bias else None,
        "epilogue": _epilogue_form(prob, top.fused_epilogue),
        "graph_launch": replays is not None,
    }
    return Plan(out_shape, run, keep, info)


def _epilogue_form(prob: ConvProblem, fused: bool):
    """plan.info's record of where fused_conv2d's residual add and activation ran."""
    return ("fused" if fused else "separate") if prob.epilogue else None


def _bias_add(p: DnnProvider, prob: ConvProblem, keep):
    """y += b over channels, the legacy call (cudnnAddTensor / miopenConvolutionForwardBias)."""
    out = getattr(prob, prob.out)
    yD = p.tensor(out, prob.dtype, keep)
    bD = p.tensor((1, out[1], 1, 1), prob.dtype, keep)
    scale = ctypes.c_float(1.0)
    keep.append(scale)
    one = ctypes.byref(scale)

    def add(b, y):
        p.api.call("add_tensor", h=p.handle, alpha=one, bD=bD, b=b, beta=one, yD=yD, y=y)

    return add


def _epilogue(p: DnnProvider, prob: ConvProblem, keep):
    """y = activation(y + r) in place, by legacy calls: the residual add is miopenOpTensor where the
    table has it (MIOpen's bias call only broadcasts a (1, C, 1, 1) bias), cudnnAddTensor
    (C = alpha*A + beta*C, here of equal dims) otherwise; the relu is the activation call with x = y."""
    t, api = p.table, p.api
    yD = p.tensor(getattr(prob, prob.out), prob.dtype, keep)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    keep += [one, zero]
    steps = []
    if prob.residual and api.has("op_tensor"):
        steps.append(
            lambda r, y: api.call(
                "op_tensor",
                h=p.handle,
                tensor_op=t.enums["tensor_op_add"],
                alpha1=ctypes.byref(one),
                aD=yD,
                a=y,
                alpha2=ctypes.byref(one),
                bD=yD,
                b=r,
                beta=ctypes.byref(zero),
                cD=yD,
                c=y,
            )
        )
    elif prob.residual:
        steps.append(
            lambda r, y: api.call(
                "add_tensor", h=p.handle, alpha=ctypes.byref(one), bD=yD, b=r, beta=ctypes.byref(one), yD=yD, y=y
            )
        )
    if prob.activation != "none":
        mode, _ = t.activations[prob.activation]
        act = p._out(P, "create_act")
        keep.append(("destroy_act", act))
        api.call(
            "set_act",
            desc=act,
            mode=mode,
            nan=t.enums.get("propagate_nan", 0),
            coef=0.0,
            act_alpha=1.0,
            act_beta=1.0,
            act_gamma=0.0,
        )
        steps.append(
            lambda r, y: api.call(
                "act_fwd",
                h=p.handle,
                desc=act,
                alpha=ctypes.byref(one),
                xD=yD,
                x=y,
                beta=ctypes.byref(zero),
                yD=yD,
                y=y,
            )
        )

    def run(r, y):
        for step in steps:
            step(r, y)

    return run


def conv_descriptor(p: DnnProvider, prob: ConvProblem, keep: list) -> int:
    """The problem's convolution descriptor (destroyed with `keep`): pads, strides, dilations, cross-correlation,
    groups; f32 accumulation and, where the library sets a math mode (cuDNN), FMA for f32 and tensor ops else.
    A library whose descriptor takes no compute type (MIOpen) is not passed one (capi's call takes the named
    arguments its table lists)."""
    t, api = p.table, p.api
    conv = p._out(P, "create_conv")
    keep.append(("destroy_conv", conv))
    api.call(
        "set_conv",
        desc=conv,
        n=2,
        pads=_ints(prob.pad),
        stride_a=_ints(prob.stride),
        dil_a=_ints(prob.dilation),
        mode=t.enums["cross_correlation"],
        ctype=t.dtypes["f32"],
    )
    api.call("set_conv_groups", desc=conv, groups=prob.groups)
    if api.has("set_conv_math"):
        api.call("set_conv_math", desc=conv, math=t.enums["fma_math" if prob.dtype == "f32" else "tensor_op_math"])
    return conv


def _legacy_conv_plan(p: DnnProvider, prob: ConvProblem, ptrs, out_shape) -> Plan:
    """The legacy calls: descriptors, the algorithm search, cudnnConvolutionForward & co."""
    t, api, keep = p.table, p.api, []
    transpose = prob.direction == "backward_data"
    # The library's x and y descriptors are the problem's x and y in both directions: backward data
    # computes dx (the transposed conv's output) from dy (its input).
    xD, yD = p.tensor(prob.x, prob.dtype, keep), p.tensor(prob.y, prob.dtype, keep)
    wD = p.tensor(prob.w, prob.dtype, keep, filter=True)
    conv = conv_descriptor(p, prob, keep)
    kind = "conv_bwd_data" if transpose else "conv_fwd"
    descs = (
        {"dyD": yD, "wD": wD, "dxD": xD, "conv": conv} if transpose else {"xD": xD, "wD": wD, "yD": yD, "conv": conv}
    )
    search_bytes = t.search_workspace
    if search_bytes is None:
        size = ctypes.c_size_t()
        api.call(f"{kind}_ws", h=p.handle, size_out=ctypes.byref(size), **descs)
        search_bytes = size.value
    y_scratch = p._malloc(_size(getattr(prob, prob.out)) * itemsize(prob.dtype))
    try:
        algo, need = _search(p, kind, descs, ptrs, y_scratch, search_bytes, transpose)
    finally:
        p.rt.call("free", ptr=y_scratch)
        p.release_workspace()  # the search's scratch is larger than any one algorithm needs
    bias = _bias_add(p, prob, keep) if prob.bias else None
    epilogue = _epilogue(p, prob, keep) if prob.epilogue else None
    alpha, beta = ctypes.byref(p.one), ctypes.byref(p.zero)
    names = ("dy", "dx") if transpose else ("x", "y")

    def run(ptrs, y):
        ws = p.workspace(need) if need else None
        api.call(
            kind,
            h=p.handle,
            alpha=alpha,
            beta=beta,
            algo=algo,
            ws=ws,
            ws_size=need,
            **descs,
            **{names[0]: ptrs[0], "w": ptrs[1], names[1]: y},
        )
        if bias is not None:
            bias(ptrs[2], y)
        if epilogue is not None:
            epilogue(ptrs[3], y)

    return Plan(
        out_shape,
        run,
        keep,
        {"api": "legacy", "algo": algo, "workspace": need, "epilogue": _epilogue_form(prob, False)},
    )


def _search(p: DnnProvider, kind, descs, ptrs, y_scratch, search_bytes, transpose):
    """The library's algorithm search on scratch output; returns (algo, workspace bytes)."""
    t = p.table
    perf = (ctypes.c_byte * (t.perf.size * 8))()
    count = ctypes.c_int()
    names = ("dy", "dx") if transpose else ("x", "y")
    p.api.call(
        f"{kind}_find",
        h=p.handle,
        req=8,
        n_out=ctypes.byref(count),
        perf=perf,
        ws=p.workspace(search_bytes) if search_bytes else None,
        ws_size=search_bytes,
        exhaustive=False,
        **descs,
        **{names[0]: ptrs[0], "w": ptrs[1], names[1]: y_scratch},
    )
    base = ctypes.addressof(perf)
    for i in range(count.value):
        rec = base + i * t.perf.size
        if t.perf.status is not None and ctypes.c_int.from_address(rec + t.perf.status).value != 0:
            continue
        return (
            ctypes.c_int.from_address(rec + t.perf.algo).value,
            ctypes.c_size_t.from_address(rec + t.perf.memory).value,
        )
    raise DeviceError(f"{t.name}: no {kind.replace('_', ' ')} algorithm for this problem")


PLANNERS = {op: _conv_plan for op in ("conv1d", "conv2d", "fused_conv2d", "conv_transpose1d", "conv_transpose2d")}
