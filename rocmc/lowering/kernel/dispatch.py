"""Emitting a hand-written kernel: the executable that embeds its code object, and the dispatch to it.

Every kernel source becomes `hal.executable.source`s of the module (the code object inline, so the .vmfb runs
without the kernel files: for AMDGPU one holding all of the source's kernels, for PTX one a kernel) and each use a
`flow.dispatch` whose operands follow the kernel's ABI: i32 push constants, then the bindings, each in
the order of its KernelFamily (kernels.py), the lowerings naming them.
"""

from __future__ import annotations

import struct
from typing import Mapping, Sequence

from ...frontend.graph import Node, TensorType
from .. import kernels
from ..emitter import Emitter, T
from ..module import LowerContext

# The generic executable target each object is keyed by (one key per module: IREE builds one variant
# per key, whatever the compile target).
_OBJECT_TARGET = {
    "rocm": '#hal.executable.target<"rocm", "rocm-hsaco-fb">',
    "cuda": '#hal.executable.target<"cuda", "cuda-nvptx-fb">',
}
_PLACEHOLDER = "tensor<4xi32>"

# Elements of each kernel element type (kernels.DTYPES) in one 16-byte vector access.
WIDE = {"f32": 4, "f16": 8, "bf16": 8}


def executable(ctx: LowerContext, family: kernels.KernelFamily, symbol: str) -> tuple[str, kernels.KernelObject]:
    """Declare (once per module) the executable holding kernel `symbol` of `family`; returns its name and object.

    An AMDGPU code object is machine code: one executable per source holds all of its kernels. PTX is compiled by
    the driver when the module loads, every entry of it: an executable per kernel holds only that entry's PTX, so a
    module's first load compiles the kernels it dispatches, not every variant of their sources."""
    source = family.source
    kind, arch = kernels.split_arch(family.arch or ctx.target.code_arch)
    name = f"rocmc_{symbol}_{arch}" if kind == "cuda" else f"rocmc_{source.split('.')[0]}_{arch}"
    if name in ctx.executables:  # declared by an earlier dispatch: neither built nor cut again
        return name, ctx.executables[name]
    obj = kernels.build(source, arch)
    if kind == "cuda":
        obj, specs, path = obj.only(symbol), [kernels.KERNELS[symbol]], f"{symbol}.ptx"
    else:
        specs, path = [s for s in kernels.KERNELS.values() if s.source == source], source
    blob = f'dense<"0x{obj.data.hex().upper()}"> : vector<{len(obj.data)}xi8>'
    X = Emitter()  # module-level text: no node's location
    with X.region(
        f"hal.executable.source private @{name} <objects = #hal.executable.objects<{{"
        f'{_OBJECT_TARGET[obj.kind]} = [#hal.executable.object<{{path = "{path}", data = {blob}}}>]}}>>'
    ):
        for ordinal, spec in enumerate(specs):
            bindings = ["#hal.pipeline.binding<storage_buffer, ReadOnly>"] * spec.inputs + [
                "#hal.pipeline.binding<storage_buffer>"
            ] * spec.outputs
            wg = ", ".join(f"{n} : index" for n in spec.workgroup)
            with X.region(
                f"hal.executable.export public @{spec.symbol} ordinal({ordinal}) layout(#hal.pipeline.layout<"
                f"constants = {spec.constants}, bindings = [{', '.join(bindings)}]>) "
                f"count(%device: !hal.device, %groups: index) -> (index, index, index)",
                f"<{{workgroup_size = [{wg}]"
                + (f", workgroup_local_memory = {family.local_memory} : index" if family.local_memory else "")
                + "}>",
            ):
                one = X.index(1)
                X.emit(f"hal.return %groups, {one}, {one} : index, index, index")
    ctx.declare(name, "\n".join(X.lines))
    ctx.executables[name] = obj
    return name, obj


def dispatch(
    E: Emitter,
    ctx: LowerContext,
    node: Node,
    symbol: str,
    constants: Mapping,
    inputs: Mapping,
    result: TensorType,
    result_dims: Sequence,
    groups,
) -> T:
    """`flow.dispatch` of kernel `symbol`, whose one result is `result` (see dispatch_results)."""
    return dispatch_results(E, ctx, node, symbol, constants, inputs, {None: (result, result_dims)}, groups)[0]


def dispatch_results(
    E: Emitter,
    ctx: LowerContext,
    node: Node,
    symbol: str,
    constants: Mapping,
    inputs: Mapping,
    results: Mapping,
    groups,
) -> list[T]:
    """`flow.dispatch` of kernel `symbol`; its results in the family's binding order.

    constants: push-constant name -> i32 SSA name or Python int; inputs: name -> T of every read-only binding
    (None: a placeholder buffer, the kernel told by a flag not to read it) and every tied one (updated in
    place: its result is tied to the operand); results: the other written bindings' name -> (TensorType,
    sizes as ints or index SSA), in binding order (the key None: the one written binding); groups: the grid.
    """
    spec = kernels.KERNELS[symbol]
    fam = spec.family
    exe, obj = executable(ctx, fam, symbol)
    operands = [b.name for b in fam.bindings if not b.writes or b.tied]
    written = [b for b in fam.bindings if b.writes]
    new = [b.name for b in written if not b.tied]
    if list(results) == [None] and len(new) == 1:
        results = {new[0]: results[None]}
    assert set(constants) == set(fam.constant_names) and set(inputs) == set(operands), (symbol, constants, inputs)
    assert list(results) == new, (symbol, list(results), new)
    cs = [i32(E, constants[n]) for n in fam.constant_names]
    args, types = list(cs), ["i32"] * len(cs)
    for t in (inputs[n] for n in operands):
        if t is None:
            args.append(E.op(f"arith.constant dense<[0, 1, 2, 3]> : {_PLACEHOLDER}", "cst"))
            types.append(_PLACEHOLDER)
        else:
            args.append(t.name)
            types.append(t.mlir + dyn_dims(E, t))
    outs, res_types = [], []
    for b in written:
        if b.tied:
            outs.append(inputs[b.name].type)
            res_types.append(inputs[b.name].name)
        else:
            ty, sizes = results[b.name]
            outs.append(ty)
            res_types.append(
                T("", ty).mlir + _dims_suffix([d for s, d in zip(ty.shape, sizes) if not isinstance(s, int)])
            )
    many = len(outs) > 1
    name = E.fresh("k")
    E.emit(
        f"{name}{f':{len(outs)}' if many else ''} = flow.dispatch @{exe}::@{symbol}[{E.as_index(groups)}]"
        f"({', '.join(args)}) : ({', '.join(types)}) -> " + (f"({', '.join(res_types)})" if many else res_types[0])
    )
    ctx.kernels.append(
        {
            "node": f"%{node.outputs[0].id}",
            "op": node.op,
            "symbol": symbol,
            "arch": obj.arch,
            "source": spec.source,
            "sha256": obj.sha256[:16],
            "bytes": len(obj.data),
        }
    )
    return [T(f"{name}#{i}" if many else name, ty) for i, ty in enumerate(outs)]


# ---- scalar helpers ----------------------------------------------------------------------------------------


def dyn_dims(E: Emitter, t: T) -> str:
    return _dims_suffix([E.dim(t, i) for i, d in enumerate(t.shape) if not isinstance(d, int)])


def _dims_suffix(dims) -> str:
    return "{" + ", ".join(dims) + "}" if dims else ""


def i32(E: Emitter, v) -> str:
    """An i32 push constant from a Python int or an index SSA value."""
    if isinstance(v, int):
        return E.const(v - (1 << 32) if v >= 1 << 31 else v, "i32")
    return E.op(f"arith.index_cast {v} : index to i32")


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]
