"""The MIOpen and cuDNN tables of the shared DNN binding (rocmc/runtime/providers/miopen.py, cudnn.py).

Each table states the header's values once; what is checked here holds without a second copy:
every declaration parses, every role and argument name the shared and vendor code call with is
declared, the shared code's roles and enums exist in both vendors' tables, enum values that must
differ do, and the perf records' offsets are those of the header structs mirrored as ctypes structs.
"""

import ast
import ctypes
from pathlib import Path

import pytest

from rocmc.externs import DNN as ABI
from rocmc.runtime.providers import cudnn, miopen
from rocmc.runtime.providers.cudnn import CUDNN
from rocmc.runtime.providers.capi import Perf, declared
from rocmc.runtime.providers.miopen import MIOPEN

PROVIDERS = Path(miopen.__file__).parent
TABLES = {"miopen": MIOPEN, "cudnn": CUDNN}
# Which tables the code of each module calls through.
MODULES = {
    "dnn.py": ("miopen", "cudnn"),
    "conv_plan.py": ("miopen", "cudnn"),
    "plans.py": ("miopen", "cudnn"),
    "recurrent.py": ("miopen", "cudnn"),
    "miopen.py": ("miopen",),
    "cudnn.py": ("cudnn",),
}
# Roles and enums of the shared code that only one vendor's path reaches, and why.
ONE_VENDOR = {
    "conv_fwd_ws": "MIOpen's search needs the workspace query first",
    "conv_bwd_data_ws": "MIOpen's search needs the workspace query first",
    "set_conv_math": "cuDNN's math type (no TF32 for f32)",
    "fma_math": "cuDNN's math type (no TF32 for f32)",
    "tensor_op_math": "cuDNN's math type (no TF32 for f32)",
    "op_tensor": "fused_conv2d's residual add as a MIOpen call (cuDNN's graph fuses it)",
    "tensor_op_add": "fused_conv2d's residual add as a MIOpen call (cuDNN's graph fuses it)",
    "rnn_params_desc": "MIOpen copies recurrent weights through the library (rnn_weights='library_copies')",
    "rnn_get_param": "MIOpen copies recurrent weights through the library",
    "rnn_get_bias": "MIOpen copies recurrent weights through the library",
    "rnn_set_param": "MIOpen copies recurrent weights through the library",
    "rnn_set_bias": "MIOpen copies recurrent weights through the library",
    "rnn_weight_params": "cuDNN hands out weight addresses (rnn_weights='address_copies')",
}


ALL_ROLES = {r for t in TABLES.values() for r in (*t.functions, *t.runtime.functions)}


def _bindings(scope) -> dict:
    """{variable: the strings assigned to it} within a scope (`kind = "filter" if f else "tensor"`)."""
    found: dict = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found.setdefault(node.targets[0].id, []).extend(_strings(node.value, {}))
    return found


def _strings(node, bound: dict) -> list:
    """The strings a role or key expression can take: 'a' if c else 'b' gives both, a variable or an
    f-string the values `bound` gives its variables."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _strings(node.body, bound) + _strings(node.orelse, bound)
    if isinstance(node, ast.Name):
        return list(bound.get(node.id, []))
    if isinstance(node, ast.JoinedStr):
        out = [""]
        for part in node.values:
            pieces = [part.value] if isinstance(part, ast.Constant) else _strings(part.value, bound)
            out = [a + b for a in out for b in pieces]
        return out
    return []


def _role_names(tree, expr_of) -> list:
    """(node, role) for every node `expr_of` gives a role expression: variables resolve in the
    innermost function assigning them; one only passed in (a parameter) takes the values it has
    anywhere in the module, kept where they name a role."""
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    anywhere = _bindings(tree)
    out = []
    for node in ast.walk(tree):
        expr = expr_of(node)
        if expr is None:
            continue
        names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
        scope, bound = parents.get(node), {}
        while scope is not None and not names <= set(bound):
            if isinstance(scope, (ast.FunctionDef, ast.Lambda)):
                bound = {**_bindings(scope), **bound}
            scope = parents.get(scope)
        lenient = not names <= set(bound)
        roles = _strings(expr, {**{k: v for k, v in anywhere.items() if k in names}, **bound})
        out += [(node, r) for r in roles if not lenient or r in ALL_ROLES]
    return out


def _runtime_receiver(node: ast.Call) -> bool:
    if node.func.attr == "_out":
        return any(k.arg == "rt" for k in node.keywords)
    return ast.unparse(node.func.value).split(".")[-1] in ("rt", "api_rt")


def _call_role(node):
    """The role expression of an `api.call(role, ...)`, `p._out(ctype, role, ...)`, `api.bound(role)`."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("call", "_out", "bound")
    ):
        args = node.args[1:] if node.func.attr == "_out" else node.args
        return args[0] if args else None
    return None


def _tree(module: str):
    return ast.parse((PROVIDERS / module).read_text())


def call_sites(module: str) -> list:
    """(line, runtime?, role, keywords or None) of every `call`, `_out` and `bound`; keywords are None
    where they can't be read (a ** splat, or `bound`'s positional arguments)."""
    out = []
    for node, role in _role_names(_tree(module), _call_role):
        names = [k.arg for k in node.keywords if k.arg != "rt"] + (["out"] if node.func.attr == "_out" else [])
        known = None if node.func.attr == "bound" or None in names else set(names)
        out.append((node.lineno, _runtime_receiver(node), role, known))
    return out


def destroy_roles(module: str) -> list:
    """Roles named in a plan's keep list, `("destroy_x", descriptor)`: _release calls them with desc=."""
    pairs = _role_names(_tree(module), lambda n: n.elts[0] if isinstance(n, ast.Tuple) and len(n.elts) == 2 else None)
    return [r for _, r in pairs if r.startswith("destroy_") or r == "be_destroy"]


def enum_keys(module: str) -> set:
    """Keys the module reads with `enums[...]` (or `e[...]`, recurrent.py's name for it)."""
    keys = set()
    for node in ast.walk(ast.parse((PROVIDERS / module).read_text())):
        if isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] in ("enums", "e"):
            keys.update(_strings(node.slice, {}))
    return keys


def _names(args: str) -> list:
    return [n for n, _ in declared(args)]


def _functions(table, runtime: bool) -> dict:
    return table.runtime.functions if runtime else table.functions


# ---- declarations ---------------------------------------------------------------------------------


@pytest.mark.parametrize("vendor", TABLES)
def test_every_declaration_parses_with_the_vendors_prefix(vendor):
    table = TABLES[vendor]
    prefixes = {"miopen": ("miopen", "hip"), "cudnn": ("cudnn", "cuda")}[vendor]
    for functions, prefix in ((table.functions, prefixes[0]), (table.runtime.functions, prefixes[1])):
        for role, (c_name, args) in functions.items():
            assert c_name.startswith(prefix), f"{vendor} {role}: {c_name} is not a {prefix} function"
            names = _names(args)
            assert len(names) == len(set(names)), f"{vendor} {role}: an argument name repeats in {args!r}"


@pytest.mark.parametrize("vendor", TABLES)
def test_every_argument_name_has_one_c_type(vendor):
    table = TABLES[vendor]
    types = {}
    for c_name, args in {**table.functions, **table.runtime.functions}.values():
        for a, t in declared(args):
            assert types.setdefault(a, t) is t, f"{c_name}: {a!r} declared with two C types"
    # the scalars _release, the search and the planners pass by name and size
    assert types.get("ws_size", ctypes.c_size_t) is ctypes.c_size_t
    for a in ("act_alpha", "act_beta", "act_gamma", "lrn_alpha", "lrn_beta", "lrn_k", "eps", "coef"):
        assert types.get(a, ctypes.c_double) is ctypes.c_double


def test_a_bad_declaration_is_refused():
    with pytest.raises(ValueError, match="unknown C type"):
        declared("h n:long")


# ---- the code's calls against the tables ----------------------------------------------------------


@pytest.mark.parametrize("module", MODULES)
def test_called_roles_are_declared_with_the_arguments_passed(module):
    """Api.call passes each declared argument by name: a declared name the call lacks is a KeyError
    at run time, a name no table declares for any role the call may name is a typo. Shared code may
    pass a name only one vendor takes (cuDNN's `nan`, MIOpen's `exhaustive`)."""
    sites = call_sites(module)
    assert len(sites) > 5
    unused: dict = {}
    for line, runtime, role, passed in sites:
        tables = [TABLES[v] for v in MODULES[module] if role in _functions(TABLES[v], runtime)]
        assert tables, f"{module}:{line}: role {role!r} is in no table"
        if passed is None:
            continue
        for t in tables:
            names = set(_names(_functions(t, runtime)[role][1]))
            assert names <= passed, f"{module}:{line}: {t.name}'s {role} also needs {sorted(names - passed)}"
            unused[line] = unused.get(line, passed) - names
    assert not {line: names for line, names in unused.items() if names}, "passed names no table declares"


@pytest.mark.parametrize("module", MODULES)
def test_destroy_roles_take_one_descriptor(module):
    for role in destroy_roles(module):
        tables = [TABLES[v] for v in MODULES[module] if role in TABLES[v].functions]
        assert tables, f"{module}: {role!r} is in no table"
        assert all(_names(t.functions[role][1]) == ["desc"] for t in tables), role


def test_the_shared_codes_roles_and_enums_are_in_both_tables():
    """What dnn.py and recurrent.py call on every vendor is in both tables; ONE_VENDOR lists the
    exceptions, each in exactly one table."""
    roles = {r for m in ("dnn.py", "conv_plan.py", "recurrent.py") for _, rt, r, _ in call_sites(m) if not rt}
    keys = enum_keys("dnn.py") | enum_keys("conv_plan.py") | enum_keys("recurrent.py")
    for name in sorted(roles | keys):
        where = [v for v, t in TABLES.items() if name in (t.functions if name in roles else t.enums)]
        if name in ONE_VENDOR:
            assert len(where) == 1, f"{name}: listed as one vendor's ({ONE_VENDOR[name]}) but in {where}"
        else:
            assert where == list(TABLES), f"{name}: the shared code needs it, only {where} have it"
    runtime_roles = {r for m in MODULES for _, rt, r, _ in call_sites(m) if rt}
    assert runtime_roles - {
        "capture_begin",
        "graph_instantiate",
        "graph_destroy",
        "graph_launch",
        "graph_exec_destroy",
    } <= set(MIOPEN.runtime.functions) & set(CUDNN.runtime.functions)
    assert not set(ONE_VENDOR) - roles - keys, "ONE_VENDOR names something the shared code no longer uses"


@pytest.mark.parametrize("vendor", TABLES)
def test_vendor_enums_the_vendor_code_reads_exist(vendor):
    module = {"miopen": "miopen.py", "cudnn": "cudnn.py"}[vendor]
    assert enum_keys(module) <= set(TABLES[vendor].enums)


def test_graph_launch_has_its_runtime_roles():
    for table in TABLES.values():
        capture = {
            "capture_begin",
            "capture_end",
            "graph_instantiate",
            "graph_launch",
            "graph_exec_destroy",
            "graph_destroy",
        }
        assert not table.graph_launch or capture <= set(table.runtime.functions), table.name


# ---- enum values ----------------------------------------------------------------------------------


def _distinct(what: str, values: dict):
    seen = {}
    for k, v in values.items():
        assert v not in seen, f"{what}: {k} and {seen[v]} are both {v}"
        seen[v] = k


# Keys of the same C enum: a shared code path picks one of them, so their values must differ.
SAME_ENUM = [
    ("pool_max", "pool_avg_include", "pool_avg_exclude"),
    ("softmax_accurate", "softmax_log"),
    ("rnn_lstm", "rnn_gru"),
    ("rnn_no_bias", "rnn_bias"),
    ("rnn_training", "rnn_inference"),
    ("problem_forward", "problem_backward_data"),
    ("fma_math", "tensor_op_math"),
]


@pytest.mark.parametrize("vendor", TABLES)
def test_enum_values_that_must_differ_do(vendor):
    t = TABLES[vendor]
    for group in SAME_ENUM:
        present = {k: t.enums[k] for k in group if k in t.enums}
        assert len(present) in (0, len(group)), f"{t.name}: {group} only partly given"
        _distinct(f"{t.name} {group}", present)
    _distinct(f"{t.name} dtypes", t.dtypes)
    _distinct(f"{t.name} activation modes", {op: mode for op, (mode, _) in t.activations.items()})
    _distinct(f"{t.name} convolution tensor ids", t.conv_ids)
    assert set(t.dtypes) == set(ABI.dtypes)
    assert set(t.activations) <= set(ABI.signatures)
    assert sorted(t.gate_order) == ["gru", "lstm"]


def test_backend_and_attention_enums_are_distinct():
    _distinct("MIOpen MHA tensor ids", miopen.MHA_TENSORS)
    _distinct("cudnnBackendDescriptorType_t", cudnn.DESCRIPTORS)
    _distinct("cudnnBackendAttributeType_t", {k: code for k, (code, _) in cudnn.ATTR_TYPES.items()})
    _distinct("cudnnBackendAttributeName_t", {k: e for k, (e, _) in cudnn.ATTRS.items()})
    _distinct("cudnnBackendHeurMode_t", cudnn.HEUR_MODES)
    _distinct("cudnnBackendNumericalNote_t", cudnn.NUMERICAL_NOTES)
    _distinct("cudnnPointwiseMode_t", {"add": cudnn.POINTWISE_ADD, "relu": cudnn.POINTWISE_RELU_FWD})
    assert all(t in cudnn.ATTR_TYPES for _, t in cudnn.ATTRS.values())
    _distinct("cuDNN graph uids", {**CUDNN.conv_ids, **{f"virtual{i}": u for i, u in enumerate(cudnn.VIRTUAL_UIDS)}})


# ---- record layouts -------------------------------------------------------------------------------


def test_perf_records_follow_the_header_structs():
    """miopenConvAlgoPerf_t (miopen.h) and cudnnConvolutionFwdAlgoPerf_t (cudnn_cnn.h) as ctypes
    lays them out; the table's offsets are what the search reads."""

    class MiopenAlgo(ctypes.Union):
        _fields_ = [("fwd_algo", ctypes.c_int), ("bwd_weights_algo", ctypes.c_int), ("bwd_data_algo", ctypes.c_int)]

    class MiopenPerf(ctypes.Structure):
        _fields_ = [("algo", MiopenAlgo), ("time", ctypes.c_float), ("memory", ctypes.c_size_t)]

    class CudnnPerf(ctypes.Structure):
        _fields_ = [
            ("algo", ctypes.c_int),
            ("status", ctypes.c_int),
            ("time", ctypes.c_float),
            ("memory", ctypes.c_size_t),
            ("determinism", ctypes.c_int),
            ("mathType", ctypes.c_int),
            ("reserved", ctypes.c_int * 3),
        ]

    assert MIOPEN.perf == Perf(
        ctypes.sizeof(MiopenPerf), MiopenPerf.algo.offset, MiopenPerf.time.offset, MiopenPerf.memory.offset
    )
    assert CUDNN.perf == Perf(
        ctypes.sizeof(CudnnPerf),
        CudnnPerf.algo.offset,
        CudnnPerf.time.offset,
        CudnnPerf.memory.offset,
        CudnnPerf.status.offset,
    )


def test_rnn_weight_slots_repack_gates():
    """MIOpen's LSTM param ids are i, f, o, g: id 2 (output gate) reads torch's block 3 of w_ih and id
    4 + 3 (new memory, recurrent) torch's block 2 of w_hh; in torch's own order every block stays."""
    from rocmc.runtime.providers.recurrent import slots

    inp, hidden, item = 5, 7, 4
    mi = {(s.lib_id, s.operand): s for s in slots("lstm", "ifog", inp, hidden, item, True)}
    assert mi[(2, 1)].offset == 3 * hidden * inp * item and mi[(2, 1)].nbytes == hidden * inp * item
    assert mi[(7, 2)].offset == 2 * hidden * hidden * item
    assert mi[(7, 4)].offset == 2 * hidden * item and mi[(7, 4)].bias
    gru = {(s.lib_id, s.operand): s for s in slots("gru", "zrn", inp, hidden, item, False)}
    assert gru[(0, 1)].offset == 1 * hidden * inp * item and len(gru) == 6  # z is torch's block 1
    cu = slots("lstm", "ifgo", inp, hidden, item, False)
    assert [s.offset for s in cu if s.operand == 1] == [k * hidden * inp * item for k in range(4)]
