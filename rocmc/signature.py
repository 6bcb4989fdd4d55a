"""The inputs of a call, matched against a signature: one function, so a compiled module and
`rocmc.evaluate` accept the same calls and reject the others with the same messages.

A signature's inputs are {name, dtype, shape} dicts (the metadata's form); shapes hold ints and
symbol names, and a call binds each symbol to one size.
"""

from __future__ import annotations

import numpy as np

from . import symbolic
from .arrays import as_numpy
from .dtypes import ALL as DTYPES, np_kind
from .errors import InputError

# numpy's dtype.kind letters that a float64 reference accepts for each kind of rocmc dtype
_NP_KINDS = {"float": "f", "int": "iu", "bool": "b"}


def np_dtype(name: str) -> np.dtype:
    return DTYPES[name].np


def input_specs(graph) -> list[dict]:
    return [{"name": v.name, "dtype": v.dtype.name, "shape": list(v.shape)} for v in graph.inputs]


def bind(
    specs: list,
    args,
    kwargs: dict,
    constraints=(),
    *,
    arrays=(np.ndarray,),
    exact_dtype: bool = True,
    what: str = "module",
) -> tuple[list, dict]:
    """The inputs in signature order and the size of each symbol; InputError for anything else.

    exact_dtype=False accepts any dtype of the input's kind (float, int or bool), as a float64
    reference does. `constraints` (symbolic.Constraint) must hold at the bound sizes. A torch tensor is
    taken as the numpy array sharing its memory (rocmc.arrays.as_numpy).
    """
    names = [s["name"] for s in specs]
    if len(args) > len(specs):
        raise InputError(f"expected {len(specs)} input(s) ({', '.join(names)}), got {len(args)}")
    values = list(args) + [None] * (len(specs) - len(args))
    for k, v in kwargs.items():
        if k not in names:
            raise InputError(f"unknown input {k!r}; inputs are {', '.join(names)}")
        i = names.index(k)
        if values[i] is not None:
            raise InputError(f"input {k!r} given twice")
        values[i] = v
    missing = [n for n, v in zip(names, values) if v is None]
    if missing:
        raise InputError(f"missing input(s) {', '.join(missing)}; expected {len(specs)}: {', '.join(names)}")
    values = [as_numpy(v, f"input {n!r}") for n, v in zip(names, values)]
    symbols: dict = {}
    for spec, v in zip(specs, values):
        _check_input(spec, v, symbols, arrays, exact_dtype, what)
    sizes = {d: n for d, (n, _, _) in symbols.items()}
    symbolic.check(constraints, sizes, {d: f"input {name!r} dim {axis}" for d, (_, name, axis) in symbols.items()})
    return values, sizes


def _check_input(spec: dict, v, symbols: dict, arrays, exact_dtype: bool, what: str) -> None:
    name, want = spec["name"], spec["dtype"]
    if want not in DTYPES:
        raise InputError(f"input {name!r}: the signature's dtype {want!r} is not one of {', '.join(DTYPES)}")
    if not isinstance(v, arrays):
        raise InputError(f"input {name!r}: expected a numpy array or a CPU torch tensor, got {type(v).__name__}")
    if exact_dtype and v.dtype != np_dtype(want):
        raise InputError(f"input {name!r}: dtype {v.dtype} but the {what} expects {want} ({np_dtype(want)})")
    if not exact_dtype and np_kind(v.dtype) not in _NP_KINDS[DTYPES[want].kind]:
        raise InputError(f"input {name!r}: dtype {v.dtype} but the {what} expects {want} (an array of that kind)")
    shape = tuple(v.shape)
    if len(shape) != len(spec["shape"]):
        raise InputError(
            f"input {name!r}: rank {len(shape)} {list(shape)}, expected rank {len(spec['shape'])} {spec['shape']}"
        )
    for axis, (got, d) in enumerate(zip(shape, spec["shape"])):
        if isinstance(d, int):
            if got != d:
                raise InputError(
                    f"input {name!r}: dim {axis} is {got}, expected {d} (shape {list(shape)} vs {spec['shape']})"
                )
        elif d in symbols and symbols[d][0] != got:
            first, other, other_axis = symbols[d]
            raise InputError(
                f"input {name!r}: dim {axis} ({d}) is {got}, but {d}={first} from input {other!r} dim {other_axis}"
            )
        else:
            symbols.setdefault(d, (int(got), name, axis))
