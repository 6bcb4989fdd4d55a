"""Results handed to the caller are the caller's: no later call, of the same module or another, changes them.

On the CPU, IREE's `to_host` is a view of the result's buffer, which goes back to IREE's pool once the
result is dropped; a later call may write into it. Every path that hands out host arrays copies off it."""

from __future__ import annotations

import numpy as np

import rocmc
from rocmc import ops
from llm_models import PROMPT_IDS, llm_checkpoint  # noqa: F401


def _owns(a: np.ndarray) -> bool:
    """The array's memory is a numpy allocation (its own, or that of the array it views)."""
    while a.base is not None:
        if not isinstance(a.base, np.ndarray):
            return False
        a = a.base
    return a.flags.owndata


def test_module_results_own_their_memory(rng):
    g = rocmc.Graph("two")
    x = g.input("x", (33, "n"), "f32")
    g.output(ops.mul(x, x), ops.cast(ops.greater(x, np.float32(0)), "bool"))
    mod = rocmc.load(rocmc.compile(g, "cpu"))
    a, b = (rng.standard_normal((33, 65)).astype(np.float32) for _ in range(2))
    sq, pos = mod(a)
    assert _owns(sq) and _owns(pos)
    mod(b)
    np.testing.assert_array_equal(sq, a * a)
    np.testing.assert_array_equal(pos, a > 0)


def test_prompt_logits_survive_later_generation(llm_checkpoint):  # noqa: F811
    """LanguageModel.logits returned a view that a later generate overwrote (by as much as 58)."""
    lm = rocmc.llm.load_hf(llm_checkpoint("llama"), "cpu", max_seq_len=32)
    logits = lm.logits(list(PROMPT_IDS))
    kept = logits.copy()
    assert _owns(logits)
    lm.generate([1, 2, 3, 4, 5, 6], 8, stop_tokens=())
    lm.logits([7, 8, 9])
    np.testing.assert_array_equal(logits, kept)
