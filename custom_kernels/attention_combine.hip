// The output of a split attention (attention_split.hip): each row's partial results, one a split, combined.
//
// part: rows x splits x (d + 2) f32, a split's d weighted values (relative to its running max), then its max and
// its sum; out (rows, d): sum_s values_s * exp(max_s - M) / sum_s sum_s * exp(max_s - M), M the largest max,
// rounded once. A split that kept no position (max -inf) weighs nothing; a row none kept gives NaN (0 / 0), as the
// float64 reference does.
//
// Symbols: attention_combine_{f32,f16,bf16}. ABI: the "attention_combine" KernelFamily in rocmc/lowering/kernels.py.
// Workgroup: BLOCK x 1 x 1, a thread an output element. Grid: ceil(rows * d / BLOCK).
#include "rocmc_gpu.h"
#include "kernel_abi.h"

template <typename T> DEVICE void combine(const float* part, T* out, u32 rows, u32 d, u32 splits) {
  const u64 o = (u64)block_x() * BLOCK + thread_x();
  if (o >= (u64)rows * d) return;
  const u64 row = o / d, c = o % d;
  const float* p = part + row * splits * (d + 2);
  float mx = -__builtin_inff();
  for (u32 sp = 0; sp < splits; ++sp) {
    const float m = p[(u64)sp * (d + 2) + d];
    mx = m > mx ? m : mx;
  }
  float sum = 0.0f, val = 0.0f;
  for (u32 sp = 0; sp < splits; ++sp) {
    const float* q = p + (u64)sp * (d + 2);
    const float f = q[d] == -__builtin_inff() ? 0.0f : exp_f32(q[d] - mx);
    sum += q[d + 1] * f;
    val += q[c] * f;
  }
  out[o] = from_f32<T>(val / sum);
}

#define ATTENTION_COMBINE(name, T) \
  KERNEL(BLOCK) void name(KERNEL_PARAMS(T)) { combine<T>(part, out, rows, d, splits); }
ATTENTION_COMBINE(attention_combine_f32, float)
ATTENTION_COMBINE(attention_combine_f16, _Float16)
ATTENTION_COMBINE(attention_combine_bf16, bf16_t)
