// LayerNorm over rows: y = (x - mean) / sqrt(var + eps) * w + b, biased variance, computed in f32 in two
// passes over the registers (mean, then the centred sum of squares: no cancellation when |mean| >> std).
//
// Symbols: layer_norm_{f32,f16,bf16} (any row; 8 vectors a thread in registers) and layer_norm_{f32,f16,bf16}_short
// (4 vectors: fewer registers, more threads resident; the host picks it for rows of up to 4 * 256 vectors).
// x, w, b and y share the element type.
// Bindings: 0 x (rows x cols, row-major, read-only), 1 w (cols), 2 b (cols) (placeholders when absent),
//           3 y (rows x cols).
// Constants (i32): 0 rows, 1 cols, 2 group (threads per row: power of two in [1, 256]), 3 eps (f32 bits),
//                  4 flags (bit 0: w present, bit 1: b present).
// Workgroup: 256 x 1 x 1. Grid: ceil(rows / (256 / group)) x 1 x 1.
#include "rows.h"

template <typename T, int N, int C>
DEVICE void layer_norm_rows(const T* x, const T* w, const T* b, T* y, u32 rows, u32 cols, u32 group, float eps,
                            u32 flags, float* smem) {
  RowSlot s = row_slot(rows, group);
  const T* xr = x + (u64)s.row * cols;
  RowCache<T, N, C> c;
  c.load(xr, cols, group, s.lane, s.active);
  float sum = row_pass(c, xr, cols, group, s.lane, s.active, [](const Vec<T, N>& v) { return sum_vec(v, 0.0f); });
  float mean = group_sum(sum, group, smem) / (float)cols;
  float sq = row_pass(c, xr, cols, group, s.lane, s.active, [&](const Vec<T, N>& v) { return sumsq_vec(v, mean); });
  float inv = rsqrt_f32(group_sum(sq, group, smem) / (float)cols + eps);
  row_write(c, xr, y + (u64)s.row * cols, cols, group, s.lane, s.active, [&](const Vec<T, N>& v, u32 i) {
    float wf[N], bf[N];
    column_f32<T, N>(w, flags & 1u, i, 1.0f, wf);
    column_f32<T, N>(b, flags & 2u, i, 0.0f, bf);
    Vec<T, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) o.v[j] = from_f32<T>((to_f32(v.v[j]) - mean) * inv * wf[j] + bf[j]);
    return o;
  });
}

template <typename T, int C>
DEVICE void layer_norm(const T* x, const T* w, const T* b, T* y, u32 rows, u32 cols, u32 group, u32 eps_bits,
                       u32 flags) {
  SHARED float smem[BLOCK / WAVE];
  constexpr int W = Wide<T>::N;
  float eps = __builtin_bit_cast(float, eps_bits);
  if (cols % W == 0 && aligned16(x, w, b, y))
    layer_norm_rows<T, W, C>(x, w, b, y, rows, cols, group, eps, flags, smem);
  else
    layer_norm_rows<T, 1, C>(x, w, b, y, rows, cols, group, eps, flags, smem);
}

#define LAYER_NORM(name, T, C)                                                                                \
  KERNEL(BLOCK) void name(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,       \
                          T* __restrict__ y, u32 rows, u32 cols, u32 group, u32 eps, u32 flags) {          \
    layer_norm<T, C>(x, w, b, y, rows, cols, group, eps, flags);                                              \
  }
LAYER_NORM(layer_norm_f32, float, 8)
LAYER_NORM(layer_norm_f32_short, float, 4)
LAYER_NORM(layer_norm_f16, _Float16, 8)
LAYER_NORM(layer_norm_f16_short, _Float16, 4)
LAYER_NORM(layer_norm_bf16, bf16_t, 8)
LAYER_NORM(layer_norm_bf16_short, bf16_t, 4)
