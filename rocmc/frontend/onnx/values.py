"""What an ONNX converter works with: Tensor (an ONNX value during import: a graph Value, an array
known at import time, or both), Node (one ONNX node's inputs, attributes and version), Unsupported (a
valid node rocmc cannot import), the element types rocmc has, the size limit of a folded constant,
and small helpers for axes and static shapes.

A known integer array that holds symbolic sizes is an object array of ints and canonical size
expressions ('seq', '(seq+1)', '(batch*seq)'), computed on with rocmc.symbolic's arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ... import symbolic
from ...errors import GraphError
from ..graph import Value
from ..opdef import normalize_axis

if TYPE_CHECKING:
    from .importer import Importer

# ONNX TensorProto element types rocmc has; anything else (int2, float4, float8e8m0, string, ...) is reported.
_DTYPES = {
    1: "f32",
    10: "f16",
    16: "bf16",
    11: "f64",
    3: "i8",
    5: "i16",
    6: "i32",
    7: "i64",
    2: "u8",
    4: "u16",
    12: "u32",
    13: "u64",
    9: "bool",
    17: "f8e4m3fn",
    18: "f8e4m3fnuz",
    19: "f8e5m2",
    20: "f8e5m2fnuz",
    22: "i4",
    21: "u4",
}
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
        raise Unsupported(
            f"{what} has element type {_dtype_name(elem_type)} (rocmc has {', '.join(_dtype_name(k) for k in _DTYPES)})"
        )
    return _DTYPES[elem_type]


def _check_folded(shape, dtype, what: str) -> None:
    """Refuse (before allocating it) a folded constant larger than MAX_FOLDED_BYTES."""
    if any(d < 0 for d in shape):
        raise Unsupported(f"{what} has a negative dim in shape [{', '.join(map(str, shape))}]")
    n = math.prod(shape)
    size = n * np.dtype(dtype).itemsize
    if size > MAX_FOLDED_BYTES:
        raise Unsupported(
            f"{what} would fold into a constant of {n} elements ({size / (1 << 30):.3g} GiB) at "
            f"import; the limit is {MAX_FOLDED_BYTES >> 30} GiB per folded constant"
        )


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
        from ...dtypes import dtype

        try:
            return dtype(self.known.dtype).name
        except GraphError:
            raise Unsupported(f"{self.name} has element type {self.known.dtype}, which rocmc lacks") from None


class Node:
    """What a converter sees of one ONNX node: inputs, attributes, the op's version, output count."""

    def __init__(self, importer: "Importer", proto, inputs: list, version: int):
        self.imp = importer
        self.proto = proto
        self.inputs = inputs  # Tensor or None (absent optional input)
        self.version = version  # since_version of the op definition in effect
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
            raise Unsupported(
                f"input {what!r} ({t.name}) must be known at import time (a constant, "
                f"or computed from constants and shapes)"
            )
        return t.known

    def ints(self, i: int, what: str, default=None):
        k = self.known(i, what)
        if k is None:
            return default
        values = np.asarray(k).reshape(-1).tolist()
        syms = [v for v in values if isinstance(v, str)]
        if syms:
            raise Unsupported(
                f"input {what!r} ({_fmt(values)}) depends on symbolic dims ({', '.join(syms)}); "
                f"rocmc needs integers here: pin them, e.g. import_onnx(..., dims={{{syms[0]!r}: N}})"
            )
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
            raise Unsupported(f"attribute {name}={v!r} is not supported (supported: {', '.join(map(repr, allowed))})")

    def reject_outputs(self, first: int, why: str) -> None:
        for i in range(first, self.n_outputs):
            if self.wants_output(i):
                raise Unsupported(f"output {i} ({self.proto.output[i]}) is requested: {why}")


def _fmt(arr) -> str:
    return "[" + ", ".join(str(x) for x in np.asarray(arr).reshape(-1)) + "]"


def _static(shape, what: str) -> tuple:
    if not all(isinstance(d, int) for d in shape):
        raise Unsupported(f"{what} needs static dims, got [{', '.join(map(str, shape))}]")
    return tuple(shape)


def _axis(n: Node, axis, rank: int, what: str = "axis", *, scalar_axis: bool = True) -> int:
    """An axis of node n's rank-`rank` input (negative counts from the end) made non-negative, as
    opdef.normalize_axis does; out of range is Unsupported (the import reports it with the node)."""
    try:
        return normalize_axis(n.proto.op_type, axis, rank, what, scalar_axis=scalar_axis)
    except GraphError as e:
        raise Unsupported(str(e)) from None


def _axes(n: Node, axes, rank: int) -> list:
    return sorted(_axis(n, int(a), rank, "axes") for a in axes)
