"""The graph IR: a Graph is an ordered list of Nodes whose operands and results are typed Values.

Shapes hold ints (static) or strings (symbolic, e.g. "seq"). Types are inferred when a node is
built, so a Graph is always well typed; printing gives one readable, typed line per node.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, Union

import numpy as np

from ..arrays import as_numpy
from ..errors import GraphError
from .. import dtypes as _dt
from ..dtypes import DType
from .registry import get_op

Dim = Union[int, str]
_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Parameter and state names: a checkpoint's own tensor names ("model.layers.0.self_attn.q_proj.weight").
_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-/:]{0,255}$")
# IREE holds dims, element counts and byte sizes as signed 64-bit integers; a tensor beyond that can't
# be written in the module (an MLIR parse failure much later), so building it is the error.
MAX_SIZE = 2**63 - 1

# The op builders behind Value's operators (`a + b` is ops.add(a, b)), by name. The builders are
# written on this module (rocmc/frontend/ops), so they register here as they are defined rather
# than being imported by it.
_OPERATORS: dict[str, Callable] = {}


def value_operator(fn: Callable) -> Callable:
    """Register a builder for Value's operators under its name (add, sub, mul, div, pow, neg, matmul)."""
    _OPERATORS[fn.__name__] = fn
    return fn


_CHUNK = 16 << 20
_pool = None


def _hash_pool():
    global _pool
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="rocmc-hash")
    return _pool


def _sha256(data) -> bytes:
    return hashlib.sha256(data).digest()


class ContentDigest:
    """sha256 of an array's bytes, computed in the background: arrays over 32 MiB as 16 MiB chunks on a
    shared thread pool (hashlib releases the GIL) whose digests are hashed again. A constant's digest
    starts when the constant is added, so it overlaps the building of the rest of the graph, and a
    compile (or a cache hit) only waits for what is left."""

    def __init__(self, a: np.ndarray):
        data = memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)
        self._value = None
        if len(data) <= 2 * _CHUNK:
            self._value = _sha256(data) if len(data) <= (1 << 20) else None
            self._parts = None if self._value else [_hash_pool().submit(_sha256, data)]
        else:
            self._parts = [_hash_pool().submit(_sha256, data[i : i + _CHUNK]) for i in range(0, len(data), _CHUNK)]
        self._chunked = len(data) > 2 * _CHUNK

    def result(self) -> bytes:
        if self._value is None:
            ds = [f.result() for f in self._parts or ()]
            self._value = _sha256(b"".join(ds)) if self._chunked else ds[0]
            self._parts = None
        return self._value


def format_dim(d: Dim) -> str:
    return str(d)


@dataclass(frozen=True)
class TensorType:
    shape: tuple
    dtype: DType

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def with_shape(self, shape) -> "TensorType":
        return TensorType(tuple(shape), self.dtype)

    def with_dtype(self, dtype) -> "TensorType":
        return TensorType(self.shape, _dt.dtype(dtype))

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(format_dim(d) for d in self.shape)}]"


def check_shape(shape, what: str) -> tuple:
    if isinstance(shape, (int, str)):
        shape = (shape,)
    out: list[int | str] = []
    for d in shape:
        if isinstance(d, (bool, np.bool_)):
            raise GraphError(f"{what}: dim {d!r} is a bool, expected an int >= 0 or a symbol name")
        if isinstance(d, (int, np.integer)):
            if d < 0:
                raise GraphError(f"{what}: dim {d} is negative, expected an int >= 0 or a symbol name")
            out.append(int(d))
        elif isinstance(d, str) and _SYMBOL.match(d):
            out.append(d)
        else:
            raise GraphError(f"{what}: dim {d!r} is neither an int >= 0 nor a symbol name like 'seq'")
    return tuple(out)


def check_size(t: TensorType, what: str) -> None:
    """Static dims, element count and bytes of `t` must fit IREE's signed 64-bit sizes."""
    static = [d for d in t.shape if isinstance(d, int)]
    if any(d > MAX_SIZE for d in static):
        raise GraphError(f"{what}: {t} has a dim larger than 2**63-1, the largest size IREE can represent")
    n = math.prod(static)
    if n * t.dtype.np.itemsize > MAX_SIZE:
        raise GraphError(
            f"{what}: {t} holds {n} elements ({n * t.dtype.np.itemsize} bytes); a tensor holds "
            f"at most 2**63-1 bytes, the largest size IREE can represent"
        )


class Value:
    """A typed SSA value: a graph input, a constant or a node result."""

    __array_priority__ = 1000  # numpy defers `ndarray + Value` to Value.__radd__

    def __init__(self, graph: "Graph", type: TensorType, producer: "Node | None", index: int, name: str | None):
        self.graph = graph
        self.type = type
        self.producer = producer
        self.index = index
        self.name = name
        self.id = graph._next_id()

    shape = property(lambda self: self.type.shape)
    dtype = property(lambda self: self.type.dtype)
    rank = property(lambda self: self.type.rank)

    def __repr__(self) -> str:
        return f"%{self.id}:{self.type}"

    # Operators call the op builders (rocmc.ops) so `a + b`, `a @ b` read naturally.
    def __add__(self, o):
        return _OPERATORS["add"](self, o)

    def __radd__(self, o):
        return _OPERATORS["add"](o, self)

    def __sub__(self, o):
        return _OPERATORS["sub"](self, o)

    def __rsub__(self, o):
        return _OPERATORS["sub"](o, self)

    def __mul__(self, o):
        return _OPERATORS["mul"](self, o)

    def __rmul__(self, o):
        return _OPERATORS["mul"](o, self)

    def __truediv__(self, o):
        return _OPERATORS["div"](self, o)

    def __rtruediv__(self, o):
        return _OPERATORS["div"](o, self)

    def __pow__(self, o):
        return _OPERATORS["pow"](self, o)

    def __neg__(self):
        return _OPERATORS["neg"](self)

    def __matmul__(self, o):
        return _OPERATORS["matmul"](self, o)

    def __rmatmul__(self, o):
        return _OPERATORS["matmul"](o, self)


@dataclass
class Node:
    op: str
    inputs: list  # Values, or None for an absent optional operand
    attrs: dict
    outputs: list = field(default_factory=list)
    id: int = -1

    def input_types(self):
        return [None if v is None else v.type for v in self.inputs]

    def describe(self) -> str:
        """How error messages name this node: `rms_norm(%0, %1)`."""
        return f"{self.op}({', '.join('_' if v is None else f'%{v.id}' for v in self.inputs)})"


def _format_attr(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_format_attr(x) for x in v) + "]"
    if isinstance(v, DType):
        return str(v)
    return repr(v)


class Graph:
    """A model: inputs, constants, nodes in topological order, outputs."""

    def __init__(self, name: str = "main"):
        if not isinstance(name, str) or not _SYMBOL.match(name):
            raise GraphError(f"Graph(name={name!r}): expected an identifier")
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}
        self.parameters: dict[str, TensorType] = {}  # weights known by name only (see `parameter`)
        self.states: dict[str, TensorType] = {}  # device-resident tensors kept across calls
        self.assigns: dict[str, Value] = {}  # state name -> its value after a call
        self.assumptions: list = []  # symbolic.Constraint the graph was built assuming
        self._digests: dict[str, tuple] = {}
        self._ids = 0
        self._names: set[str] = set()

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids - 1

    # ---- building -------------------------------------------------------------------------
    def input(self, name: str, shape, dtype="f32") -> Value:
        if not isinstance(name, str) or not _SYMBOL.match(name):
            raise GraphError(f"input(name={name!r}): expected an identifier")
        if name in self._names:
            raise GraphError(f"input {name!r}: the name is already used in graph {self.name!r}")
        t = TensorType(check_shape(shape, f"input {name!r}"), _dt.dtype(dtype))
        check_size(t, f"input {name!r}")
        v = Value(self, t, None, 0, name)
        self._names.add(name)
        self.inputs.append(v)
        return v

    def constant(self, name: str | None, array, dtype=None) -> Value:
        """A constant tensor; the array (numpy, a CPU torch tensor, or what np.asarray takes) is copied,
        so later changes to it don't leak in."""
        arr = np.asarray(as_numpy(array, f"constant {name!r}"))
        if dtype is not None:
            arr = arr.astype(_dt.dtype(dtype).np)
        elif arr.dtype == np.float64:
            raise GraphError(f"constant {name!r}: a float64 array needs an explicit dtype= (f64, f32, f16, bf16)")
        elif arr.dtype == np.int64 and not isinstance(array, np.ndarray):
            arr = arr.astype(np.int64)
        dt = _dt.dtype(arr.dtype)
        if name is None:
            i = len(self.constants)
            while f"c{i}" in self._names:
                i += 1
            name = f"c{i}"
        if not _SYMBOL.match(name):
            raise GraphError(f"constant(name={name!r}): expected an identifier")
        if name in self._names:
            raise GraphError(f"constant {name!r}: the name is already used in graph {self.name!r}")
        self._names.add(name)
        # The graph owns a read-only copy (ascontiguousarray would make 0-d arrays 1-d): later edits of
        # the caller's array can't change the graph, and each constant's digest is computed once.
        const = np.array(arr, order="C", copy=True)
        const.flags.writeable = False
        self.constants[name] = const
        self._digests[name] = (const, ContentDigest(const))
        node = Node("constant", [], {"name": name}, id=len(self.nodes))
        v = Value(self, TensorType(tuple(int(d) for d in arr.shape), dt), node, 0, name)
        node.outputs = [v]
        self.nodes.append(node)
        return v

    def share_constant(self, source: "Graph", name: str) -> Value:
        """Constant `name` of graph `source` as a constant of this graph: the same read-only array and
        content digest, neither copied nor hashed again (a rewritten copy of a graph of large weights)."""
        if name in self._names:
            raise GraphError(f"constant {name!r}: the name is already used in graph {self.name!r}")
        const = source.constants[name]
        self._names.add(name)
        self.constants[name] = const
        self._digests[name] = source._digests.get(name) or (const, ContentDigest(const))
        node = Node("constant", [], {"name": name}, id=len(self.nodes))
        v = Value(self, TensorType(tuple(int(d) for d in const.shape), _dt.dtype(const.dtype)), node, 0, name)
        node.outputs = [v]
        self.nodes.append(node)
        return v

    def parameter(self, name: str, shape, dtype="f32") -> Value:
        """A weight known only by name, shape and dtype: the compiled module holds no bytes of it, and
        they come at load time (`rocmc.load(art, parameters=...)`) from an .irpa or .safetensors file,
        or from arrays. `name` is the tensor's name there, e.g. "model.layers.0.mlp.up_proj.weight"."""
        return self._named_leaf(
            "parameter",
            self.parameters,
            name,
            shape,
            dtype,
            "a tensor name of letters, digits and _.-/: (at most 256 characters)",
            "a parameter's shape is static",
        )

    def state(self, name: str, shape, dtype="f32") -> Value:
        """A tensor that lives on the device across calls (a KV cache): its value at the start of a call.
        It starts as zeros when the module is loaded; `assign(name, value)` sets its value for the next
        call. Functions compiled together (`rocmc.compile({"prefill": g1, "decode": g2})`) share the
        states of the same name."""
        return self._named_leaf(
            "state",
            self.states,
            name,
            shape,
            dtype,
            "a name of letters, digits and _.-/:",
            "a state's shape is static (size it for the largest use)",
        )

    def _named_leaf(self, op: str, table: dict, name, shape, dtype, name_rule: str, static_rule: str) -> Value:
        """A parameter or state: a checked name new to `table`, a static shape, no operands."""
        if not isinstance(name, str) or not _KEY.match(name):
            raise GraphError(f"{op}(name={name!r}): expected {name_rule}")
        if name in table:
            raise GraphError(f"{op} {name!r}: the name is already used in graph {self.name!r}")
        t = TensorType(check_shape(shape, f"{op} {name!r}"), _dt.dtype(dtype))
        if not t.is_static:
            raise GraphError(f"{op} {name!r}: shape {list(t.shape)} has a symbolic dim; {static_rule}")
        check_size(t, f"{op} {name!r}")
        table[name] = t
        node = Node(op, [], {"name": name}, id=len(self.nodes))
        node.outputs = [Value(self, t, node, 0, None)]
        self.nodes.append(node)
        return node.outputs[0]

    def assign(self, name: str, value: Value) -> None:
        """Make `value` the state's value after this call (at most once per state and call)."""
        if name not in self.states:
            raise GraphError(
                f"assign({name!r}): graph {self.name!r} has no state of that name; declare it "
                f"with graph.state(name, shape, dtype)"
            )
        if not isinstance(value, Value) or value.graph is not self:
            raise GraphError(f"assign({name!r}): {value!r} is not a value of graph {self.name!r}")
        if name in self.assigns:
            raise GraphError(f"assign({name!r}): the state is already assigned in graph {self.name!r}")
        if value.type != self.states[name]:
            raise GraphError(f"assign({name!r}): value is {value.type}, but the state is {self.states[name]}")
        self.assigns[name] = value

    def apply(self, op: str, inputs: Sequence, attrs: dict | None = None) -> list[Value]:
        """Add a node; its result types come from the op's shape/dtype rule."""
        opdef = get_op(op)
        attrs = dict(attrs or {})
        for v in inputs:
            if v is not None and (not isinstance(v, Value) or v.graph is not self):
                raise GraphError(f"{op}: operand {v!r} is not a value of graph {self.name!r}")
        node = Node(op, list(inputs), attrs, id=len(self.nodes))
        opdef.check_attrs(node)
        types = opdef.infer(node, [None if v is None else v.type for v in inputs], attrs)
        for t in types:
            check_size(t, node.describe())
        node.outputs = [Value(self, t, node, i, None) for i, t in enumerate(types)]
        self.nodes.append(node)
        return node.outputs

    def assume(self, constraint) -> None:
        """Record what the graph's construction assumed of its sizes (a symbolic.Constraint, e.g. an
        importer deciding `seq == 1` as false assumes seq >= 2): checked on every call, like the
        constraints of its types."""
        from ..symbolic import Constraint

        if not isinstance(constraint, Constraint):
            raise GraphError(f"assume: {constraint!r} is not a rocmc.symbolic.Constraint")
        unknown = (constraint.lhs.symbols() | constraint.rhs.symbols()) - set(self.symbols())
        if unknown:
            raise GraphError(
                f"assume: {constraint.describe()} names {', '.join(sorted(unknown))}, not a dim of "
                f"any input of graph {self.name!r}"
            )
        if constraint not in self.assumptions:
            self.assumptions.append(constraint)

    def output(self, *values: Value) -> None:
        for v in values:
            if not isinstance(v, Value) or v.graph is not self:
                raise GraphError(f"output: {v!r} is not a value of graph {self.name!r}")
        self.outputs.extend(values)

    # ---- reading --------------------------------------------------------------------------
    def symbols(self) -> list[str]:
        seen: list[str] = []
        for v in self.inputs:
            for d in v.shape:
                if isinstance(d, str) and d not in seen:
                    seen.append(d)
        return seen

    def __str__(self) -> str:
        args = ", ".join(f"%{v.id}:{v.type} {v.name}" for v in self.inputs)
        lines = [f"graph {self.name}({args}) {{"]
        for n in self.nodes:
            res = ", ".join(f"%{o.id}:{o.type}" for o in n.outputs)
            if n.op == "constant":
                lines.append(f"  {res} = constant {n.attrs['name']}")
                continue
            if n.op in ("parameter", "state"):
                lines.append(f"  {res} = {n.op} {json.dumps(n.attrs['name'])}")
                continue
            attrs = ""
            if n.attrs:
                attrs = " {" + ", ".join(f"{k}={_format_attr(v)}" for k, v in n.attrs.items()) + "}"
            lines.append(f"  {res} = {n.describe()}{attrs}")
        for name, v in self.assigns.items():
            lines.append(f"  assign {json.dumps(name)} = %{v.id}")
        for c in self.assumptions:
            lines.append(f"  assume {c.describe()}")
        lines.append(f"  return {', '.join(f'%{v.id}' for v in self.outputs)}")
        lines.append("}")
        return "\n".join(lines)

    __repr__ = __str__

    def hash(self, bytes_below: int | None = None) -> str:
        """Stable content hash: structure, attributes and every constant's bytes (with `bytes_below`,
        only of constants smaller than that many bytes: the others become parameters, and the module
        depends on their names, shapes and dtypes alone). Parameters count by name, shape and dtype."""
        # Each constant's digest is computed once, from when it was added (constants are read-only
        # copies owned by the graph; one replaced in `constants` directly gets a fresh digest).
        h = hashlib.sha256(str(self).encode())
        for name in sorted(self.constants):
            a = self.constants[name]
            if self._digests.get(name, (None,))[0] is not a:
                self._digests[name] = (a, ContentDigest(a))
            h.update(f"{name}:{a.dtype.str}:{a.shape}:".encode())
            if bytes_below is None or a.nbytes < bytes_below:
                h.update(self._digests[name][1].result())
        return h.hexdigest()

    def validate(self) -> None:
        if not self.outputs and not self.assigns:
            raise GraphError(f"graph {self.name!r} has no outputs: call graph.output(value)")
