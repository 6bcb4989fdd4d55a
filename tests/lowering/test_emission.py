"""MLIR emission: the Emitter's structured helpers, and emitted text MLIR rejects reported as a
LoweringError naming the node whose lowering wrote it, with the numbered lines around the failure."""

import re
from contextlib import contextmanager

import pytest

import rocmc
from rocmc import ops
from rocmc.lowering import registry
from rocmc.lowering.emitter import Emitter, T


def _chain():
    """x -> exp (%1) -> tanh (%2) -> neg (%3): the broken node sits between two good ones."""
    g = rocmc.Graph("chain")
    g.output(ops.neg(ops.tanh(ops.exp(g.input("x", (2, 3))))))
    return g


@contextmanager
def broken_tanh():
    """Registers tanh implementations that emit invalid MLIR (`undeclared`: a use of a value never
    defined, a parse error; `mistyped`: a copy into a tensor of another shape, a verifier error),
    and removes them afterwards."""

    def undeclared(E, node, ins, ctx):
        x = ins[0]
        E.const(1.0, "f32")
        return [T(E.op(f"math.tanh %never_defined : {x.mlir}"), x.type)]

    def mistyped(E, node, ins, ctx):
        x = ins[0]
        init = E.empty([3, 2], "f32")
        E.op(f"linalg.copy ins({x.name} : {x.mlir}) outs({init} : tensor<3x2xf32>) -> tensor<3x2xf32>")
        return [x]

    before = dict(registry.REGISTRY["tanh"])
    try:
        registry.lowering("tanh", impl="undeclared", default_on=())(undeclared)
        registry.lowering("tanh", impl="mistyped", default_on=())(mistyped)
        yield
    finally:
        registry.REGISTRY["tanh"] = before


def _numbered(message: str) -> list:
    return re.findall(r"^([ >]) +(\d+) \| (.*)$", message, flags=re.M)


def test_a_parse_error_names_the_node_and_shows_the_lines_around_it():
    with broken_tanh(), pytest.raises(rocmc.LoweringError) as e:
        rocmc.compile(_chain(), "cpu", impl={"tanh": "undeclared"})
    msg = str(e.value)
    tanh = _chain().nodes[1].outputs[0].id
    assert re.match(
        rf'lowering of %{tanh} \(tanh\) produced invalid MLIR: "-":\d+:\d+: use of undeclared SSA value', msg
    ), msg
    rows = _numbered(msg)
    marked = [r for r in rows if r[0] == ">"]
    assert len(marked) == 1 and "%never_defined" in marked[0][2]
    numbers = [int(n) for _, n, _ in rows]
    at = int(marked[0][1])
    assert numbers == list(range(at - 3, at + 4))  # 3 lines before, 3 after, consecutive
    assert int(re.search(r'"-":(\d+):', msg).group(1)) == at
    assert re.search(r"^ +\| +\^$", msg, flags=re.M)  # a caret under the failing column
    assert any('loc("rocmc.1:exp")' in text for _, _, text in rows)  # so is the good node before


def test_a_verifier_error_names_the_node_by_its_location():
    with broken_tanh(), pytest.raises(rocmc.LoweringError) as e:
        rocmc.compile(_chain(), "cpu", impl={"tanh": "mistyped"})
    msg = str(e.value)
    tanh = _chain().nodes[1].outputs[0].id
    assert msg.startswith(f"lowering of %{tanh} (tanh) produced invalid MLIR: "), msg
    assert "'linalg.copy' op" in msg.splitlines()[0]
    marked = [r for r in _numbered(msg) if r[0] == ">"]
    assert len(marked) == 1 and "linalg.copy" in marked[0][2] and f'loc("rocmc.{tanh}:tanh")' in marked[0][2]


def test_the_registry_is_restored_after_a_broken_lowering():
    before = dict(registry.REGISTRY["tanh"])
    with broken_tanh():
        assert {"undeclared", "mistyped"} <= set(registry.REGISTRY["tanh"])
        with pytest.raises(rocmc.LoweringError):
            rocmc.compile(_chain(), "cpu", impl="undeclared")
    assert registry.REGISTRY["tanh"] == before
    art = rocmc.compile(_chain(), "cpu")
    assert [c["impl"] for c in art.metadata["implementations"]] == ["generated"] * 3


def test_generated_lowerings_are_the_fallback_and_no_other_is():
    for op, impls in registry.REGISTRY.items():
        for name, impl in impls.items():
            assert impl.fallback == (name == "generated"), (op, name)


# ---- the Emitter's helpers --------------------------------------------------------------------------


def test_index_arithmetic_folds_static_sizes_and_emits_symbolic_ones():
    E = Emitter()
    assert E.addi(2, 3) == 5 and E.muli(4, 5) == 20 and E.ceildiv(7, 2) == 4 and E.product([2, 3, 4]) == 24
    assert E.addi("%n", 0) == "%n" and E.muli(1, "%n") == "%n" and E.subi("%n", 0) == "%n"
    assert E.lines == []
    n = E.product([2, "%a", 3, "%b"])
    assert len(E.lines) == 3  # a*b, the constant 6, then the product
    assert E.lines[0].strip() == "%v1 = arith.muli %a, %b : index" and E.lines[-1].strip().startswith(f"{n} = ")
    assert "arith.constant 6 : index" in E.lines[1]


def test_a_region_indents_its_body_and_carries_the_location_on_its_closing_line():
    E = Emitter()
    E.loc = 'loc("rocmc.7:pad")'
    with E.region("%p = tensor.pad %x low[0] high[1]", ": tensor<2xf32> to tensor<3xf32>", ["index"], "i") as (i,):
        E.emit("tensor.yield %c : f32")
    assert E.lines == [
        "  %p = tensor.pad %x low[0] high[1] {",
        f"  ^bb0({i}: index):",
        '    tensor.yield %c : f32 loc("rocmc.7:pad")',
        '  } : tensor<2xf32> to tensor<3xf32> loc("rocmc.7:pad")',
    ]


def test_a_generic_with_two_results_puts_their_types_in_parentheses():
    E = Emitter()
    ty = "tensor<4xf32>"
    E.generic([], [("%a", ty), ("%b", ty)], ["affine_map<(d0) -> (d0)>"] * 2, ["parallel"], lambda E, a: [a[0], a[1]])
    assert E.lines[-1].strip() == f"}} -> ({ty}, {ty})"


def test_a_recorded_size_is_what_dim_gives():
    E = Emitter()
    t = T("%t", rocmc.TensorType(("s", 4), rocmc.f32))
    E.set_dim(t, 0, "%hinted")
    assert E.dim(t, 0) == "%hinted" and E.dim(t, 1) == 4 and E.lines == []
