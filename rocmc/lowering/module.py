"""Graph -> MLIR module: choose an implementation per node, emit, parse, verify, write bytecode."""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import dataclass, field

import numpy as np

from .. import symbolic
from ..dtypes import ALL as DTYPES, FLOAT8
from .._version import __version__
from ..artifact import FORMAT, PARAMETER_SCOPE
from ..errors import GraphError, LoweringError, RocmcError
from ..frontend.graph import Graph, TensorType
from ..frontend.opdef import dim_constraints
from ..signature import input_specs
from . import nibbles, registry
from .emitter import Emitter, T, mlir_string, tensor_type
from .entry_points import caller_storage, held_entry_points, state_buffers
from .compiler import iree_version
from .codegen.padding import ASSUMED_MAX
from .target import Target


@dataclass
class LowerContext:
    """What a lowering may use besides its operands: the target and module-level additions."""

    target: Target
    graph: Graph
    decls: list = field(default_factory=list)  # module-level ops (extern decls, executables)
    decl_keys: set = field(default_factory=set)
    resources: dict = field(default_factory=dict)  # resource name -> numpy array
    kernels: list = field(default_factory=list)  # hand-written code objects embedded (for metadata)
    executables: dict = field(default_factory=dict)  # executable name -> the hand-written code object it embeds
    externs: list = field(default_factory=list)  # extern call imports (for metadata)
    # The function's long form: a second form that the runtime calls instead when, at a call, the product of
    # some term's sizes exceeds `long_limit` (runtime/module.py). A lowering whose fastest code needs memory
    # growing with sizes it cannot bound at compile time asks for it (`long_form`) and emits its alternative
    # while the long form is emitted (one user today: see codegen/attention.py).
    emitting_long_form: bool = False
    long_terms: list = field(default_factory=list)
    long_limit: int | None = None
    # The size of each symbolic dim of the function being emitted (an index SSA value defined at its
    # top), for lowerings whose result size is a symbol bound by another input (e.g. narrow).
    symbols: dict = field(default_factory=dict)
    # Constants of at least this many bytes become named parameters instead of module data (None: all
    # embedded); every parameter and state of the module, by name (shared by all its functions).
    external: int | None = None
    parameters: dict = field(default_factory=dict)
    states: dict = field(default_factory=dict)
    # States held by the caller (`held_states`): each function takes the states it reads or writes as arguments
    # (storage its caller owns, updated in place) instead of module globals; see lowering/entry_points.py. The
    # function being emitted: its state arguments and the values it assigns, by state name.
    held_states: bool = False
    fn_states: dict = field(default_factory=dict)
    fn_assigns: dict = field(default_factory=dict)
    _resource_of: dict = field(default_factory=dict)  # (id(array), elt) -> resource name
    # Why the target's tuning flags (Target.tuning_flags) are not tried for this module: code it holds that IREE
    # 3.13 fails to compile with them (each reason once), so the compile goes without them at once instead of
    # after a failed attempt (each attempt costs as much as the compile).
    untuned: list = field(default_factory=list)

    def avoid_tuning(self, reason: str) -> None:
        """Compile this module without the target's tuning flags, because of `reason` (said in its summary)."""
        if reason not in self.untuned:
            self.untuned.append(reason)

    def long_form(self, term: list, limit: int) -> bool:
        """Ask for the function's long form, taken at a call where the product of `term`'s sizes (ints or size
        expressions) exceeds `limit`: False while the function's own form is emitted (the term is recorded),
        True while the long form is (emit the alternative then). One limit per function."""
        if self.emitting_long_form:
            return True
        if self.long_limit not in (None, limit):
            raise LoweringError(f"two long-form limits in one function: {self.long_limit} and {limit}")
        self.long_limit = limit
        self.long_terms.append(list(term))
        return False

    def symbol_size(self, name: str) -> str:
        """The index SSA value holding symbol `name`'s size in the function being emitted."""
        if name not in self.symbols:
            raise LoweringError(f"symbol {name!r} is not a dim of any input of graph {self.graph.name!r}")
        return self.symbols[name]

    def parameter(self, E: Emitter, name: str, type: TensorType, source: str) -> T:
        """Load the named parameter: a global initialised from the parameter scope at load time (the
        module holds no bytes of it)."""
        info = self._global(self.parameters, name, type, source, "p")
        elt = _storage_elt(type)
        self.declare(
            f"parameter:{name}",
            f"util.global private @{info['global']} = #flow.parameter.named<"
            f'"{PARAMETER_SCOPE}"::"{mlir_string(name)}"> : {tensor_type(type.shape, elt)}',
        )
        return self._load(E, info["global"], type)

    def state(self, E: Emitter, name: str, type: TensorType) -> T:
        """Load a state: a mutable global of the module, zeros until a function assigns it; with `held_states`, the
        function's argument for it (the caller's buffer)."""
        if self.held_states:
            self._global(self.states, name, type, None, "s")
            arg = self._state_arg(name, type)
            return E.convert(arg, "i1") if type.dtype.kind == "bool" else T(arg.name, type)
        twin = next(
            (
                n
                for n, i in self.states.items()
                if n != name and (i["shape"], i["dtype"]) == (list(type.shape), type.dtype.name)
            ),
            None,
        )
        if twin is not None:
            # IREE 3.13 merges mutable globals of one type and initial value once they are updated in
            # place, so both states would read and write the same memory (docs/architecture.md, "State").
            raise LoweringError(
                f"states {twin!r} and {name!r} are both {type}: IREE 3.13 would store them in "
                f"one buffer once updated in place; stack them into one state (a leading axis)"
            )
        info = self._global(self.states, name, type, None, "s")
        self.declare(f"state:{name}", f"util.global private mutable @{info['global']} = {_state_zeros(info)}")
        return self._load(E, info["global"], type)

    def _state_arg(self, name: str, type: TensorType) -> T:
        """The argument of the function being emitted that holds state `name` (held states)."""
        arg = self.fn_states.get(name)
        if arg is None:
            arg = self.fn_states[name] = T(f"%state{len(self.fn_states)}", type, _storage_elt(type))
        return arg

    def store_state(self, E: Emitter, name: str, value: T) -> None:
        info = self.states[name]
        elt = _storage_elt(value.type)
        if value.mlir_elt != elt:
            value = E.convert(value, elt)
        if self.held_states:  # returned, and stored by the entry point into the caller's buffer it came in
            self._state_arg(name, value.type)
            self.fn_assigns[name] = T(value.name, value.type, elt)
            return
        E.emit(f"util.global.store {value.name}, @{info['global']} : {tensor_type(value.shape, elt)}")

    def _global(self, table: dict, name: str, type: TensorType, source, prefix: str) -> dict:
        info = table.get(name)
        if info is None:
            info = {
                "name": name,
                "shape": list(type.shape),
                "dtype": type.dtype.name,
                "global": f"rocmc_{prefix}{len(table)}",
            }
            if source is not None:
                info["from"] = source
            table[name] = info
        elif (info["shape"], info["dtype"]) != (list(type.shape), type.dtype.name):
            kind = "parameter" if table is self.parameters else "state"
            raise LoweringError(
                f"{kind} {name!r} is {type} in one function and "
                f"{info['dtype']}[{','.join(map(str, info['shape']))}] in another"
            )
        return info

    @staticmethod
    def _load(E: Emitter, sym: str, type: TensorType) -> T:
        elt = _storage_elt(type)
        v = T(E.op(f"util.global.load @{sym} : {tensor_type(type.shape, elt)}", "w"), type, elt)
        return E.convert(v, "i1") if type.dtype.kind == "bool" else T(v.name, type)

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
        if type.dtype.packed:  # 4-bit values are held as i8 (ml_dtypes keeps only the low nibble of a byte)
            arr = arr.astype(np.uint8 if type.dtype.unsigned else np.int8)
        return T(constant_op(E, self, arr, type.shape, type.dtype.mlir, hint), type)


SMALL = 16


def _storage_elt(type: TensorType) -> str:
    """How a tensor is held in memory: bools as i8 (i1 has no byte layout)."""
    return "i8" if type.dtype.kind == "bool" else type.dtype.mlir


def _state_zeros(info: dict) -> str:
    """A state's initial value (its LowerContext.states entry), `dense<0...> : tensor<...>` in the type it is held
    as: a global's initializer, or what `rocmc$states` fills a held state's buffer with."""
    type = TensorType(tuple(info["shape"]), DTYPES[info["dtype"]])
    zero = "0.000000e+00" if type.dtype.kind == "float" else "0"
    return f"dense<{zero}> : {tensor_type(type.shape, _storage_elt(type))}"


def constant_op(E: Emitter, ctx: LowerContext, arr: np.ndarray, shape, elt: str, hint: str) -> str:
    ty = tensor_type(shape, elt)
    if arr.size <= SMALL:
        flat = arr.reshape(-1)
        splat = flat.size > 0 and np.all(flat.view(np.uint8).reshape(flat.size, -1) == flat[:1].view(np.uint8))
        raw = (flat[:1] if splat else flat).tobytes()
        held = _stored(shape, elt) if elt in _FLOAT8_MLIR else ty  # a small bf16 constant verifies as it is
        return _bitcast(E, E.op(f'arith.constant dense<"0x{raw.hex().upper()}"> : {held}', "cst"), held, ty)
    # A module global holding a resource: every function of the module (and initializers) loads the
    # same one, so the weights are stored once whatever uses them.
    key = (id(arr), elt, arr.shape)
    name = ctx._resource_of.get(key)
    if name is None or ctx.resources.get(name) is not arr:
        name = f"rocmc_{hint}{len(ctx.resources)}"
        ctx.resources[name] = arr
        ctx._resource_of[key] = name
        ctx.declare(f"global:{name}", f"util.global private @{name} = dense_resource<{name}> : {_stored(shape, elt)}")
    held = _stored(shape, elt)
    return _bitcast(E, E.op(f"util.global.load @{name} : {held}", "cst"), held, ty)


def _bitcast(E: Emitter, value: str, held: str, ty: str) -> str:
    """`value`, held as `held`, as tensor type `ty` (a bitcast where the two differ)."""
    return value if held == ty else E.op(f"arith.bitcast {value} : {held} to {ty}", "cst")


_FLOAT8_MLIR = {d.mlir for d in FLOAT8}


def _stored(shape, elt: str) -> str:
    """Type of a resource global: bf16 data is held as its i16 bits (IREE 3.13's constant evaluation
    turns a bf16 resource converted to f32 into an f32 constant still holding the bf16 bytes: an
    `arith.constant` that fails to verify), float8 data as its bytes (IREE 3.13 can't serialize a float8
    constant), and bitcast where it is loaded."""
    return tensor_type(shape, "i16" if elt == "bf16" else "i8" if elt in _FLOAT8_MLIR else elt)


@dataclass
class Lowered:
    target: Target
    text: str  # MLIR text as emitted (resources elided)
    bytecode: bytes  # verified module as MLIR bytecode, what iree-compile reads
    metadata: dict
    untuned: list = field(default_factory=list)  # LowerContext.untuned


def signature(graph: Graph) -> dict:
    return {
        "inputs": input_specs(graph),
        "outputs": [
            {"name": f"out{i}", "dtype": v.dtype.name, "shape": list(v.shape)} for i, v in enumerate(graph.outputs)
        ],
    }


@dataclass
class _Function:
    name: str
    args: list
    rets: list
    lines: list
    choices: list
    # Held states (LowerContext.held_states): the states the function takes and those it assigns, (name, T), and
    # the assigned ones whose buffer the call may write in place (`updated_in_place`).
    state_args: list = field(default_factory=list)
    state_rets: list = field(default_factory=list)
    in_place: frozenset = frozenset()


def _emit_function(graph: Graph, ctx: LowerContext, impl, libraries, name: str, constraints: list) -> _Function:
    """One function computing the graph: an implementation per node, emitted in order, after the
    checks of its inputs' sizes."""
    E = Emitter()
    env: dict[int, T] = {}
    ctx.fn_states, ctx.fn_assigns = {}, {}
    args = [
        nibbles.boundary(v, i) if v.dtype.packed else T(f"%arg{i}", TensorType(v.shape, v.dtype), v.dtype.abi_mlir)
        for i, v in enumerate(graph.inputs)
    ]
    E.loc = 'loc("rocmc.checks")'
    ctx.symbols = _emit_checks(E, graph, args, constraints)
    hints = _divisibility_hints(E, constraints, ctx.symbols)
    for v, arg in zip(graph.inputs, args):
        E.loc = f'loc("rocmc.{v.id}:input")'
        arg = _hinted(E, arg, v, hints)
        env[v.id] = (
            E.convert(arg, "i1") if v.dtype.kind == "bool" else nibbles.unpack(E, arg, v) if v.dtype.packed else arg
        )
    choices = []
    for node in graph.nodes:
        E.loc = f'loc("rocmc.{node.outputs[0].id}:{node.op}")'
        out = node.outputs[0]
        if node.op == "constant":
            arr = graph.constants[node.attrs["name"]]
            if ctx.external is not None and arr.nbytes >= ctx.external and arr.size > SMALL:
                env[out.id] = ctx.parameter(E, node.attrs["name"], out.type, "constant")
            else:
                env[out.id] = ctx.constant(E, arr, out.type, "w")
            continue
        if node.op in ("parameter", "state") and out.dtype.packed:
            raise LoweringError(
                f"{node.describe()}: a {node.op} of {out.dtype} is not supported (a constant or an input is)"
            )
        if node.op == "parameter":
            env[out.id] = ctx.parameter(E, node.attrs["name"], out.type, "graph")
            continue
        if node.op == "state":
            env[out.id] = ctx.state(E, node.attrs["name"], out.type)
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
            raise LoweringError(
                f"{node.describe()}: lowering gave {len(results)} results, expected {len(node.outputs)}"
            )
        for v, r in zip(node.outputs, results):
            if r.mlir_elt != v.dtype.mlir or r.type.shape != v.type.shape:
                r = E.convert(r, v.dtype.mlir, v.type) if r.type.shape == v.type.shape else r
            if r.mlir_elt != v.dtype.mlir or len(r.type.shape) != v.type.rank:
                raise LoweringError(
                    f"{node.describe()}: {choice.impl.name} lowering returned {r.mlir}, "
                    f"expected {tensor_type(v.type.shape, v.dtype.mlir)}"
                )
            env[v.id] = nibbles.wrap(E, T(r.name, v.type)) if v.dtype.packed else T(r.name, v.type)
        choices.append(choice.record(node))
    E.loc = 'loc("rocmc.return")'
    for state, v in graph.assigns.items():
        ctx.store_state(E, state, env[v.id])
    rets = []
    for v in graph.outputs:
        r = env[v.id]
        if v.dtype.kind == "bool":
            r = E.convert(r, "i8")
        elif v.dtype.packed:
            r = nibbles.pack(E, r, v)
        rets.append(r)
    in_place = frozenset(n for n in ctx.fn_assigns if updated_in_place(graph, n))
    return _Function(
        name, args, rets, E.lines, choices, list(ctx.fn_states.items()), list(ctx.fn_assigns.items()), in_place
    )


# Ops that write one operand in place (its index): the KV cache's store, a slice's update.
IN_PLACE_OPS = {"rope_store_kv": 1, "update_slice": 0}


def updated_in_place(graph: Graph, name: str) -> bool:
    """Whether a call may write state `name`'s buffer in place (held states, lowering/entry_points.py): its value
    before the call has one use, an op that writes it in place. IREE 3.13 does not order a read of the state's
    old value against the in-place write of the caller's buffer (the buffer it aliases the new value to), so any
    other use (a second reader, an output, a view) keeps the old value in a copy instead."""
    ids = {n.outputs[0].id for n in graph.nodes if n.op == "state" and n.attrs["name"] == name}
    uses = [(n.op, i) for n in graph.nodes for i, v in enumerate(n.inputs) if v is not None and v.id in ids]
    escapes = any(v.id in ids for v in [*graph.outputs, *graph.assigns.values()])
    return not escapes and len(uses) == 1 and IN_PLACE_OPS.get(uses[0][0]) == uses[0][1]


def _emit_checks(E: Emitter, graph: Graph, args: list, constraints: list) -> dict:
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
    for c in constraints:
        a, b = E.as_index(c.lhs.compute(E.ix, values)), c.rhs.compute(E.ix, values)
        if c.kind == "divisible":
            ok = _divisible(E, a, b)
        else:
            ok = E.op(f"arith.cmpi sge, {a}, {E.as_index(b)} : index", "ok")
        E.check(ok, c.describe())
    return values


def _divisibility_hints(E: Emitter, constraints: list, symbols: dict) -> dict:
    """{symbol: its size with `util.assume.int ... udiv = k`} for each input dim the constraints (checked
    just before) say divides by a constant k > 1 (e.g. torch.export's Dim 8*k): IREE then knows it
    when it tiles the contractions over that dim, as for the sizes padding.py pads."""
    hints: dict[str, str] = {}
    for c in constraints:
        if c.kind != "divisible" or not isinstance(c.lhs, symbolic.Sym) or not isinstance(c.rhs, symbolic.Int):
            continue
        name, k = c.lhs.name, c.rhs.value
        if k > 1 and name in symbols and not isinstance(symbols[name], int):
            base = hints.get(name, symbols[name])
            hints[name] = E.op(f"util.assume.int {base}<umin = 0, umax = {ASSUMED_MAX}, udiv = {k}> : index", "d")
    symbols.update(hints)
    return hints


def _hinted(E: Emitter, arg: T, v, hints: dict) -> T:
    """The input `arg` with the hinted sizes tied to its dynamic dims (flow.tensor.tie_shape)."""
    if not any(isinstance(d, str) and d in hints for d in v.shape):
        return arg
    dims = [str(hints.get(d) or E.dim(arg, i)) for i, d in enumerate(v.shape) if isinstance(d, str)]
    tied = T(E.op(f"flow.tensor.tie_shape {arg.name} : {arg.mlir}{{{', '.join(dims)}}}", "in"), arg.type, arg.mlir_elt)
    for i, d in enumerate(v.shape):
        if isinstance(d, str) and d in hints:
            E.set_dim(tied, i, hints[d])
    return tied


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
    ret = f"  return {', '.join(r.name for r in f.rets)} : {sig_out}" if f.rets else "  return"
    return [f"func.func @{f.name}({sig_in}) -> ({sig_out}) {attrs}{{", *f.lines, ret, "}"]


def _async_twin(f: _Function) -> list[str]:
    """The stream-ordered form of an exported function (IREE's coarse-fences ABI): `name$async` takes the
    same inputs plus a fence to wait on and one to signal, and returns once its work is queued; its
    results are ready when the signal fence is reached (rocmc.runtime's `Module.submit`). It calls the
    function itself, so the module holds its program once."""
    sig_in = ", ".join(f"{a.name}: {a.mlir}" for a in f.args)
    types_in = ", ".join(a.mlir for a in f.args)
    sig_out = ", ".join(r.mlir for r in f.rets)
    results = [f"%r#{i}" for i in range(len(f.rets))]
    call = f"func.call @{f.name}({', '.join(a.name for a in f.args)}) : ({types_in}) -> ({sig_out})"
    head = f"%r:{len(f.rets)} = " if f.rets else ""
    ret = f"  util.return {', '.join(results)} : {sig_out}" if f.rets else "  util.return"
    model = 'attributes {iree.abi.model = "coarse-fences"}'
    return [f'util.func public @"{f.name}$async"({sig_in}) -> ({sig_out}) {model} {{', f"  {head}{call}", ret, "}"]


def program_of(program) -> dict:
    """{function name: Graph}: one graph is the function `main`; a dict names several functions that
    share the module's parameters and states."""
    if isinstance(program, Graph):
        return {"main": program}
    if not isinstance(program, dict) or not program:
        raise GraphError(
            f"compile: expected a Graph or a non-empty dict of function name -> Graph, got {type(program).__name__}"
        )
    for name, g in program.items():
        if not isinstance(name, str) or not _FUNCTION.match(name) or name.endswith("_long"):
            raise GraphError(
                f"compile: function name {name!r} is not an identifier (or ends in _long, which "
                f"rocmc uses for long forms)"
            )
        if not isinstance(g, Graph):
            raise GraphError(f"compile: function {name!r} is a {type(g).__name__}, expected a Graph")
    return dict(program)


_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def asynchronous_functions(asynchronous, program: dict) -> tuple:
    """compile(asynchronous=): True (every function), False or () (none), or names of the program's
    functions; the names, in the program's order."""
    if asynchronous is True:
        return tuple(program)
    if asynchronous is False or asynchronous is None:
        return ()
    if isinstance(asynchronous, str) or not all(isinstance(n, str) for n in asynchronous):
        raise GraphError(f"compile(asynchronous={asynchronous!r}): expected True, False or a list of function names")
    unknown = sorted(set(asynchronous) - set(program))
    if unknown:
        raise GraphError(
            f"compile(asynchronous=...): {', '.join(map(repr, unknown))} is not a function of the program; "
            f"its functions are {', '.join(program)}"
        )
    return tuple(n for n in program if n in set(asynchronous))


def program_hash(program: dict, bytes_below: int | None = None) -> str:
    """The content hash of a program; that of its graph alone for the one-function case."""
    if list(program) == ["main"]:
        return program["main"].hash(bytes_below)
    h = hashlib.sha256()
    for name, g in program.items():
        h.update(f"{name}:{g.hash(bytes_below)};".encode())
    return h.hexdigest()


def lower(
    program,
    target,
    impl=None,
    libraries=(),
    external: int | None = None,
    info: dict | None = None,
    rewrite: bool = False,
    asynchronous=(),
) -> Lowered:
    """Lower a Graph (function `main`) or a {name: Graph} program; with `external`, constants of at least
    that many bytes become named parameters; with `rewrite`, the graphs go through rocmc.rewrite first
    (the metadata keeps the given graphs' hash and text, and records what was rewritten); each function
    named in `asynchronous` is also exported in its stream-ordered form (`_async_twin`)."""
    program = given = program_of(program)
    asynchronous = asynchronous_functions(asynchronous, program)
    records = None
    if rewrite:
        from ..rewrite import rewrite_program

        program, records = rewrite_program(given)
    target = Target.parse(target)
    first = next(iter(program.values()))
    ctx = LowerContext(target, first, external=external)
    # A module with states whose functions are issued stream-ordered holds no state itself: its caller does
    # (entry_points.py says why).
    ctx.held_states = bool(asynchronous) and any(g.states for g in program.values())
    emitted, infos, twins = [], [], []
    for name, graph in program.items():
        graph.validate()
        ctx.graph, ctx.long_terms, ctx.long_limit, ctx.emitting_long_form = graph, [], None, False
        constraints = dim_constraints(graph)
        f = _emit_function(graph, ctx, impl, libraries, name, constraints)
        emitted.append(f)
        entry = {
            "name": name,
            "signature": signature(graph),
            "constraints": [c.to_json() for c in constraints],
            "implementations": f.choices,
        }
        if ctx.long_terms:
            # The same graph again, each lowering that asked emitting its long alternative (sharing constants,
            # kernels and imports): what the runtime calls when a term exceeds the limit.
            kernels, externs, terms = list(ctx.kernels), list(ctx.externs), list(ctx.long_terms)
            ctx.emitting_long_form = True
            emitted.append(_emit_function(graph, ctx, impl, libraries, f"{name}_long", constraints))
            ctx.kernels[:], ctx.externs[:], ctx.emitting_long_form = kernels, externs, False
            entry["long_form"] = {"function": f"{name}_long", "scores": terms, "limit": ctx.long_limit}
        if ctx.held_states:
            entry["held_states"] = [n for n, _ in f.state_args]
            entry["assigned_states"] = [n for n, _ in f.state_rets]
            entry["states_in_place"] = sorted(f.in_place)
        if name in asynchronous:
            entry["asynchronous"] = f"{name}$async"
            if ctx.held_states and caller_storage(f):
                entry["async_storage"] = "caller"  # it takes its results' buffers and transient storage
            twins.append(f)
        infos.append(entry)
    main = infos[0]
    meta = {
        "rocmc": __version__,
        "format": FORMAT,
        "iree": iree_version(),
        "graph": first.name if len(program) == 1 else "+".join(program),
        "graph_hash": program_hash(given, external),
        "graph_text": "\n".join(str(g) for g in given.values()),
        "target": str(target),
        **{k: v for k, v in main.items() if k != "name"},
        "kernels": ctx.kernels,
        "externs": ctx.externs,
    }
    if target.code_note:  # kept in the module itself, so a saved artifact still says so
        meta["compile_note"] = target.code_note
    if main["name"] != "main":
        meta["function"] = main["name"]
    world = _world(program)
    if world > 1:
        meta["world_size"] = world  # the ranks the runtime must start it as (tensor parallelism)
    if info is not None:
        meta["info"] = info
    if records is not None:
        meta["rewrites"] = records
        if records:
            meta["rewritten_text"] = "\n".join(str(g) for g in program.values())
    if len(infos) > 1:
        meta["functions"] = infos[1:]
    for kind, table in (("parameters", ctx.parameters), ("states", ctx.states)):
        if table:
            meta[kind] = [{k: v for k, v in info.items() if k != "global"} for info in table.values()]
    refl = f'attributes {{iree.reflection = {{rocmc.meta = "{mlir_string(json.dumps(meta, sort_keys=True))}"}}}} '
    if ctx.held_states:
        twin_names = {f.name for f in twins}
        functions = [
            line
            for i, f in enumerate(emitted)
            for line in held_entry_points(f, refl if i == 0 else "", f.name in twin_names)
        ]
        functions += state_buffers([_state_zeros(info) for info in ctx.states.values()])
    else:
        functions = [
            *_function_text(emitted[0], refl),
            *[line for f in emitted[1:] for line in _function_text(f)],
            *[line for f in twins for line in _async_twin(f)],
        ]
    text = "\n".join(["module {", *ctx.decls, *functions, "}"])
    return Lowered(target, text, _to_bytecode(text, ctx.resources), meta, list(ctx.untuned))


def _to_bytecode(text: str, resources: dict) -> bytes:
    from iree.compiler import ir

    with ir.Context() as mctx, ir.Location.unknown():
        mctx.allow_unregistered_dialects = False
        try:
            module = ir.Module.parse(text)
        except Exception as e:  # noqa: BLE001 - MLIR diagnostics: a bug in a lowering, not in the user's graph
            raise invalid_mlir(text, str(e)) from None
        keep: list = []
        if resources:
            _bind_resources(ir, module, resources, keep)
        try:
            module.operation.verify()
        except Exception as e:  # noqa: BLE001
            raise invalid_mlir(text, str(e)) from None
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
        return buf.getvalue()


CONTEXT_LINES = 3  # lines shown either side of the failing one
_SHOWN_CHARS = 240  # of each line shown (a function's first line holds the whole metadata)
_AT_LINE = re.compile(r'"-":(\d+):(\d+)')
_NAMED = re.compile(r'error: "(rocmc\.[^"]+)": \'([\w.]+)\' op')
_NODE_LOC = re.compile(r'loc\("rocmc\.([^"]+)"\)')


def invalid_mlir(text: str, diagnostics: str) -> LoweringError:
    """The error for emitted text that MLIR rejects: the first diagnostic, the node whose lowering wrote
    the failing line (the location on it or nearest before it in its function) and the numbered lines
    around it. A parse error gives a line and column; a verifier error gives the op's location."""
    lines = text.split("\n")
    first = next(
        (l.strip()[len("error: ") :] for l in diagnostics.splitlines() if l.strip().startswith("error:")),
        diagnostics.strip(),
    )
    at, col = _failing_line(lines, diagnostics)
    if at is None:
        return LoweringError(f"emitted MLIR is invalid: {first}")
    return LoweringError(
        f"lowering of {_node_before(lines, at)} produced invalid MLIR: {first}\n" + _excerpt(lines, at, col)
    )


def _failing_line(lines: list, diagnostics: str):
    """(0-based line, 1-based column or None) the diagnostics point at, or (None, None)."""
    m = _AT_LINE.search(diagnostics)
    if m and 0 < int(m.group(1)) <= len(lines):
        return int(m.group(1)) - 1, int(m.group(2))
    m = _NAMED.search(diagnostics)
    if m:
        loc, op = f'loc("{m.group(1)}")', m.group(2)
        ours = [i for i, l in enumerate(lines) if l.endswith(loc)]
        match = [i for i in ours if f"= {op} " in lines[i] or lines[i].lstrip().startswith(f"{op} ")]
        if match or ours:
            return (match or ours)[0], None
    return None, None


def _node_before(lines: list, at: int) -> str:
    """How the message names what emitted line `at`: the node of the location on it or nearest before."""
    for line in reversed(lines[: at + 1]):
        m = _NODE_LOC.search(line)
        if m:
            where = m.group(1)
            if where == "checks":
                return "the input size checks"
            if where == "return":
                return "the function's results"
            value, _, op = where.partition(":")
            return f"%{value} ({op})"
        if line.startswith("func.func"):
            break
    return "a module-level declaration"


def _excerpt(lines: list, at: int, col: int | None) -> str:
    """Lines at-3..at+3, numbered (1-based), the failing one marked, a caret under its column."""
    lo, hi = max(0, at - CONTEXT_LINES), min(len(lines), at + CONTEXT_LINES + 1)
    width = len(str(hi))
    out = []
    for i in range(lo, hi):
        line = lines[i] if len(lines[i]) <= _SHOWN_CHARS else lines[i][:_SHOWN_CHARS] + " ..."
        out.append(f"{'>' if i == at else ' '} {i + 1:>{width}} | {line}")
        if i == at and col is not None and col <= _SHOWN_CHARS:
            out.append(f"  {' ' * width} | {' ' * (col - 1)}^")
    return "\n".join(out)


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
                            name = s[len("dense_resource<") : s.index(">")]
                            arr = resources[name]
                            raw = arr.view(np.uint8) if arr.dtype.itemsize == 1 else arr.view(f"u{arr.dtype.itemsize}")
                            keep.append(raw)
                            o.attributes[key] = ir.DenseResourceElementsAttr.get_from_buffer(
                                memoryview(raw), name, a.type
                            )
                    walk(o)

    walk(module.operation)


def _world(program: dict) -> int:
    """The number of ranks a program's collectives were built for (1: none); one number per program."""
    worlds = {
        (n.describe(), n.attrs["world"])
        for g in program.values()
        for n in g.nodes
        if n.op in ("all_reduce", "all_gather")
    }
    sizes = {w for _, w in worlds}
    if len(sizes) > 1:
        raise LoweringError(
            f"the program's collectives were built for different numbers of ranks: "
            f"{', '.join(f'{d} world={w}' for d, w in sorted(worlds)[:4])}"
        )
    return sizes.pop() if sizes else 1
