"""Symbolic dim sizes: integer expressions over the sizes of named dims, spelled as graph types spell them.

A shape holds ints and strings; a string is a symbol ('seq') or a size derived from symbols: '(seq+4)',
'((n*3)/5)', 'conv(h,3,2,1,1,1)'. `parse` reads that spelling with a tokenizer and a recursive-descent
parser (bounded in length and depth; never `eval`), `str` writes it back unchanged, and `evaluate`
computes a size from the symbols' values. The grammar:

    expr  := term (('+' | '-') term)*
    term  := unary (('*' | '/' | '//') unary)*
    unary := '-' unary | atom
    atom  := INT | NAME | NAME '(' expr (',' expr)* [',' FLAG] ')' | '(' expr ')'

'/' divides exactly: the dividend must be a multiple, which is a `Constraint` checked when a graph is
called. '//' floors. The functions are the size rules of conv, pool, conv_transpose and slice, and min
and max. Every rule is written against an arithmetic passed in (`INT` here; the lowering passes one
that emits index ops), so one definition gives static sizes, call-time checks and the module's asserts.
`call_dim` is how the op rules use them: the size for static dims, else the call's spelling.
"""

from __future__ import annotations

import functools
import operator
import re
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Iterable, NoReturn

from .errors import GraphError, InputError

MAX_LENGTH = 10_000  # characters of one expression
MAX_DEPTH = 100  # nesting of parentheses and calls (the parser recurses)
MAX_INT = 2**63 - 1  # sizes and literals are int64, as in the module

# ONNX spells "to the end" as INT_MAX-like numbers; beyond this, an index means "past the edge".
BIG = 2**31 - 1


class _Inexact(ArithmeticError):
    pass


def _exact_div(a: int, b: int) -> int:
    if b == 0 or a % b:
        raise _Inexact(f"{a} is not divisible by {b}")
    return a // b


# Integer arithmetic; the lowering passes emitters with the same names.
INT = SimpleNamespace(
    add=operator.add,
    sub=operator.sub,
    mul=operator.mul,
    div=_exact_div,
    floordiv=operator.floordiv,
    ceildiv=lambda a, b: -(-a // b),
    min=min,
    max=max,
)


# ---- size rules ------------------------------------------------------------------------------


def slice_bounds(dim, start: int, end: int, step: int, ar=INT):
    """ONNX Slice on one axis of size `dim`: (first index, element count).

    Negative start/end count from the end; both are clamped to [0, dim] for positive steps and
    to [0, dim-1] / [-1, dim-1] for negative ones. `ar` does the arithmetic, so one rule gives the
    static sizes and emits index ops in the lowering (where `dim` may be a run-time value).
    """

    def at(i, lo):
        if i >= BIG:
            return dim if step > 0 else ar.sub(dim, 1)
        if i <= -BIG:
            return lo
        return ar.add(dim, i) if i < 0 else i

    if step > 0:
        s = ar.min(ar.max(at(start, 0), 0), dim)
        e = ar.min(ar.max(at(end, 0), 0), dim)
        return s, ar.max(ar.ceildiv(ar.sub(e, s), step), 0)
    top = ar.sub(dim, 1)
    s = ar.min(ar.max(at(start, 0), 0), top)
    e = ar.min(ar.max(at(end, -1), -1), top)
    return s, ar.max(ar.ceildiv(ar.sub(s, e), -step), 0)


def _span(ar, size, kernel, pad_lo, pad_hi, dilation):
    """Padded size minus the kernel's reach: how far the first window can move."""
    return ar.sub(ar.add(ar.add(size, pad_lo), pad_hi), ar.add(ar.mul(dilation, ar.sub(kernel, 1)), 1))


def conv_size(ar, size, kernel, stride, pad_lo, pad_hi, dilation):
    return ar.add(ar.floordiv(_span(ar, size, kernel, pad_lo, pad_hi, dilation), stride), 1)


def pool_size(ar, size, kernel, stride, pad_lo, pad_hi, dilation, ceil=False):
    """torch's rule: with ceil mode the last window must start inside the input or the low padding."""
    span = _span(ar, size, kernel, pad_lo, pad_hi, dilation)
    if not ceil:
        return ar.add(ar.floordiv(span, stride), 1)
    out = ar.add(ar.ceildiv(span, stride), 1)
    past = ar.sub(ar.mul(ar.sub(out, 1), stride), ar.add(size, pad_lo))  # >= 0: the last window starts past
    return ar.sub(out, ar.min(ar.max(ar.add(past, 1), 0), 1))


def conv_transpose_size(ar, size, kernel, stride, pad_lo, pad_hi, dilation, out_pad):
    grown = ar.mul(ar.sub(size, 1), stride)
    reach = ar.add(ar.mul(dilation, ar.sub(kernel, 1)), ar.add(out_pad, 1))
    return ar.add(ar.sub(ar.sub(grown, pad_lo), pad_hi), reach)


def slice_size(ar, dim, start, end, step):
    return slice_bounds(dim, start, end, step, ar)[1]


@dataclass(frozen=True)
class _Rule:
    fn: Callable
    arity: int
    literals_from: int  # arguments from this one on are int literals (the rules branch on them)
    flags: tuple = ()  # trailing bare words, passed as True
    windowed: bool = False  # a result below 1 means the window does not fit the input


FUNCTIONS = {
    "conv": _Rule(conv_size, 6, 1, windowed=True),
    "pool": _Rule(pool_size, 6, 1, ("ceil",), windowed=True),
    "conv_transpose": _Rule(conv_transpose_size, 7, 1, windowed=True),
    "slice": _Rule(slice_size, 4, 1),
    "min": _Rule(lambda ar, a, b: ar.min(a, b), 2, 2),
    "max": _Rule(lambda ar, a, b: ar.max(a, b), 2, 2),
}


# ---- expressions -----------------------------------------------------------------------------


class Expr:
    """A size: `evaluate` it for given symbol sizes, or `compute` it with another arithmetic."""

    def compute(self, ar, sizes: dict):
        raise NotImplementedError

    def children(self) -> tuple:
        return ()

    def walk(self):
        """Every subexpression, operands before the expression using them."""
        for c in self.children():
            yield from c.walk()
        yield self

    def symbols(self) -> set:
        return {e.name for e in self.walk() if isinstance(e, Sym)}

    def evaluate(self, sizes: dict, error=InputError) -> int:
        missing = sorted(self.symbols() - set(sizes))
        if missing:
            raise error(f"size {self} needs the size of {', '.join(missing)}, which no input gives")
        try:
            v = self.compute(INT, sizes)
        except ArithmeticError as e:
            raise error(f"size {self} at {_show(sizes, self.symbols())}: {e}") from None
        if abs(v) > MAX_INT:
            raise error(f"size {self} = {v} at {_show(sizes, self.symbols())} does not fit in int64")
        return v


@dataclass(frozen=True)
class Int(Expr):
    value: int

    def compute(self, ar, sizes):
        return self.value

    def __str__(self):
        return str(self.value)


@dataclass(frozen=True)
class Sym(Expr):
    name: str

    def compute(self, ar, sizes):
        return sizes[self.name]

    def __str__(self):
        return self.name


@dataclass(frozen=True)
class Neg(Expr):
    x: Expr

    def compute(self, ar, sizes):
        return ar.sub(0, self.x.compute(ar, sizes))

    def children(self):
        return (self.x,)

    def __str__(self):
        return f"-{self.x}"


_APPLY = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floordiv"}


@dataclass(frozen=True)
class Chain(Expr):
    """Operators of one precedence applied left to right, spelled in parentheses: '(a*b*4)'."""

    first: Expr
    rest: tuple  # ((operator, Expr), ...)

    def compute(self, ar, sizes):
        v = self.first.compute(ar, sizes)
        for op, x in self.rest:
            v = getattr(ar, _APPLY[op])(v, x.compute(ar, sizes))
        return v

    def children(self):
        return (self.first, *(x for _, x in self.rest))

    def prefix(self, n: int) -> Expr:
        """The chain of the first operand and the next n operations."""
        return Chain(self.first, self.rest[:n]) if n else self.first

    def __str__(self):
        return "(" + str(self.first) + "".join(f"{op}{x}" for op, x in self.rest) + ")"


@dataclass(frozen=True)
class Call(Expr):
    name: str
    args: tuple
    flags: tuple = ()

    def compute(self, ar, sizes):
        return FUNCTIONS[self.name].fn(ar, *(a.compute(ar, sizes) for a in self.args), **{f: True for f in self.flags})

    def children(self):
        return self.args

    def __str__(self):
        return _spell(self.name, self.args, self.flags)


def _spell(name: str, args, flags=()) -> str:
    """How a size function's call is written: 'conv(h,3,2,1,0,1)', 'pool(h,3,2,1,1,1,ceil)'."""
    return f"{name}({','.join(map(str, (*args, *flags)))})"


def call_dim(name: str, *args, **flags):
    """A size function of FUNCTIONS applied to dims (ints or size expressions) and int literals: the
    size when no dim is an expression, else the call as graph types spell it, which `parse` reads
    back. `flags` are the rule's bare words, on when true (pool's ceil=True)."""
    rule = FUNCTIONS[name]
    if not any(isinstance(a, str) for a in args):
        return rule.fn(INT, *args, **flags)
    return _spell(name, args, tuple(f for f in rule.flags if flags.get(f)))


def bare(e: Expr) -> str:
    """How messages show a size: without the parentheses around a whole chain."""
    s = str(e)
    return s[1:-1] if isinstance(e, Chain) else s


def _show(sizes: dict, names) -> str:
    return ", ".join(f"{n}={sizes[n]}" for n in sorted(names) if n in sizes)


# ---- parsing ---------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*/(),]))")


def _tokens(text: str, fail) -> list:
    out, i = [], 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if m is None:
            if text[i:].strip():
                fail(f"unexpected {text[i:].lstrip()[0]!r} at offset {i}")
            break
        number, name, punct = m.groups()
        out.append(("int", int(number)) if number else ("name", name) if name else (punct, punct))
        i = m.end()
    return out


class _Parser:
    def __init__(self, text: str, error):
        self.text, self.error = text, error
        self.toks = _tokens(text, self.fail)
        self.i = self.depth = 0

    def fail(self, why: str) -> NoReturn:
        raise self.error(f"size expression {self.text[:80]!r}{'...' if len(self.text) > 80 else ''}: {why}")

    def peek(self):
        return self.toks[self.i][0] if self.i < len(self.toks) else "end"

    def found(self) -> str:
        return repr(str(self.toks[self.i][1])) if self.i < len(self.toks) else "the end"

    def take(self, kind: str):
        if self.peek() != kind:
            self.fail(f"expected {kind!r}, found {self.found()}")
        self.i += 1
        return self.toks[self.i - 1][1]

    def enter(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(f"nested more than {MAX_DEPTH} deep")

    def expr(self) -> Expr:
        return self.chain(("+", "-"), self.term)

    def term(self) -> Expr:
        return self.chain(("*", "/", "//"), self.unary)

    def chain(self, ops, operand) -> Expr:
        first, rest = operand(), []
        while self.peek() in ops:
            op = self.take(self.peek())
            rest.append((op, operand()))
        return Chain(first, tuple(rest)) if rest else first

    def unary(self) -> Expr:
        if self.peek() != "-":
            return self.atom()
        self.take("-")
        self.enter()
        x = self.unary()
        self.depth -= 1
        return Int(-x.value) if isinstance(x, Int) else Neg(x)

    def atom(self) -> Expr:
        kind = self.peek()
        if kind == "int":
            v = self.take("int")
            if v > MAX_INT:
                self.fail(f"{v} does not fit in int64")
            return Int(v)
        if kind == "name":
            name = self.take("name")
            return self.call(name) if self.peek() == "(" else Sym(name)
        if kind == "(":
            self.take("(")
            self.enter()
            e = self.expr()
            self.depth -= 1
            self.take(")")
            return e
        self.fail(f"expected a number, a name or '(', found {self.found()}")

    def call(self, name: str) -> Expr:
        rule = FUNCTIONS.get(name)
        if rule is None:
            self.fail(f"unknown function {name!r}; expected one of {', '.join(FUNCTIONS)}")
        self.take("(")
        self.enter()
        args: list[Expr] = []
        flags: list[str] = []
        while True:
            if self.peek() == "name" and self.toks[self.i][1] in rule.flags and len(args) == rule.arity:
                flags.append(self.take("name"))
            else:
                args.append(self.expr())
            if self.peek() != ",":
                break
            self.take(",")
        self.take(")")
        self.depth -= 1
        if len(args) != rule.arity:
            self.fail(f"{name} takes {rule.arity} sizes, got {len(args)}")
        if not all(isinstance(a, Int) for a in args[rule.literals_from :]):
            self.fail(f"{name}: arguments after the first {rule.literals_from} must be integers")
        return Call(name, tuple(args), tuple(flags))


@functools.lru_cache(maxsize=4096)
def _parse(text: str, error) -> Expr:
    if len(text) > MAX_LENGTH:
        raise error(f"size expression of {len(text)} characters; at most {MAX_LENGTH} are allowed")
    p = _Parser(text, error)
    e = p.expr()
    if p.peek() != "end":
        p.fail(f"unexpected {p.found()} after a complete expression")
    return e


def parse(text, error=GraphError) -> Expr:
    """The expression a dim spells: an int, a symbol name or arithmetic of them. Junk raises `error`."""
    if isinstance(text, bool):
        raise error(f"size {text!r} is a bool, expected an int or a size expression")
    if isinstance(text, int):
        return Int(text)
    if not isinstance(text, str):
        raise error(f"size {text!r} is a {type(text).__name__}, expected an int or a size expression")
    return _parse(text, error)


# ---- constraints -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Constraint:
    """What the sizes of a call must satisfy for a node's types to hold: `lhs` divisible by `rhs`
    ("divisible") or `lhs >= rhs` ("at_least")."""

    node: str  # the node's description, e.g. 'reshape(%1)'
    kind: str
    lhs: Expr
    rhs: Expr

    def bound(self) -> tuple[str, str, int] | None:
        """(symbol, "least" or "most", n) when this is a bound of one symbol by a number, else None."""
        if self.kind != "at_least":
            return None
        if isinstance(self.lhs, Sym) and isinstance(self.rhs, Int):
            return self.lhs.name, "least", self.rhs.value
        if isinstance(self.lhs, Int) and isinstance(self.rhs, Sym):
            return self.rhs.name, "most", self.lhs.value
        return None

    def failure(self, sizes: dict, where: dict | None = None, ranges: dict | None = None) -> str | None:
        """Why `sizes` break it, or None when they don't. `where` names the input dim each symbol was
        read from ({symbol: "input 'ids' dim 1"}); `ranges` ({symbol: (least, most)}, `ranges_of`) gives
        a bounded symbol's whole allowed range rather than this constraint's half of it."""
        a, b = self.lhs.evaluate(sizes), self.rhs.evaluate(sizes)
        broken = (b <= 0 or a % b) if self.kind == "divisible" else a < b
        if not broken:
            return None
        where = where or {}
        bound = self.bound()
        if bound is not None:
            sym = bound[0]
            least, most = (ranges or {}).get(sym) or ranges_of([self])[sym]
            return (
                f"{_dim(sym, where)} is {sizes[sym]}; allowed range is "
                f"[{least}, {'inf)' if most is None else f'{most}]'} ({self.node})"
            )
        at = ", ".join(f"{_dim(n, where)} = {sizes[n]}" for n in sorted(self.lhs.symbols() | self.rhs.symbols()))
        at = f" with {at}" if at else ""
        lhs, rhs = bare(self.lhs), bare(self.rhs)
        rhs_is = "" if isinstance(self.rhs, Int) else f" and {rhs} = {b}"
        if self.kind == "divisible":
            return f"{self.node}: {lhs} = {a} is not divisible by {rhs}{rhs_is}{at}"
        return f"{self.node}: needs {lhs} >= {rhs}, but {lhs} = {a}{rhs_is}{at}"

    def describe(self) -> str:
        """The fact itself, without values (what the module's assert says)."""
        what = "divisible by" if self.kind == "divisible" else ">="
        return f"{self.node}: {bare(self.lhs)} {what} {bare(self.rhs)}"

    def to_json(self) -> dict:
        return {"node": self.node, "kind": self.kind, "lhs": str(self.lhs), "rhs": str(self.rhs)}

    @classmethod
    def from_json(cls, d, error=GraphError) -> "Constraint":
        if not (isinstance(d, dict) and isinstance(d.get("node"), str) and d.get("kind") in ("divisible", "at_least")):
            raise error(f"constraint {d!r}: expected {{node, kind: divisible or at_least, lhs, rhs}}")
        return cls(d["node"], d["kind"], parse(d.get("lhs"), error), parse(d.get("rhs"), error))


def _never_negative(e: Expr) -> bool:
    """True when e >= 0 for every choice of sizes >= 0 whose windows fit (conservative)."""
    if isinstance(e, Int):
        return e.value >= 0
    if isinstance(e, Sym):
        return True
    if isinstance(e, Chain):
        return all(op != "-" for op, _ in e.rest) and all(_never_negative(c) for c in e.children())
    if isinstance(e, Call):
        return e.name == "slice" or FUNCTIONS[e.name].windowed or all(map(_never_negative, e.args))
    return False


def constraints(node_dims: Iterable, error=GraphError) -> list[Constraint]:
    """The constraints of a graph's types, from (node description, output dims) pairs in graph order:
    each exact division divides, each window fits, and no size derived with a '-' is negative. A
    constraint is attributed to the first node whose result has the size; inner ones come first."""
    out, seen_dims, seen = [], set(), set()

    def add(c: Constraint):
        key = (c.kind, str(c.lhs), str(c.rhs))
        if key not in seen:
            seen.add(key)
            out.append(c)

    for node, dims in node_dims:
        for d in dims:
            if not isinstance(d, str) or d in seen_dims:
                continue
            seen_dims.add(d)
            e = parse(d, error)
            for sub in e.walk():
                if isinstance(sub, Chain):
                    for k, (op, x) in enumerate(sub.rest):
                        if op == "/":
                            add(Constraint(node, "divisible", sub.prefix(k), x))
                elif isinstance(sub, Call) and FUNCTIONS[sub.name].windowed:
                    add(Constraint(node, "at_least", sub, Int(1)))
            if not _never_negative(e):
                add(Constraint(node, "at_least", e, Int(0)))
    return out


def _dim(sym: str, where: dict) -> str:
    """A symbol as messages name it: the input dim it was read from, when known."""
    return f"{where[sym]} ({sym!r})" if sym in where else f"size {sym}"


def ranges_of(cs: Iterable[Constraint]) -> dict:
    """{symbol: (least, most)} over the constraints that bound one symbol by a number (least 0 when
    only bounded above: a size; most None when unbounded)."""
    out: dict = {}
    for c in cs:
        bound = c.bound()
        if bound is None:
            continue
        sym, side, n = bound
        least, most = out.get(sym, (0, None))
        if side == "least":
            least = max(least, n)
        else:
            most = n if most is None else min(most, n)
        out[sym] = (least, most)
    return out


def check(cs: Iterable[Constraint], sizes: dict, where: dict | None = None) -> None:
    """Raise InputError for the first constraint `sizes` break; `where` ({symbol: "input 'x' dim 1"})
    lets the message name the input dim a size came from."""
    cs = list(cs)
    ranges = ranges_of(cs)
    for c in cs:
        why = c.failure(sizes, where, ranges)
        if why:
            raise InputError(why)


# ---- arithmetic on dims ----------------------------------------------------------------------
#
# Exporters compute shapes with ONNX ops (Shape -> Gather -> Add -> Concat -> Reshape). Over symbolic
# dims the importer does that arithmetic here, on dims spelled as graph types spell them (an int or a
# size expression), and keeps each result canonical: a polynomial over symbols and opaque atoms
# (floor divisions, min/max, window sizes), so (seq+1)-1 is seq again and batch*seq is the product
# reshape understands.

ASSUMED_AT_LEAST = 2  # what a comparison of symbols assumes, as torch.export does (0 and 1 specialize)


class Undecided(ArithmeticError):
    """A comparison of sizes that holds for some sizes and fails for others."""


def _poly(e: Expr) -> dict:
    """{monomial (sorted atoms): coefficient} of an expression; what is not + - * is an atom."""
    if isinstance(e, Int):
        return {(): e.value} if e.value else {}
    if isinstance(e, Sym):
        return {(e.name,): 1}
    if isinstance(e, Neg):
        return _pscale(_poly(e.x), -1)
    if isinstance(e, Chain):
        acc = _poly(e.first)
        for op, x in e.rest:
            p = _poly(x)
            if op == "+":
                acc = _padd(acc, p)
            elif op == "-":
                acc = _padd(acc, _pscale(p, -1))
            elif op == "*":
                acc = _pmul(acc, p)
            else:
                acc = _pdiv(acc, p, op)
        return acc
    assert isinstance(e, Call), e  # what is not + - * is a call of a size function
    return {(_atom_text(e),): 1}


def _atom_text(e: Call) -> str:
    return _spell(e.name, [dim_of(_poly(a)) for a in e.args], e.flags)


def _padd(a: dict, b: dict) -> dict:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + c
    return {m: c for m, c in out.items() if c}


def _pscale(a: dict, k: int) -> dict:
    return {m: c * k for m, c in a.items() if c * k}


def _pmul(a: dict, b: dict) -> dict:
    out: dict = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = tuple(sorted(ma + mb))
            out[m] = out.get(m, 0) + ca * cb
    return {m: c for m, c in out.items() if c}


def _pdiv(a: dict, b: dict, op: str) -> dict:
    """a / b or a // b: exact term by term when b is a constant dividing every coefficient (for '//'
    also a constant a), else an opaque atom."""
    if set(b) == {()}:
        k = b[()]
        if all(c % k == 0 for c in a.values()):
            return {m: c // k for m, c in a.items()}
        if set(a) == {()}:
            return _poly(Int(a[()] // k if op == "//" else _exact_div(a[()], k)))
    elif not a:
        return {}
    return {(f"({dim_of(a)}{op}{dim_of(b)})",): 1}


def _monomial(m: tuple, c: int) -> str:
    """'a', '(a*b)', '(a*4)': products in the spelling reshape's sizes use (atoms, then the coefficient)."""
    parts = list(m) + ([str(abs(c))] if abs(c) != 1 else [])
    return parts[0] if len(parts) == 1 else "(" + "*".join(parts) + ")"


def _text(p: dict) -> str:
    if not p:
        return "0"
    terms = sorted(p.items(), key=lambda mc: (mc[1] < 0, -len(mc[0]), mc[0]))
    out = ""
    for m, c in terms:
        body = _monomial(m, c) if m else str(abs(c))
        out += ("-" if c < 0 else "+" if out else "") + body
    return out


def dim_of(p: dict):
    """A polynomial as a graph dim: an int, a symbol, '(a*b)' or '(seq+1)'."""
    if set(p) <= {()}:
        return p.get((), 0)
    if len(p) == 1:
        ((m, c),) = p.items()
        if c > 0:
            return _monomial(m, c)
    return f"({_text(p)})"


def _dim_poly(d) -> dict:
    if isinstance(d, bool) or not isinstance(d, (int, str)):
        try:
            d = int(d)
        except (TypeError, ValueError):
            raise GraphError(f"size {d!r} is a {type(d).__name__}, expected an int or a size expression") from None
    return _poly(parse(d))


def canonical(d):
    """The canonical spelling of a dim: (seq+1)-1 -> 'seq', '(2*n)' -> '(n*2)', '(4+0)' -> 4."""
    return dim_of(_dim_poly(d))


def dim_add(a, b):
    return dim_of(_padd(_dim_poly(a), _dim_poly(b)))


def dim_sub(a, b):
    return dim_of(_padd(_dim_poly(a), _pscale(_dim_poly(b), -1)))


def dim_mul(a, b):
    return dim_of(_pmul(_dim_poly(a), _dim_poly(b)))


def dim_floordiv(a, b):
    """a // b (ONNX's integer Div of sizes, which are never negative here)."""
    if b == 0:
        raise ZeroDivisionError(f"{a} // 0")
    return dim_of(_pdiv(_dim_poly(a), _dim_poly(b), "//"))


def dim_mod(a, b):
    """a mod b, spelled a - (a//b)*b: a multiple of the divisor is 0."""
    return dim_sub(a, dim_mul(dim_floordiv(a, b), b))


def dim_min(a, b, assumed: dict | None = None):
    return _extreme("min", a, b, assumed)


def dim_max(a, b, assumed: dict | None = None):
    return _extreme("max", a, b, assumed)


def _extreme(name: str, a, b, assumed: dict | None):
    """min/max of two sizes: the one that is, when `decide` says which (with `assumed` given, also by
    assuming least sizes of symbols, which are added to it), else 'min(a,b)'."""
    for relation, pick in (("<=", a if name == "min" else b), (">=", b if name == "min" else a)):
        try:
            ok, needs = decide(a, relation, b)
        except Undecided:
            continue
        if ok and not (needs and assumed is None):
            if assumed is not None:
                for x, least in needs.items():
                    assumed[x] = max(assumed.get(x, 0), least)
            return canonical(pick)
    return canonical(f"{name}({canonical(a)},{canonical(b)})")


def _range(p: dict, least: int):
    """(low, high) of a polynomial over symbols >= least (None: unbounded); Undecided when its
    terms pull both ways or hold opaque atoms, whose sizes the importer cannot bound."""
    const = p.get((), 0)
    terms = {m: c for m, c in p.items() if m}
    if not terms:
        return const, const
    if any(not all(_is_symbol(x) for x in m) for m in terms):
        raise Undecided(f"{dim_of(p)} holds sizes the importer cannot bound")
    edge = const + sum(c * least ** len(m) for m, c in terms.items())
    if all(c > 0 for c in terms.values()):
        return edge, None
    if all(c < 0 for c in terms.values()):
        return None, edge
    raise Undecided(f"the sign of {dim_of(p)} depends on the sizes")


_RELATIONS = {
    # relation: (holds for every value in [lo, hi], fails for every value in [lo, hi])
    "==": (lambda lo, hi: lo == hi == 0, lambda lo, hi: (lo is not None and lo > 0) or (hi is not None and hi < 0)),
    "<": (lambda lo, hi: hi is not None and hi < 0, lambda lo, hi: lo is not None and lo >= 0),
    "<=": (lambda lo, hi: hi is not None and hi <= 0, lambda lo, hi: lo is not None and lo > 0),
    ">": (lambda lo, hi: lo is not None and lo > 0, lambda lo, hi: hi is not None and hi <= 0),
    ">=": (lambda lo, hi: lo is not None and lo >= 0, lambda lo, hi: hi is not None and hi < 0),
}


def decide(a, relation: str, b) -> tuple[bool, dict]:
    """Whether `a relation b` holds for sizes (relation: ==, <, <=, >, >=), and what deciding it
    assumed: {symbol: least size}, empty when it holds or fails for every size >= 0, else each
    symbol >= 1 (no empty tensors) or, failing that, >= ASSUMED_AT_LEAST. Undecided when even that
    leaves it open (seq < kv)."""
    p = _padd(_dim_poly(a), _pscale(_dim_poly(b), -1))
    holds, fails = _RELATIONS[relation]
    symbols = sorted({x for m in p if m for x in m})
    for least in (0, 1, ASSUMED_AT_LEAST):
        lo, hi = _range(p, least)
        if holds(lo, hi) or fails(lo, hi):
            return holds(lo, hi), ({x: least for x in symbols} if least else {})
    raise Undecided(f"whether {canonical(a)} {relation} {canonical(b)} depends on the sizes")


def _is_symbol(x: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", x) is not None
