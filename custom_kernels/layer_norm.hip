// LayerNorm over rows: y = (x - mean) / sqrt(var + eps) * w + b, biased variance, computed in f32 from the
// row held in registers (row_moments: f32 rows in two passes, mean then centred squares; 16-bit rows in one,
// shifted sums of x and x^2).
//
// Symbols: layer_norm_{f32,f16,bf16} (any row; 8 vectors a thread in registers) and layer_norm_{f32,f16,bf16}_short
// (4 vectors: fewer registers, more threads resident; the host picks it for rows of up to 4 * BLOCK vectors).
// x, w, b and y share the element type.
// ABI (bindings, push constants, FLAG_* bits, BLOCK): the "layer_norm" KernelFamily in rocmc/lowering/kernels.py,
// which the build generates kernel_abi.h from (included by rows.h).
// Workgroup: BLOCK x 1 x 1. Grid: ceil(rows / (BLOCK / group)) x 1 x 1.
#include "rows.h"

// Shared memory of the reductions: two of one float (mean, then variance) or one of two (shifted sums).
typedef SumSlots<2> LayerNormSlots;

struct Moments {
  float mean, inv_std;
};

// Mean and 1/sqrt(var + eps) of each group's row.
template <typename T, int N, int C>
DEVICE Moments row_moments(const RowCache<T, N, C>& c, const T* xr, u32 cols, u32 group, const RowSlot& s, float eps,
                           LayerNormSlots* slots) {
  float n = (float)cols;
  if constexpr (ROCMC_LN_ONEPASS == 2 || (ROCMC_LN_ONEPASS == 1 && sizeof(T) == 2)) {
    // One visit, one reduction: sums of d = x - K and d^2 with K = the row's first element, var = mean(d^2) -
    // mean(d)^2. The shift keeps a large |mean| from cancelling (a row of mean 300 and deviation 1 is as exact
    // as the two-pass form); what cancels is (K - mean)^2 against var, and since K is one of the row's own
    // elements, (K - mean)^2 <= cols * var: the relative error of var is at most ~cols * 2^-24 (4096 columns:
    // 2.4e-4, with K an extreme outlier), under the rounding of a 16-bit result (bf16 2^-9, f16 2^-11) but
    // not of an f32 one, which therefore keeps the two passes by default.
    float k = s.active ? to_f32(xr[0]) : 0.0f;
    float m[2] = {0.0f, 0.0f};
    row_visit(c, xr, cols, group, s.lane, s.active, [&](const Vec<T, N>& v) {
      m[0] += sum_vec(v, k);
      m[1] += sumsq_vec(v, k);
    });
    group_sum<2>(m, group, slots);
    float d = m[0] / n, var = m[1] / n - d * d;
    return {k + d, rsqrt_f32(__builtin_fmaxf(var, 0.0f) + eps)};
  } else {
    // Two passes over the registers: the mean, then the centred sum of squares (no cancellation at all).
    SumSlots<1>* one = reinterpret_cast<SumSlots<1>*>(slots->v[0]);
    SumSlots<1>* two = reinterpret_cast<SumSlots<1>*>(slots->v[1]);
    float sum = row_pass(c, xr, cols, group, s.lane, s.active, [](const Vec<T, N>& v) { return sum_vec(v, 0.0f); });
    float mean = group_sum(sum, group, one) / n;
    float sq = row_pass(c, xr, cols, group, s.lane, s.active, [&](const Vec<T, N>& v) { return sumsq_vec(v, mean); });
    return {mean, rsqrt_f32(group_sum(sq, group, two) / n + eps)};
  }
}

template <typename T, int N, int C>
DEVICE void layer_norm_rows(const T* x, const T* w, const T* b, T* y, u32 rows, u32 cols, u32 group, float eps,
                            u32 flags, LayerNormSlots* slots) {
  for_rows<T, N, C>(x, rows, cols, group, slots, [&](const RowSlot& s, const RowCache<T, N, C>& c, LayerNormSlots* sl) {
    const T* xr = x + (u64)s.row * cols;
    Moments mo = row_moments(c, xr, cols, group, s, eps, sl);
    row_write(c, xr, y + (u64)s.row * cols, cols, group, s.lane, s.active, [&](const Vec<T, N>& v, u32 i) {
      float wf[N], bf[N], o[N];
      column_f32<T, N>(w, flags & FLAG_W, i, 1.0f, wf);
      column_f32<T, N>(b, flags & FLAG_B, i, 0.0f, bf);
#pragma unroll
      for (int j = 0; j < N; ++j) o[j] = (to_f32(v.v[j]) - mo.mean) * mo.inv_std * wf[j] + bf[j];
      return round_vec<T, N>(o);
    });
  });
}

template <typename T, int C>
DEVICE void layer_norm(const T* x, const T* w, const T* b, T* y, u32 rows, u32 cols, u32 group, u32 eps_bits,
                       u32 flags) {
  SHARED LayerNormSlots slots[2];
  constexpr int W = Wide<T>::N;
  float eps = __builtin_bit_cast(float, eps_bits);
  if (cols % W == 0 && aligned16(x, w, b, y))
    layer_norm_rows<T, W, C>(x, w, b, y, rows, cols, group, eps, flags, slots);
  else
    layer_norm_rows<T, 1, C>(x, w, b, y, rows, cols, group, eps, flags, slots);
}

#define LAYER_NORM(name, T, C)                                                                                \
  ROW_KERNEL(C) void name(KERNEL_PARAMS(T)) { layer_norm<T, C>(x, w, b, y, rows, cols, group, eps, flags); }
LAYER_NORM(layer_norm_f32, float, 8)
LAYER_NORM(layer_norm_f32_short, float, 4)
LAYER_NORM(layer_norm_f16, _Float16, 8)
LAYER_NORM(layer_norm_f16_short, _Float16, 4)
LAYER_NORM(layer_norm_bf16, bf16_t, 8)
LAYER_NORM(layer_norm_bf16_short, bf16_t, 4)
