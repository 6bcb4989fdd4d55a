"""Entry points of a module with held states, written against IREE's native ABI (`iree.abi.stub`).

Why: a decode loop issues step n + 1 before it reads step n's tokens (`Module.submit`), so that the host's work
for a step hides behind the GPU's. IREE 3.13's CUDA HAL blocks the issuing thread in queue allocations and frees
until the work before them is done, and a step allocated and freed its intermediate buffer. IREE's caller-given
storage removes both (`hal.tensor.alias` of each result onto a caller's buffer, `hal.tensor.transients` for the
intermediate values), but its pass (`iree-stream-emplace-transients`) follows a mutable global's timeline into
every function that writes it, and fails where several do (prefill and decode write the KV cache). So a module
whose functions are issued stream-ordered holds no state itself: the states are buffers its caller holds.

Each function `name` of such a module is emitted as
- `name$body` (private): the graph's function, the states it reads or writes as trailing arguments, the states it
  assigns as trailing results;
- `name` (synchronous): inputs and states as buffer views; results, then the states written, as buffer views,
  which the caller keeps as the states (exporting them makes the call return only once they are written). A
  state the call writes in place (module.py, `updated_in_place`: its old value has one use, an op writing it in
  place, as the KV cache's store) is imported with `consume` (the module may write the caller's buffer: without
  it IREE copied the whole state into a transient and back, two whole-state copies a call) and its new value
  aliased back onto the same buffer. Any other state's new value goes to another buffer: IREE 3.13 does not
  order reads of the old value against a write into the buffer it was imported from (a state read by an output
  or a second op came back already updated);
- `name$async` (IREE's coarse-fences ABI, for `compile(asynchronous=...)`): the same with fences, the buffers for
  the new values of states not written in place from the caller (`%next<i>`), and, where every result is static
  (`caller_storage`), the results' buffers and the transient storage from the caller: one queue submission with
  no allocation, free or host wait.
- `rocmc$states` (`STATE_BUFFERS`): a buffer of zeros for each state, filled on the device; the runtime calls it
  once at load (rocmc/runtime/module.py).

Each entry point carries the `iree.abi.declaration` IREE's own would, which the load check reads
(artifact/schema.py, check_signatures).
"""

from __future__ import annotations

from ..artifact import STATE_BUFFERS
from .emitter import mlir_string


def held_entry_points(f, attrs: str, asynchronous: bool) -> list[str]:
    """`name$body`, `name` and (asynchronous) `name$async` of function `f` (module.py's _Function); `attrs`: the
    attributes of the module's first function (its metadata), or ""."""
    e = _EntryPoint(f)
    res = e.call(*e.imports(""))
    outs = [
        e.op(f"hal.tensor.export {v} : {r.mlir}{e.dims_of_tensor(v, r.mlir)} -> !hal.buffer_view")
        for v, r in zip(res, f.rets)
    ]
    for v, (name, r) in zip(res[len(f.rets) :], f.state_rets):
        if name in f.in_place:  # into the caller's buffer it came in (the same buffer returned)
            v = e.op(f"hal.tensor.alias {v} : {r.mlir} to {e.state_view(name)} : !hal.buffer_view")
        outs.append(e.op(f"hal.tensor.export {v} : {r.mlir} -> !hal.buffer_view"))  # else a new buffer
    declared = _declaration(
        "sync", f.name, _declared_inputs(f), [*_values("output", f.rets), *_values("state", _states(f.state_rets))]
    )
    refl = f'iree.reflection = {{iree.abi.declaration = "{mlir_string(declared)}"'
    if attrs:
        attrs = attrs.replace("attributes {iree.reflection = {", f"attributes {{iree.abi.stub, {refl}, ", 1)
    else:
        attrs = f"attributes {{iree.abi.stub, {refl}}}}} "
    lines = [*_body(f), *e.function(f.name, _views(f), outs, attrs)]
    return lines + _async(f) if asynchronous else lines


def caller_storage(f) -> bool:
    """Whether `name$async` takes its results' buffers and its transient storage from the caller: where every
    result's size is known at compile time."""
    return all(d is not None for r in f.rets for d in _dims(r.mlir))


def state_buffers(zeros: list[str]) -> list[str]:
    """`rocmc$states`: a new buffer of each state's initial value (`zeros`: `dense<0...> : tensor<...>` each, in
    the metadata's order), filled on the device."""
    lines, outs = [], []
    for i, value in enumerate(zeros):
        mlir = value.split(" : ", 1)[1]
        lines += [
            f"  %z{i} = arith.constant {value}",
            f"  %e{i} = hal.tensor.export %z{i} : {mlir} -> !hal.buffer_view",
        ]
        outs.append(f"%e{i}")
    sig = ", ".join(["!hal.buffer_view"] * len(outs))
    head = f'util.func public @"{STATE_BUFFERS}"() -> ({sig}) attributes {{iree.abi.stub}} {{'
    return [head, *lines, f"  util.return {', '.join(outs)} : {sig}", "}"]


def _async(f) -> list[str]:
    """`name$async`: inputs and states imported after the wait fence, results joined into the signal fence."""
    e = _EntryPoint(f)
    res = e.call(*e.imports("%wait"))
    storage = caller_storage(f)
    joined, types = [], []
    for i, (v, r) in enumerate(zip(res, f.rets)):
        if storage:
            v = e.op(f"hal.tensor.alias wait(%wait) => {v} : {r.mlir} to %out{i} : !hal.buffer_view")
        joined.append(v)
        types.append((r.mlir, "" if storage else e.dims_of_tensor(v, r.mlir)))
    for v, (name, r) in zip(res[len(f.rets) :], f.state_rets):
        target = e.state_view(name) if name in f.in_place else e.next_view(name)
        joined.append(e.op(f"hal.tensor.alias wait(%wait) => {v} : {r.mlir} to {target} : !hal.buffer_view"))
        types.append((r.mlir, ""))
    if storage:
        joined = [
            e.op(f"hal.tensor.transients {v} : {t} from %transients : !hal.buffer") for v, (t, _) in zip(joined, types)
        ]
    rets = []
    if joined:
        ready = e.results(
            f"hal.tensor.barrier join({', '.join(joined)} : {', '.join(t for t, _ in types)}) => %signal : !hal.fence",
            len(joined),
        )
        if not storage:  # the results as new buffer views
            rets = [
                e.op(f"hal.tensor.export {v} : {t}{d} -> !hal.buffer_view")
                for v, (t, d) in zip(ready, types[: len(f.rets)])
            ]
    params = _views(f) + [f"%next{i}: !hal.buffer_view" for i in range(len(_copied(f)))]
    given = _values("next", _states(_copied(f)))
    if storage:
        params += [f"%out{i}: !hal.buffer_view" for i in range(len(f.rets))] + ["%transients: !hal.buffer"]
        given += [*_values("output", f.rets), "%transients: !hal.buffer"]
    params += ["%wait: !hal.fence", "%signal: !hal.fence"]
    declared = _declaration(
        "async", f"{f.name}$async", _declared_inputs(f) + given, [] if storage else _values("output", f.rets)
    )
    attrs = (
        'attributes {iree.abi.model = "coarse-fences", iree.abi.stub, '
        f'iree.reflection = {{iree.abi.declaration = "{mlir_string(declared)}"}}}} '
    )
    return e.function(f'"{f.name}$async"', params, rets, attrs)


class _EntryPoint:
    """An entry point's ops being written: SSA values %v1, %v2, ... in order."""

    def __init__(self, f):
        self.f, self.lines, self.n = f, [], 0
        self.state_index = {name: i for i, (name, _) in enumerate(f.state_args)}
        self.next_index = {name: i for i, (name, _) in enumerate(_copied(f))}

    def op(self, text: str) -> str:
        self.n += 1
        self.lines.append(f"  %v{self.n} = {text}")
        return f"%v{self.n}"

    def results(self, text: str, count: int) -> list[str]:
        """An op of `count` results: their names."""
        if count == 1:
            return [self.op(text)]
        self.n += 1
        self.lines.append(f"  %v{self.n}:{count} = {text}")
        return [f"%v{self.n}#{i}" for i in range(count)]

    def state_view(self, name: str) -> str:
        return f"%st{self.state_index[name]}"

    def next_view(self, name: str) -> str:
        """The caller's buffer for the new value of a state not written in place (`$async`)."""
        return f"%next{self.next_index[name]}"

    def dims_of_view(self, view: str, mlir: str) -> str:
        """`{%d, ...}`: the dynamic dims of a buffer view imported as `mlir` ("" if static)."""
        dims = [i for i, d in enumerate(_dims(mlir)) if d is None]
        vals = [self.op(f"hal.buffer_view.dim<{view} : !hal.buffer_view>[{i}] : index") for i in dims]
        return f"{{{', '.join(vals)}}}" if vals else ""

    def dims_of_tensor(self, value: str, mlir: str) -> str:
        """`{%d, ...}`: the dynamic dims of a tensor value ("" if static)."""
        dims = [i for i, d in enumerate(_dims(mlir)) if d is None]
        vals = [self.op(f"tensor.dim {value}, {self.op(f'arith.constant {i} : index')} : {mlir}") for i in dims]
        return f"{{{', '.join(vals)}}}" if vals else ""

    def imports(self, wait: str) -> tuple[list, list]:
        """Each input view (%in<i>) and state view (%st<i>) imported as the body takes it, after fence `wait` if
        given; a state the call may write in place (module.py, `updated_in_place`) is consumed: the module writes
        the caller's buffer. Another assigned state is copied (IREE keeps its old value for its readers)."""
        f, after = self.f, f"wait({wait}) => " if wait else ""
        ins = []
        for i, a in enumerate(f.args):
            dims = self.dims_of_view(f"%in{i}", a.mlir)
            ins.append(self.op(f"hal.tensor.import {after}%in{i} : !hal.buffer_view -> {a.mlir}{dims}"))
        states = []
        for i, (name, a) in enumerate(f.state_args):
            consume = "consume " if name in f.in_place else ""
            states.append(self.op(f"hal.tensor.import {after}{consume}%st{i} : !hal.buffer_view -> {a.mlir}"))
        return ins, states

    def call(self, inputs: list, states: list) -> list[str]:
        """Call the body; its results (outputs, then the states assigned)."""
        f = self.f
        types_in = ", ".join(a.mlir for a in [*f.args, *_states(f.state_args)])
        types_out = [r.mlir for r in [*f.rets, *_states(f.state_rets)]]
        call = f'func.call @"{f.name}$body"({", ".join(inputs + states)}) : ({types_in}) -> ({", ".join(types_out)})'
        if not types_out:
            self.lines.append(f"  {call}")
            return []
        return self.results(call, len(types_out))

    def function(self, name: str, params: list, rets: list, attrs: str) -> list[str]:
        sig = ", ".join(["!hal.buffer_view"] * len(rets))
        ret = f"  util.return {', '.join(rets)} : {sig}" if rets else "  util.return"
        return [f"util.func public @{name}({', '.join(params)}) -> ({sig}) {attrs}{{", *self.lines, ret, "}"]


def _body(f) -> list[str]:
    """`name$body`: the function with the states it takes as trailing arguments, those it assigns as trailing
    results."""
    args, rets = [*f.args, *_states(f.state_args)], [*f.rets, *_states(f.state_rets)]
    sig_in = ", ".join(f"{a.name}: {a.mlir}" for a in args)
    sig_out = ", ".join(r.mlir for r in rets)
    ret = f"  return {', '.join(r.name for r in rets)} : {sig_out}" if rets else "  return"
    return [f'func.func private @"{f.name}$body"({sig_in}) -> ({sig_out}) {{', *f.lines, ret, "}"]


def _copied(f) -> list:
    """The states `f` assigns that it does not write in place, (name, T): their new values go to other buffers
    (the synchronous form returns a new one; `$async` takes one from the caller), which become the states."""
    return [(name, r) for name, r in f.state_rets if name not in f.in_place]


def _states(pairs: list) -> list:
    return [v for _, v in pairs]


def _views(f) -> list[str]:
    return [f"%in{i}: !hal.buffer_view" for i in range(len(f.args))] + [
        f"%st{i}: !hal.buffer_view" for i in range(len(f.state_args))
    ]


def _values(prefix: str, values: list) -> list[str]:
    return [f"%{prefix}{i}: {v.mlir}" for i, v in enumerate(values)]


def _declared_inputs(f) -> list[str]:
    return [*_values("input", f.args), *_values("state", _states(f.state_args))]


def _declaration(kind: str, name: str, ins: list, outs: list) -> str:
    """As IREE's reflection `iree.abi.declaration` states a function."""
    return f"{kind} func @{name}({', '.join(ins)}) -> ({', '.join(outs)})"


def _dims(mlir: str) -> list:
    """The dims of a tensor type's text: ints, None where dynamic."""
    return [None if d == "?" else int(d) for d in mlir[len("tensor<") : -1].split("x")[:-1]]
