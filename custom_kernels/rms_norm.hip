// RMSNorm over rows: y = x / sqrt(mean(x^2) + eps) * w, computed in f32 whatever the storage type.
//
// Symbols: rms_norm_{f32,f16,bf16} (any row; 8 vectors a thread in registers) and rms_norm_{f32,f16,bf16}_short
// (4 vectors: fewer registers, more threads resident; the host picks it for rows of up to 4 * BLOCK vectors).
// x, w and y share the element type.
// ABI (bindings, push constants, FLAG_* bits, BLOCK): the "rms_norm" KernelFamily in rocmc/lowering/kernels.py,
// which the build generates kernel_abi.h from (included by rows.h).
// Workgroup: BLOCK x 1 x 1. Grid: ceil(rows / (BLOCK / group)) x 1 x 1.
#include "rows.h"

template <typename T, int N, int C>
DEVICE void rms_norm_rows(const T* x, const T* w, T* y, u32 rows, u32 cols, u32 group, float eps, bool has_w,
                          SumSlots<1>* slots) {
  for_rows<T, N, C>(x, rows, cols, group, slots, [&](const RowSlot& s, const RowCache<T, N, C>& c, SumSlots<1>* sl) {
    const T* xr = x + (u64)s.row * cols;
    float ss = row_pass(c, xr, cols, group, s.lane, s.active, [](const Vec<T, N>& v) { return sumsq_vec(v, 0.0f); });
    float scale = rsqrt_f32(group_sum(ss, group, sl) / (float)cols + eps);
    row_write(c, xr, y + (u64)s.row * cols, cols, group, s.lane, s.active, [&](const Vec<T, N>& v, u32 i) {
      float wf[N], o[N];
      column_f32<T, N>(w, has_w, i, 1.0f, wf);
#pragma unroll
      for (int j = 0; j < N; ++j) o[j] = to_f32(v.v[j]) * scale * wf[j];
      return round_vec<T, N>(o);
    });
  });
}

template <typename T, int C>
DEVICE void rms_norm(const T* x, const T* w, T* y, u32 rows, u32 cols, u32 group, u32 eps_bits, u32 flags) {
  SHARED SumSlots<1> slots[2];
  constexpr int W = Wide<T>::N;
  float eps = __builtin_bit_cast(float, eps_bits);
  bool has_w = flags & FLAG_W;
  if (cols % W == 0 && aligned16(x, w, y))
    rms_norm_rows<T, W, C>(x, w, y, rows, cols, group, eps, has_w, slots);
  else
    rms_norm_rows<T, 1, C>(x, w, y, rows, cols, group, eps, has_w, slots);
}

#define RMS_NORM(name, T, C)                                                                                  \
  ROW_KERNEL(C) void name(KERNEL_PARAMS(T)) { rms_norm<T, C>(x, w, y, rows, cols, group, eps, flags); }
RMS_NORM(rms_norm_f32, float, 8)
RMS_NORM(rms_norm_f32_short, float, 4)
RMS_NORM(rms_norm_f16, _Float16, 8)
RMS_NORM(rms_norm_f16_short, _Float16, 4)
RMS_NORM(rms_norm_bf16, bf16_t, 8)
RMS_NORM(rms_norm_bf16_short, bf16_t, 4)
