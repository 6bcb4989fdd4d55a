// Linear layers of many rows on Hopper's warpgroup matrix instructions (wgmma, NVIDIA sm_90a: H100, H200): a
// prefill's projections where the module is compiled for cuda:sm_90, as linear_mm.hip computes them elsewhere (the
// same ABI, epilogue and rounding: linear.h), at the instruction rate mma.sync can't reach on these GPUs.
//
// y (M, N) = epilogue(x (M, K) @ w^T), w (N, K) as stored, or (2N, K) with FLAG_GATED (the gate's N rows, then the
// up's), accumulated in f32. No FLAG_NORM (rms_norm's kernel runs before it). The tiles, the pipeline and the
// matrix instructions: wgmma.h (shared with linear_qwgmma.hip, the same product over packed weights).
//
// Symbols: linear_wgmma_{f16,bf16}. ABI: the "linear_wgmma" KernelFamily in rocmc/lowering/kernels.py (linear_mm's
// bindings and constants). Workgroup: BLOCK x 1 x 1. Grid: ceil(M / BM) * ceil(N / (gated ? BN / 2 : BN)), the
// workgroups of one column of tiles consecutive.
#include "wgmma.h"

template <typename T>
DEVICE void linear_wgmma_entry(const T* x, const T* w, const T* bias, const T* res, T* y, const LinShape& s) {
  linear_wgmma_body<T, 0>(x, MmWeights<T>{w, nullptr, nullptr, 0u, 0u, true}, bias, res, y, s);
}

#define LINEAR_WGMMA(name, T)                                   \
  KERNEL_OCC(BLOCK, ROCMC_WG_OCC) void name(KERNEL_PARAMS(T)) { \
    LinShape s{M, N, K, flags, __builtin_bit_cast(float, eps)}; \
    linear_wgmma_entry<T>(x, w, bias, residual, y, s);          \
  }
LINEAR_WGMMA(linear_wgmma_f16, _Float16)
LINEAR_WGMMA(linear_wgmma_bf16, bf16_t)
