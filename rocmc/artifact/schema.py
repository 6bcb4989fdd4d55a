"""rocmc's metadata in a module: what it must hold (the schema), and how it is read from .vmfb bytes
and checked, against the schema and against the module's own function signatures.

The metadata is a JSON string in the entry function's `iree.reflection` dictionary (`rocmc.meta`).
Read from a file it is untrusted input: every key the runtime relies on is checked for presence and
type, and every signature it states is compared with the one IREE declares for the function.
"""

from __future__ import annotations

import json
import re

from ..aliases import ALIASES, CURRENT_NAMES_FORMAT, current
from ..archs import known_targets
from ..errors import ArtifactError
from ..dtypes import ALL as DTYPES
from .integrity import check_header

# Version of the metadata rocmc writes. 1 (no "format" key): every extern call is the DNN library's,
# imported as `miopen.<op>`, and its entry names no library; 2: each extern entry names its library
# (`miopen`, `hipblaslt`); 3: the libraries are roles, imported as `dnn.<op>` and `blas.<op>`, and the
# implementations are named `dnn`, `blas`, `kernel` (before: `miopen`, `hipblaslt`, `hip`; rocmc.aliases).
FORMAT = 3


def read_metadata(data: bytes, what: str = "artifact") -> dict:
    """rocmc's metadata from .vmfb bytes, checked against its schema and against the module's own
    function signatures; ArtifactError if the file is not a valid rocmc module."""
    check_header(data, what)
    from iree import runtime as rt

    try:
        inst = rt.VmInstance()
        mod = rt.VmModule.copy_buffer(inst, data)
        # The metadata is on the module's first function: `main`, or the first of a program.
        fns = [f for f in (mod.lookup_function(n) for n in mod.function_names) if f is not None]
    except Exception as e:  # noqa: BLE001
        raise ArtifactError(f"{what}: corrupt or truncated .vmfb ({e})") from None
    fn = next((f for f in fns if "rocmc.meta" in f.reflection), None)
    if fn is None and not any(f.name == "main" for f in fns):
        raise ArtifactError(f"{what}: the module has no 'main' function; not built by rocmc")
    meta = None if fn is None else fn.reflection.get("rocmc.meta")
    if meta is None:
        raise ArtifactError(f"{what}: no rocmc metadata in the module; was it built by rocmc?")
    try:
        meta = json.loads(meta)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ArtifactError(f"{what}: unreadable rocmc metadata ({e})") from None
    check_metadata(meta, what)
    check_signatures(mod, meta, what)
    return current_names(meta)


def current_names(meta: dict) -> dict:
    """The metadata of a module of format 2 or earlier with its implementation and library names read
    as the current ones (`miopen` -> `dnn`, `hipblaslt` -> `blas`, `hip` -> `kernel`). The extern
    entries keep the import each names, the module's own (`miopen.conv2d`), and `format` stays, so the
    runtime serves those namespaces (runtime/providers). A module of format 3 is returned as it is."""
    if meta.get("format", 1) >= CURRENT_NAMES_FORMAT:
        return meta

    def choice(c: dict) -> dict:
        skipped = [_current_prefix(r) for r in c.get("skipped", [])] if isinstance(c.get("skipped"), list) else None
        return {**c, "impl": current(c["impl"]), **({"skipped": skipped} if skipped is not None else {})}

    def extern(x: dict) -> dict:
        return {**x, "impl": current(x["impl"]), **({"library": current(x["library"])} if "library" in x else {})}

    out = {
        **meta,
        "implementations": [choice(c) for c in meta["implementations"]],
        "externs": [extern(x) for x in meta["externs"]],
    }
    if "functions" in meta:
        out["functions"] = [
            {**f, "implementations": [choice(c) for c in f["implementations"]]} for f in meta["functions"]
        ]
    return out


def _current_prefix(reason):
    """A recorded skip reason `hip: ...` as `kernel: ...`."""
    if not isinstance(reason, str):
        return reason
    name, sep, rest = reason.partition(": ")
    return f"{ALIASES[name]}{sep}{rest}" if sep and name in ALIASES else reason


def functions(meta: dict) -> list[dict]:
    """Each function of the module as {name, signature, constraints, implementations, long_form?,
    asynchronous?}: the first as the top level of the metadata describes it, then those of `functions`."""
    first = {
        "name": meta.get("function", "main"),
        "signature": meta["signature"],
        "constraints": meta.get("constraints", []),
        "implementations": meta["implementations"],
    }
    for key in ("long_form", "asynchronous", "async_storage", "held_states", "assigned_states", "states_in_place"):
        if key in meta:
            first[key] = meta[key]
    return [first, *meta.get("functions", [])]


# ---- the schema ------------------------------------------------------------------------------

_DIM = (int, str)  # a static size, or a symbol or size expression
_TENSOR = {"name": str, "dtype": frozenset(DTYPES), "shape": [_DIM]}
# Keys ending in "?" are optional. Unknown keys are allowed (read by newer versions only).
METADATA_SCHEMA = {
    "rocmc": str,
    "iree": str,
    "graph": str,
    "graph_hash": str,
    "target": frozenset(known_targets()),
    "signature": {"inputs": [_TENSOR], "outputs": [_TENSOR]},
    "implementations": [{"node": str, "op": str, "impl": str}],
    "kernels": [{"node": str, "op": str, "symbol": str, "arch": str}],
    "format?": int,  # FORMAT; absent in modules of format 1
    "externs": [{"node": str, "op": str, "import": str, "impl": str, "dtype": str, "attrs?": dict, "library?": str}],
    "graph_text?": str,
    "compile_flags?": [str],
    "compile_note?": str,
    "long_form?": {"function": str, "scores": [[_DIM]], "limit": int},
    "asynchronous?": str,  # the function's stream-ordered form (IREE's coarse-fences ABI)
    "async_storage?": frozenset(("caller",)),  # that form takes its results' buffers and transient storage
    # The states the function takes from its caller, and those it writes back (held states: lowering/module.py)
    "held_states?": [str],
    "assigned_states?": [str],
    "states_in_place?": [str],  # those of them written into the caller's buffer (the others: into a new one)
    # A program of several functions: the first is described above (named `function`, default "main").
    "function?": str,
    "functions?": [
        {
            "name": str,
            "signature": {"inputs": [_TENSOR], "outputs": [_TENSOR]},
            "constraints": list,
            "implementations": [{"node": str, "op": str, "impl": str}],
            "long_form?": {"function": str, "scores": [[_DIM]], "limit": int},
            "asynchronous?": str,
            "async_storage?": frozenset(("caller",)),
            "held_states?": [str],
            "assigned_states?": [str],
            "states_in_place?": [str],
        }
    ],
    "parameters?": [
        {"name": str, "shape": [int], "dtype": frozenset(DTYPES), "from": frozenset(("graph", "constant"))}
    ],
    "states?": [{"name": str, "shape": [int], "dtype": frozenset(DTYPES)}],
    "info?": dict,
    # rocmc.rewrite ran (compile(rewrite=True)): what it replaced, and the graph compiled if it changed.
    "rewrites?": [{"function": str, "pattern": str, "op": str, "node": str, "replaced": [[str]]}],
    "rewritten_text?": str,
}
_KIND = {str: "a string", int: "a non-negative integer", dict: "an object", _DIM: "a size or a symbol"}


def check_metadata(meta, what: str = "artifact") -> None:
    """ArtifactError naming the first key of rocmc's metadata that is missing or malformed."""
    _check(meta, METADATA_SCHEMA, "", what)


def _check(value, spec, key: str, what: str) -> None:
    def bad(expected: str):
        raise ArtifactError(f"{what}: rocmc metadata key {key or 'root'!r} is {_short(value)}, expected {expected}")

    if isinstance(spec, dict):
        if not isinstance(value, dict):
            bad("an object")
        for name, sub in spec.items():
            optional, name = name.endswith("?"), name.rstrip("?")
            child = f"{key}.{name}" if key else name
            if name in value:
                _check(value[name], sub, child, what)
            elif not optional:
                raise ArtifactError(
                    f"{what}: rocmc metadata lacks the key {child!r}; the file was edited or "
                    f"made by another rocmc: recompile it"
                )
    elif isinstance(spec, list):
        if not isinstance(value, list):
            bad("a list")
        for i, item in enumerate(value):
            _check(item, spec[0], f"{key}[{i}]", what)
    elif isinstance(spec, frozenset):
        if not isinstance(value, str) or value not in spec:
            bad(f"one of {', '.join(sorted(spec))}")
    else:
        types = spec if isinstance(spec, tuple) else (spec,)
        ok = isinstance(value, types) and not isinstance(value, bool)
        if not ok or (isinstance(value, int) and value < 0) or value == "":
            bad(_KIND[spec])


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- the metadata against the module ---------------------------------------------------------

_DECLARATION = re.compile(r"(?:sync |async )?func @([\w$.-]+)\((.*)\) -> \((.*)\)")
_ABI_VALUE = re.compile(r"%[\w$.-]+: (tensor<[^>]*>|[^,]+)")
_CCONV = re.compile(r"<VmFunction [\w$.-]+\(0(\w*)_(\w*)\)")


def check_signatures(module, meta: dict, what: str = "artifact") -> None:
    """ArtifactError unless the metadata's signature is the one of each function it names (main, and
    the long form): counts, element types, ranks and static sizes, as IREE's reflection and the
    functions' calling conventions state them. Symbolic sizes show as `?` there; the module itself
    checks the equalities between them when called."""
    states = {s["name"]: s for s in meta.get("states", [])}
    for f in functions(meta):
        _check_function(module, f, what, states)


def _check_function(module, f: dict, what: str, states: dict) -> None:
    sig = f["signature"]
    # Held states (the caller's buffers) follow the inputs; those assigned follow the synchronous form's outputs.
    held = [states[n] for n in f.get("held_states", []) if n in states]
    assigned = [states[n] for n in f.get("assigned_states", []) if n in states]
    if len(held) != len(f.get("held_states", [])) or len(assigned) != len(f.get("assigned_states", [])):
        raise ArtifactError(f"{what}: function {f['name']!r} names states the metadata does not declare")
    inputs, outputs = sig["inputs"] + held, sig["outputs"] + assigned
    want = ([_abi_type(x) for x in inputs], [_abi_type(x) for x in outputs])
    names = [f["name"]] + ([f["long_form"]["function"]] if "long_form" in f else [])
    if "asynchronous" in f:
        if f["asynchronous"] != f"{f['name']}$async":
            raise ArtifactError(
                f"{what}: the metadata names {f['asynchronous']!r} as the stream-ordered form of "
                f"{f['name']!r}, expected {f['name'] + '$async'!r}"
            )
        names.append(f["asynchronous"])
    for name in names:
        fn = module.lookup_function(name)
        if fn is None:
            raise ArtifactError(f"{what}: the metadata names function {name!r}, which the module lacks")
        fenced = name.endswith("$async")
        got = _declared(fn, name, what, fences=fenced)
        w_in, w_out, s_in, s_out = want[0], want[1], inputs, outputs
        if fenced and held:  # the stream-ordered form returns no state: it takes buffers for those not in place
            w_out, s_out = w_out[: len(sig["outputs"])], s_out[: len(sig["outputs"])]
            moved = [st for st in assigned if st["name"] not in f.get("states_in_place", [])]
            w_in, s_in = w_in + [_abi_type(st) for st in moved], s_in + moved
        if fenced and f.get("async_storage") == "caller":  # it takes its results' buffers, then transient storage
            w_in, s_in = w_in + w_out + ["!hal.buffer"], s_in + s_out + [{"name": "transients"}]
            w_out, s_out = [], []
        for kind, specs, w, g in (
            ("input", s_in, w_in, got[0]),
            ("output", s_out, w_out, got[1]),
        ):
            if len(w) != len(g):
                raise ArtifactError(
                    f"{what}: the metadata lists {len(w)} {kind}(s) but function {name!r} has "
                    f"{len(g)}; the metadata does not describe this module"
                )
            for spec, a, b in zip(specs, w, g):
                if a != b:
                    raise ArtifactError(
                        f"{what}: the metadata says {kind} {spec['name']!r} is {a} but function "
                        f"{name!r} has {b}; the metadata does not describe this module"
                    )


def _abi_type(spec: dict) -> str:
    """The type IREE's reflection prints for a signature entry."""
    d = DTYPES[spec["dtype"]]
    shape = d.abi_shape(spec["shape"]) if d.packed else spec["shape"]
    dims = "".join(f"{n if isinstance(n, int) else '?'}x" for n in shape)
    return f"tensor<{dims}{d.abi_mlir}>"


def _declared(fn, name: str, what: str, fences: bool = False) -> tuple[list, list]:
    """(input types, output types) of a function as IREE declares it, checked against the number of
    values its calling convention passes (with `fences`, a stream-ordered function: two more inputs, the
    fences it waits on and signals)."""
    declaration = fn.reflection.get("iree.abi.declaration", "")
    m = _DECLARATION.fullmatch(declaration)
    cc = _CCONV.match(repr(fn))
    if m is None or m.group(1) != name or cc is None or declaration.startswith("async ") != fences:
        raise ArtifactError(f"{what}: function {name!r} has no readable ABI declaration; not built by rocmc")
    ins, outs = (_ABI_VALUE.findall(m.group(i)) for i in (2, 3))
    if cc.group(1).strip("v") != "r" * (len(ins) + 2 * fences) or cc.group(2).strip("v") != "r" * len(outs):
        raise ArtifactError(
            f"{what}: function {name!r} passes ({cc.group(1)}) -> ({cc.group(2)}) but declares "
            f"{len(ins)} input(s) and {len(outs)} output(s); the module is inconsistent"
        )
    return [t.strip() for t in ins], [t.strip() for t in outs]
