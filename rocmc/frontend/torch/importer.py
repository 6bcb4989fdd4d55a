"""torch.export -> rocmc Graph: the importer and the converter registry.

An nn.Module is exported with `torch.export.export` and decomposed to the core ATen opset
(`run_decompositions`), keeping `aten.scaled_dot_product_attention` whole so it becomes `ops.sdpa`.
Each FX node is converted by one small function from the CONVERTERS table (`@converts("aten.add.Tensor")`)
onto rocmc's ops; parameters and buffers become graph constants (or named parameters, `parameters=
"external"`), lifted tensor constants become constants.

Shapes: a `torch.export.Dim` is a symbolic dim of the rocmc input named after the Dim. The program's own
size arithmetic (`sym_size`, `operator.mul/add/floordiv` of sizes feeding `view`, `expand`, `arange`,
`slice`) is followed node by node with rocmc.symbolic's canonical arithmetic, so `batch*seq` stays the
product `reshape` understands. The Dims' ranges (and the divisibility a derived Dim such as `8*k`
guarantees) become `graph.assume` constraints, checked on every call (InputError); an end torch leaves
open (a Dim without max, Dim.AUTO, Dim.DYNAMIC) bounds nothing. Where a conversion
has to decide a comparison of sizes it assumes what torch.export assumes (symbols >= 2) and records it.

Dtypes follow torch's promotion (`torch.result_type` over the operands' dtypes and dimensions), and
every result is checked against the dtype and rank torch recorded for the node.

Every node that cannot be imported is collected and reported together in one ModelImportError
(ATen op, node name, reason).

An nn.Module is exported inside `_Bound`: keyword arguments that hold no tensor are bound into the call
(constants of the export, not inputs) and the result is reduced to its tensors, so a transformers model
exports as loaded (its DynamicCache and None fields dropped). Non-tensor inputs torch.export specialized
(a bool, int, float, str or None placeholder) are constants too, and so are non-tensor outputs dropped.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ... import symbolic
from ...errors import GraphError, ModelImportError, RocmcError
from ...progress import step
from ..graph import Graph, Value
from ..importing import SizeReasoning, identifier
from ..opdef import normalize_axis


DTYPES = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.uint16: "u16",
    torch.uint32: "u32",
    torch.uint64: "u64",
    torch.bool: "bool",
    torch.float8_e4m3fn: "f8e4m3fn",
    torch.float8_e4m3fnuz: "f8e4m3fnuz",
    torch.float8_e5m2: "f8e5m2",
    torch.float8_e5m2fnuz: "f8e5m2fnuz",
}
_TORCH_DTYPES = {v: k for k, v in DTYPES.items()}


class Unsupported(Exception):
    """Raised by a converter: the node is valid ATen but rocmc cannot import it (the reason says why)."""


class Missing:
    """A result rocmc does not compute (max_pool's indices, layer norm's saved statistics): an error
    only for a node that uses it."""

    def __init__(self, why: str):
        self.why = why


CONVERTERS: dict[str, Callable] = {}


def converts(*names: str):
    """Register a converter for ATen ops named as torch prints them ("aten.add.Tensor") or Python's
    size arithmetic ("operator.mul"). An ATen name torch does not have is a mistake in the table."""

    def deco(fn):
        for name in names:
            if name.startswith("aten.") and not aten_exists(name):
                raise GraphError(f"converter {fn.__name__}: torch has no ATen op {name!r}")
            CONVERTERS[name] = fn
        return fn

    return deco


def aten_exists(name: str) -> bool:
    """Whether torch has the ATen overload 'aten.op.overload'."""
    _, op, overload = name.split(".")
    packet = getattr(torch.ops.aten, op, None)
    return packet is not None and overload in packet.overloads()


def _ops():
    from ... import ops

    return ops


def op_name(target) -> str:
    """The table key of an FX call target: 'aten.add.Tensor', 'operator.mul', 'torch.sym_max'."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    module = {"_operator": "operator", "torch.fx.experimental.sym_node": "torch"}.get(module, module)
    return f"{module}.{getattr(target, '__name__', repr(target))}"


def torch_cast(v: Value, dtype: str) -> Value:
    """v converted as torch converts: to float8_e4m3fn saturating (out of range, infinities included, to +-448),
    to the other float8 types not (NaN or infinity), like rocmc's cast."""
    return _ops().cast(v, dtype, saturate=dtype == "f8e4m3fn")


def rocmc_dtype(dt, what: str) -> str:
    if dt not in DTYPES:
        raise Unsupported(f"{what} has dtype {dt}, which rocmc lacks ({', '.join(map(str, DTYPES))})")
    return DTYPES[dt]


def to_numpy(t: torch.Tensor, what: str) -> np.ndarray:
    """A torch tensor's values as a numpy array of the rocmc dtype (bf16 and float8 through their bits, as
    rocmc.arrays reads every tensor)."""
    from ...arrays import as_numpy

    rocmc_dtype(t.dtype, what)  # Unsupported for a dtype rocmc lacks
    return as_numpy(t.detach().cpu().contiguous(), what)


def is_size(v) -> bool:
    """A size: an int or a size expression (a str)."""
    return isinstance(v, str) or (isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)))


# ---- what a converter sees of one FX node ---------------------------------------------------------


class Node:
    """One FX call_function node: its operands by schema name, torch's recorded result, the importer."""

    def __init__(self, imp: "Importer", fx):
        self.imp, self.fx = imp, fx
        self.name = op_name(fx.target)
        self.graph = imp.graph
        self.args = [imp.resolve(a) for a in fx.args]
        self.kwargs = {k: imp.resolve(v) for k, v in fx.kwargs.items()}
        self.a: dict = {}
        self._fx_args: dict = {}
        schema = getattr(fx.target, "_schema", None)
        if schema is not None:
            for i, arg in enumerate(schema.arguments):
                if i < len(fx.args):
                    self.a[arg.name], self._fx_args[arg.name] = self.args[i], fx.args[i]
                elif arg.name in fx.kwargs:
                    self.a[arg.name], self._fx_args[arg.name] = self.kwargs[arg.name], fx.kwargs[arg.name]
                elif arg.has_default_value():
                    self.a[arg.name] = self._fx_args[arg.name] = arg.default_value
        else:
            self.a = {i: v for i, v in enumerate(self.args)}
            self._fx_args = dict(enumerate(fx.args))

    @property
    def val(self):
        """torch's result for this node (a FakeTensor, a SymInt, or a list of them)."""
        return self.fx.meta.get("val")

    def out_dtype(self, i: int | None = None) -> str:
        v = self.val if i is None else self.val[i]
        return rocmc_dtype(v.dtype, f"result of {self.fx.name}")

    def fx_arg(self, key):
        return self._fx_args.get(key)

    def value(self, key, dtype: str | None = None) -> Value:
        """Operand `key` as a rocmc Value (a scalar becomes a constant), cast to `dtype` when given."""
        v = self.a[key]
        return self.imp.tensor(v, dtype, f"operand {key!r}")

    def promoted(self, *keys) -> str:
        """torch's result dtype of the operands `keys` (tensors by dtype and dimension, scalars by kind)."""
        return promote([self.fx_arg(k) for k in keys], f"operands of {self.fx.name}")

    def size_list(self, key) -> list:
        """A list of sizes (ints and size expressions)."""
        v = self.a[key]
        v = [v] if is_size(v) else list(v)
        for d in v:
            if not is_size(d):
                raise Unsupported(f"{key}={v!r}: expected sizes (ints or symbolic sizes)")
        return [d if isinstance(d, str) else int(d) for d in v]

    def int_list(self, key) -> list:
        v = self.size_list(key)
        syms = [d for d in v if isinstance(d, str)]
        if syms:
            raise Unsupported(f"{key}={v}: depends on symbolic sizes ({', '.join(syms)}); rocmc needs integers here")
        return v

    def axis(self, d, rank: int, arg: str = "dim", *, scalar: bool = True) -> int:
        """Dim `d` of a rank-`rank` operand made non-negative (negative counts from the end); out of range
        is a GraphError naming the op. With `scalar` a 0-d operand takes dim 0 or -1, as torch wraps
        the dims of a scalar; without it a 0-d operand has no dims."""
        return normalize_axis(self.name, d, max(rank, 1) if scalar else rank, arg, scalar_axis=False)


def _example(x):
    """A stand-in for an operand in torch.result_type: a real 0-d or 1-d tensor of its dtype (the
    dimension decides the promotion category), or the Python scalar."""
    import torch.fx

    if isinstance(x, torch.fx.Node):
        x = x.meta.get("val")
    if isinstance(x, torch.Tensor):
        return torch.empty((1,) * min(x.dim(), 1), dtype=x.dtype)
    if isinstance(x, torch.SymInt):
        return 1
    if isinstance(x, torch.SymFloat):
        return 1.0
    if isinstance(x, torch.SymBool):
        return True
    return x


def promote(fx_operands, what: str) -> str:
    """torch's result dtype of the operands (FX nodes or Python scalars), as a rocmc dtype name."""
    examples = [_example(x) for x in fx_operands if x is not None]
    try:
        acc = examples[0]
        for e in examples[1:]:
            dims = max((t.dim() for t in (acc, e) if isinstance(t, torch.Tensor)), default=0)
            acc = torch.empty((1,) * dims, dtype=torch.result_type(acc, e))
    except (TypeError, RuntimeError, IndexError) as e:
        raise Unsupported(f"{what}: no result dtype ({e})") from None
    if isinstance(acc, torch.Tensor):
        return rocmc_dtype(acc.dtype, what)
    return (
        "bool"
        if isinstance(acc, bool)
        else "i64"
        if isinstance(acc, int)
        else rocmc_dtype(torch.get_default_dtype(), what)
    )


# ---- the importer -----------------------------------------------------------------------------------


class Importer(SizeReasoning):
    unsupported = Unsupported  # what deciding a comparison of sizes raises

    def __init__(self, ep, name: str, parameters: str, prefix: str = ""):
        self.ep = ep
        self.prefix = prefix  # of the state-dict names of a module exported inside _Bound
        self.graph = Graph(name)
        self.parameters = parameters
        self.env: dict = {}  # fx node -> Value | size | scalar | list | Missing | None
        self.problems: list[tuple[str, str, str]] = []
        self.symbols: dict = {}  # sympy symbol -> rocmc size
        self._pending: list = []  # assumptions of an input's dims, made once it exists
        self.label = ""

    # -- values
    def resolve(self, a):
        import torch.fx

        if isinstance(a, torch.fx.Node):
            v = self.env[a]
            if isinstance(v, Missing):
                raise Unsupported(f"uses {a.name}: {v.why}")
            return v
        if isinstance(a, (list, tuple)):
            return type(a)(self.resolve(x) for x in a)
        return a

    def tensor(self, v, dtype: str | None, what: str) -> Value:
        R = _ops()
        if isinstance(v, Value):
            return v if dtype is None or v.dtype.name == dtype else torch_cast(v, dtype)
        if isinstance(v, str):  # a symbolic size used as data
            v = R.reshape(R.sizes(self.graph, [v]), ())
            return v if dtype is None or dtype == "i64" else R.cast(v, dtype)
        if isinstance(v, (bool, int, float, np.number)):
            from ...dtypes import dtype as rocmc_dt

            dt = dtype or ("bool" if isinstance(v, bool) else "i64" if isinstance(v, int) else "f32")
            return self.graph.constant(None, np.asarray(v, dtype=rocmc_dt(dt).np), dtype=dt)
        raise Unsupported(f"{what} is {type(v).__name__}, expected a tensor or a scalar")

    # -- the pass
    def run(self) -> Graph:
        from torch.export.graph_signature import InputKind, OutputKind

        specs = {s.arg.name: s for s in self.ep.graph_signature.input_specs}
        self._symbol_names()
        for fx in self.ep.graph.nodes:
            self.label = f"{fx.target} node {fx.name!r}" if fx.op == "call_function" else f"{fx.op} {fx.name!r}"
            try:
                if fx.op == "placeholder":
                    self.env[fx] = self._placeholder(fx, specs[fx.name], InputKind)
                elif fx.op == "call_function":
                    self.env[fx] = self._call(fx)
                elif fx.op == "get_attr":
                    self.env[fx] = self._attr(fx)
                elif fx.op == "output":
                    self._outputs(fx, OutputKind)
            except (Unsupported, RocmcError) as e:
                self.problems.append(
                    (op_name(fx.target) if fx.op == "call_function" else f"({fx.op})", fx.name, str(e))
                )
                self.env[fx] = Missing("an earlier node could not be imported")
        if self.problems:
            raise ModelImportError(problem_report(self.problems))
        return self.graph

    def _call(self, fx):
        name = op_name(fx.target)
        if name not in CONVERTERS:
            for a in fx.all_input_nodes:  # report only the first cause along a chain
                if isinstance(self.env.get(a), Missing) and self.env[a].why.startswith("an earlier"):
                    raise Unsupported("op is not supported (and an operand could not be imported)")
            raise Unsupported("op is not supported")
        if any(
            isinstance(self.env.get(a), Missing) and self.env[a].why.startswith("an earlier")
            for a in fx.all_input_nodes
        ):
            return Missing("an earlier node could not be imported")
        out = CONVERTERS[name](Node(self, fx))
        return self._checked(fx, out)

    def _checked(self, fx, out):
        """Results against torch's record: a tensor's rank and static dims must agree (an importer bug
        otherwise), its dtype is torch's (a cast where a rocmc op's rule differs)."""
        val = fx.meta.get("val")
        if isinstance(out, (list, tuple)) and isinstance(val, (list, tuple)):
            return [self._check_one(fx, o, v, i) for i, (o, v) in enumerate(zip(out, val))]
        return self._check_one(fx, out, val, None)

    def _check_one(self, fx, out, val, i):
        if not isinstance(out, Value) or not isinstance(val, torch.Tensor):
            return out
        where = fx.name if i is None else f"{fx.name}[{i}]"
        shape = list(val.shape)
        same = len(shape) == out.rank and all(
            not isinstance(d, int) or not isinstance(r, int) or d == r for d, r in zip(shape, out.shape)
        )
        if not same:
            raise Unsupported(f"converted to {out.type} but torch computes shape {shape} for {where}")
        dt = rocmc_dtype(val.dtype, f"result {where}")
        return out if out.dtype.name == dt else torch_cast(out, dt)

    def _attr(self, fx):
        t = getattr(self.ep.graph_module, fx.target)
        if not isinstance(t, torch.Tensor):
            raise Unsupported(f"attribute {fx.target} is a {type(t).__name__}, not a tensor")
        return self.graph.constant(self._const_name(fx.target), to_numpy(t, fx.target))

    def _const_name(self, name: str) -> str:
        base, i = identifier(name, "c"), 1
        out = base
        while out in self.graph._names:
            out, i = f"{base}_{i}", i + 1
        return out

    def _placeholder(self, fx, spec, InputKind):
        if spec.kind == InputKind.USER_INPUT:
            val = fx.meta.get("val")
            if val is None or isinstance(val, (bool, int, float, str)):
                return val  # torch.export specialized the program to this value: a constant
            if not isinstance(val, torch.Tensor):
                raise Unsupported(f"input {fx.name!r} is a {type(val).__name__}; only tensor inputs are supported")
            shape = [self._input_dim(fx, axis, d) for axis, d in enumerate(val.shape)]
            v = self.graph.input(identifier(fx.name, "x"), shape, rocmc_dtype(val.dtype, f"input {fx.name!r}"))
            for assume in self._pending:  # an assumption may name only the dims of existing inputs
                assume()
            self._pending = []
            return v
        if not fx.users:
            return None
        target = spec.target.removeprefix(self.prefix) if spec.target else spec.target
        if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
            t = self.ep.state_dict[spec.target]
            if self.parameters == "external":
                return self.graph.parameter(target, tuple(t.shape), rocmc_dtype(t.dtype, target))
            return self.graph.constant(self._const_name(target), to_numpy(t, target))
        if spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            t = self.ep.constants.get(spec.target)
            if t is None:
                t = self.ep.state_dict[spec.target]
            if not isinstance(t, torch.Tensor):
                raise Unsupported(f"constant {target!r} is a {type(t).__name__}, not a tensor")
            return self.graph.constant(self._const_name(target), to_numpy(t, target))
        raise Unsupported(f"input kind {spec.kind.name} is not supported")

    def _outputs(self, fx, OutputKind) -> None:
        outs = fx.args[0] if isinstance(fx.args[0], (list, tuple)) else [fx.args[0]]
        for spec, o in zip(self.ep.graph_signature.output_specs, outs):
            if spec.kind != OutputKind.USER_OUTPUT:
                self.problems.append(
                    (
                        "(output)",
                        spec.arg.name,
                        f"output kind {spec.kind.name} (the program mutates its inputs or buffers) is not supported",
                    )
                )
                continue
            v = self.env.get(o) if o is not None and not isinstance(o, (int, float, bool, str)) else o
            if isinstance(v, Missing):
                if not v.why.startswith("an earlier"):
                    self.problems.append(("(output)", spec.arg.name, v.why))
                continue
            if not isinstance(v, Value):
                continue  # a constant or a size: only tensors are outputs (import_torch says so)
            self.graph.output(v)

    # -- symbolic dims
    def _symbol_names(self) -> None:
        """Find torch's shape environment: it knows the torch.export.Dim name of each symbol."""
        self._shape_env = None
        for fx in self.ep.graph.nodes:
            v = fx.meta.get("val") if fx.op == "placeholder" else None
            if isinstance(v, torch.Tensor) and getattr(v, "fake_mode", None) is not None:
                self._shape_env = v.fake_mode.shape_env
                if self._shape_env is not None:
                    return

    def _dim_name(self, sym) -> str | None:
        """The torch.export.Dim name of a symbol, when the program still knows it (a program loaded from
        a .pt2 file does not)."""
        env = self._shape_env
        names = getattr(env, "source_name_to_debug_name", None) or {}
        for src in getattr(env, "var_to_sources", {}).get(sym, []):
            given = names.get(src.name)
            if given and given.isidentifier():
                return given
        return None

    def _input_dim(self, fx, axis: int, d):
        """A dim of a user input: an int, the Dim's name, or for a derived Dim (a*k+b) a name of its own
        (the root k is then the exact quotient, a constraint of the graph)."""
        if isinstance(d, int):
            return d
        expr = d.node.expr
        if expr in self.symbols:
            return self.symbols[expr]
        import sympy

        free = list(expr.free_symbols)
        if isinstance(expr, sympy.Symbol):
            name = self._fresh(self._dim_name(expr) or f"{identifier(fx.name, 'x')}_d{axis}")
            self.symbols[expr] = name
            self._pending.append(lambda: self._assume_range(name, expr, 1, 0))
            return name
        a, b = _linear(expr, free[0]) if len(free) == 1 else (None, None)
        if a is None:
            raise Unsupported(f"input dim {axis} is {expr}: rocmc takes a Dim or a*Dim+b")
        s = free[0]
        name = self._fresh(f"{identifier(fx.name, 'x')}_d{axis}")
        self.symbols[expr] = name
        if s not in self.symbols:  # the root Dim: (name - b) / a, exactly
            self.symbols[s] = symbolic.canonical(f"(({name}-{b})/{a})" if b else f"({name}/{a})")
        self._pending.append(lambda: self._assume_derived(name, s, a, b, expr))
        return name

    def _assume_derived(self, name: str, s, a: int, b: int, expr) -> None:
        self.graph.assume(
            symbolic.Constraint(
                f"torch.export dim {name} = {expr}",
                "divisible",
                symbolic.parse(symbolic.dim_sub(name, b)),
                symbolic.Int(a),
            )
        )
        self._assume_range(name, s, a, b)

    def _fresh(self, name: str) -> str:
        base, i = name, 1
        while name in self.graph.symbols() or name in self.graph._names:
            name, i = f"{base}_{i}", i + 1
        return name

    def _assume_range(self, name: str, sym, a, b) -> None:
        """The range torch.export keeps for symbol `sym` as constraints on input dim `name` = a*sym + b.
        An end torch leaves open (a Dim without max, Dim.AUTO, Dim.DYNAMIC: torch's int_oo) bounds
        nothing; a lower end of 0 or less says nothing a size doesn't."""
        vr = self.ep.range_constraints.get(sym)
        if vr is None:
            return
        lo, hi = _finite(vr.lower), _finite(vr.upper)
        what = f"torch.export range of {name}"
        if lo is not None and a * lo + b > 0:
            self.graph.assume(symbolic.Constraint(what, "at_least", symbolic.Sym(name), symbolic.Int(a * lo + b)))
        if hi is not None:
            self.graph.assume(symbolic.Constraint(what, "at_least", symbolic.Int(a * hi + b), symbolic.Sym(name)))


def _finite(bound) -> int | None:
    """An end of a torch value range as an int; None for an infinite one (sympy's oo or torch's int_oo,
    which sympy calls finite and cannot convert)."""
    import sympy

    return int(bound) if isinstance(bound, (int, sympy.Integer)) and not isinstance(bound, bool) else None


def _linear(expr, s):
    """(a, b) with expr == a*s + b for integers a > 0, b, else (None, None)."""
    import sympy

    poly = sympy.Poly(expr, s) if expr.is_polynomial(s) else None
    if poly is None or poly.degree() != 1:
        return None, None
    a, b = poly.all_coeffs()
    if not (a.is_Integer and b.is_Integer and a > 0):
        return None, None
    return int(a), int(b)


# ---- a module called with its constant keyword arguments, returning its tensors ---------------------


class _Bound(torch.nn.Module):
    """`model` called with its non-tensor keyword arguments fixed, returning the tensors of its result.
    Its forward has the model's signature less the fixed arguments, so torch.export names the inputs
    after the model's parameters and reads `dynamic_shapes` as it would for the model itself."""

    ATTR = "bound_model"  # the model's submodule name: the prefix the importer takes off state-dict names

    def __init__(self, model, fixed: dict):
        super().__init__()
        setattr(self, self.ATTR, model)
        self._fixed = fixed
        self.training = model.training  # the model's own mode; its submodules keep theirs

    def forward(self, *args, **kwargs):
        return tuple(_tensors(getattr(self, self.ATTR)(*args, **kwargs, **self._fixed)))


def _holds_tensor(v) -> bool:
    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, dict):
        return any(_holds_tensor(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return any(_holds_tensor(x) for x in v)
    return not isinstance(v, (bool, int, float, str, type(None), torch.dtype, torch.device))


def _tensors(out):
    """The tensors of a module's result, in order; everything else (None, caches, numbers) left out."""
    import dataclasses

    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, dict):  # a dict, or a transformers ModelOutput (its set fields)
        for v in out.values():
            yield from _tensors(v)
    elif isinstance(out, (list, tuple)):
        for v in out:
            yield from _tensors(v)
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):
        for f in dataclasses.fields(out):
            yield from _tensors(getattr(out, f.name))


def _bind_constants(model, kwargs: dict, dynamic_shapes):
    """(the module to export, its remaining keyword arguments, the dynamic shapes for them): keyword
    arguments that hold no tensor become constants of a _Bound module."""
    import inspect

    fixed = {k: v for k, v in kwargs.items() if not _holds_tensor(v)}
    kept = {k: v for k, v in kwargs.items() if k not in fixed}
    bound = _Bound(model, fixed)
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        params += [p for n, p in sig.parameters.items() if n not in fixed]
        forward = lambda self, *a, **k: _Bound.forward(self, *a, **k)  # noqa: E731 - one per import
        forward.__signature__ = sig.replace(parameters=params, return_annotation=inspect.Signature.empty)
        bound.forward = forward.__get__(bound)
    if isinstance(dynamic_shapes, dict):
        given = [k for k in fixed if dynamic_shapes.get(k) is not None]
        if given:
            raise ModelImportError(
                f"import_torch: dynamic_shapes gives a shape for {', '.join(map(repr, given))}, "
                f"a keyword argument that holds no tensor (a constant of the export); "
                f"expected None or no entry"
            )
        dynamic_shapes = {k: v for k, v in dynamic_shapes.items() if k not in fixed}
    return bound, kept, dynamic_shapes


def problem_report(problems) -> str:
    lines = [f"cannot import the torch program: {len(problems)} unsupported node(s)"]
    for op, name, reason in problems:
        lines.append(f"  {op} {name!r}: {reason}")
    return "\n".join(lines)


def decompositions():
    """The core ATen decomposition table, without scaled_dot_product_attention (rocmc's sdpa)."""
    table = torch.export.default_decompositions()
    table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)
    return table


@step("importing a torch model (torch.export)", logger=__package__)  # rocmc.frontend.torch
def import_torch(
    model, args=(), *, kwargs=None, dynamic_shapes=None, name: str | None = None, parameters: str = "constants"
) -> Graph:
    """Import a torch nn.Module (exported here with torch.export) or an ExportedProgram as a Graph.

    args, kwargs: example inputs of the module (as for torch.export.export). A keyword argument that
        holds no tensor (use_cache=False, output_attentions=False, an int, a str, None) is a constant
        of the export: it is bound into the traced call and is no graph input.
    dynamic_shapes: torch.export's spec ({axis: torch.export.Dim("seq", min=.., max=..)} per input, as a
        tuple in the order of forward's parameters or a dict by parameter name; the constant keyword
        arguments need no entry). Each Dim becomes a symbolic dim of that name, its range an assumption
        checked at call time; a Dim without max (Dim("seq"), Dim.AUTO, Dim.DYNAMIC) has no upper bound.
    Outputs: the module's tensors in order of its result's structure (a tuple or list in order, a dict,
        a ModelOutput or a dataclass field by field, nested containers flattened); whatever is not a
        tensor (None, a transformers DynamicCache, a number) is dropped. A causal LM's graph returns its
        logits.
    parameters: "constants" (weights in the module) or "external" (graph.parameter under the state-dict
        names; supplied at load time, `rocmc.load(art, parameters=...)`).
    Raises ModelImportError listing every node that cannot be imported.
    """
    if parameters not in ("constants", "external"):
        raise ModelImportError(f"import_torch: parameters={parameters!r}, expected 'constants' or 'external'")
    forward = None
    prefix = ""
    if isinstance(model, torch.nn.Module):
        forward = model.forward
        bound, kwargs, dynamic_shapes = _bind_constants(model, dict(kwargs or {}), dynamic_shapes)
        prefix = f"{_Bound.ATTR}."
        try:
            ep = torch.export.export(bound, tuple(args), kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=False)
        except Exception as e:  # noqa: BLE001 - torch.export's own failures are import errors
            raise ModelImportError(f"torch.export failed: {type(e).__name__}: {e}") from None
    elif isinstance(model, torch.export.ExportedProgram):
        ep = model
    else:
        raise ModelImportError(
            f"import_torch: expected a torch.nn.Module or torch.export.ExportedProgram, got {type(model).__name__}"
        )
    try:
        ep = ep.run_decompositions(decompositions())
    except Exception as e:  # noqa: BLE001
        raise ModelImportError(f"decomposing to core ATen failed: {type(e).__name__}: {e}") from None
    gname = identifier(name or (type(model).__name__ if forward is not None else "main"), "main")
    return Importer(ep, gname, parameters, prefix).run()


def load_program(path) -> Graph:
    """A saved torch.export program (.pt2). Loading one unpickles Python objects: trust it as code."""
    try:
        ep = torch.export.load(str(path))
    except Exception as e:  # noqa: BLE001
        raise ModelImportError(f"cannot load torch.export program {str(path)!r}: {type(e).__name__}: {e}") from None
    return import_torch(ep)
