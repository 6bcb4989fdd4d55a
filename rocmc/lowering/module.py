"""Graph -> MLIR module: choose an implementation per node, emit, parse, verify, write bytecode."""
from __future__ import annotations

import io
import json
import operator
from dataclasses import dataclass, field

import numpy as np

from .._version import __version__
from ..errors import CompileError, LoweringError, RocmcError
from ..frontend.graph import Graph, TensorType
from ..frontend.opdef import dim_constraints
from ..signature import input_specs
from . import registry
from .emitter import Emitter, T, mlir_string, tensor_type
from .compiler import iree_version
from .generated.shape import Ix
from .target import Target


@dataclass
class LowerContext:
    """What a lowering may use besides its operands: the target and module-level additions."""
    target: Target
    graph: Graph
    decls: list = field(default_factory=list)        # module-level ops (extern decls, executables)
    decl_keys: set = field(default_factory=set)
    resources: dict = field(default_factory=dict)    # resource name -> numpy array
    kernels: list = field(default_factory=list)      # hand-written code objects embedded (for metadata)
    externs: list = field(default_factory=list)      # extern call imports (for metadata)
    # GPU sdpa with a symbolic key length (attention.py): "decomposed" in @main, which records the
    # score count of each such node in `long_sdpa`; "fused" in @main_long, which the runtime calls
    # when those scores would not fit.
    sdpa_form: str = "decomposed"
    long_sdpa: list = field(default_factory=list)
    _resource_of: dict = field(default_factory=dict)  # (id(array), elt) -> resource name

    def declare(self, key: str, text: str) -> None:
        """Add a module-level op once (keyed, so several nodes can share it)."""
        if key not in self.decl_keys:
            self.decl_keys.add(key)
            self.decls.append(text)

    def constant(self, E: Emitter, array: np.ndarray, type: TensorType, hint: str = "k") -> T:
        """Emit a tensor constant; large ones become MLIR resources (no text round trip)."""
        arr = np.asarray(array, dtype=type.dtype.np, order="C")
        if type.dtype.kind == "bool":
            i8 = constant_op(E, self, arr.astype(np.int8), type.shape, "i8", hint)
            return E.convert(T(i8, type, "i8"), "i1")
        return T(constant_op(E, self, arr, type.shape, type.dtype.mlir, hint), type)


SMALL = 16


def constant_op(E: Emitter, ctx: LowerContext, arr: np.ndarray, shape, elt: str, hint: str) -> str:
    ty = tensor_type(shape, elt)
    if arr.size <= SMALL:
        flat = arr.reshape(-1)
        splat = flat.size > 0 and np.all(flat.view(np.uint8).reshape(flat.size, -1) == flat[:1].view(np.uint8))
        raw = (flat[:1] if splat else flat).tobytes()
        return E.op(f'arith.constant dense<"0x{raw.hex().upper()}"> : {ty}', "cst")
    # A module global holding a resource: every function of the module (and initializers) loads the
    # same one, so the weights are stored once whatever uses them.
    key = (id(arr), elt, arr.shape)
    name = ctx._resource_of.get(key)
    if name is None or ctx.resources.get(name) is not arr:
        name = f"rocmc_{hint}{len(ctx.resources)}"
        ctx.resources[name] = arr
        ctx._resource_of[key] = name
        ctx.declare(f"global:{name}", f"util.global private @{name} = dense_resource<{name}> : {ty}")
    return E.op(f"util.global.load @{name} : {ty}", "cst")


@dataclass
class Lowered:
    target: Target
    text: str                  # MLIR text as emitted (resources elided)
    bytecode: bytes            # verified module as MLIR bytecode, what iree-compile reads
    metadata: dict


def signature(graph: Graph) -> dict:
    return {
        "inputs": input_specs(graph),
        "outputs": [{"name": f"out{i}", "dtype": v.dtype.name, "shape": list(v.shape)}
                    for i, v in enumerate(graph.outputs)],
    }


@dataclass
class _Function:
    name: str
    args: list
    rets: list
    lines: list
    choices: list


def _emit_function(graph: Graph, ctx: LowerContext, impl, libraries, name: str,
                   constraints: list) -> _Function:
    """One function computing the graph: an implementation per node, emitted in order, after the
    checks of its inputs' sizes."""
    E = Emitter()
    env: dict[int, T] = {}
    args = [T(f"%arg{i}", TensorType(v.shape, v.dtype), v.dtype.abi_mlir) for i, v in enumerate(graph.inputs)]
    E.loc = 'loc("rocmc.checks")'
    _emit_checks(E, graph, args, constraints)
    for v, arg in zip(graph.inputs, args):
        E.loc = f'loc("rocmc.{v.id}:input")'
        env[v.id] = E.convert(arg, "i1") if v.dtype.kind == "bool" else arg
    choices = []
    for node in graph.nodes:
        E.loc = f'loc("rocmc.{node.outputs[0].id}:{node.op}")'
        if node.op == "constant":
            out = node.outputs[0]
            env[out.id] = ctx.constant(E, graph.constants[node.attrs["name"]], out.type, "w")
            continue
        choice = registry.choose(node, ctx.target, impl, libraries)
        operands = [None if v is None else env[v.id] for v in node.inputs]
        try:
            results = choice.impl.fn(E, node, operands, ctx)
        except RocmcError:
            raise
        except Exception as e:  # a bug in a lowering: name the node, never a raw traceback alone
            raise LoweringError(f"{node.describe()}: {choice.impl.name} lowering failed: {e!r}") from e
        if len(results) != len(node.outputs):
            raise LoweringError(f"{node.describe()}: lowering gave {len(results)} results, expected {len(node.outputs)}")
        for v, r in zip(node.outputs, results):
            if r.mlir_elt != v.dtype.mlir or r.type.shape != v.type.shape:
                r = E.convert(r, v.dtype.mlir, v.type) if r.type.shape == v.type.shape else r
            if r.mlir_elt != v.dtype.mlir or len(r.type.shape) != v.type.rank:
                raise LoweringError(f"{node.describe()}: {choice.impl.name} lowering returned {r.mlir}, "
                                    f"expected {tensor_type(v.type.shape, v.dtype.mlir)}")
            env[v.id] = T(r.name, v.type)
        choices.append(choice.record(node))
    E.loc = 'loc("rocmc.return")'
    rets = []
    for v in graph.outputs:
        r = env[v.id]
        if v.dtype.kind == "bool":
            r = E.convert(r, "i8")
        rets.append(r)
    return _Function(name, args, rets, E.lines, choices)


class _IndexArith(Ix):
    """symbolic's arithmetic on index values, for the sizes the checks compare."""

    def floordiv(self, a, b):
        return self._op("floordivsi", a, b, operator.floordiv)


def _emit_checks(E: Emitter, graph: Graph, args: list, constraints: list) -> None:
    """Asserts that the sizes of a call are those the module was built for: a symbol has one size
    across the inputs, and every constraint holds. The runtime checks the same from the metadata
    first (with values in its messages); these make the module safe whatever its metadata says."""
    sizes: dict = {}
    for arg, v in zip(args, graph.inputs):
        for axis, d in enumerate(v.shape):
            if not isinstance(d, str):
                continue
            size = E.dim(arg, axis)
            if d not in sizes:
                sizes[d] = (size, v.name, axis)
                continue
            first, name, first_axis = sizes[d]
            ok = E.op(f"arith.cmpi eq, {first}, {size} : index", "ok")
            E.check(ok, f"dim {axis} of input {v.name!r} equals dim {first_axis} of input {name!r} ({d})")
    values = {d: size for d, (size, _, _) in sizes.items()}
    ar = _IndexArith(E)
    for c in constraints:
        a, b = E.as_index(c.lhs.compute(ar, values)), c.rhs.compute(ar, values)
        if c.kind == "divisible":
            ok = _divisible(E, a, b)
        else:
            ok = E.op(f"arith.cmpi sge, {a}, {E.as_index(b)} : index", "ok")
        E.check(ok, c.describe())


def _divisible(E: Emitter, a: str, b) -> str:
    """a % b == 0 and b > 0 (remsi by b <= 0 is never evaluated)."""
    zero = E.index(0)
    if isinstance(b, int):
        if b <= 0:
            return E.op("arith.constant false", "ok")
        rem = E.op(f"arith.remsi {a}, {E.index(b)} : index")
        return E.op(f"arith.cmpi eq, {rem}, {zero} : index", "ok")
    safe = E.op(f"arith.maxsi {b}, {E.index(1)} : index")
    rem = E.op(f"arith.remsi {a}, {safe} : index")
    exact = E.op(f"arith.cmpi eq, {rem}, {zero} : index", "ok")
    positive = E.op(f"arith.cmpi sgt, {b}, {zero} : index", "ok")
    return E.op(f"arith.andi {exact}, {positive} : i1", "ok")


def _function_text(f: _Function, attrs: str = "") -> list[str]:
    sig_in = ", ".join(f"{a.name}: {a.mlir}" for a in f.args)
    sig_out = ", ".join(r.mlir for r in f.rets)
    return [f"func.func @{f.name}({sig_in}) -> ({sig_out}) {attrs}{{", *f.lines,
            f"  return {', '.join(r.name for r in f.rets)} : {sig_out}", "}"]


def lower(graph: Graph, target, impl=None, libraries=()) -> Lowered:
    graph.validate()
    target = Target.parse(target)
    ctx = LowerContext(target, graph)
    constraints = dim_constraints(graph)
    main = _emit_function(graph, ctx, impl, libraries, "main", constraints)
    functions = [main]
    meta = {
        "rocmc": __version__,
        "iree": iree_version(),
        "graph": graph.name,
        "graph_hash": graph.hash(),
        "graph_text": str(graph),
        "target": str(target),
        "signature": signature(graph),
        "constraints": [c.to_json() for c in constraints],
        "implementations": main.choices,
        "kernels": ctx.kernels,
        "externs": ctx.externs,
    }
    if ctx.long_sdpa:
        # The same graph with every such sdpa fused (sharing constants, kernels and imports): what
        # the runtime calls when a decomposed sdpa's scores would exceed the limit.
        from .generated.attention import DECOMPOSE_UP_TO_SCORES
        kernels, externs, terms = list(ctx.kernels), list(ctx.externs), list(ctx.long_sdpa)
        ctx.sdpa_form = "fused"
        functions.append(_emit_function(graph, ctx, impl, libraries, "main_long", constraints))
        ctx.kernels[:], ctx.externs[:] = kernels, externs
        meta["long_form"] = {"function": "main_long", "scores": terms, "limit": DECOMPOSE_UP_TO_SCORES}
    refl = f'attributes {{iree.reflection = {{rocmc.meta = "{mlir_string(json.dumps(meta, sort_keys=True))}"}}}} '
    text = "\n".join(["module {", *ctx.decls, *_function_text(main, refl),
                      *[line for f in functions[1:] for line in _function_text(f)], "}"])
    return Lowered(target, text, _to_bytecode(text, ctx.resources), meta)


def _to_bytecode(text: str, resources: dict) -> bytes:
    from iree.compiler import ir
    with ir.Context() as mctx, ir.Location.unknown():
        mctx.allow_unregistered_dialects = False
        try:
            module = ir.Module.parse(text)
        except Exception as e:   # MLIR diagnostics: a bug in a lowering, not in the user's graph
            raise CompileError("emitted MLIR does not parse", stage="emit", diagnostics=str(e)) from None
        keep = []
        if resources:
            _bind_resources(ir, module, resources, keep)
        try:
            module.operation.verify()
        except Exception as e:
            raise CompileError("emitted MLIR does not verify", stage="emit", diagnostics=str(e)) from None
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
        return buf.getvalue()


def _bind_resources(ir, module, resources: dict, keep: list) -> None:
    """Replace each placeholder `dense_resource<name>` with the array's bytes, copied only once
    into the bytecode (no hex text)."""
    attr_of = {"arith.constant": "value", "util.global": "initial_value"}

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for o in block.operations:
                    key = attr_of.get(o.name)
                    if key is not None and key in o.attributes:
                        a = o.attributes[key]
                        s = str(a)
                        if s.startswith("dense_resource<"):
                            name = s[len("dense_resource<"):s.index(">")]
                            arr = resources[name]
                            raw = arr.view(np.uint8) if arr.dtype.itemsize == 1 else arr.view(f"u{arr.dtype.itemsize}")
                            keep.append(raw)
                            o.attributes[key] = ir.DenseResourceElementsAttr.get_from_buffer(
                                memoryview(raw), name, a.type)
                    walk(o)
    walk(module.operation)
