"""The function's long form (LowerContext.long_form): a general request any lowering can make, which the lowering
driver serves without knowing the op (GPU sdpa with a symbolic key length is today's user)."""

from __future__ import annotations

import inspect

import pytest

import rocmc
from rocmc import ops
from rocmc.errors import LoweringError
from rocmc.lowering import module as lowering_module
from rocmc.lowering.module import LowerContext
from rocmc.lowering.target import Target


def test_a_lowering_asks_and_then_emits_its_alternative():
    ctx = LowerContext(Target.parse("cuda:sm_80"), rocmc.Graph("g"))
    assert ctx.long_form([2, "s", 8], 1000) is False and ctx.long_form(["s", "s"], 1000) is False
    assert ctx.long_terms == [[2, "s", 8], ["s", "s"]] and ctx.long_limit == 1000
    with pytest.raises(LoweringError, match="two long-form limits in one function: 1000 and 5"):
        ctx.long_form(["s"], 5)
    ctx.emitting_long_form = True
    assert ctx.long_form([2, "s", 8], 1000) is True and len(ctx.long_terms) == 2  # nothing recorded again


def test_the_driver_knows_no_op():
    """lowering/module.py emits the long form for whoever asked: no op of attention named in its code."""
    source = inspect.getsource(lowering_module)
    assert "sdpa" not in source and "DECOMPOSE" not in source


@pytest.mark.parametrize("impl", [None, "blas"])
def test_sdpa_with_a_symbolic_key_length_gets_a_long_form(impl):
    g = rocmc.Graph("att")
    q = g.input("q", (1, 4, "s", 32), "f16")
    k = g.input("k", (1, 4, "kv", 32), "f16")
    g.output(ops.sdpa(q, k, k))
    art = rocmc.compile(g, "cuda:sm_80", **({"impl": {"sdpa": impl}} if impl else {}))
    long = art.metadata["long_form"]
    assert long["function"] == "main_long" and long["scores"] == [[1, 4, "s", "kv"]]
    assert long["limit"] == 1 << 28
    static = rocmc.Graph("att")
    q = static.input("q", (1, 4, 16, 32), "f16")
    static.output(ops.sdpa(q, q, q))
    assert "long_form" not in rocmc.compile(static, "cuda:sm_80").metadata
