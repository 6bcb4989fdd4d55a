"""ONNX -> rocmc Graph: the importer.

Graph inputs become inputs (a `dim_param` stays a symbolic dim), initializers become constants and
each node is converted by one small function from the CONVERTERS table onto rocmc's ops (registered
with @converts by the converter modules: elementwise, shapes, nn, spatial, indexing). Values known
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

from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from ...errors import GraphError, ModelImportError, RocmcError
from ...progress import step
from ..graph import Graph, Value
from ..importing import SizeReasoning, identifier
from .values import _DTYPES, Node, Tensor, Unsupported, _check_folded, _dtype_name, _ops, _rocmc_dtype, _static

MAX_OPSET = 23  # highest default-domain opset whose op definitions rocmc implements

# Versions after opset 23 that changed only things rocmc checks elsewhere (new element types such as
# int2/float8e8m0, Cast's round_mode for float8 targets, Range's stash_type for f16 accumulation):
# op -> the newest such version accepted.
NEWER_COMPATIBLE = {
    op: 25
    for op in (
        "Cast",
        "CastLike",
        "Constant",
        "ConstantOfShape",
        "Flatten",
        "Identity",
        "Pad",
        "Reshape",
        "Shape",
        "Size",
        "Squeeze",
        "Transpose",
        "Unsqueeze",
    )
}
NEWER_COMPATIBLE["Range"] = 27
NEWER_COMPATIBLE["TopK"] = 24  # TopK-24 only added bfloat16 inputs
# QuantizeLinear/DequantizeLinear-24 and -25 only added float8e8m0 scales and int2/uint2 values.
NEWER_COMPATIBLE.update({"QuantizeLinear": 25, "DequantizeLinear": 25})


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


CONVERTERS: dict[str, Callable] = {}
# Ops whose result is computed with numpy when every input is known at import time.
FOLDERS: dict[str, Callable] = {}
# Elementwise ops evaluated with rocmc's own references when every input is known and FOLDERS has
# no numpy rule (or it declined): constant tables such as RoPE's cos/sin never reach the module.
REFERENCE_FOLDS: set[str] = set()
# Folders whose result has the broadcast shape of their inputs: that result's size is checked before
# folding (too large: the node is converted instead, or is an error for an op rocmc only folds).
BROADCASTING_FOLDS: set[str] = set()


def converts(*op_types: str):
    def deco(fn):
        for op in op_types:
            CONVERTERS[op] = fn
        return fn

    return deco


# Operators of other domains than ai.onnx rocmc imports (ONNX Runtime's com.microsoft): (domain, op type) ->
# (its attributes, converter), registered with @contrib. onnx.defs has no schemas for them: each is imported as
# ONNX Runtime defines its version 1.
CONTRIB: dict[tuple[str, str], tuple[frozenset, Callable]] = {}


def contrib(domain: str, op_type: str, attributes: tuple):
    def deco(fn):
        CONTRIB[(domain, op_type)] = (frozenset(attributes), fn)
        return fn

    return deco


def folds(*op_types: str, broadcasting: bool = False):
    def deco(fn):
        for op in op_types:
            FOLDERS[op] = fn
            if broadcasting:
                BROADCASTING_FOLDS.add(op)
        return fn

    return deco


# ---- the importer ---------------------------------------------------------------------------


class Importer(SizeReasoning):
    unsupported = Unsupported  # what deciding a comparison of sizes raises

    def __init__(self, model, name: str | None, dims: dict | None):
        self.model = model
        self.onnx_graph = model.graph
        self.dims = dict(dims or {})
        self.graph = Graph(identifier(name or model.graph.name or "main", "main"))
        self.env: dict[str, Tensor | None] = {}  # None: poisoned by an earlier unsupported node
        self.problems: list[tuple[str, str, str]] = []  # (op type, node name, reason)
        self.opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
        self._used: set[str] = set()
        self._writer: dict[str, str] = {}  # value name -> what defined it, for duplicates
        self.label = ""  # the node being converted, for assumptions

    # -- values
    def value(self, t: Tensor) -> Value:
        if t.value is None:
            arr = t.known
            if arr.dtype == object:  # sizes used as data: computed from the inputs' shapes at run time
                R = _ops()
                flat = R.sizes(self.graph, arr.reshape(-1).tolist(), dtype=t.int_type)
                t.value = flat if arr.ndim == 1 else R.reshape(flat, arr.shape)
                return t.value
            from ...dtypes import dtype as rocmc_dtype

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
            if not poisoned:  # downstream of a reported problem only the op and version are checked
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
        if (domain, proto.op_type) in CONTRIB:
            return 1
        if domain != "":
            ops = sorted(op for d, op in CONTRIB if d == domain)
            also = f"; of {domain!r}: {', '.join(ops)}" if ops else ""
            raise Unsupported(f"domain {domain!r} is not supported (only the default ai.onnx domain{also})")
        if proto.op_type not in CONVERTERS and proto.op_type not in FOLDERS:
            raise Unsupported("op type is not supported")
        opset = self.opsets.get("", 0)
        since = _since_version(proto.op_type, opset, "")
        if since is None:
            raise Unsupported(f"op type does not exist in opset {opset}")
        if since > MAX_OPSET and since > NEWER_COMPATIBLE.get(proto.op_type, 0):
            raise Unsupported(
                f"{proto.op_type}-{since} (opset {opset}) is newer than opset {MAX_OPSET}, the last rocmc implements"
            )
        return since

    def _check_attributes(self, proto) -> None:
        extra = CONTRIB.get((proto.domain, proto.op_type))
        known = extra[0] if extra else _schema_attributes(proto.op_type, self.opsets.get("", 0), "")
        for a in proto.attribute:
            if a.name not in known:
                raise Unsupported(
                    f"unknown attribute {a.name!r}: {proto.op_type} has {', '.join(sorted(known)) or 'no attributes'}"
                )

    def _convert(self, proto, node: Node) -> list:
        extra = CONTRIB.get((proto.domain, proto.op_type))
        if extra:
            return self._results(proto, extra[1](node))
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
        return self._results(proto, CONVERTERS[proto.op_type](node))

    def _results(self, proto, res) -> list:
        """A converter's results as Tensors, one per output of the node."""
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
    if op_type not in BROADCASTING_FOLDS:
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
    if len(declared) != v.rank or any(
        isinstance(c, int) and d is not None and d != c for d, c in zip(declared, v.shape)
    ):
        text = ",".join("?" if d is None else str(d) for d in declared)
        raise Unsupported(f"declared with shape [{text}], but the model computes {v.type}")


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

    with step(f"importing ONNX model{f' {model}' if isinstance(model, (str, Path)) else ''}", logger=__name__):
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
            raise ModelImportError(
                f"import_onnx: expected a path, bytes or onnx.ModelProto, got {type(model).__name__}"
            )
        return Importer(model, name, dims).run()
