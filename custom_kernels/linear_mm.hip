// Linear layers of many rows on the matrix units: a prefill's projections (rocmc's linear, fused_linear and
// gated_linear when x has more rows than linear_rows takes, or a symbolic number of them), on IREE's stream like
// every dispatch of the module, with the epilogue of linear.h: bias, residual add, activation, act(gate) * up.
//
// y (M, N) = epilogue(x (M, K) @ w^T), w (N, K) as stored, or (2N, K) when gated (FLAG_GATED: the gate's N rows,
// then the up's N rows), accumulated in f32 and rounded as linear_rows.hip's header says. No FLAG_NORM (the norm is
// rms_norm's kernel before it). The tiles, the pipeline and the matrix instructions: mm.h (shared with
// linear_qmm.hip, the same product over packed weights).
//
// Symbols: linear_mm_{f16,bf16}. ABI: the "linear_mm" KernelFamily in rocmc/lowering/kernels.py (linear_rows'
// bindings and constants). Workgroup: BLOCK x 1 x 1. Grid: ceil(M / BM) * ceil(N / (gated ? BN / 2 : BN)), the
// workgroups of one column of tiles (the same w rows) consecutive. Elsewhere (gfx1100's WMMA, sm < 80) the entry
// point traps: the lowering never dispatches it there (kernel/linear.py says why and IREE's code takes the op).
//
// Tuning switch, set with -D to compare versions: ROCMC_MM_OCC, NVPTX resident workgroups a multiprocessor to fit
// registers for (1: up to 255 registers a thread, 154 used; 2: 128, no spills at sm_90's ptxas). 2 is the default:
// on an H200 it took a 4096^3 GEMM from 129 to 216 TFLOP/s and a 7B prefill's projections 1.2-1.7x faster at 512
// and 2048 rows (bench/prefill_gpu.py, BENCHMARKS.md).
#include "mm.h"

#if HAS_MMA
template <typename T>
DEVICE void linear_mm_entry(const T* x, const T* w, const T* bias, const T* res, const T*, T* y, const LinShape& s) {
  MM_TILES(tiles);
  linear_mm<T, 0>(x, MmWeights<T>{w, nullptr, nullptr, 0u, 0u, true}, bias, res, y, s, tiles);
}
#else
template <typename T>
DEVICE void linear_mm_entry(const T*, const T*, const T*, const T*, const T*, T*, const LinShape&) {
  __builtin_trap();  // no matrix instructions the kernel is written for: never dispatched here
}
#endif

#define LINEAR_MM(name, T)                                       \
  KERNEL_OCC(BLOCK, ROCMC_MM_OCC) void name(KERNEL_PARAMS(T)) {  \
    LinShape s{M, N, K, flags, __builtin_bit_cast(float, eps)};  \
    linear_mm_entry<T>(x, w, bias, residual, norm, y, s);        \
  }
LINEAR_MM(linear_mm_f16, _Float16)
LINEAR_MM(linear_mm_bf16, bf16_t)
