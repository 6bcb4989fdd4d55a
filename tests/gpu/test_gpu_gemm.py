"""The GEMM library (cuBLASLt behind `blas.matmul`) on an NVIDIA GPU against numpy in float64:
linear with bias and symbolic rows, batched matmuls with both transposes, a broadcast matrix, and
causal grouped-query attention through GEMMs, in f32, f16 and bf16, each for 1, 77 and 300 rows."""

from __future__ import annotations

import numpy as np
import pytest

import rocmc
from rocmc import ops

from gpu_harness import Case, ids, max_over_max

LIB = {"impl": {"matmul": "blas", "linear": "blas", "sdpa": "blas"}}
ROWS = (1, 77, 300)
TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}


def _attention(q, k, v):
    """Causal grouped-query attention in float64."""
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


# name -> (input names, input shapes ("m": symbolic rows), build(*inputs), float64 reference)
FORMS = {
    "linear": (("x", "w", "b"), (("m", 320), (515, 320), (515,)), ops.linear, lambda x, w, b: x @ w.T + b),
    "bmm_tt": (
        ("a", "c"),
        ((6, 96, "m"), (6, 200, 96)),
        lambda a, c: ops.matmul(a, c, transpose_a=True, transpose_b=True),
        lambda a, c: np.swapaxes(a, 1, 2) @ np.swapaxes(c, 1, 2),
    ),
    "bmm_bcast": (("a", "c"), ((2, 4, "m", 72), (72, 130)), ops.matmul, lambda a, c: a @ c),
    "sdpa_gqa_causal": (
        ("q", "k", "v"),
        ((2, 8, "m", 64), (2, 2, "m", 64), (2, 2, "m", 64)),
        lambda q, k, v: ops.sdpa(q, k, v, is_causal=True),
        _attention,
    ),
}


def _case(form, dtype) -> Case:
    names, shapes, build, ref = FORMS[form]

    def graph():
        g = rocmc.Graph(f"{form}_{dtype}")
        g.output(build(*[g.input(n, s, dtype) for n, s in zip(names, shapes)]))
        return g

    def inputs(rng, m):
        npt = rocmc.dtype(dtype).np
        return [rng.uniform(-1, 1, tuple(m if d == "m" else d for d in s)).astype(npt) for s in shapes]

    return Case(
        f"gemm.{form}_{dtype}",
        graph,
        inputs,
        TOL[dtype],
        max_over_max,
        sizes=ROWS,
        compile=LIB,
        reference=ref,
        calls="blas",
    )


CASES = [_case(form, dt) for dt in ("f32", "f16", "bf16") for form in FORMS]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_gemm_library_call(case, gpu):
    gpu(case)
