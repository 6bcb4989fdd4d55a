"""Text emission of MLIR for one function, one small helper per recurring construct.

Lowerings write MLIR text through an Emitter; the module is then parsed and verified with IREE's MLIR
bindings (see module.py) before iree-compile sees it, so a malformed lowering fails at once, naming
the node, instead of deep inside the compiler. Every op a node emits carries the location
`rocmc.<id>:<op>`, which IREE keeps through fusion; that is how dispatches are mapped back to nodes.
"""

from __future__ import annotations

import operator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Iterable, Sequence

import ml_dtypes
import numpy as np

from ..dtypes import ALL as DTYPES, of_mlir
from ..frontend.graph import TensorType


@dataclass
class T:
    """A tensor SSA value being emitted: its name and graph type (element type may be overridden)."""

    name: str
    type: TensorType
    elt: str | None = None  # MLIR element type when it differs from type.dtype.mlir (e.g. f32 accumulators)

    @property
    def shape(self):
        return self.type.shape

    @property
    def rank(self):
        return self.type.rank

    @property
    def mlir_elt(self) -> str:
        return self.elt or self.type.dtype.mlir

    @property
    def mlir(self) -> str:
        return tensor_type(self.type.shape, self.mlir_elt)


def tensor_type(shape: Sequence, elt: str) -> str:
    dims = "".join(f"{d}x" if isinstance(d, int) else "?x" for d in shape)
    return f"tensor<{dims}{elt}>"


def result_types(types: Sequence[str]) -> str:
    """An op's trailing result types: one bare, several in parentheses (as MLIR's parser wants)."""
    return types[0] if len(types) == 1 else f"({', '.join(types)})"


def affine_map(n: int, results: Sequence) -> str:
    """affine_map over dims d0..d{n-1}; results are dim indices or literal expression strings."""
    dims = ", ".join(f"d{i}" for i in range(n))
    res = ", ".join(f"d{r}" if isinstance(r, int) else str(r) for r in results)
    return f"affine_map<({dims}) -> ({res})>"


# The MLIR float element types (from the dtype table).
FLOAT_TYPES = tuple(d.mlir for d in DTYPES.values() if d.is_float)


def signless(value: int, bits: int) -> int:
    """`value` as the signed integer of `bits` bits with the same bit pattern (how MLIR spells an
    unsigned constant such as 255 : i8 -> -1), so every integer of either signedness parses."""
    if bits == 1:
        return value & 1
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def mlir_string(s: str) -> str:
    """The body of an MLIR string literal holding `s`."""
    return s.replace("\\", "\\\\").replace('"', '\\"')


def float_literal(x: float, elt: str) -> str:
    if np.isnan(x):
        return {"f16": "0x7E00", "bf16": "0x7FC0", "f32": "0x7FC00000", "f64": "0x7FF8000000000000"}[elt]
    if np.isinf(x):
        pos = {"f16": "0x7C00", "bf16": "0x7F80", "f32": "0x7F800000", "f64": "0x7FF0000000000000"}[elt]
        neg = {"f16": "0xFC00", "bf16": "0xFF80", "f32": "0xFF800000", "f64": "0xFFF0000000000000"}[elt]
        return pos if x > 0 else neg
    r = repr(float(x))
    # MLIR float literals need a '.' before any exponent: 1e-05 -> 1.000000000000000e-05.
    return r if "." in r else f"{float(x):.15e}"


class Emitter:
    """The text of one function body. Ops go through `emit`/`op` (indented to the region they are in,
    with the location of the node being lowered); ops with a region through `region`."""

    def __init__(self):
        self.lines: list[str] = []
        self._n = 0
        self._depth = 0  # regions open around the next line
        self.loc = ""  # location suffix of the node being lowered
        self._sizes: dict = {}  # (value, axis) -> its size, once known
        self._memo: dict = {}

    # ---- names and raw text ------------------------------------------------------------
    def fresh(self, prefix: str = "v") -> str:
        self._n += 1
        return f"%{prefix}{self._n}"

    def _line(self, text: str) -> None:
        self.lines.append(" " * (2 + 2 * self._depth) + text)

    def emit(self, line: str) -> None:
        """One op, at the current region depth, carrying the node's location."""
        self._line(line + (f" {self.loc}" if self.loc else ""))

    def op(self, text: str, prefix: str = "v") -> str:
        """Emit `%new = <text>` and return %new."""
        r = self.fresh(prefix)
        self.emit(f"{r} = {text}")
        return r

    @contextmanager
    def region(self, head: str, tail: str = "", args: Sequence[str] = (), prefix: str = "a"):
        """An op with one region: `head {`, a block declaring a fresh argument of each type in
        `args` (none: the head declares them, as scf.for does), the ops emitted in the with-block,
        then `} tail` with the node's location. Yields the block arguments' names."""
        names = [self.fresh(prefix) for _ in args]
        self._line(f"{head} {{")
        if names:
            self._line(f"^bb0({', '.join(f'{n}: {t}' for n, t in zip(names, args))}):")
        self._depth += 1
        try:
            yield names
        finally:
            self._depth -= 1
        self.emit("}" + (f" {tail}" if tail else ""))

    def memo(self, key, make: Callable[[], object]):
        """`make()` once per function for `key` (a value derived from SSA values already emitted)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    # ---- scalars ------------------------------------------------------------------------
    def const(self, value, elt: str) -> str:
        if elt in FLOAT_TYPES:
            return self.op(f"arith.constant {float_literal(value, elt)} : {elt}", "c")
        if elt == "i1":
            return self.op(f"arith.constant {'true' if value else 'false'}", "c")
        return self.op(f"arith.constant {signless(int(value), of_mlir(elt).bits)} : {elt}", "c")

    def _arith(self, fop: str, iop: str, a: str, b: str, elt: str) -> str:
        return self.op(f"arith.{fop if elt in FLOAT_TYPES else iop} {a}, {b} : {elt}")

    def add(self, a: str, b: str, elt: str) -> str:
        """a + b on scalars of element type `elt` (arith.addf or arith.addi by the type)."""
        return self._arith("addf", "addi", a, b, elt)

    def sub(self, a: str, b: str, elt: str) -> str:
        return self._arith("subf", "subi", a, b, elt)

    def mul(self, a: str, b: str, elt: str) -> str:
        return self._arith("mulf", "muli", a, b, elt)

    def check(self, ok: str, fact: str) -> None:
        """Fail the call unless the i1 `ok` holds. The runtime finds `fact` in IREE's error by its
        prefix (runtime/module.py) and raises it as an InputError."""
        self.emit(f'cf.assert {ok}, "rocmc check: {mlir_string(fact)}"')

    def index(self, n: int) -> str:
        return self.op(f"arith.constant {int(n)} : index", "c")

    def cast_scalar(self, v: str, src: str, dst: str, unsigned_src: bool = False, unsigned_dst: bool = False) -> str:
        """Convert a scalar between element types with C-like semantics (float->int truncates, a
        narrower int keeps the low bits); the flags say which side is an unsigned integer."""
        if src == dst:
            return v
        fs, fd = src in FLOAT_TYPES, dst in FLOAT_TYPES
        if fs and fd:
            bs, bd = of_mlir(src).bits, of_mlir(dst).bits
            # Between two types of one width (bf16 and f16, two float8s) and between a float8 and anything but f32
            # (IREE's CPU code converts float8 to and from f32 only), through f32.
            if "f32" not in (src, dst) and (bs == bd or 8 in (bs, bd)):
                v = self.cast_scalar(v, src, "f32")
                src, bs = "f32", 32
            op = "arith.extf" if bd > bs else "arith.truncf"
            if bd == 8:
                v = self._float8_carry(v, dst)
            return self.op(f"{op} {v} : {src} to {dst}")
        if fs != fd and 8 in (of_mlir(src).bits if fs else 0, of_mlir(dst).bits if fd else 0):
            # float8 <-> integers and bool through f32 (IREE's CPU code converts float8 to and from f32 only)
            return self.cast_scalar(self.cast_scalar(v, src, "f32", unsigned_src), "f32", dst, False, unsigned_dst)
        if fs and not fd:
            if dst == "i1":
                z = self.const(0.0, src)
                return self.op(f"arith.cmpf une, {v}, {z} : {src}")
            return self.op(f"arith.{'fptoui' if unsigned_dst else 'fptosi'} {v} : {src} to {dst}")
        if not fs and fd:
            op = "arith.uitofp" if (src == "i1" or unsigned_src) else "arith.sitofp"
            return self.op(f"{op} {v} : {src} to {dst}")
        if dst == "i1":
            z = self.const(0, src)
            return self.op(f"arith.cmpi ne, {v}, {z} : {src}")
        if of_mlir(dst).bits > of_mlir(src).bits:
            op = "arith.extui" if (src == "i1" or unsigned_src) else "arith.extsi"
            return self.op(f"{op} {v} : {src} to {dst}")
        return self.op(f"arith.trunci {v} : {src} to {dst}")

    def _float8_carry(self, v: str, dst: str) -> str:
        """f32 `v` with the values that round up from float8 `dst`'s largest subnormal to its smallest normal set
        to that normal (sign kept): IREE 3.13's f32 -> float8 truncation gives them 0 (every float8 type, CPU
        code; from the midpoint, a tie, which goes to the even normal, to the normal itself)."""
        info = ml_dtypes.finfo(of_mlir(dst).np)
        tiny = float(info.smallest_normal)
        mid = tiny * (1.0 - 2.0 ** -(int(info.nmant) + 1))
        a = self.op(f"math.absf {v} : f32")
        up = self.op(f"arith.cmpf oge, {a}, {self.const(mid, 'f32')} : f32")
        below = self.op(f"arith.cmpf olt, {a}, {self.const(tiny, 'f32')} : f32")
        both = self.op(f"arith.andi {up}, {below} : i1")
        normal = self.op(f"math.copysign {self.const(tiny, 'f32')}, {v} : f32")
        return self.op(f"arith.select {both}, {normal}, {v} : f32")

    # ---- index arithmetic ---------------------------------------------------------------
    # Sizes are ints when static and `index` SSA values otherwise: these fold the former and emit
    # arith for the latter, so one code path serves static and symbolic shapes.
    def _index_op(self, name: str, a, b, fold):
        if isinstance(a, int) and isinstance(b, int):
            return fold(a, b)
        return self.op(f"arith.{name} {self.as_index(a)}, {self.as_index(b)} : index", "i")

    def addi(self, a, b):
        return a if b == 0 else b if a == 0 else self._index_op("addi", a, b, operator.add)

    def subi(self, a, b):
        return a if b == 0 else self._index_op("subi", a, b, operator.sub)

    def muli(self, a, b):
        return a if b == 1 else b if a == 1 else self._index_op("muli", a, b, operator.mul)

    def divsi(self, a, b):
        """a / b where b divides a."""
        return a if b == 1 else self._index_op("divsi", a, b, operator.floordiv)

    def floordivsi(self, a, b):
        return self._index_op("floordivsi", a, b, operator.floordiv)

    def ceildiv(self, a, b: int):
        """Ceiling division by a positive int, exact for a > 0 and <= 0 otherwise (what size rules
        need: they clamp at 0). arith.ceildivsi on index fails IREE's CPU backend."""
        if b == 1 or isinstance(a, int):
            return a if b == 1 else -(-a // b)
        return self.divsi(self.addi(a, b - 1), b)

    def ceildivui(self, a, b):
        """Ceiling division of non-negative sizes in one op (for GPU dispatch grids)."""
        return self._index_op("ceildivui", a, b, lambda x, y: -(-x // y))

    def minsi(self, a, b):
        return self._index_op("minsi", a, b, min)

    def maxsi(self, a, b):
        return self._index_op("maxsi", a, b, max)

    def product(self, sizes: Iterable):
        """The product of sizes: the dynamic ones multiplied in order, then by the static ones' product."""
        const, dyn = 1, None
        for s in sizes:
            if isinstance(s, int):
                const *= s
            else:
                dyn = s if dyn is None else self.op(f"arith.muli {dyn}, {s} : index")
        if dyn is None:
            return const
        return dyn if const == 1 else self.op(f"arith.muli {dyn}, {self.index(const)} : index")

    @property
    def ix(self) -> SimpleNamespace:
        """This arithmetic under the names `rocmc.symbolic`'s size rules call (as `symbolic.INT`)."""
        return SimpleNamespace(
            add=self.addi,
            sub=self.subi,
            mul=self.muli,
            div=self.divsi,
            floordiv=self.floordivsi,
            ceildiv=self.ceildiv,
            min=self.minsi,
            max=self.maxsi,
        )

    # ---- shapes -------------------------------------------------------------------------
    def dim(self, t: T, i: int) -> str | int:
        """Size of dim i: an int when static, else an SSA index from tensor.dim (or as recorded)."""
        d = t.shape[i]
        if isinstance(d, int):
            return d
        key = (t.name, i)
        if key not in self._sizes:
            c = self.index(i)
            self._sizes[key] = self.op(f"tensor.dim {t.name}, {c} : {t.mlir}", "d")
        return self._sizes[key]

    def set_dim(self, t: T, i: int, size: str) -> None:
        """Record that dim i of `t` is the index value `size` (e.g. one carrying a divisibility
        hint), so `dim` returns it instead of reading the tensor."""
        self._sizes[(t.name, i)] = size

    def as_index(self, d) -> str:
        return self.index(d) if isinstance(d, int) else d

    def dims(self, t: T) -> list:
        return [self.dim(t, i) for i in range(t.rank)]

    def empty(self, sizes: Sequence, elt: str) -> str:
        """tensor.empty with `sizes` holding ints and SSA index names (dynamic)."""
        shape = [s if isinstance(s, int) else "?" for s in sizes]
        dyn = [s for s in sizes if not isinstance(s, int)]
        return self.op(f"tensor.empty({', '.join(dyn)}) : {tensor_type(shape, elt)}", "e")

    def filled(self, sizes: Sequence, elt: str, value) -> str:
        e = self.empty(sizes, elt)
        c = self.const(value, elt)
        ty = tensor_type([s if isinstance(s, int) else "?" for s in sizes], elt)
        return self.op(f"linalg.fill ins({c} : {elt}) outs({e} : {ty}) -> {ty}", "f")

    # ---- linalg.generic -------------------------------------------------------------------
    def generic(
        self,
        ins: Sequence[tuple[str, str]],
        outs: Sequence[tuple[str, str]],
        maps: Sequence[str],
        iterators: Sequence[str],
        body: Callable[["Emitter", list[str]], Sequence[str]],
    ) -> list[str]:
        """Emit linalg.generic. ins/outs: (ssa, tensor type); body gets the block arguments and
        returns the values to yield (emitting scalar ops through the same Emitter)."""

        def elt_of(ty):
            return ty[ty.rindex("x") + 1 : -1] if "x" in ty else ty[len("tensor<") : -1]

        results = [self.fresh("g") for _ in outs]
        head = (
            f"{', '.join(results)} = linalg.generic {{indexing_maps = [{', '.join(maps)}], "
            f"iterator_types = [{', '.join(repr(i).replace(chr(39), chr(34)) for i in iterators)}]}}"
        )
        if ins:
            head += f" ins({', '.join(n for n, _ in ins)} : {', '.join(t for _, t in ins)})"
        head += f" outs({', '.join(n for n, _ in outs)} : {', '.join(t for _, t in outs)})"
        with self.region(
            head, f"-> {result_types([t for _, t in outs])}", [elt_of(t) for _, t in list(ins) + list(outs)]
        ) as args:
            ys = body(self, args)
            self.emit(f"linalg.yield {', '.join(ys)} : {', '.join(elt_of(t) for _, t in outs)}")
        return results

    def map(self, ins: Sequence[T], out_type: TensorType, fn, out_elt: str | None = None) -> T:
        """Elementwise map with numpy broadcasting of `ins` to `out_type`'s shape; `fn(E, scalars)`
        returns the result scalar. Inputs of lower rank or size-1 dims broadcast."""
        rank = out_type.rank
        elt = out_elt or out_type.dtype.mlir
        sizes = []
        for i in range(rank):
            # Take each dynamic output size from an input that has the same (non-broadcast) dim.
            d = out_type.shape[i]
            if isinstance(d, int):
                sizes.append(d)
                continue
            src = next(t for t in ins if t.rank - rank + i >= 0 and t.shape[t.rank - rank + i] == d)
            sizes.append(self.dim(src, src.rank - rank + i))
        init = self.empty(sizes, elt)
        out_ty = tensor_type(out_type.shape, elt)
        maps = []
        for t in ins:
            off = rank - t.rank
            res = []
            for j, d in enumerate(t.shape):
                res.append("0" if d == 1 and out_type.shape[off + j] != 1 else off + j)
            maps.append(affine_map(rank, res))
        maps.append(affine_map(rank, range(rank)))
        r = self.generic(
            [(t.name, t.mlir) for t in ins],
            [(init, out_ty)],
            maps,
            ["parallel"] * rank,
            lambda E, a: [fn(E, a[: len(ins)])],
        )
        return T(r[0], out_type, out_elt)

    def convert(self, t: T, dst_elt: str, out_type: TensorType | None = None) -> T:
        """Elementwise element-type conversion of a whole tensor. A side whose element type is its
        graph dtype's reads that dtype's signedness (u8 -> f32 is uitofp; f32 -> u8 is fptoui)."""
        if t.mlir_elt == dst_elt:
            return t
        out_type = out_type or t.type
        src = t.mlir_elt
        unsigned_src = src == t.type.dtype.mlir and t.type.dtype.unsigned
        unsigned_dst = dst_elt == out_type.dtype.mlir and out_type.dtype.unsigned
        return self.map(
            [t], out_type, lambda E, a: E.cast_scalar(a[0], src, dst_elt, unsigned_src, unsigned_dst), out_elt=dst_elt
        )
