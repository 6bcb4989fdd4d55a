// Quantized linear layers of many rows on the matrix units: rocmc's quantized_linear in a prefill (more rows than
// linear_qm takes, or a symbolic number of them) on NVIDIA sm_80+ (mma.sync) and AMD gfx90a / gfx94x (MFMA), over
// 4- or 8-bit weights with a scale and a zero point a group: linear_mm.hip's tiled product (mm.h), each chunk of w
// read as its packed bytes and dequantized on its way into shared memory, W = q * s - z * s rounded once to x's
// type (linear_qm's arithmetic): the packed bytes are what streams from memory, no f16 copy of the weights is made.
// The epilogue: linear.h's (bias, residual add, act(gate) * up). No FLAG_NORM: the norm is rms_norm's kernel before
// it; act-order's permutation of x is a gather before it.
//
// Symbols: linear_qmm_{f16,bf16}. ABI: the "linear_qmm" KernelFamily in rocmc/lowering/kernels.py (linear_q's
// bindings and constants). Workgroup: BLOCK x 1 x 1. Grid: linear_mm's. The host admits K and K / G multiples of
// BK (32). Elsewhere (gfx1100's WMMA, sm < 80) the entry point traps: the lowering never dispatches it there.

#include "quant.h"
#include "mm.h"

#if HAS_MMA
template <typename T, int BITS>
DEVICE void linear_qmm_bits(const T* x, const unsigned char* w, const T* sc, const T* z, const T* bias, const T* res,
                            const T*, T* y, const QShape& q) {
  MM_TILES(tiles);
  const MmWeights<T> W{w, sc, z, q.G, q.s.K / q.G, ((u64)w & 7u) == 0};
  linear_mm<T, BITS>(x, W, bias, res, y, q.s, tiles);
}
#else
template <typename T, int BITS>
DEVICE void linear_qmm_bits(const T*, const unsigned char*, const T*, const T*, const T*, const T*, const T*, T*,
                            const QShape&) {
  __builtin_trap();  // no matrix instructions the kernel is written for: never dispatched here
}
#endif

LINEAR_Q(linear_qmm_f16, linear_qmm_bits, _Float16, ROCMC_MM_OCC)
LINEAR_Q(linear_qmm_bf16, linear_qmm_bits, bf16_t, ROCMC_MM_OCC)
