"""The element types rocmc knows, with every fact the layers need about them: numpy storage, MLIR
spelling, accumulation type, IREE's HAL element type, width. The frontend, the lowering and the runtime
all read them here; the module is on the ground floor (it imports no layer of rocmc), so reading it loads
no op registry.

MLIR's integers are signless: i8 holds both int8 and uint8. The signedness lives here, on the DType
(`unsigned`), and lowerings read it to pick the unsigned form of an op (divui, cmpi ult, uitofp, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import GraphError


NumpyDType = np.dtype  # the annotation of DType.np (whose field name hides the module there)


@dataclass(frozen=True)
class DType:
    name: str  # rocmc spelling, used in printed IR: f32, f64, u8, i64, bool, ...
    np: NumpyDType  # numpy storage type
    mlir: str  # MLIR element type inside the module (signless for integers)
    kind: str  # "float", "int" or "bool"
    bits: int
    hal: str  # IREE's HalElementType member of the module's element (integers signless, bool as i8)
    unsigned: bool = False  # an integer read as 0..2**bits-1
    raw: NumpyDType | None = None  # what the runtime passes when numpy's path into IREE lacks the type:
    # its bits, tagged with `hal` (bf16 as uint16)

    @property
    def signed(self) -> bool:
        """A signed integer (bool and floats are neither)."""
        return self.kind == "int" and not self.unsigned

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind == "int"

    @property
    def itemsize(self) -> int:
        """Bytes of one element as numpy stores it (bool, i4 and u4: 1)."""
        return self.np.itemsize

    @property
    def packed(self) -> bool:
        """A sub-byte integer (i4, u4): numpy holds one value a byte, IREE's ABI and a module's buffers two a
        byte, the first in the low nibble (`pack_nibbles`)."""
        return self.kind == "int" and self.bits < 8

    @property
    def passed_as_bits(self) -> bool:
        """Whether numpy's path into IREE lacks the type, so the runtime passes its bits tagged with `hal`:
        bf16 and the float8 types (`raw`), and the packed integers."""
        return self.raw is not None or self.packed

    @property
    def limits(self) -> tuple[int, int]:
        """The smallest and largest value of an integer type."""
        if self.kind != "int":
            raise GraphError(f"dtype {self.name} is not an integer type")
        if self.unsigned:
            return 0, (1 << self.bits) - 1
        return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1

    @property
    def acc_mlir(self) -> str:
        """The MLIR type arithmetic and accumulation run in: f16 and bf16 widen to f32 and round once
        at the end (as torch does for half types); every other type computes in itself."""
        return "f32" if self.kind == "float" and self.bits < 32 else self.mlir

    @property
    def abi_mlir(self) -> str:
        """Element type at the module boundary (i1 travels as i8 through IREE's ABI; i4 and u4 as i8 bytes, two
        values a byte: `abi_shape`)."""
        return "i8" if self.kind == "bool" or self.packed else self.mlir

    def abi_shape(self, shape) -> list:
        """The shape of a tensor of this type at the module boundary: its own, or for i4 / u4 (static sizes) the
        1-D count of bytes its values pack into (`pack_nibbles`)."""
        if not self.packed:
            return list(shape)
        n = 1
        for d in shape:
            n *= d
        return [(n + 1) // 2]

    @property
    def abi_np(self) -> NumpyDType:
        """numpy type of the module's arrays at its boundary (bool travels as int8, as abi_mlir says)."""
        return np.dtype(np.int8) if self.kind == "bool" else self.np

    def hal_element_type(self):
        """IREE's HalElementType value of `hal` (the runtime is imported on use, not with this module)."""
        from iree import runtime as rt

        return getattr(rt.HalElementType, self.hal)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"rocmc.{self.name}"


f32 = DType("f32", np.dtype(np.float32), "f32", "float", 32, "FLOAT_32")
f16 = DType("f16", np.dtype(np.float16), "f16", "float", 16, "FLOAT_16")
bf16 = DType("bf16", np.dtype(ml_dtypes.bfloat16), "bf16", "float", 16, "BFLOAT_16", raw=np.dtype(np.uint16))
f64 = DType("f64", np.dtype(np.float64), "f64", "float", 64, "FLOAT_64")
i8 = DType("i8", np.dtype(np.int8), "i8", "int", 8, "INT_8")
i16 = DType("i16", np.dtype(np.int16), "i16", "int", 16, "INT_16")
i32 = DType("i32", np.dtype(np.int32), "i32", "int", 32, "INT_32")
i64 = DType("i64", np.dtype(np.int64), "i64", "int", 64, "INT_64")
u8 = DType("u8", np.dtype(np.uint8), "i8", "int", 8, "INT_8", unsigned=True)
u16 = DType("u16", np.dtype(np.uint16), "i16", "int", 16, "INT_16", unsigned=True)
u32 = DType("u32", np.dtype(np.uint32), "i32", "int", 32, "INT_32", unsigned=True)
u64 = DType("u64", np.dtype(np.uint64), "i64", "int", 64, "INT_64", unsigned=True)
bool_ = DType("bool", np.dtype(np.bool_), "i1", "bool", 1, "INT_8")
# float8 (OCP's e4m3fn and e5m2; the fnuz variants of AMD's gfx942): stored and passed as their bytes, converted to
# f32 for arithmetic like the 16-bit types.
_U8 = np.dtype(np.uint8)
f8e4m3fn = DType("f8e4m3fn", np.dtype(ml_dtypes.float8_e4m3fn), "f8E4M3FN", "float", 8, "FLOAT_8_E4M3_FN", raw=_U8)
f8e4m3fnuz = DType(
    "f8e4m3fnuz", np.dtype(ml_dtypes.float8_e4m3fnuz), "f8E4M3FNUZ", "float", 8, "FLOAT_8_E4M3_FNUZ", raw=_U8
)
f8e5m2 = DType("f8e5m2", np.dtype(ml_dtypes.float8_e5m2), "f8E5M2", "float", 8, "FLOAT_8_E5M2", raw=_U8)
f8e5m2fnuz = DType(
    "f8e5m2fnuz", np.dtype(ml_dtypes.float8_e5m2fnuz), "f8E5M2FNUZ", "float", 8, "FLOAT_8_E5M2_FNUZ", raw=_U8
)
FLOAT8 = (f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz)
# 4-bit integers (ONNX's INT4 / UINT4, the values of int4 checkpoints): numpy arrays of ml_dtypes' int4 / uint4 (a
# value a byte) on the host; at a module's boundary their bytes, two values a byte (a 1-D i8 tensor: IREE 3.13 sizes
# an i4 tensor only in whole bytes, and its code for i4 tensors fails to compile at many sizes). Inside a module they
# are held and computed as i8, each result wrapped to 4 bits as numpy's int4 arithmetic wraps (lowering/nibbles.py).
i4 = DType("i4", np.dtype(ml_dtypes.int4), "i8", "int", 4, "INT_4")
u4 = DType("u4", np.dtype(ml_dtypes.uint4), "i8", "int", 4, "INT_4", unsigned=True)

ALL = {d.name: d for d in (f32, f16, bf16, f64, i8, i16, i32, i64, u8, u16, u32, u64, bool_, *FLOAT8, i4, u4)}
# The type an MLIR element type stands for in the lowering, which sees signless names: 'i8' is i8, whose
# facts other than the sign are u8's too.
_BY_MLIR = {d.mlir: d for d in ALL.values() if not d.unsigned and not d.packed}
# numpy's names of every type, and rocmc's older spellings
_ALIASES = {**{d.np.name: d for d in ALL.values()}, "bool_": bool_}


def dtype(spec) -> DType:
    """Parse a dtype from a rocmc name, a numpy dtype or a DType."""
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, str):
        if spec in ALL:
            return ALL[spec]
        if spec in _ALIASES:
            return _ALIASES[spec]
    else:
        try:
            npd = np.dtype(spec)
        except TypeError:
            npd = None
        if npd is not None:
            for d in ALL.values():
                if d.np == npd:
                    return d
    raise GraphError(f"unsupported dtype {spec!r}: expected one of {', '.join(ALL)}")


def promote(a: DType, b: DType) -> DType:
    """Result type of a binary op; rocmc does not promote silently between distinct types."""
    if a == b:
        return a
    raise GraphError(f"dtype mismatch: {a} vs {b} (insert an explicit cast)")


def of_mlir(elt: str) -> DType:
    """The DType of an MLIR element type as the lowering spells it (signless: 'i8' gives i8)."""
    if elt not in _BY_MLIR:
        raise GraphError(f"MLIR element type {elt!r} is none of rocmc's; expected one of {', '.join(_BY_MLIR)}")
    return _BY_MLIR[elt]


def acc_mlir(elt: str) -> str:
    """The MLIR type arithmetic on `elt` values runs in (DType.acc_mlir)."""
    return of_mlir(elt).acc_mlir


def np_kind(dt) -> str:
    """numpy's kind letter of a numpy dtype ('f', 'i', 'u', 'b', ...), with bfloat16 and the float8 types floats
    ('f') and int4 / uint4 integers ('i' / 'u'): ml_dtypes' types are kind 'V' to numpy."""
    dt = np.dtype(dt)
    return "f" if dt.name in _ML_FLOATS else _ML_INTS.get(dt.name, dt.kind)


_ML_FLOATS = {d.np.name for d in (bf16, *FLOAT8)}
_ML_INTS = {i4.np.name: "i", u4.np.name: "u"}


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """The bytes of a 4-bit array as IREE stores it: its values in order, two a byte, the first in the low
    nibble (an odd count ends in half a byte)."""
    flat = np.ascontiguousarray(values).reshape(-1).view(np.uint8) & 0xF
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def unpack_nibbles(raw: np.ndarray, d: DType, shape) -> np.ndarray:
    """The inverse of `pack_nibbles`: an array of `shape` of the 4-bit type `d` from its packed bytes."""
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if raw.size != (n + 1) // 2:
        raise GraphError(f"{n} values of {d} take {(n + 1) // 2} bytes, not {raw.size}")
    nib = np.empty(raw.size * 2, np.uint8)
    nib[0::2], nib[1::2] = raw & 0xF, raw >> 4
    values = nib[:n].astype(np.int8)
    if d.signed:  # sign-extend the nibbles
        values = (values ^ 8) - 8
    return values.astype(d.np).reshape(shape)


def float8_max(d: DType) -> float:
    """The largest finite value of a float8 type."""
    return float(ml_dtypes.finfo(d.np).max)


def is_float_mlir(elt: str) -> bool:
    """Whether the MLIR element type `elt` is a float type."""
    return of_mlir(elt).is_float
