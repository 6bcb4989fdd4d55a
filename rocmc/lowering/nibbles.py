"""4-bit integers (i4, u4) at a module's boundary and inside it.

At the boundary a tensor of 4-bit values is its bytes: a 1-D i8 tensor of ceil(n / 2) bytes, two values a byte, the
first in the low nibble (dtypes.pack_nibbles, what the runtime writes and reads). Inside the module rocmc holds 4-bit
values as i8 (dtypes.i4.mlir) and computes on those: no op reads or writes an i4 element, since IREE 3.13 sizes an i4
tensor only in whole bytes and its code for i4 tensors fails to compile at many sizes (masked i4 vector loads and
stores do not legalize on llvm-cpu). Results of the graph's ops are wrapped to 4 bits, as numpy's int4 arithmetic
(ml_dtypes) wraps.

The boundary takes static sizes.
"""

from __future__ import annotations

from .. import dtypes
from ..errors import LoweringError
from ..frontend.graph import TensorType, Value
from .emitter import Emitter, T, affine_map, tensor_type


def check_boundary(v: Value, what: str) -> None:
    """A typed error, before IREE's, for a 4-bit input or output the boundary can't pass."""
    if any(not isinstance(d, int) for d in v.shape):
        raise LoweringError(
            f"{what} {v.name!r}: {v.type} has symbolic sizes; a tensor of {v.dtype} crosses a module's boundary "
            f"with static sizes"
        )


def _count(v: Value) -> int:
    n = 1
    for d in v.shape:
        n *= d
    return n


def _bytes_type(v: Value) -> TensorType:
    return TensorType(tuple(v.dtype.abi_shape(v.shape)), dtypes.u8)


def boundary(v: Value, i: int) -> T:
    """Function argument i, the bytes of the 4-bit input `v`."""
    check_boundary(v, "input")
    return T(f"%arg{i}", _bytes_type(v), "i8")


def _shaped(E: Emitter, name: str, shape, n: int) -> str:
    """A 1-D i8 tensor of n values as `shape`."""
    if list(shape) == [n]:
        return name
    groups = "[[" + ", ".join(str(i) for i in range(len(shape))) + "]]"
    sizes = ", ".join(str(d) for d in shape)
    if not shape:  # rank 0
        return E.op(f"tensor.collapse_shape {name} [] : {tensor_type([1], 'i8')} into {tensor_type([], 'i8')}")
    return E.op(
        f"tensor.expand_shape {name} {groups} output_shape [{sizes}] : "
        f"{tensor_type([n], 'i8')} into {tensor_type(shape, 'i8')}"
    )


def _flat(E: Emitter, name: str, shape, n: int) -> str:
    """An i8 tensor of `shape` (n values) as 1-D."""
    if list(shape) == [n]:
        return name
    if not shape:
        return E.op(
            f"tensor.expand_shape {name} [] output_shape [1] : {tensor_type([], 'i8')} into {tensor_type([1], 'i8')}"
        )
    groups = "[[" + ", ".join(str(i) for i in range(len(shape))) + "]]"
    return E.op(f"tensor.collapse_shape {name} {groups} : {tensor_type(shape, 'i8')} into {tensor_type([n], 'i8')}")


def _nibble(E: Emitter, byte: str, shift: str, signed: bool) -> str:
    """The 4 bits of an i8 `byte` from bit `shift` (0 or 4) up, as an i8 value: sign-extended or not."""
    s = E.op(f"arith.shrui {byte}, {shift} : i8")
    four = E.const(4, "i8")
    if signed:
        return E.op(f"arith.shrsi {E.op(f'arith.shli {s}, {four} : i8')}, {four} : i8")
    return E.op(f"arith.andi {s}, {E.const(15, 'i8')} : i8")


def _shift(E: Emitter) -> str:
    """4 x the index along the pairs' second dim: the low nibble's shift (0), the high one's (4)."""
    k = E.op("linalg.index 1 : index")
    return E.op(f"arith.muli {E.op(f'arith.index_cast {k} : index to i8')}, {E.const(4, 'i8')} : i8")


def unpack(E: Emitter, arg: T, v: Value) -> T:
    """An input's bytes as the i8 tensor of its 4-bit values the module computes on."""
    n, nb = _count(v), (_count(v) + 1) // 2
    pairs = tensor_type([nb, 2], "i8")
    signed = v.dtype.signed
    (u,) = E.generic(
        [(arg.name, arg.mlir)],
        [(E.empty([nb, 2], "i8"), pairs)],
        [affine_map(2, [0]), affine_map(2, [0, 1])],
        ["parallel", "parallel"],
        lambda E, a: [_nibble(E, a[0], _shift(E), signed)],
    )
    flat = E.op(f"tensor.collapse_shape {u} [[0, 1]] : {pairs} into {tensor_type([2 * nb], 'i8')}")
    if 2 * nb != n:  # an odd count: the last byte's high nibble is padding
        flat = E.op(
            f"tensor.extract_slice {flat}[0] [{n}] [1] : {tensor_type([2 * nb], 'i8')} to {tensor_type([n], 'i8')}"
        )
    return T(_shaped(E, flat, list(v.shape), n), v.type)


def pack(E: Emitter, r: T, v: Value) -> T:
    """An output's i8 values (already 4-bit) as the bytes of the boundary: two a byte, the first in the low nibble."""
    check_boundary(v, "output")
    n, nb = _count(v), (_count(v) + 1) // 2
    flat = _flat(E, r.name, list(v.shape), n)
    if 2 * nb != n:  # an odd count: a zero nibble completes the last byte
        flat = E.op(
            f"tensor.insert_slice {flat} into {E.filled([2 * nb], 'i8', 0)}[0] [{n}] [1] : "
            f"{tensor_type([n], 'i8')} into {tensor_type([2 * nb], 'i8')}"
        )
    pairs = tensor_type([nb, 2], "i8")
    split = E.op(
        f"tensor.expand_shape {flat} [[0, 1]] output_shape [{nb}, 2] : {tensor_type([2 * nb], 'i8')} into {pairs}"
    )

    def body(E, a):
        low = E.op(f"arith.andi {a[0]}, {E.const(15, 'i8')} : i8")
        return [E.op(f"arith.ori {a[1]}, {E.op(f'arith.shli {low}, {_shift(E)} : i8')} : i8")]

    (joined,) = E.generic(
        [(split, pairs)],
        [(E.filled([nb], "i8", 0), tensor_type([nb], "i8"))],
        [affine_map(2, [0, 1]), affine_map(2, [0])],
        ["parallel", "reduction"],
        body,
    )
    return T(joined, _bytes_type(v), "i8")


def wrap(E: Emitter, r: T) -> T:
    """An op's i8 result as 4-bit values, wrapping as numpy's int4 / uint4 arithmetic does."""
    signed = r.type.dtype.signed
    return E.map([r], r.type, lambda E, a: _nibble(E, a[0], E.const(0, "i8"), signed))
