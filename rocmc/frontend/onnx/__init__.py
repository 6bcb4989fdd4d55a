"""ONNX -> rocmc Graph.

Graph inputs become inputs (a `dim_param` stays a symbolic dim), initializers become constants and
each node is converted by one small function from the CONVERTERS table onto rocmc's ops. Values known
at import time (initializers, Constant, and whatever Shape/Gather/Concat/... compute from them) are
kept as numpy arrays and folded, so shape arithmetic never reaches the compiled module. Shapes are
values too: a shape that holds a symbolic dim is an object array of ints and size expressions
('seq', '(seq+1)', '(batch*seq)'), and the shape ops exporters write (Gather, Concat, Add, Mul, Div,
Min, Equal, Where, Range, Expand, ConstantOfShape, Slice, Reshape, ...) compute on it with
rocmc.symbolic's canonical arithmetic, so dims stay symbolic in the compiled module. A comparison of
sizes the importer cannot decide otherwise assumes symbols >= 2 (as torch.export does), and a Slice
whose symbolic end may pass the dim assumes it does not; each assumption is kept in the graph and
checked when the module is called (InputError).
Elementwise nodes whose inputs are all known (RoPE's cos/sin tables) are evaluated at import with
rocmc's own float64 op references, rounded to the node's dtype, and become constants too.

Every node that cannot be imported (op type, opset version, attribute value, dtype) is collected and
reported together in one ModelImportError.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from ... import symbolic
from ...errors import GraphError, ModelImportError, RocmcError
from ...progress import step
from ..graph import Graph, Value
from ..importing import identifier, slice_bound
from ..ops.shape import gather_indices

MAX_OPSET = 23   # highest default-domain opset whose op definitions rocmc implements

# ONNX TensorProto element types rocmc has; anything else (float8, int4, string, ...) is reported.
_DTYPES = {1: "f32", 10: "f16", 16: "bf16", 11: "f64", 3: "i8", 5: "i16", 6: "i32", 7: "i64",
           2: "u8", 4: "u16", 12: "u32", 13: "u64", 9: "bool"}
# Versions after opset 23 that changed only things rocmc checks elsewhere (new element types such as
# int2/float8e8m0, Cast's round_mode for float8 targets, Range's stash_type for f16 accumulation):
# op -> the newest such version accepted.
NEWER_COMPATIBLE = {op: 25 for op in ("Cast", "CastLike", "Constant", "ConstantOfShape", "Flatten", "Identity",
                                      "Pad", "Reshape", "Shape", "Size", "Squeeze", "Transpose", "Unsqueeze")}
NEWER_COMPATIBLE["Range"] = 27
# A value folded at import becomes a constant of the module. A tiny model can ask for a huge one
# (ConstantOfShape([65536, 65536]), Range(0, 2**40, 1)); past this size it is an import error,
# raised before anything is allocated. Real weights arrive as initializers, which this doesn't limit.
MAX_FOLDED_BYTES = 1 << 30


class Unsupported(Exception):
    """Raised by a converter: the node is valid ONNX but rocmc cannot import it (the reason says why)."""


def _ops():
    from ... import ops
    return ops


def _dtype_name(elem_type: int) -> str:
    import onnx
    return onnx.TensorProto.DataType.Name(elem_type)


def _rocmc_dtype(elem_type: int, what: str) -> str:
    if elem_type not in _DTYPES:
        raise Unsupported(f"{what} has element type {_dtype_name(elem_type)} "
                          f"(rocmc has {', '.join(_dtype_name(k) for k in _DTYPES)})")
    return _DTYPES[elem_type]


@lru_cache(maxsize=None)
def _since_version(op_type: str, opset: int, domain: str) -> int | None:
    import onnx.defs
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except onnx.defs.SchemaError:
        return None


@lru_cache(maxsize=None)
def _schema_attributes(op_type: str, opset: int, domain: str) -> frozenset:
    import onnx.defs
    return frozenset(onnx.defs.get_schema(op_type, opset, domain).attributes)


def _check_folded(shape, dtype, what: str) -> None:
    """Refuse (before allocating it) a folded constant larger than MAX_FOLDED_BYTES."""
    if any(d < 0 for d in shape):
        raise Unsupported(f"{what} has a negative dim in shape [{', '.join(map(str, shape))}]")
    n = math.prod(shape)
    size = n * np.dtype(dtype).itemsize
    if size > MAX_FOLDED_BYTES:
        raise Unsupported(f"{what} would fold into a constant of {n} elements ({size / (1 << 30):.3g} GiB) at "
                          f"import; the limit is {MAX_FOLDED_BYTES >> 30} GiB per folded constant")


# ---- values during import -------------------------------------------------------------------

_INT_TYPES = {"i32": np.int32, "i64": np.int64}


def _known_array(a, int_type: str = "i64") -> np.ndarray:
    """An import-time value as a numpy array: sizes that are symbolic as an object array of ints and
    canonical size expressions (numpy would otherwise make strings of every entry), one whose entries
    all became ints as a plain integer array."""
    a = np.asarray(a)
    if a.dtype.kind not in "OUS":
        return a
    flat = [_dim_entry(v) for v in a.reshape(-1).tolist()]
    if all(isinstance(v, int) for v in flat):
        return np.asarray(flat, dtype=_INT_TYPES.get(int_type, np.int64)).reshape(a.shape)
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(a.shape)


def _dim_entry(v):
    if isinstance(v, (bytes, np.bytes_)):
        v = v.decode()
    if isinstance(v, str):
        try:
            return symbolic.canonical(v)
        except GraphError:
            raise Unsupported(f"value {v!r} is neither a number nor a size expression") from None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise Unsupported(f"a shape value mixes sizes with {v!r}")
    return int(v)


def _sym_values(arrays) -> bool:
    return any(np.asarray(a).dtype == object for a in arrays)

@dataclass
class Tensor:
    """An ONNX value: a graph Value, an array known at import time, or both (materialized once).

    A known integer array holding symbolic sizes is an object array of ints and size expressions;
    `int_type` is then the integer type it stands for (Shape gives int64, a Cast may make it int32)."""
    value: Value | None = None
    known: np.ndarray | None = None
    name: str = ""
    int_type: str = "i64"

    def __post_init__(self):
        if self.known is not None:
            self.known = _known_array(self.known, self.int_type)

    @property
    def shape(self) -> tuple:
        return tuple(self.value.shape) if self.value is not None else tuple(self.known.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def dtype_name(self) -> str:
        if self.value is not None:
            return self.value.dtype.name
        if self.known.dtype == object:
            return self.int_type
        from ..dtypes import dtype
        try:
            return dtype(self.known.dtype).name
        except GraphError:
            raise Unsupported(f"{self.name} has element type {self.known.dtype}, which rocmc lacks") from None


class Node:
    """What a converter sees of one ONNX node: inputs, attributes, the op's version, output count."""

    def __init__(self, importer: "Importer", proto, inputs: list, version: int):
        self.imp = importer
        self.proto = proto
        self.inputs = inputs            # Tensor or None (absent optional input)
        self.version = version          # since_version of the op definition in effect
        self.attrs = {a.name: a for a in proto.attribute}
        self.n_outputs = len(proto.output)

    def wants_output(self, i: int) -> bool:
        return i < len(self.proto.output) and self.proto.output[i] != ""

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def value(self, i: int) -> Value | None:
        return self.imp.value(self.inputs[i]) if self.has(i) else None

    def known(self, i: int, what: str, default=None) -> np.ndarray | None:
        """The import-time value of input i (required to fold shapes, axes, pads, ...)."""
        if not self.has(i):
            return default
        t = self.inputs[i]
        if t.known is None:
            raise Unsupported(f"input {what!r} ({t.name}) must be known at import time (a constant, "
                              f"or computed from constants and shapes)")
        return t.known

    def ints(self, i: int, what: str, default=None):
        k = self.known(i, what)
        if k is None:
            return default
        values = np.asarray(k).reshape(-1).tolist()
        syms = [v for v in values if isinstance(v, str)]
        if syms:
            raise Unsupported(f"input {what!r} ({_fmt(values)}) depends on symbolic dims ({', '.join(syms)}); "
                              f"rocmc needs integers here: pin them, e.g. import_onnx(..., dims={{{syms[0]!r}: N}})")
        return [int(v) for v in values]

    def attr(self, name: str, default=None):
        import onnx.helper
        a = self.attrs.get(name)
        if a is None:
            return default
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, list):
            return [x.decode() if isinstance(x, bytes) else x for x in v]
        return v

    def reject_attr(self, name: str, allowed, default) -> None:
        v = self.attr(name, default)
        if v not in allowed:
            raise Unsupported(f"attribute {name}={v!r} is not supported (supported: "
                              f"{', '.join(map(repr, allowed))})")

    def reject_outputs(self, first: int, why: str) -> None:
        for i in range(first, self.n_outputs):
            if self.wants_output(i):
                raise Unsupported(f"output {i} ({self.proto.output[i]}) is requested: {why}")


CONVERTERS: dict[str, Callable] = {}
# Ops whose result is computed with numpy when every input is known at import time.
FOLDERS: dict[str, Callable] = {}
# Elementwise ops evaluated with rocmc's own references when every input is known and FOLDERS has
# no numpy rule (or it declined): constant tables such as RoPE's cos/sin never reach the module.
REFERENCE_FOLDS: set[str] = set()


def converts(*op_types: str):
    def deco(fn):
        for op in op_types:
            CONVERTERS[op] = fn
        return fn
    return deco


def folds(*op_types: str):
    def deco(fn):
        for op in op_types:
            FOLDERS[op] = fn
        return fn
    return deco


# ---- the importer ---------------------------------------------------------------------------

class Importer:
    def __init__(self, model, name: str | None, dims: dict | None):
        self.model = model
        self.onnx_graph = model.graph
        self.dims = dict(dims or {})
        self.graph = Graph(identifier(name or model.graph.name or "main", "main"))
        self.env: dict[str, Tensor | None] = {}     # None: poisoned by an earlier unsupported node
        self.problems: list[tuple[str, str, str]] = []  # (op type, node name, reason)
        self.opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
        self._used: set[str] = set()
        self._writer: dict[str, str] = {}              # value name -> what defined it, for duplicates
        self.label = ""                                # the node being converted, for assumptions

    # -- assumptions about symbolic sizes
    def assume_symbols(self, least: dict) -> None:
        """The node being converted decided a comparison by assuming these least sizes {symbol: n}."""
        for name, n in sorted(least.items()):
            self.graph.assume(symbolic.Constraint(f"{self.label} (imported assuming {name} >= {n})",
                                                  "at_least", symbolic.Sym(name), symbolic.Int(n)))

    def assume_at_most(self, a, b) -> None:
        """The node being converted assumed size a <= size b (checked when the module is called)."""
        self.graph.assume(symbolic.Constraint(f"{self.label} (imported assuming {a} <= {b})", "at_least",
                                              symbolic.parse(b), symbolic.parse(a)))

    def at_most(self, a, b) -> bool:
        """Whether size a <= size b; when nothing decides it, assumed true (a Slice's symbolic end within
        its dim: a call that breaks it is an InputError, not a silently shorter slice)."""
        try:
            return self.decide(a, "<=", b)
        except Unsupported:
            self.assume_at_most(a, b)
            return True

    def decide(self, a, relation: str, b) -> bool:
        """Whether `a relation b` holds for two sizes (symbolic.decide, recording what it assumed);
        Unsupported when no assumption decides it."""
        try:
            ok, needs = symbolic.decide(a, relation, b)
        except symbolic.Undecided as e:
            raise Unsupported(f"cannot decide {a} {relation} {b}: {e}") from None
        self.assume_symbols(needs)
        return ok

    # -- values
    def value(self, t: Tensor) -> Value:
        if t.value is None:
            arr = t.known
            if arr.dtype == object:   # sizes used as data: computed from the inputs' shapes at run time
                R = _ops()
                flat = R.sizes(self.graph, arr.reshape(-1).tolist(), dtype=t.int_type)
                t.value = flat if arr.ndim == 1 else R.reshape(flat, arr.shape)
                return t.value
            from ..dtypes import dtype as rocmc_dtype
            try:
                dtype = rocmc_dtype(arr.dtype)
            except GraphError:
                raise Unsupported(f"{t.name} has element type {arr.dtype}, which rocmc does not support") from None
            t.value = self.graph.constant(self._unique(t.name or "c"), arr, dtype=dtype)
        return t.value

    def _unique(self, name: str) -> str:
        base = identifier(name, "v")
        out, i = base, 1
        while out in self._used or out in self.graph._names:
            out, i = f"{base}_{i}", i + 1
        self._used.add(out)
        return out

    # -- the pass
    def run(self) -> Graph:
        self._check_opsets()
        inits = {t.name: t for t in self.onnx_graph.initializer}
        inits.update({t.values.name: t for t in self.onnx_graph.sparse_initializer})
        for t in self.onnx_graph.initializer:
            self._initializer(t)
        for t in self.onnx_graph.sparse_initializer:
            self.problems.append(("(initializer)", t.values.name, "sparse initializers are not supported"))
            self._define(t.values.name, None, "a sparse initializer")
        for vi in self.onnx_graph.input:
            if vi.name not in inits:
                self._input(vi)
        for proto in self.onnx_graph.node:
            self._node(proto)
        self._outputs()
        if self.problems:
            raise ModelImportError(_problem_report(self.problems))
        return self.graph

    def _check_opsets(self) -> None:
        if "" not in self.opsets:
            self.problems.append(("(model)", "", "the model imports no default-domain (ai.onnx) opset"))

    def _initializer(self, proto) -> None:
        from onnx import numpy_helper
        try:
            arr = numpy_helper.to_array(proto)
        except Exception as e:  # noqa: BLE001 - an unreadable tensor is an import problem, not a crash
            self.problems.append(("(initializer)", proto.name, f"cannot read tensor: {e}"))
            self._define(proto.name, None, "an initializer")
            return
        if np.asarray(arr).dtype.kind in "OUS":
            self.problems.append(("(initializer)", proto.name, "string tensors are not supported"))
            self._define(proto.name, None, "an initializer")
            return
        self._define(proto.name, Tensor(known=np.asarray(arr), name=proto.name), "an initializer")

    def _define(self, name: str, t: "Tensor | None", writer: str) -> bool:
        """Bind a value name once (ONNX graphs are SSA); a second writer is reported, the first kept."""
        if name in self._writer:
            self.problems.append(("(value)", name, f"is written twice: by {self._writer[name]} and by {writer}"))
            return False
        self._writer[name] = writer
        self.env[name] = t
        return True

    def _input(self, vi) -> None:
        tt = vi.type.tensor_type
        try:
            if not vi.type.HasField("tensor_type"):
                raise Unsupported("only tensor inputs are supported")
            dt = _rocmc_dtype(tt.elem_type, f"input {vi.name!r}")
            shape = []
            if not tt.HasField("shape"):
                raise Unsupported(f"input {vi.name!r} has no shape (not even a rank)")
            for i, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value"):
                    shape.append(int(d.dim_value))
                else:
                    sym = identifier(d.dim_param, "") if d.dim_param else f"{identifier(vi.name, 'x')}_d{i}"
                    shape.append(self.dims.get(d.dim_param or sym, sym))
            v = self.graph.input(self._unique(vi.name), shape, dt)
            self._define(vi.name, Tensor(value=v, name=vi.name), "a graph input")
        except (Unsupported, GraphError) as e:
            self.problems.append(("(input)", vi.name, str(e)))
            self._define(vi.name, None, "a graph input")

    def _node(self, proto) -> None:
        op, label = proto.op_type, proto.name or (proto.output[0] if proto.output else "")
        inputs, poisoned = [], False
        for name in proto.input:
            if name == "":
                inputs.append(None)
            elif name not in self.env:
                self.problems.append((op, label, f"input {name!r} is not defined before the node"))
                poisoned = True
                inputs.append(None)
            else:
                t = self.env[name]
                poisoned |= t is None
                inputs.append(t)
        outs = [None] * len(proto.output)
        self.label = f"{op} node {label!r}"
        try:
            version = self._version(proto)
            self._check_attributes(proto)
            if not poisoned:   # downstream of a reported problem only the op and version are checked
                outs = self._convert(proto, Node(self, proto, inputs, version))
        except (Unsupported, RocmcError) as e:
            self.problems.append((op, label, str(e)))
        for name, t in zip(proto.output, outs):
            if name:
                if isinstance(t, Tensor):
                    t.name = t.name or name
                self._define(name, t, f"{op} node {label!r}")

    def _version(self, proto) -> int:
        domain = "" if proto.domain == "ai.onnx" else proto.domain
        if domain != "":
            raise Unsupported(f"domain {domain!r} is not supported (only the default ai.onnx domain)")
        if proto.op_type not in CONVERTERS and proto.op_type not in FOLDERS:
            raise Unsupported("op type is not supported")
        opset = self.opsets.get("", 0)
        since = _since_version(proto.op_type, opset, "")
        if since is None:
            raise Unsupported(f"op type does not exist in opset {opset}")
        if since > MAX_OPSET and since > NEWER_COMPATIBLE.get(proto.op_type, 0):
            raise Unsupported(f"{proto.op_type}-{since} (opset {opset}) is newer than opset {MAX_OPSET}, "
                              f"the last rocmc implements")
        return since

    def _check_attributes(self, proto) -> None:
        known = _schema_attributes(proto.op_type, self.opsets.get("", 0), "")
        for a in proto.attribute:
            if a.name not in known:
                raise Unsupported(f"unknown attribute {a.name!r}: {proto.op_type} has "
                                  f"{', '.join(sorted(known)) or 'no attributes'}")

    def _convert(self, proto, node: Node) -> list:
        fold = FOLDERS.get(proto.op_type)
        if not all(t is None or t.known is not None for t in node.inputs):
            fold = None
        elif fold is not None:
            fold = _fold_if_small(proto.op_type, node, fold)
        if fold is not None:
            try:
                res = fold(node)
            except Unsupported:
                res = None
            if res is not None:
                it = next((t.int_type for t in node.inputs if t is not None and t.known.dtype == object), "i64")
                return [r if isinstance(r, Tensor) else Tensor(known=r, int_type=it) for r in res]
        if proto.op_type in REFERENCE_FOLDS and all(t is None or t.known is not None for t in node.inputs):
            res = self._fold_by_reference(proto, node)
            if res is not None:
                return [Tensor(known=r) for r in res]
        if proto.op_type not in CONVERTERS:
            raise Unsupported("supported only on values known at import time (constants and static shapes)")
        res = CONVERTERS[proto.op_type](node)
        res = res if isinstance(res, (list, tuple)) else [res]
        out = []
        for r in res:
            if r is None or isinstance(r, Tensor):
                out.append(r)
            elif isinstance(r, Value):
                out.append(Tensor(value=r))
            else:
                out.append(Tensor(known=np.asarray(r)))
        return out + [None] * (len(proto.output) - len(out))

    def _fold_by_reference(self, proto, node: Node) -> list | None:
        """The node's results computed at import time, or None (convert it) when an input is not a plain
        array (a symbolic shape), a result would exceed MAX_FOLDED_BYTES or the conversion fails (the
        ordinary path then reports why). The node's converter builds its rocmc ops in a scratch graph
        whose inputs are constants, and rocmc's float64 references evaluate it, rounded to each
        result's dtype: the constant is what the compiled ops would compute, not numpy's opinion."""
        if any(t is not None and t.known.dtype == object for t in node.inputs):
            return None
        from ..reference import evaluate
        scratch = Importer(self.model, "fold", self.dims)
        inputs = [None if t is None else Tensor(known=t.known, name=t.name) for t in node.inputs]
        try:
            res = CONVERTERS[proto.op_type](Node(scratch, proto, inputs, node.version))
            res = list(res) if isinstance(res, (list, tuple)) else [res]
            if not res or not all(isinstance(r, Value) for r in res):
                return None
            for r in res:
                _check_folded(_static(r.shape, proto.op_type), r.dtype.np, proto.op_type)
            scratch.graph.output(*res)
            out = evaluate(scratch.graph, round_to_dtype=True)
        except (Unsupported, RocmcError):
            return None
        out = out if isinstance(out, tuple) else (out,)
        return [np.asarray(o).astype(r.dtype.np) for o, r in zip(out, res)]

    def _outputs(self) -> None:
        for vi in self.onnx_graph.output:
            t = self.env.get(vi.name)
            if t is None:
                if vi.name not in self.env:
                    self.problems.append(("(output)", vi.name, "no node produces it"))
                continue
            try:
                v = self.value(t)
                _check_declared(vi, v)
                self.graph.output(v)
            except (Unsupported, RocmcError) as e:
                self.problems.append(("(output)", vi.name, str(e)))


def _fold_if_small(op_type: str, node: Node, fold):
    """`fold`, or None (convert to graph ops instead) when the broadcast result would be too large to
    hold as a constant; an op rocmc only folds is then an error."""
    if op_type not in _BROADCASTING_FOLDS:
        return fold
    arrays = [t.known for t in node.inputs if t is not None]
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
    except ValueError:
        raise Unsupported(f"inputs of shapes {', '.join(str(list(a.shape)) for a in arrays)} don't broadcast") from None
    try:
        _check_folded(shape, max((a.dtype for a in arrays), key=lambda d: d.itemsize), op_type)
    except Unsupported:
        if op_type in CONVERTERS:
            return None
        raise
    return fold


def _check_declared(vi, v: Value) -> None:
    """A graph output's declared element type and static dims must be those computed."""
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        return
    if tt.elem_type and _DTYPES.get(tt.elem_type) != v.dtype.name:
        raise Unsupported(f"declared with element type {_dtype_name(tt.elem_type)}, but the model computes {v.type}")
    if not tt.HasField("shape"):
        return
    declared = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if len(declared) != v.rank or any(isinstance(c, int) and d is not None and d != c
                                      for d, c in zip(declared, v.shape)):
        text = ",".join("?" if d is None else str(d) for d in declared)
        raise Unsupported(f"declared with shape [{text}], but the model computes {v.type}")



def _fmt(arr) -> str:
    return "[" + ", ".join(str(x) for x in np.asarray(arr).reshape(-1)) + "]"


def _problem_report(problems) -> str:
    lines = [f"cannot import the ONNX model: {len(problems)} unsupported node(s) or value(s)"]
    for op, name, reason in problems:
        lines.append(f"  {op} {name!r}: {reason}")
    return "\n".join(lines)


def import_onnx(model, *, name: str | None = None, dims: dict | None = None) -> Graph:
    """Import an ONNX model (path, serialized bytes or onnx.ModelProto) as a rocmc Graph.

    name: the graph's name (default: the ONNX graph's name).
    dims: {symbolic dim name: int} to pin symbolic input dims to sizes.
    Raises ModelImportError listing every node that cannot be imported (op type, name, reason).
    """
    import onnx
    with step(f"importing ONNX model{f' {model}' if isinstance(model, (str, Path)) else ''}",
              logger=__name__):
        if isinstance(model, (str, Path)):
            try:
                model = onnx.load(str(model))
            except Exception as e:  # noqa: BLE001 - any failure to parse is an import error
                raise ModelImportError(f"cannot read ONNX model {str(model)!r}: {e}") from None
        elif isinstance(model, (bytes, bytearray)):
            try:
                model = onnx.load_from_string(bytes(model))
            except Exception as e:  # noqa: BLE001
                raise ModelImportError(f"cannot parse ONNX model bytes: {e}") from None
        elif not isinstance(model, onnx.ModelProto):
            raise ModelImportError(f"import_onnx: expected a path, bytes or onnx.ModelProto, got "
                                   f"{type(model).__name__}")
        return Importer(model, name, dims).run()


# ---- shape helpers --------------------------------------------------------------------------

def _static(shape, what: str) -> tuple:
    if not all(isinstance(d, int) for d in shape):
        raise Unsupported(f"{what} needs static dims, got [{', '.join(map(str, shape))}]")
    return tuple(shape)


def _axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise Unsupported(f"{what}={axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


def _axes(axes, rank: int) -> list:
    return sorted(_axis(int(a), rank, "axes") for a in axes)


def _shape_array(shape) -> np.ndarray:
    """A shape as an import-time value: int64 when static, else an object array with symbol names."""
    if all(isinstance(d, int) for d in shape):
        return np.asarray(shape, dtype=np.int64).reshape(len(shape))
    return np.asarray(list(shape), dtype=object).reshape(len(shape))


def _dims(arr) -> list:
    return [d if isinstance(d, str) else int(d) for d in np.asarray(arr).reshape(-1).tolist()]


def _reshape_target(in_shape, target, allowzero: bool) -> list:
    """ONNX Reshape's target: 0 copies the input dim (unless allowzero); -1 is left to rocmc's reshape."""
    return [in_shape[i] if (isinstance(d, int) and d == 0 and not allowzero) else d for i, d in enumerate(target)]


def _broadcast(a, b, imp: "Importer") -> list:
    """Numpy broadcasting of two shapes; symbolic dims are equal when their sizes are (decided by
    `imp`, which may assume symbols >= 2: a symbolic dim against 1 is then the dim)."""
    rank = max(len(a), len(b))
    a = [1] * (rank - len(a)) + list(a)
    b = [1] * (rank - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        elif (isinstance(x, str) or isinstance(y, str)) and _equal_sizes(imp, x, y):
            out.append(x)
        else:
            raise Unsupported(f"shapes {_fmt(a)} and {_fmt(b)} do not broadcast")
    return out


def _equal_sizes(imp: "Importer", x, y) -> bool:
    try:
        return imp.decide(x, "==", y)
    except Unsupported:
        return False


# ---- elementwise ----------------------------------------------------------------------------

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Equal": "equal", "Less": "less",
           "LessOrEqual": "less_equal", "Greater": "greater", "GreaterOrEqual": "greater_equal",
           "And": "logical_and", "Or": "logical_or", "Xor": "logical_xor"}
_NUMPY_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Equal": np.equal, "Less": np.less,
                 "LessOrEqual": np.less_equal, "Greater": np.greater, "GreaterOrEqual": np.greater_equal,
                 "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}
# Folders whose result has the broadcast shape of their inputs.
_BROADCASTING_FOLDS = (*_NUMPY_BINARY, "Div", "Mod", "Max", "Min", "Where")
_UNARY = {"Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Tanh": "tanh",
          "Sigmoid": "sigmoid", "Erf": "erf", "Relu": "relu", "Not": "logical_not", "Cos": "cos", "Sin": "sin",
          "Sign": "sign", "Floor": "floor", "Ceil": "ceil", "Round": "round", "Reciprocal": "reciprocal",
          "IsNaN": "isnan"}


@converts(*_BINARY)
def _binary(n: Node):
    if n.version < 7 and n.attr("broadcast", 0):
        raise Unsupported("legacy broadcast attribute (opset < 7)")
    return getattr(_ops(), _BINARY[n.proto.op_type])(n.value(0), n.value(1))


@folds(*_NUMPY_BINARY)
def _fold_binary(n: Node):
    a, b = n.known(0, "A"), n.known(1, "B")
    if _sym_values((a, b)):
        return _sym_elementwise(n, [a, b])
    arithmetic = n.proto.op_type in ("Add", "Sub", "Mul")
    return [_NUMPY_BINARY[n.proto.op_type](a, b).astype(a.dtype if arithmetic else bool)]


def _sym_elementwise(n: Node, arrays) -> list:
    """An elementwise node over sizes (some symbolic), computed with rocmc.symbolic's arithmetic:
    the shape arithmetic of exporters (seq+1, batch*seq, seq//2, min(seq, 512), seq == 1)."""
    op = n.proto.op_type
    if not all(np.asarray(a).dtype.kind in "Oiu" for a in arrays):
        raise Unsupported(f"{op} mixes symbolic sizes with non-integer values")
    shape = np.broadcast_shapes(*(np.shape(a) for a in arrays))
    out = [_sym_scalar(n, op, list(xs)) for xs in np.broadcast(*arrays)]
    if op in _SIZE_COMPARISONS:
        return [np.asarray(out, dtype=bool).reshape(shape)]
    res = np.empty(len(out), dtype=object)
    res[:] = out
    return [res.reshape(shape)]


_SIZE_COMPARISONS = {"Equal": "==", "Less": "<", "LessOrEqual": "<=", "Greater": ">", "GreaterOrEqual": ">="}


def _sym_scalar(n: Node, op: str, xs: list):
    xs = [x if isinstance(x, str) else int(x) for x in xs]
    S = symbolic
    if op in _SIZE_COMPARISONS:
        return n.imp.decide(xs[0], _SIZE_COMPARISONS[op], xs[1])
    if op in ("Max", "Min"):
        assumed: dict = {}
        acc = xs[0]
        for x in xs[1:]:
            acc = (S.dim_max if op == "Max" else S.dim_min)(acc, x, assumed)
        n.imp.assume_symbols(assumed)
        return acc
    if op in ("Div", "Mod"):
        a, b = xs
        if not (n.imp.decide(b, ">", 0) and n.imp.decide(a, ">=", 0)):
            raise Unsupported(f"{op} of sizes {a} and {b}: only non-negative by positive is supported")
        return S.dim_floordiv(a, b) if op == "Div" else S.dim_mod(a, b)
    fn = {"Add": S.dim_add, "Sub": S.dim_sub, "Mul": S.dim_mul}.get(op)
    if fn is None:
        raise Unsupported(f"{op} of symbolic sizes")
    return fn(*xs)


@folds("Mod")
def _fold_mod(n: Node):
    a, b = n.known(0, "A"), n.known(1, "B")
    if _sym_values((a, b)):
        return _sym_elementwise(n, [a, b])
    return [(np.fmod(a, b) if n.attr("fmod", 0) else np.mod(a, b)).astype(a.dtype)]


@folds("Trilu")
def _fold_trilu(n: Node):
    a = n.known(0, "input")
    k = n.ints(1, "k", [0])[0]
    return [np.triu(a, k) if n.attr("upper", 1) else np.tril(a, k)]


@folds("Div")
def _fold_div(n: Node):
    a, b = n.known(0, "A"), n.known(1, "B")
    if _sym_values((a, b)):
        return _sym_elementwise(n, [a, b])
    if a.dtype.kind in "iu":
        q = np.abs(a) // np.maximum(np.abs(b), 1)
        return [np.where((a < 0) ^ (b < 0), -q, q).astype(a.dtype)]
    return [(a / b).astype(a.dtype)]


@converts("Pow")
def _pow(n: Node):
    x, y = n.value(0), n.value(1)
    if y.dtype != x.dtype:   # ONNX allows an exponent of another type; rocmc's pow wants one dtype
        y = _ops().cast(y, x.dtype)
    return _ops().pow(x, y)


@converts(*_UNARY)
def _unary(n: Node):
    return getattr(_ops(), _UNARY[n.proto.op_type])(n.value(0))


@converts("IsInf")
def _isinf(n: Node):
    return _ops().isinf(n.value(0), detect_positive=int(n.attr("detect_positive", 1)),
                        detect_negative=int(n.attr("detect_negative", 1)))


@converts("Mod")
def _mod(n: Node):
    return _ops().mod(n.value(0), n.value(1), fmod=int(n.attr("fmod", 0)))


_NUMPY_UNARY = {"Neg": np.negative, "Abs": np.abs, "Not": np.logical_not, "Sqrt": np.sqrt, "Exp": np.exp,
                "Log": np.log, "Relu": lambda a: np.maximum(a, 0)}


@folds(*_NUMPY_UNARY)
def _fold_unary(n: Node):
    a = n.known(0, "X")
    if a.dtype == object:
        if n.proto.op_type != "Neg":
            return None
        return [_known_array(np.vectorize(lambda d: symbolic.dim_sub(0, d), otypes=[object])(a))]
    return [np.asarray(_NUMPY_UNARY[n.proto.op_type](a)).astype(a.dtype)]


_ACTIVATIONS = {
    "LeakyRelu": lambda R, x, n: R.leaky_relu(x, negative_slope=float(n.attr("alpha", 0.01))),
    "Elu": lambda R, x, n: R.elu(x, alpha=float(n.attr("alpha", 1.0))),
    "Gelu": lambda R, x, n: R.gelu(x, approximate=n.attr("approximate", "none")),
    "Softsign": lambda R, x, n: R.div(x, R.add(R.abs(x), 1.0)),
    # relu(x) + log(1 + exp(-|x|)): no overflow for large |x|
    "Softplus": lambda R, x, n: _softplus(R, x),
    "HardSigmoid": lambda R, x, n: R.clipped_relu(R.add(R.mul(x, float(n.attr("alpha", 0.2))),
                                                        float(n.attr("beta", 0.5))), ceiling=1.0),
    "HardSwish": lambda R, x, n: R.mul(x, R.clipped_relu(R.add(R.mul(x, 1.0 / 6.0), 0.5), ceiling=1.0)),
    "Selu": lambda R, x, n: R.mul(R.elu(x, alpha=float(n.attr("alpha", 1.67326319217681884765625))),
                                  float(n.attr("gamma", 1.05070102214813232421875))),
    # celu(x) = alpha * elu(x / alpha)
    "Celu": lambda R, x, n: R.mul(R.elu(R.div(x, float(n.attr("alpha", 1.0)))), float(n.attr("alpha", 1.0))),
    "ThresholdedRelu": lambda R, x, n: R.where(R.greater(x, float(n.attr("alpha", 1.0))), x, R.mul(x, 0.0)),
    "Mish": lambda R, x, n: R.mul(x, R.tanh(_softplus(R, x))),
}


def _softplus(R, x):
    return R.add(R.relu(x), R.log(R.add(R.exp(R.neg(R.abs(x))), 1.0)))


@converts(*_ACTIVATIONS)
def _activation(n: Node):
    if n.proto.op_type == "Gelu":
        n.reject_attr("approximate", ("none", "tanh"), "none")
    return _ACTIVATIONS[n.proto.op_type](_ops(), n.value(0), n)


@converts("PRelu")
def _prelu(n: Node):
    R = _ops()
    x, slope = n.value(0), n.value(1)
    return R.where(R.less(x, 0), R.mul(x, slope), x)


@converts("Clip")
def _clip(n: Node):
    R = _ops()
    x = n.value(0)
    if n.version < 11:
        lo, hi = n.attr("min"), n.attr("max")
        lo = None if lo is None else np.asarray(lo, dtype=x.dtype.np)
        hi = None if hi is None else np.asarray(hi, dtype=x.dtype.np)
    else:
        lo, hi = n.value(1), n.value(2)
    if lo is not None:
        x = R.maximum(x, lo)
    if hi is not None:
        x = R.minimum(x, hi)
    return x


@converts("Max", "Min", "Sum", "Mean")
def _variadic(n: Node):
    R = _ops()
    fn = {"Max": R.maximum, "Min": R.minimum, "Sum": R.add, "Mean": R.add}[n.proto.op_type]
    vals = [n.value(i) for i in range(len(n.inputs))]
    acc = vals[0]
    for v in vals[1:]:
        acc = fn(acc, v)
    if n.proto.op_type == "Mean":
        acc = R.div(acc, float(len(vals)))
    return acc


@folds("Max", "Min")
def _fold_minmax(n: Node):
    arrs = [n.known(i, "data_0") for i in range(len(n.inputs))]
    if _sym_values(arrs):
        return _sym_elementwise(n, arrs)
    fn = np.maximum if n.proto.op_type == "Max" else np.minimum
    acc = arrs[0]
    for a in arrs[1:]:
        acc = fn(acc, a)
    return [acc]


@converts("Where")
def _where(n: Node):
    return _ops().where(n.value(0), n.value(1), n.value(2))


@folds("Where")
def _fold_where(n: Node):
    c, a, b = n.known(0, "condition"), n.known(1, "X"), n.known(2, "Y")
    return [np.where(c, a, b)]


REFERENCE_FOLDS.update(_UNARY, _BINARY, _ACTIVATIONS, ("IsInf", "Mod", "Pow", "PRelu", "Clip", "Max", "Min",
                                                          "Sum", "Mean", "Where"))


@converts("Cast", "CastLike")
def _cast(n: Node):
    to = n.inputs[1].dtype_name() if n.proto.op_type == "CastLike" else _rocmc_dtype(n.attr("to"), "target type 'to'")
    src = n.inputs[0]
    if src.known is not None and src.known.dtype != object:   # e.g. a constant cast like a runtime tensor
        from ..dtypes import dtype
        return [src.known.astype(dtype(to).np)]
    return _ops().cast(n.value(0), to)


@folds("Cast")
def _fold_cast(n: Node):
    a = n.known(0, "input")
    to = n.attr("to")
    if a.dtype == object:   # sizes stay sizes as integers; as floats they become data (Importer.value)
        return [Tensor(known=a, int_type="i32" if to == 6 else "i64")] if to in (6, 7) else None
    import onnx.helper
    return [a.astype(onnx.helper.tensor_dtype_to_np_dtype(to))]


@converts("Identity", "Dropout")
def _identity(n: Node):
    if n.proto.op_type == "Dropout":
        training = n.known(2, "training_mode") if n.version >= 12 else None
        if training is not None and bool(np.asarray(training).reshape(-1)[0]):
            ratio = n.known(1, "ratio", np.asarray(0.5)) if n.version >= 12 else n.attr("ratio", 0.5)
            if float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
                raise Unsupported("training_mode=true with a nonzero ratio (random dropout) is not supported")
        if n.wants_output(1):   # the mask of an inference dropout keeps everything
            shape = _static(n.inputs[0].shape, "Dropout's mask output")
            _check_folded(shape, bool, "Dropout's mask output")
            return [n.inputs[0], np.ones(shape, dtype=bool)]
    return [n.inputs[0]]


# ---- constants and shapes (folded at import) --------------------------------------------------

@converts("Constant")
def _constant(n: Node):
    from onnx import numpy_helper
    kinds = {"value": None, "value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
             "value_ints": np.int64}
    for key, dtype in kinds.items():
        if key in n.attrs:
            v = n.attr(key)
            arr = numpy_helper.to_array(v) if dtype is None else np.asarray(v, dtype=dtype)
            if arr.dtype.kind in "OUS":
                raise Unsupported("string tensors are not supported")
            return [arr]
    raise Unsupported(f"Constant with {', '.join(n.attrs)} is not supported (only tensor, float(s), int(s))")


@converts("Shape")
def _shape(n: Node):
    shape = n.inputs[0].shape
    r = len(shape)
    start, end = n.attr("start", 0), n.attr("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return [_shape_array(shape[start:end])]


@converts("Size")
def _size(n: Node):
    total = 1
    for d in n.inputs[0].shape:
        total = symbolic.dim_mul(total, d)
    return [_known_array(np.asarray(total, dtype=object))]


@converts("ConstantOfShape")
def _constant_of_shape(n: Node):
    from onnx import numpy_helper
    shape = _dims(n.known(0, "input"))
    v = n.attr("value")
    fill = numpy_helper.to_array(v).reshape(-1)[0] if v is not None else np.float32(0)
    if any(isinstance(d, str) for d in shape):   # filled at run time, to sizes the inputs give
        return _ops().broadcast_to(n.imp.value(Tensor(known=np.asarray(fill), name="fill")), shape)
    _check_folded(shape, np.asarray(fill).dtype, "ConstantOfShape")
    return [np.full(shape, fill, dtype=np.asarray(fill).dtype)]


@converts("Range")
def _range(n: Node):
    start, limit, delta = (n.known(i, w) for i, w in enumerate(("start", "limit", "delta")))
    if any(np.asarray(v).dtype.kind in "OU" for v in (start, limit, delta)):   # a symbolic dim among them
        return _symbolic_range(n, start, limit, delta)
    count = np.ceil((np.float64(limit) - np.float64(start)) / np.float64(delta)) if delta != 0 else np.inf
    if not np.isfinite(count):
        raise Unsupported(f"Range({start}, {limit}, {delta}) has no finite length")
    _check_folded((max(int(count), 0),), np.asarray(start).dtype, "Range")
    return [np.arange(start, limit, delta).astype(np.asarray(start).dtype)]


# ---- reductions -----------------------------------------------------------------------------

_REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceProd": "prod", "ReduceMax": "max",
           "ReduceMin": "min", "ReduceL1": "norm1", "ReduceL2": "norm2"}
_REDUCE_AXES_AS_INPUT = {"ReduceSum": 13}   # others moved axes to an input in opset 18


def _reduce_axes(n: Node, rank: int):
    """The axes to reduce, or [] for none (noop_with_empty_axes)."""
    since = _REDUCE_AXES_AS_INPUT.get(n.proto.op_type, 18)
    axes = n.ints(1, "axes") if n.version >= since else n.attr("axes")
    if not axes:
        return [] if n.attr("noop_with_empty_axes", 0) else list(range(rank))
    return _axes(axes, rank)


def _reduce(R, fn: str, x: Value, axes, keep: bool) -> Value:
    if x.dtype.kind == "bool" and fn in ("max", "min"):   # any / all, through int32
        return R.cast(getattr(R, fn)(R.cast(x, "i32"), axis=tuple(axes), keepdims=keep), "bool")
    return getattr(R, fn)(x, axis=tuple(axes), keepdims=keep)


@converts(*_REDUCE, "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")
def _reduction(n: Node):
    R = _ops()
    x = n.value(0)
    axes = _reduce_axes(n, x.rank)
    keep = bool(n.attr("keepdims", 1))
    op = n.proto.op_type
    if not axes:   # noop_with_empty_axes: ONNX returns the input unchanged
        return [n.inputs[0]]
    if op in _REDUCE:
        return _reduce(R, _REDUCE[op], x, axes, keep)
    if op == "ReduceSumSquare":
        return _reduce(R, "sum", R.mul(x, x), axes, keep)
    if op == "ReduceLogSum":
        return R.log(_reduce(R, "sum", x, axes, keep))
    m = _reduce(R, "max", x, axes, True)   # log-sum-exp shifted by the max, so exp never overflows
    s = R.log(_reduce(R, "sum", R.exp(R.sub(x, m)), axes, keep))
    return R.add(s, m if keep else _reduce(R, "max", x, axes, False))


# ---- softmax, normalization -----------------------------------------------------------------

@converts("Softmax", "LogSoftmax")
def _softmax(n: Node):
    R = _ops()
    fn = R.softmax if n.proto.op_type == "Softmax" else R.log_softmax
    x = n.value(0)
    if n.version >= 13:
        return fn(x, axis=_axis(n.attr("axis", -1), x.rank))
    # Before opset 13 the input is viewed as 2D [prod(dims[:axis]), prod(dims[axis:])].
    axis = _axis(n.attr("axis", 1), x.rank)
    if axis == x.rank - 1:
        return fn(x, axis=axis)
    shape = _static(x.shape, f"{n.proto.op_type}-{n.version} with axis={axis}")
    flat = R.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))
    return R.reshape(fn(flat, axis=1), shape)


@converts("LayerNormalization")
def _layer_norm(n: Node):
    R = _ops()
    x = n.value(0)
    axis, eps = _axis(n.attr("axis", -1), x.rank), float(n.attr("epsilon", 1e-5))
    y = R.layer_norm(x, n.value(1), n.value(2), eps=eps, axis=axis)
    if not (n.wants_output(1) or n.wants_output(2)):
        return y
    # The optional Mean and InvStdDev outputs, in the stash type (float32), over axes[axis:].
    if n.attr("stash_type", 1) != 1:
        raise Unsupported(f"stash_type={n.attr('stash_type')} (only 1, float32, is supported)")
    xf = x if x.dtype.name == "f32" else R.cast(x, "f32")
    axes = tuple(range(axis, x.rank))
    mean = R.mean(xf, axis=axes, keepdims=True)
    centered = R.sub(xf, mean)
    inv_std = R.rsqrt(R.add(R.mean(R.mul(centered, centered), axis=axes, keepdims=True), eps))
    return [y, mean, inv_std]


@converts("RMSNormalization")
def _rms_norm(n: Node):
    x = n.value(0)
    return _ops().rms_norm(x, n.value(1), eps=float(n.attr("epsilon", 1e-5)), axis=_axis(n.attr("axis", -1), x.rank))


@converts("BatchNormalization")
def _batch_norm(n: Node):
    if n.attr("training_mode", 0):
        raise Unsupported("training_mode=1 is not supported (inference only)")
    if n.version < 9 and not n.attr("spatial", 1):
        raise Unsupported("spatial=0 is not supported")
    n.reject_outputs(1, "running statistics outputs exist only in training mode")
    return _ops().batch_norm(n.value(0), n.value(3), n.value(4), n.value(1), n.value(2),
                             eps=float(n.attr("epsilon", 1e-5)))


@converts("LRN")
def _lrn(n: Node):
    return _ops().local_response_norm(n.value(0), size=int(n.attr("size")), alpha=float(n.attr("alpha", 1e-4)),
                                      beta=float(n.attr("beta", 0.75)), k=float(n.attr("bias", 1.0)))


# ---- matmul ---------------------------------------------------------------------------------

@converts("MatMul")
def _matmul(n: Node):
    R = _ops()
    a, b = n.value(0), n.value(1)
    a1, b1 = a.rank == 1, b.rank == 1   # numpy's matmul promotes 1-D operands, then drops the dim
    if a1:
        a = R.unsqueeze(a, 0)
    if b1:
        b = R.unsqueeze(b, 1)
    y = R.matmul(a, b)
    if b1:
        y = R.squeeze(y, -1)
    if a1:
        y = R.squeeze(y, -1 if b1 else -2) if y.rank else y
    return y


@converts("Gemm")
def _gemm(n: Node):
    R = _ops()
    a, b, c = n.value(0), n.value(1), n.value(2)
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    ta, tb = bool(n.attr("transA", 0)), bool(n.attr("transB", 0))
    if tb and not ta and alpha == 1.0 and (c is None or (beta == 1.0 and c.rank == 1)):
        return R.linear(a, b, c)   # x @ W^T + bias: the linear layer form, with its library paths
    y = R.matmul(a, b, transpose_a=ta, transpose_b=tb)
    if alpha != 1.0:
        y = R.mul(y, alpha)
    if c is not None:
        y = R.add(y, c if beta == 1.0 else R.mul(c, beta))
    return y


# ---- attention and rotary embedding (opset 23) ------------------------------------------------

def _to_heads(R, x: Value, heads: int) -> Value:
    """[B, S, heads*D] -> [B, heads, S, D]."""
    return R.permute(R.reshape(x, (x.shape[0], x.shape[1], heads, -1)), (0, 2, 1, 3))


@converts("Attention")
def _attention(n: Node):
    R = _ops()
    q, k, v, mask = n.value(0), n.value(1), n.value(2), n.value(3)
    past_k, past_v = n.value(4), n.value(5)
    three_d = q.rank == 3
    if three_d:
        qh, kvh = n.attr("q_num_heads"), n.attr("kv_num_heads")
        if not qh or not kvh:
            raise Unsupported("3-D inputs need q_num_heads and kv_num_heads")
        q, k, v = _to_heads(R, q, qh), _to_heads(R, k, kvh), _to_heads(R, v, kvh)
    new_kv = k.shape[2]
    past = 0 if past_k is None else past_k.shape[2]
    if past_k is not None:
        k = R.concat([past_k, k], axis=2)
        v = R.concat([past_v, v], axis=2)
    if mask is not None:
        mask = _pad_mask(R, q, mask, k.shape[2])
    causal = bool(n.attr("is_causal", 0))
    softcap, scale = float(n.attr("softcap", 0.0)), n.attr("scale")
    scale = None if scale is None else float(scale)
    if causal and (new_kv != q.shape[2] or softcap or n.wants_output(3)):
        # ONNX keeps key j for query i when j <= i + past_length; rocmc's is_causal aligns to the
        # bottom right (j <= i + kv_length - q_length). They differ here, so spell the mask out.
        s, total, past = _static((q.shape[2], k.shape[2], past), "is_causal with query and new key lengths that differ")
        _check_folded((s, total), bool, "the is_causal mask")
        keep = n.imp.value(Tensor(known=np.tril(np.ones((s, total), dtype=bool), k=past), name="causal_keep"))
        mask, causal = _and_keep(R, q, mask, keep), False
    if softcap or n.wants_output(3):
        y, qk = _attention_steps(R, n, q, k, v, mask, scale, softcap)
    else:
        if mask is not None and mask.dtype.is_float and mask.dtype != q.dtype:
            mask = R.cast(mask, q.dtype)
        y, qk = R.sdpa(q, k, v, mask=mask, is_causal=causal, scale=scale), None
    if three_d:
        y = R.reshape(R.permute(y, (0, 2, 1, 3)), (y.shape[0], y.shape[2], -1))
    return [y, k if n.wants_output(1) else None, v if n.wants_output(2) else None, qk]


def _pad_mask(R, q: Value, mask: Value, total) -> Value:
    """ONNX lets the mask cover fewer keys than there are; the rest are masked out."""
    short = total - mask.shape[-1] if isinstance(total, int) and isinstance(mask.shape[-1], int) else 0
    if short <= 0:
        return mask
    widths = [(0, 0)] * (mask.rank - 1) + [(0, short)]
    return R.pad(mask, widths, value=0 if mask.dtype.kind == "bool" else float("-inf"))


def _attention_steps(R, n: Node, q: Value, k: Value, v: Value, mask, scale, softcap: float):
    """Attention spelled out, for what the fused op has no room for: softcap and the qk_matmul_output
    output (mode 0/1: Q.K^T after softcap, 2: plus the mask, 3: after softmax), as ONNX defines them."""
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:   # grouped-query: repeat each KV head hq/hkv times ([h0, h0, h1, h1, ...])
        rep = _static((hq, hkv), "grouped-query Attention with softcap or qk_matmul_output")
        rep = rep[0] // rep[1]

        def repeat(t):
            b, h, sk, d = t.shape
            return R.reshape(R.broadcast_to(R.unsqueeze(t, 2), (b, h, rep, sk, d)), (b, h * rep, sk, d))
        k, v = repeat(k), repeat(v)
    if scale is None:
        scale = 1.0 / math.sqrt(_static(q.shape[3:], "Attention's head size")[0])
    root = math.sqrt(scale)   # ONNX scales Q and K by sqrt(scale) each
    qk = R.matmul(R.mul(q, root), R.mul(k, root), transpose_b=True)
    if softcap:
        qk = R.mul(R.tanh(R.div(qk, softcap)), softcap)
    scores = qk
    if mask is not None:
        bias = mask if mask.dtype.is_float else R.where(mask, np.asarray(0.0, dtype=q.dtype.np),
                                                         np.asarray(-np.inf, dtype=q.dtype.np))
        scores = R.add(qk, R.cast(bias, q.dtype) if bias.dtype != q.dtype else bias)
    probs = R.softmax(scores, axis=3)
    mode = int(n.attr("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise Unsupported(f"qk_matmul_output_mode={mode}")
    return R.matmul(probs, v), {0: qk, 1: qk, 2: scores, 3: probs}[mode]


def _and_keep(R, q: Value, mask: Value | None, keep: Value) -> Value:
    """Combine an attention mask (boolean keep-mask or additive) with a boolean keep-mask."""
    if mask is None:
        return keep
    if mask.dtype.kind == "bool":
        return R.logical_and(mask, keep)
    return R.where(keep, R.cast(mask, q.dtype), np.asarray(-np.inf, dtype=q.dtype.np))


@converts("RotaryEmbedding")
def _rotary_embedding(n: Node):
    R = _ops()
    x, cos, sin, pos = n.value(0), n.value(1), n.value(2), n.value(3)
    interleaved = bool(n.attr("interleaved", 0))
    rot = int(n.attr("rotary_embedding_dim", 0)) or None
    if x.rank == 4:   # [B, H, S, D]
        return R.rope(x, cos, sin, interleaved=interleaved, layout="bhsd", rotary_dim=rot, position_ids=pos)
    heads = n.attr("num_heads")
    if x.rank != 3 or not heads:
        raise Unsupported("3-D input needs num_heads (4-D input is [batch, heads, seq, head_size])")
    b, s, hidden = x.shape
    if not isinstance(hidden, int) or hidden % heads:
        raise Unsupported(f"hidden size {hidden} is not a static multiple of num_heads={heads}")
    y = R.rope(R.reshape(x, (b, s, heads, hidden // heads)), cos, sin, interleaved=interleaved, layout="bshd",
               rotary_dim=rot, position_ids=pos)
    return R.reshape(y, (b, s, hidden))


# ---- data movement --------------------------------------------------------------------------

@converts("Reshape")
def _reshape(n: Node):
    shape = _reshape_target(n.inputs[0].shape, _dims(n.known(1, "shape")) if n.version >= 5 else n.attr("shape"),
                            bool(n.attr("allowzero", 0)))
    return _ops().reshape(n.value(0), tuple(shape))


@folds("Reshape")
def _fold_reshape(n: Node):
    a = n.known(0, "data")
    target = _reshape_target(a.shape, _dims(n.known(1, "shape")), bool(n.attr("allowzero", 0)))
    return [a.reshape(target)]


@converts("Flatten")
def _flatten(n: Node):
    from ..ops.shape import product
    x = n.inputs[0]
    axis = n.attr("axis", 1)
    axis = axis + x.rank if axis < 0 else axis   # Flatten's axis ranges over [-rank, rank]
    if not 0 <= axis <= x.rank:
        raise Unsupported(f"axis={n.attr('axis')} is out of range for rank {x.rank}")
    if x.known is not None:
        return [x.known.reshape(math.prod(x.shape[:axis]), -1)]
    return _ops().reshape(n.value(0), (product(x.shape[:axis]).dim, product(x.shape[axis:]).dim))


@converts("Transpose")
def _transpose(n: Node):
    perm = n.attr("perm") or list(reversed(range(n.inputs[0].rank)))
    if n.inputs[0].known is not None:
        return [np.transpose(n.inputs[0].known, perm)]
    return _ops().permute(n.value(0), tuple(int(p) for p in perm))


@converts("Concat")
def _concat(n: Node):
    ts = [t for t in n.inputs if t is not None]
    axis = _axis(n.attr("axis"), ts[0].rank)
    return _ops().concat([n.imp.value(t) for t in ts], axis=axis)


@folds("Concat")
def _fold_concat(n: Node):
    arrs = [t.known for t in n.inputs if t is not None]
    axis = _axis(n.attr("axis"), arrs[0].ndim)
    if any(a.dtype == object for a in arrs):
        arrs = [a.astype(object) for a in arrs]
    return [np.concatenate(arrs, axis=axis)]


def _slice_args(n: Node, rank: int):
    if n.version < 10:
        starts, ends = n.attr("starts"), n.attr("ends")
        axes, steps = n.attr("axes") or list(range(len(starts))), [1] * len(starts)
    else:
        starts, ends = n.ints(1, "starts"), n.ints(2, "ends")
        axes = n.ints(3, "axes") or list(range(len(starts)))
        steps = n.ints(4, "steps") or [1] * len(starts)
    return [int(s) for s in starts], [int(e) for e in ends], [_axis(int(a), rank, "axes") for a in axes], \
        [int(s) for s in steps]


@converts("Slice")
def _slice(n: Node):
    x = n.inputs[0]
    if n.version >= 10 and _sym_values([n.known(i, w) for i, w in ((1, "starts"), (2, "ends")) if n.has(i)]):
        return _symbolic_slice(n, x)
    starts, ends, axes, steps = _slice_args(n, x.rank)
    if x.known is not None:
        return [_np_slice(x.known, starts, ends, axes, steps)]
    if any(s == 0 for s in steps):
        raise Unsupported("Slice step 0")
    return _ops().slice(n.value(0), starts, ends, axes, steps)


def _symbolic_slice(n: Node, x: Tensor):
    """Slice with sizes among its bounds (x[:, :seq], x[past:past+seq]): step 1 on those axes, each a
    `narrow` of a symbolic length. Bounds are clamped to the dim as ONNX does when the importer can
    decide it, else the end is assumed within the dim (and checked when the module is called)."""
    starts, ends = (np.asarray(n.known(i, w)).reshape(-1).tolist() for i, w in ((1, "starts"), (2, "ends")))
    axes = n.ints(3, "axes") or list(range(len(starts)))
    steps = n.ints(4, "steps") or [1] * len(starts)
    R, v = _ops(), n.value(0)
    for s, e, ax, st in zip(starts, ends, axes, steps):
        ax = _axis(ax, x.rank, "axes")
        if isinstance(s, int) and isinstance(e, int) and not isinstance(x.shape[ax], str):
            v = R.slice(v, [s], [e], [ax], [st])
            continue
        if st != 1:
            raise Unsupported(f"Slice with symbolic bounds ({s}:{e}) and step {st}; only step 1 is supported")
        dim = x.shape[ax]
        s, e = slice_bound(n.imp.at_most, s, dim), slice_bound(n.imp.at_most, e, dim)
        if not n.imp.at_most(e, dim):
            e = dim
        if not n.imp.at_most(s, e):
            raise Unsupported(f"Slice {s}:{e} of axis {ax} is empty; rocmc has no empty tensors")
        v = R.narrow(v, ax, s, symbolic.dim_sub(e, s))
    return v



def _np_slice(a, starts, ends, axes, steps):
    index = [slice(None)] * a.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        dim = a.shape[ax]
        # ONNX clamps start/end like Python slicing, but INT64_MIN/MAX mean "past the end".
        index[ax] = slice(max(min(s, dim), -dim - 1), max(min(e, dim), -dim - 1), st)
    return a[tuple(index)]


@converts("Gather")
def _gather(n: Node):
    data, idx = n.inputs[0], n.inputs[1]
    axis = _axis(n.attr("axis", 0), data.rank)
    if idx.known is not None and data.known is not None and data.shape[axis] > 0:
        return [np.take(data.known, gather_indices(idx.known, data.shape[axis]), axis=axis)]
    return _ops().gather(n.value(0), n.value(1), axis=axis)


@converts("GatherElements")
def _gather_elements(n: Node):
    axis = _axis(n.attr("axis", 0), n.inputs[0].rank)
    return _ops().take_along_axis(n.value(0), n.value(1), axis=axis)


@converts("GatherND")
def _gather_nd(n: Node):
    return _ops().gather_nd(n.value(0), n.value(1), batch_dims=n.attr("batch_dims", 0))


def _unsqueeze_axes(n: Node, rank: int):
    axes = n.ints(1, "axes") if n.version >= 13 else n.attr("axes")
    return sorted(_axis(int(a), rank + len(axes), "axes") for a in axes)


@converts("Unsqueeze")
def _unsqueeze(n: Node):
    x = n.inputs[0]
    axes = _unsqueeze_axes(n, x.rank)
    if x.known is not None:
        return [np.expand_dims(x.known, tuple(axes))]
    return _ops().unsqueeze(n.value(0), axes)


@converts("Squeeze")
def _squeeze(n: Node):
    x = n.inputs[0]
    axes = (n.ints(1, "axes") if n.version >= 13 else n.attr("axes"))
    if axes:
        axes = _axes(axes, x.rank)
        if any(x.shape[a] != 1 for a in axes):
            raise Unsupported(f"squeezed axes {axes} of [{', '.join(map(str, x.shape))}] are not all 1")
    else:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    if x.known is not None:
        return [np.squeeze(x.known, tuple(axes))]
    return _ops().squeeze(n.value(0), axes)


@converts("Expand")
def _expand(n: Node):
    x = n.inputs[0]
    shape = _broadcast(x.shape, _dims(n.known(1, "shape")), n.imp)
    if x.known is not None and all(isinstance(d, int) for d in shape) and math.prod(shape) <= 1 << 16:
        return [np.broadcast_to(x.known, shape).copy()]
    return _ops().broadcast_to(n.value(0), tuple(shape))


@converts("Split")
def _split(n: Node):
    x = n.inputs[0]
    axis = _axis(n.attr("axis", 0), x.rank)
    dim = x.shape[axis]
    sizes = n.ints(1, "split") if n.version >= 13 else n.attr("split")
    if not sizes:
        count = n.attr("num_outputs") or n.n_outputs
        dim = _static((dim,), "Split into equal parts")[0]
        part = -(-dim // count)
        sizes = [min(part, dim - i * part) for i in range(count)]
    outs, start = [], 0
    for size in sizes:
        end = start + int(size)
        if x.known is not None:
            outs.append(_np_slice(x.known, [start], [end], [axis], [1]))
        else:
            outs.append(_ops().slice(n.value(0), [start], [end], [axis], [1]))
        start = end
    return outs


@converts("Pad")
def _pad(n: Node):
    x = n.value(0)
    mode = n.attr("mode", "constant")
    if n.version < 11:
        pads, value, axes = n.attr("pads"), float(n.attr("value", 0.0)), None
    else:
        pads = n.ints(1, "pads")
        cv = n.known(2, "constant_value")
        value = 0 if cv is None else np.asarray(cv).reshape(-1)[0].item()
        axes = n.ints(3, "axes")
    axes = list(range(x.rank)) if not axes else [_axis(a, x.rank, "axes") for a in axes]
    k = len(axes)
    width = [[0, 0] for _ in range(x.rank)]
    for i, a in enumerate(axes):
        width[a] = [int(pads[i]), int(pads[i + k])]
    return _ops().pad(x, [tuple(w) for w in width], mode=mode, value=value)


# ---- index ops: TopK, CumSum, and Range up to a symbolic dim -----------------------------------

NEWER_COMPATIBLE["TopK"] = 24     # TopK-24 only added bfloat16 inputs

def _one_int(n: Node, i: int, what: str) -> int:
    """An input that must hold one integer known at import time (TopK's K, CumSum's axis)."""
    values = n.ints(i, what)
    if values is None or len(values) != 1:
        raise Unsupported(f"input {what!r} must hold one integer, got {values}")
    return values[0]


@converts("TopK")
def _topk(n: Node):
    x = n.value(0)
    k = _one_int(n, 1, "K") if n.version >= 10 else n.attr("k")
    values, indices = _ops().topk(x, k, axis=_axis(n.attr("axis", -1), x.rank),
                                  largest=bool(n.attr("largest", 1)), sorted=bool(n.attr("sorted", 1)))
    return [values, indices]


@converts("CumSum")
def _cumsum(n: Node):
    x = n.value(0)
    return _ops().cumsum(x, _axis(_one_int(n, 1, "axis"), x.rank), exclusive=bool(n.attr("exclusive", 0)),
                         reverse=bool(n.attr("reverse", 0)))


def _symbolic_range(n: Node, start, limit, delta):
    """Range over symbolic sizes (positions from a Shape: Range(past, past+seq, 1)): an arange of the
    symbolic length, scaled by the step and shifted by the start, both computed at run time."""
    R = _ops()
    start, limit, delta = (np.asarray(v).reshape(-1) for v in (start, limit, delta))
    if not (start.size == limit.size == delta.size == 1) or np.asarray(delta).dtype == object or int(delta[0]) <= 0:
        raise Unsupported(f"Range({_fmt(start)}, {_fmt(limit)}, {_fmt(delta)}) over symbolic sizes needs scalars "
                          f"and a positive integer step")
    s, e, d = _entry(start[0]), _entry(limit[0]), int(delta[0])
    if not n.imp.at_most(s, e):
        raise Unsupported(f"Range({s}, {e}, {d}) is empty for every size; rocmc has no empty tensors")
    span = symbolic.dim_sub(e, s)
    count = span if d == 1 else symbolic.dim_floordiv(symbolic.dim_add(span, d - 1), d)
    dtype = n.inputs[0].dtype_name()
    r = R.arange(n.imp.graph, 0, count, 1, dtype=dtype)
    if d != 1:
        r = R.mul(r, np.asarray(d, dtype=r.dtype.np))
    if s != 0:
        r = R.add(r, n.imp.value(Tensor(known=_known_array(np.asarray(s, dtype=object)), int_type=dtype, name="start")))
    return r


def _entry(v):
    return v if isinstance(v, str) else int(v)


from . import spatial  # noqa: E402,F401
from . import indexing  # noqa: E402,F401
