"""The `blas` implementation: matmul, linear and fused_linear as calls into a GEMM library.

`blas.matmul(a, b, bias, transpose_a, transpose_b, epilogue)` (rocmc.externs.BLAS) is served by the
role's providers: hipBLASLt on hip devices, its twin cuBLASLt on cuda devices and the float64
reference on the CPU. Operands
are passed as they are stored, viewed as (batch, rows, cols): a transposed operand (linear's weight,
`transpose_b=True`) is a flag to the library, never a copy. `linear`'s leading dims are the GEMM's
rows; a matmul's batch dims are flattened into one, each operand either carrying the result's batch
or broadcasting a single matrix over it (a stride-0 batch for the library).

When to call the library (`supports`): the library's kernels win on large GEMMs, but one call costs
~18 us of host time (IREE's synchronous import: the host waits for the inputs, launches, waits for
the result), more than IREE's own code takes for a small GEMM or a decode step's GEMV. So a GEMM
calls the library only when its row count M is at least MIN_ROWS (or symbolic: a prefill's sequence)
and its N and K at least MIN_COLS; the reason a node stays generated is in `art.summary()`.
The implementation is opt-in: `libraries=["blas"]` uses it for every GEMM the rule lets through,
`impl={"matmul": "blas"}` for one op regardless of size. (It was on by default on rocm and cuda
targets until a 7B prefill through cuBLASLt hit an intermittent illegal memory access; the cause, results
taken from IREE's caching pool, is fixed (providers/dnn.py `result_view`), and the path was not re-measured
against the hand-written `linear_mm` that became the prefill default meanwhile. BENCHMARKS.md.)

`fused_linear` (activation(linear(x, w, b)), put in place of the chain by rocmc.rewrite) is linear's
call with the library's epilogue set: relu, or GELU, which both libraries compute as the tanh
approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), gelu(approximate="tanh")'s formula with
its constants (the sources at LINEARS). The library applies it after the bias, before the result is
stored, where the separate ops round the GEMM's result to the storage type first: results differ by
rounding only.

Attention (`sdpa`) has a `blas` implementation too: scores = scale * q.k^T and out = p.v are
two batched library GEMMs (the heads of a kv group are the rows of one GEMM, so grouped-query
attention reads each k and v once, without copies), the mask and the softmax over keys IREE's code
in between (f32 arithmetic; the scores and p are stored in the storage type, as PyTorch's math
attention stores them). It materialises the (s, skv) scores, so it is chosen where they fit (the
rule) and, with symbolic lengths, the module keeps IREE's fused attention in `@main_long` for calls
whose scores would not (codegen/attention.py).
"""

from __future__ import annotations

from ..externs import BLAS, EPILOGUES, to_bits
from ..frontend.graph import TensorType
from . import extern
from .emitter import Emitter, T, affine_map, tensor_type
from .extern import reshaped_to
from .codegen import attention as generated_attention
from .registry import lowering

# Below these sizes IREE's code is faster than one library call (bench/gemm_gpu.py, BENCHMARKS.md).
MIN_ROWS = 16
MIN_COLS = 16


def _batch_role(lead: tuple, batch: tuple) -> str | None:
    """How an operand's leading dims map onto the result's batch dims: "full" (the same dims),
    "one" (a single matrix broadcast over the batch), or None (a partial broadcast)."""
    if tuple(lead) == tuple(batch):
        return "full"
    if all(d == 1 for d in lead):
        return "one"
    return None


# linear's forms: the same operands and call, fused_linear with its activation as the epilogue.
LINEARS = ("linear", "fused_linear")

# What the vendors' GELU epilogue computes (HIPBLASLT_EPILOGUE_GELU / CUBLASLT_EPILOGUE_GELU), read in:
# - ROCm/hipBLASLt 0.11.0 (commit 7d9fb683, 2024-10), tensilelite/Tensile/Activation.py getGeluModule:
#   "Gelu(x) = 0.5 * x * (1 + tanh(k0 * x * (1 + k1 * x * x)))" with FloatGeluK0 = 0x3f4c422a
#   (sqrt(2/pi) in f32) and FloatGeluK1 = 0x3d372713 (0.044715 in f32); its test reference,
#   clients/include/testing_matmul.hpp `_gelu`, is the same formula in f32 with k0 = 0.7978845608028654.
#   hipblaslt.h documents HIPBLASLT_EPILOGUE_GELU as "x:=GELU(x)" only.
# - cuBLASLt is closed; its documentation (cublasLtEpilogue_t) says only "x := GELU(x)". Its users fix
#   the form: openxla/xla xla/service/gpu/gemm_rewriter.cc (commit 001918b7) fuses into the GELU epilogue
#   only the chain "0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))", and pytorch/pytorch 2.x
#   aten/src/ATen/native/cuda/Blas.cpp (addmm_out_cuda_impl, _addmm_activation's use_gelu) stands in for
#   the epilogue, where it cannot use it, with at::gelu_(result, "tanh"). Measured on an H200 (cuBLASLt
#   of CUDA 13, 2026-11-26): an f32 fused_linear through this call is within 7e-6 of the float64 tanh
#   GELU on values up to 12, and 4.8e-4 off the erf GELU.
# Both: rocmc's gelu(approximate="tanh"), so "gelu_tanh" is fused (EPILOGUES).


def _gemm_dims(node):
    """(M, N, K, batch dims) of a matmul or linear node, as ints or size expressions."""
    if node.op in LINEARS:
        x, w = node.inputs[0].type, node.inputs[1].type
        m = 1
        for d in x.shape[:-1]:
            m = m * d if isinstance(m, int) and isinstance(d, int) else "symbolic"
        return m, w.shape[0], w.shape[1], ()
    a, b = node.inputs[0].type, node.inputs[1].type
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    m = a.shape[-1] if ta else a.shape[-2]
    k = a.shape[-2] if ta else a.shape[-1]
    n = b.shape[-2] if tb else b.shape[-1]
    return m, n, k, node.outputs[0].shape[:-2]


def supports(node, target) -> str | None:
    dtype = node.inputs[0].dtype.name
    if node.op == "fused_linear" and len(node.inputs) > 3 and node.inputs[3] is not None:
        return "a residual operand (the library call's epilogue adds none: IREE's code fuses the add)"
    if dtype not in BLAS.dtypes:
        return f"dtype {dtype} (the GEMM library takes {', '.join(BLAS.dtypes)})"
    if node.op == "matmul":
        a, b = node.inputs[0].type, node.inputs[1].type
        if a.rank < 2 or b.rank < 2:
            return "a 1-D operand (a matrix-vector product: IREE's code)"
        batch = node.outputs[0].shape[:-2]
        for arg, t in (("a", a), ("b", b)):
            if _batch_role(t.shape[:-2], batch) is None:
                return (
                    f"{arg!r} broadcasts part of the batch ({list(t.shape[:-2])} over {list(batch)}); "
                    f"the library takes a full batch or one matrix"
                )
    return None


def size_rule(node, target) -> str | None:
    """Whether the GEMM is large enough for a library call to pay (module docstring)."""
    m, n, k, _ = _gemm_dims(node)
    if isinstance(m, int) and m < MIN_ROWS:
        return (
            f"M={m} rows, below the {MIN_ROWS}-row rule (one library call costs ~18 us; IREE's code is "
            f"faster for so few rows)"
        )
    for name, d in (("N", n), ("K", k)):
        if isinstance(d, int) and d < MIN_COLS:
            return f"{name}={d}, below the {MIN_COLS}-column rule (too small a GEMM for a library call)"
    return None


def _rows(E: Emitter, t: T, keep: int):
    """View sizes of `t` as (batch, d0, d1) where its last `keep` dims stay and the rest collapse."""
    dims = E.dims(t)
    return [E.product(dims[:-2]), dims[-2], dims[-1]] if keep == 2 else [1, E.product(dims[:-1]), dims[-1]]


def lower_gemm(E: Emitter, node, ins: list, ctx) -> list:
    elt = ins[0].mlir_elt
    dtype = node.inputs[0].dtype.name
    out = node.outputs[0]
    epilogue = node.attrs.get("activation", "none")
    if node.op in LINEARS:
        x, w, bias = ins
        args = [
            extern.operand(E, ctx, node, 0, x, 3, elt, lambda t: _rows(E, t, 1)),
            extern.operand(E, ctx, node, 1, w, 3, elt, lambda t: [1, *E.dims(t)]),
            extern.operand(E, ctx, node, 2, bias, 1, elt),
        ]
        flags = [0, 1]
        sizes = E.dims(x)[:-1] + [E.dim(w, 0)]
    else:
        a, b = ins
        batch = out.shape[:-2]

        def view(t: T):
            if _batch_role(t.shape[:-2], batch) == "one":
                return [1, *E.dims(t)[-2:]]
            return _rows(E, t, 2)

        args = [
            extern.operand(E, ctx, node, 0, a, 3, elt, view),
            extern.operand(E, ctx, node, 1, b, 3, elt, view),
            extern.operand(E, ctx, node, 2, None, 1, elt),
        ]
        ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
        flags = [int(ta), int(tb)]
        full = a if _batch_role(a.shape[:-2], batch) == "full" else b
        sizes = E.dims(full)[:-2] + [
            E.dim(a, a.rank - 1 if ta else a.rank - 2),
            E.dim(b, b.rank - 2 if tb else b.rank - 1),
        ]
    r, r_ty = extern.call(
        E, ctx, node, BLAS, dtype, args, flags + [EPILOGUES.index(epilogue), to_bits(1.0)], 3, elt, op="matmul"
    )
    return [T(reshaped_to(E, r, r_ty, sizes, tensor_type(out.shape, elt)), out.type)]


def _gemm(
    E: Emitter, ctx, node, a: str, b: str, dtype: str, elt: str, transpose_b: bool = False, alpha: float = 1.0
) -> tuple[str, str]:
    """One library call on two (batch, rows, cols) buffer views, no bias."""
    none = extern.operand(E, ctx, node, None, None, 1, elt)
    return extern.call(
        E,
        ctx,
        node,
        BLAS,
        dtype,
        [a, b, none],
        [0, int(transpose_b), EPILOGUES.index("none"), to_bits(alpha)],
        3,
        elt,
        op="matmul",
    )


lowering(
    "matmul",
    *LINEARS,
    impl="blas",
    kinds=("cpu", "rocm", "cuda"),
    default_on=(),
    library="blas",
    priority=20,
    supports=supports,
    rule=size_rule,
)(lower_gemm)


# ---- attention as two library GEMMs -------------------------------------------------------------


def _scores(node) -> int | None:
    """b * hq * s * skv of an sdpa node: the scores it materialises (None when a size is symbolic)."""
    (b, hq, s, _), skv = node.inputs[0].shape, node.inputs[1].shape[2]
    total = 1
    for d in (b, hq, s, skv):
        if not isinstance(d, int):
            return None
        total *= d
    return total


def sdpa_supports(node, target) -> str | None:
    dtype = node.inputs[0].dtype.name
    if dtype not in BLAS.dtypes:
        return f"dtype {dtype} (the GEMM library takes {', '.join(BLAS.dtypes)})"
    return None


def sdpa_rule(node, target) -> str | None:
    """Materialising the scores must fit (as for the generated decomposition) and pay: a decode
    step's single query row is IREE's fused attention."""
    n = _scores(node)
    if n is not None and n > generated_attention.DECOMPOSE_UP_TO_SCORES:
        return (
            f"{n} scores to materialise (over {generated_attention.DECOMPOSE_UP_TO_SCORES}); IREE's fused "
            f"attention keeps them in registers"
        )
    s = node.inputs[0].shape[2]
    if isinstance(s, int) and s < MIN_ROWS:
        return f"{s} query rows, below the {MIN_ROWS}-row rule"
    return None


def lower_sdpa(E: Emitter, node, ins: list, ctx) -> list:
    unbounded = ctx.target.kind != "cpu" and _scores(node) is None
    limit = generated_attention.DECOMPOSE_UP_TO_SCORES
    if unbounded and ctx.long_form(generated_attention.score_term(node), limit):
        return generated_attention.lower_sdpa(E, node, ins, ctx)  # the long form: IREE's fused attention
    q, k, v, mask = ins
    elt, dtype = q.mlir_elt, node.inputs[0].dtype.name
    dims = generated_attention._Dims(E, q, k)
    bh = E.product([dims.b, dims.hkv])
    rows = E.product([dims.g, dims.s])
    dv = E.dim(v, 3)
    qv = extern.operand(E, ctx, node, 0, q, 3, elt, lambda t: [bh, rows, E.dim(t, 3)])
    kv = extern.operand(E, ctx, node, 1, k, 3, elt, lambda t: [bh, dims.skv, E.dim(t, 3)])
    r, r_ty = _gemm(E, ctx, node, qv, kv, dtype, elt, transpose_b=True, alpha=node.attrs["scale"])
    loops = [dims.b, dims.hkv, dims.g, dims.s, dims.skv]
    scores_ty = tensor_type(generated_attention._shape(loops), elt)
    scores = reshaped_to(E, r, r_ty, loops, scores_ty)
    p = _softmax(E, node, scores, scores_ty, mask, dims, elt)
    p_type = TensorType(tuple(d if isinstance(d, int) else "?" for d in loops), node.inputs[0].dtype)
    pv = extern.operand(E, ctx, node, None, T(p, p_type), 3, elt, lambda t: [bh, rows, dims.skv])
    vv = extern.operand(E, ctx, node, 2, v, 3, elt, lambda t: [bh, dims.skv, dv])
    y, y_ty = _gemm(E, ctx, node, pv, vv, dtype, elt)
    out = node.outputs[0]
    return [T(reshaped_to(E, y, y_ty, [dims.b, E.dim(q, 1), dims.s, dv], tensor_type(out.shape, elt)), out.type)]


def _softmax(E: Emitter, node, scores: str, scores_ty: str, mask: T | None, dims, elt: str) -> str:
    """p = softmax over keys of the masked scores, in f32, stored in the storage type."""
    m = generated_attention._mask(E, node, mask, dims)
    B, H, G, M, K2 = (
        generated_attention.B,
        generated_attention.H,
        generated_attention.G,
        generated_attention.M,
        generated_attention.K2,
    )
    loops = [B, H, G, M, K2]
    size = {B: dims.b, H: dims.hkv, G: dims.g, M: dims.s, K2: dims.skv}
    ins = [(scores, scores_ty, loops)] + ([m] if m else [])

    def amap(of):
        return affine_map(len(loops), [loops.index(x) for x in of])

    def masked(E, a):
        x = E.cast_scalar(a[0], elt, "f32")
        if m is None:
            return x
        if m[1].endswith("xi1>"):
            return E.op(f"arith.select {a[1]}, {x}, {E.const(float('-inf'), 'f32')} : f32")
        return E.op(f"arith.addf {x}, {E.cast_scalar(a[1], elt, 'f32')} : f32")  # an additive mask has q's type

    def run(out_loops, extra, init_value, out_elt, reduce, body):
        sizes = [size[x] for x in out_loops]
        init = E.empty(sizes, out_elt) if init_value is None else E.filled(sizes, out_elt, init_value)
        ty = tensor_type(generated_attention._shape(sizes), out_elt)
        operands = ins + extra
        maps = [amap(of) for _, _, of in operands] + [amap(out_loops)]
        iters = ["parallel"] * 4 + ["reduction" if reduce else "parallel"]
        return E.generic([(n, t) for n, t, _ in operands], [(init, ty)], maps, iters, body)[0], ty

    rows = [B, H, G, M]
    mx, mx_ty = run(
        rows, [], float("-inf"), "f32", True, lambda E, a: [E.op(f"arith.maximumf {masked(E, a)}, {a[-1]} : f32")]
    )

    def exp(E, a):
        return E.op(f"math.exp {E.op(f'arith.subf {masked(E, a)}, {a[len(ins)]} : f32')} : f32")

    total, total_ty = run(
        rows, [(mx, mx_ty, rows)], 0.0, "f32", True, lambda E, a: [E.op(f"arith.addf {exp(E, a)}, {a[-1]} : f32")]
    )
    p, _ = run(
        loops,
        [(mx, mx_ty, rows), (total, total_ty, rows)],
        None,
        elt,
        False,
        lambda E, a: [E.cast_scalar(E.op(f"arith.divf {exp(E, a)}, {a[len(ins) + 1]} : f32"), "f32", elt)],
    )
    return p


lowering(
    "sdpa",
    impl="blas",
    kinds=("cpu", "rocm", "cuda"),
    default_on=(),
    library="blas",
    priority=20,
    supports=sdpa_supports,
    rule=sdpa_rule,
)(lower_sdpa)
