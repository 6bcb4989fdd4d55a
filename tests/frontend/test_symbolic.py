"""Symbolic sizes: parsed (never `eval`ed), checked at call time by the runtime, `evaluate` and the
compiled module itself."""

import copy
import math
import re
import time
from pathlib import Path

import numpy as np
import pytest

import rocmc
from rocmc import ops, symbolic
from rocmc.runtime.module import _long_form
from rocmc.symbolic import parse

from helpers import GPU_TARGETS, rand


def _reshape_graph():
    g = rocmc.Graph("r")
    g.output(ops.reshape(g.input("x", ("n", 3), "f32"), (5, -1)))
    return g


@pytest.fixture(scope="module")
def reshape_art():
    return rocmc.compile(_reshape_graph(), "cpu")


def _producer_dims() -> list:
    """Every symbolic size the graph builders spell, from the builders themselves."""
    g = rocmc.Graph("dims")
    x = g.input("x", ("n", 3), "f32")
    im = g.input("im", ("b", 2, "h", "w"), "f32")
    seq = g.input("seq", (1, 2, "t"), "f32")
    outs = [
        ops.reshape(x, (5, -1)),
        ops.reshape(x, ("n", 3, 1)),
        ops.pad(x, ((2, 2), (0, 0))),
        ops.concat([x, x, ops.pad(x, ((1, 0), (0, 0)))], axis=0),
        ops.slice(x, [2], [2**31 - 1], [0]),
        ops.slice(x, [-3], [2**31 - 1], [0], [2]),
        ops.conv2d(im, np.ones((4, 2, 3, 3), np.float32), stride=2, padding=1),
        ops.conv1d(seq, np.ones((2, 2, 3), np.float32), dilation=2),
        ops.max_pool2d(im, 3, stride=2, padding=1, ceil_mode=True),
        ops.avg_pool2d(im, 2),
        ops.conv_transpose1d(seq, np.ones((2, 2, 3), np.float32), stride=2, padding=1, output_padding=1),
    ]
    dims = {d for v in outs for d in v.shape if isinstance(d, str)}
    assert {d.split("(")[0] for d in dims if "(" in d} >= {"", "conv", "pool", "conv_transpose", "slice"}
    return sorted(dims)


@pytest.mark.parametrize(
    "text",
    _producer_dims() + ["((m*n)/(m*2))", "((n+4)*m*2)", "(n--3)", "(n//2)", "min(a,(b+1))", "pool(h,3,2,1,1,1,ceil)"],
)
def test_every_spelling_parses_and_prints_back(text):
    assert str(parse(text)) == text


def _windows(n, k, s, lo, hi, d, ceil=False):
    """torch's output size of a conv or pool window: a ceil-mode window starting past the input and
    the low padding is dropped."""
    span = (n + lo + hi - d * (k - 1) - 1) / s
    out = (math.ceil(span) if ceil else math.floor(span)) + 1
    return out - 1 if ceil and (out - 1) * s >= n + lo else out


@pytest.mark.parametrize(
    "text,static",
    [
        ("conv(n,3,2,1,0,2)", lambda n: _windows(n, 3, 2, 1, 0, 2)),
        ("pool(n,3,2,1,1,1)", lambda n: _windows(n, 3, 2, 1, 1, 1)),
        ("pool(n,3,2,1,1,1,ceil)", lambda n: _windows(n, 3, 2, 1, 1, 1, ceil=True)),
        ("pool(n,2,3,0,0,1,ceil)", lambda n: _windows(n, 2, 3, 0, 0, 1, ceil=True)),
        ("conv_transpose(n,3,2,1,0,1,1)", lambda n: (n - 1) * 2 - 1 - 0 + 1 * (3 - 1) + 1 + 1),
        ("slice(n,-3,2147483647,1)", lambda n: len(range(n)[-3:])),
        ("slice(n,1,-1,2)", lambda n: len(range(n)[1:-1:2])),
        ("slice(n,-1,-2147483647,-2)", lambda n: len(range(n)[-1::-2])),
    ],
)
def test_functions_compute_the_static_rule(text, static):
    for n in range(1, 12):
        assert parse(text).evaluate({"n": n}) == static(n), n


@pytest.mark.parametrize(
    "name,args,flags",
    [
        ("conv", (3, 2, 1, 0, 2), {}),
        ("pool", (3, 2, 1, 1, 1), {"ceil": True}),
        ("pool", (2, 3, 0, 0, 1), {"ceil": False}),
        ("conv_transpose", (3, 2, 1, 0, 1, 1), {}),
    ],
)
def test_call_dim_spells_what_parse_evaluates(name, args, flags):
    spelled = symbolic.call_dim(name, "n", *args, **flags)
    assert spelled == f"{name}(n,{','.join(map(str, args))}{',ceil' if flags.get('ceil') else ''})"
    for n in range(1, 12):
        assert parse(spelled).evaluate({"n": n}) == symbolic.call_dim(name, n, *args, **flags), n


@pytest.mark.parametrize(
    "junk",
    [
        "9**9**9**9",
        "__import__('os').system('true')",
        "n+",
        "(n",
        "n)",
        "1e9",
        "n;1",
        "9" * 30,
        "(" * 500 + "n" + ")" * 500,
        "n+" * 6000 + "n",
        "conv(h,3)",
        "slice(n,m,1,1)",
        "open(1)",
        "",
        "n n",
        "pool(h,3,2,1,1,1,floor)",
    ],
)
def test_junk_is_rejected_quickly(junk):
    start = time.perf_counter()
    with pytest.raises(rocmc.ArtifactError, match="size expression"):
        parse(junk, rocmc.ArtifactError)
    assert time.perf_counter() - start < 0.5


def test_exact_division_that_does_not_divide_is_an_error():
    assert parse("((n*3)/5)").evaluate({"n": 5}) == 3
    with pytest.raises(rocmc.InputError, match=r"\(\(n\*3\)/5\) at n=4: 12 is not divisible by 5"):
        parse("((n*3)/5)").evaluate({"n": 4})


def test_no_eval_in_rocmc():
    sources = Path(rocmc.__file__).parent.rglob("*.py")
    assert not [p.name for p in sources if re.search(r"\beval\s*\(", p.read_text())]


def test_long_form_terms_are_parsed_at_load():
    long = _long_form({"function": "main_long", "scores": [[1, 4, "s", "(s*8)"]], "limit": 1000})
    assert [d.evaluate({"s": 3}) for d in long["scores"][0]] == [1, 4, 3, 24]
    with pytest.raises(rocmc.ArtifactError, match="size expression"):
        _long_form({"function": "main_long", "scores": [[1, "9**9**9**9"]], "limit": 1000})


def test_metadata_constraint_junk_is_an_artifact_error():
    with pytest.raises(rocmc.ArtifactError, match="size expression"):
        symbolic.Constraint.from_json(
            {"node": "reshape(%0)", "kind": "divisible", "lhs": "__import__('os')", "rhs": "5"}, rocmc.ArtifactError
        )


# ---- call-time checks ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 4, 7])
def test_reshape_that_does_not_divide_is_an_input_error(reshape_art, n):
    x = np.arange(3 * n, dtype=np.float32).reshape(n, 3)
    want = rf"reshape\(%0\): n\*3 = {3 * n} is not divisible by 5 with input 'x' dim 0 \('n'\) = {n}$"
    with pytest.raises(rocmc.InputError, match=want):
        rocmc.load(reshape_art)(x)
    with pytest.raises(rocmc.InputError, match=want):
        rocmc.evaluate(_reshape_graph(), x)


@pytest.mark.parametrize("n", [5, 10])
def test_reshape_that_divides_matches_evaluate(reshape_art, n, rng):
    x = rand(rng, (n, 3))
    got = rocmc.load(reshape_art)(x)
    assert got.shape == (5, 3 * n // 5)
    np.testing.assert_array_equal(got, rocmc.evaluate(_reshape_graph(), x))


def test_metadata_records_the_constraint(reshape_art):
    assert reshape_art.metadata["constraints"] == [
        {"node": "reshape(%0)", "kind": "divisible", "lhs": "(n*3)", "rhs": "5"}
    ]


def test_negative_derived_size_is_an_input_error():
    g = rocmc.Graph("s")
    g.output(ops.slice(g.input("x", ("n", 2), "f32"), [3], [2**31 - 1], [0]))
    x = np.ones((2, 2), np.float32)
    for run in (rocmc.load(rocmc.compile(g, "cpu")), lambda a: rocmc.evaluate(g, a)):
        with pytest.raises(
            rocmc.InputError, match=r"slice\(%0\): needs n-3 >= 0, but n-3 = -1 with input 'x' dim 0 \('n'\) = 2$"
        ):
            run(x)


def test_conv_window_larger_than_the_input_is_an_input_error():
    g = rocmc.Graph("c")
    g.output(ops.conv1d(g.input("x", (1, 1, "t"), "f32"), np.ones((1, 1, 3), np.float32)))
    x = np.ones((1, 1, 2), np.float32)
    for run in (rocmc.load(rocmc.compile(g, "cpu")), lambda a: rocmc.evaluate(g, a)):
        with pytest.raises(
            rocmc.InputError,
            match=r"needs conv\(t,3,1,0,0,1\) >= 1, but conv\(t,3,1,0,0,1\) = 0 "
            r"with input 'x' dim 2 \('t'\) = 2$",
        ):
            run(x)


# ---- the module's own checks -----------------------------------------------------------------


def _call_directly(art, *inputs):
    """Call @main through IREE's API: no rocmc checks before the module's own."""
    from iree import runtime as rt

    ctx = rt.SystemContext(config=rt.Config("local-task"))
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, art.vmfb))
    return ctx.modules.module["main"](*inputs)


def test_module_asserts_divisibility_itself(reshape_art):
    np.testing.assert_array_equal(_call_directly(reshape_art, np.ones((5, 3), np.float32)).to_host(), 1.0)
    with pytest.raises(RuntimeError, match=r"rocmc check: reshape\(%0\): n\*3 divisible by 5"):
        _call_directly(reshape_art, np.ones((4, 3), np.float32))


def test_metadata_renaming_a_symbol_cannot_make_the_module_read_out_of_bounds():
    g = rocmc.Graph("k")
    x, y = g.input("x", ("K", 3), "f32"), g.input("y", ("K", 3), "f32")
    g.output(x + y)
    art = rocmc.compile(g, "cpu")
    meta = copy.deepcopy(art.metadata)
    meta["signature"]["inputs"][1]["shape"][0] = "J"
    module = rocmc.load(rocmc.Artifact(art.vmfb, meta))
    with pytest.raises(
        rocmc.InputError,
        match=r"module rejected the call: dim 0 of input 'y' equals dim 0 of "
        r"input 'x' \(K\)",
    ):
        module(np.ones((5, 3), np.float32), np.ones((2, 3), np.float32))


@pytest.mark.parametrize("target", GPU_TARGETS)
def test_module_with_checks_compiles_for_gpus(target):
    art = rocmc.compile(_reshape_graph(), target)
    assert "rocmc check: reshape(%0): n*3 divisible by 5" in art.ir("input")


def test_every_entry_function_checks_its_inputs():
    g = rocmc.Graph("sdpa")
    q, k, v = (g.input(n, (1, h, "s", 32), "f16") for n, h in (("q", 4), ("k", 2), ("v", 2)))
    g.output(ops.sdpa(q, k, v))
    art = rocmc.compile(g, "cuda:sm_80")
    bodies = re.split(r"^func\.func @(\w+)", art.ir("input"), flags=re.M)
    checks = {bodies[i]: bodies[i + 1].count("cf.assert") for i in range(1, len(bodies), 2)}
    assert "long_form" in art.metadata and checks == {"main": 2, "main_long": 2}


# ---- calling conventions ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def output_graph():
    g = rocmc.Graph("o")
    g.output(g.input("output", (2,), "f32") * 2.0)
    return g


def test_input_named_output_is_passed_by_keyword(output_graph, rng):
    x = rand(rng, (2,))
    module = rocmc.load(rocmc.compile(output_graph, "cpu"))
    np.testing.assert_array_equal(module(output=x), 2 * x)
    np.testing.assert_array_equal(module(x, output="device").to_host(), 2 * x)
    np.testing.assert_array_equal(rocmc.evaluate(output_graph, output=x), 2.0 * x)


def test_call_after_close_is_a_device_error(output_graph):
    module = rocmc.load(rocmc.compile(output_graph, "cpu"))
    module.close()
    with pytest.raises(rocmc.DeviceError, match="module was closed"):
        module(np.ones(2, np.float32))


@pytest.fixture(scope="module")
def two_inputs():
    g = rocmc.Graph("two")
    a, b = g.input("a", ("n", 4), "f32"), g.input("b", ("n", 4), "f32")
    g.output(a + b)
    return g, rocmc.load(rocmc.compile(g, "cpu"))


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((np.ones((2, 5), np.float32), np.ones((2, 5), np.float32)), {}),
        ((np.ones((2, 4, 1), np.float32), np.ones((2, 4), np.float32)), {}),
        ((np.ones((2, 4), np.float32), np.ones((3, 4), np.float32)), {}),
        ((np.ones((2, 4), np.float32),), {}),
        ((np.ones((2, 4), np.float32),), {"c": np.ones((2, 4), np.float32)}),
        ((np.ones((2, 4), np.float32),) * 3, {}),
    ],
)
def test_evaluate_rejects_inputs_as_the_module_does(two_inputs, args, kwargs):
    g, module = two_inputs
    with pytest.raises(rocmc.InputError) as by_module:
        module(*args, **kwargs)
    with pytest.raises(rocmc.InputError) as by_evaluate:
        rocmc.evaluate(g, *args, **kwargs)
    assert str(by_evaluate.value) == str(by_module.value)


def test_evaluate_rejects_a_dtype_of_another_kind(two_inputs):
    g, _ = two_inputs
    with pytest.raises(rocmc.InputError, match="input 'a': dtype int32 but the graph expects f32"):
        rocmc.evaluate(g, np.ones((2, 4), np.int32), np.ones((2, 4), np.float32))


# ---- arithmetic on dims (what the ONNX importer computes shapes with) -------------------------


@pytest.mark.parametrize(
    "expr, canonical",
    [
        ("((seq+1)-1)", "seq"),
        ("(2*n)", "(n*2)"),
        ("(4+0)", 4),
        ("(b*seq*4)", "(b*seq*4)"),
        ("(seq*4*b)", "(b*seq*4)"),
        ("((s+1)//2)", "((s+1)//2)"),
        ("((2*s+4)//2)", "(s+2)"),
        ("(0-s)", "(-s)"),
    ],
)
def test_canonical_dims(expr, canonical):
    assert symbolic.canonical(expr) == canonical
    assert symbolic.canonical(canonical) == canonical


def test_dim_arithmetic_evaluates_as_integers(rng):
    """Every canonical result evaluates to the integer arithmetic of the sizes it was built from."""
    ops_ = [
        ("add", lambda a, b: a + b),
        ("sub", lambda a, b: a - b),
        ("mul", lambda a, b: a * b),
        ("floordiv", lambda a, b: a // b),
        ("mod", lambda a, b: a % b),
    ]
    for _ in range(40):
        sizes = {"s": int(rng.integers(1, 50)), "b": int(rng.integers(1, 9))}
        a = symbolic.dim_add(symbolic.dim_mul("s", int(rng.integers(1, 4))), int(rng.integers(0, 7)))
        for name, fn in ops_:
            b = int(rng.integers(1, 6)) if name in ("floordiv", "mod") else "b"
            d = getattr(symbolic, f"dim_{name}")(a, b)
            want = fn(symbolic.parse(a).evaluate(sizes), b if isinstance(b, int) else sizes["b"])
            got = d if isinstance(d, int) else symbolic.parse(d).evaluate(sizes)
            assert got == want, (name, a, b, d, sizes)


def test_decide_says_what_it_assumed():
    assert symbolic.decide(0, "<=", "seq") == (True, {})
    assert symbolic.decide("seq", "==", "seq") == (True, {})
    assert symbolic.decide("seq", ">=", 1) == (True, {"seq": 1})
    assert symbolic.decide("seq", "==", 1) == (False, {"seq": 2})
    assert symbolic.decide(symbolic.dim_add("s", 3), ">", "s") == (True, {})
    for a, b in (("seq", 512), ("q", "kv"), (symbolic.dim_floordiv("s", 2), 3)):
        with pytest.raises(symbolic.Undecided):
            symbolic.decide(a, "<=", b)
    assumed = {}
    assert symbolic.dim_max("b", 1, assumed) == "b" and assumed == {"b": 1}
    assert symbolic.dim_min("s", 1000) == "min(s,1000)"
