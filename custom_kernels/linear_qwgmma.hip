// Quantized linear layers of many rows on Hopper's warpgroup matrix instructions (NVIDIA sm_90a: H100, H200): a
// prefill's quantized_linear where the module is compiled for cuda:sm_90, as linear_qmm.hip computes it elsewhere
// (the same ABI, packed layout, dequantization and epilogue), the packed weights dequantized on their way into
// shared memory (wgmma.h). K and the group size are multiples of 64 (a chunk lies in one group).
//
// Symbols: linear_qwgmma_{f16,bf16}. ABI: the "linear_qwgmma" KernelFamily in rocmc/lowering/kernels.py (quant.h's
// bindings and constants). Workgroup and grid: linear_wgmma.hip's. Registers are not capped for two workgroups a
// multiprocessor (ROCMC_WG_OCC 1): at the cap the packed pieces spilled (64 bytes) and a 7B prefill took 61.4 / 78.2
// ms (4 / 8-bit) against 56.9 / 62.3 uncapped on an H200 (BENCHMARKS.md).
#ifndef ROCMC_WG_OCC
#define ROCMC_WG_OCC 1
#endif
#include "quant.h"
#include "wgmma.h"

template <typename T, int BITS>
DEVICE void linear_qwgmma_bits(const T* x, const unsigned char* w, const T* sc, const T* z, const T* bias, const T* res,
                               const T*, T* y, const QShape& q) {
  const MmWeights<T> W{w, sc, z, q.G, q.s.K / q.G, ((u64)w & 7u) == 0};
  linear_wgmma_body<T, BITS>(x, W, bias, res, y, q.s);
}

LINEAR_Q(linear_qwgmma_f16, linear_qwgmma_bits, _Float16, ROCMC_WG_OCC)
LINEAR_Q(linear_qwgmma_bf16, linear_qwgmma_bits, bf16_t, ROCMC_WG_OCC)
