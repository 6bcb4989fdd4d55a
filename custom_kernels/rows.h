// rows.h: shared machinery of the row-wise kernels (RMSNorm, LayerNorm).
//
// A workgroup of BLOCK threads is split into groups of `group` threads (a power of two in [1, BLOCK], chosen
// by the host from the row length); each group owns one row. Short rows thus share a workgroup, long rows
// get all of it. Every thread keeps up to C vectors of its row in registers (C is a template parameter:
// each kernel comes in a C = 4 variant, for rows of up to 4 vectors a thread, whose fewer registers allow
// more resident threads, and a C = 8 variant for any row), so a row that fits (group * C * vector width
// elements) is read from memory exactly once; the rest of a longer row is streamed again for each pass.
#pragma once
#include "rocmc_gpu.h"

#define BLOCK 256

// Sum `v` over the `group` threads that share a row. Every thread of the workgroup must call it (it holds
// barriers when a group spans several waves); `smem` holds BLOCK / WAVE floats.
DEVICE float group_sum(float v, u32 group, float* smem) {
  u32 width = group < WAVE ? group : WAVE;
  for (u32 off = width >> 1; off > 0; off >>= 1) v += shfl_xor(v, off);
  if (group <= WAVE) return v;
  u32 tid = thread_x();
  sync_threads();  // earlier readers of smem are done
  if ((tid & (WAVE - 1)) == 0) smem[tid / WAVE] = v;
  sync_threads();
  u32 waves = group / WAVE, first = (tid / group) * waves;
  float s = 0.0f;
  for (u32 i = 0; i < waves; ++i) s += smem[first + i];
  return s;
}

// Where one thread works: its row (when `active`) and its lane within the row's group.
struct RowSlot {
  u32 row, lane;
  bool active;
};

DEVICE RowSlot row_slot(u32 rows, u32 group) {
  u32 tid = thread_x();
  RowSlot s;
  s.row = block_x() * (BLOCK / group) + tid / group;
  s.lane = tid & (group - 1);
  s.active = s.row < rows;
  return s;
}

// The part of a row one thread holds in registers: vectors k = 0..C-1 at element (k*group + lane)*N.
template <typename T, int N, int C> struct RowCache {
  Vec<T, N> v[C];

  DEVICE_MEMBER void load(const T* row, u32 cols, u32 group, u32 lane, bool active) {
#pragma unroll
    for (int k = 0; k < C; ++k) {
      u32 i = (k * group + lane) * N;
      if (active && i < cols) v[k] = load_vec<T, N>(row + i);
    }
  }
};

template <typename T, int N> DEVICE float sum_vec(const Vec<T, N>& x, float shift) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j) s += to_f32(x.v[j]) - shift;
  return s;
}

template <typename T, int N> DEVICE float sumsq_vec(const Vec<T, N>& x, float shift) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    float d = to_f32(x.v[j]) - shift;
    s += d * d;
  }
  return s;
}

// One pass over a thread's share of a row: `f(vec)` summed over the cached vectors and the streamed rest.
template <typename T, int N, int C, typename F>
DEVICE float row_pass(const RowCache<T, N, C>& c, const T* row, u32 cols, u32 group, u32 lane, bool active, F f) {
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < C; ++k) {
    u32 i = (k * group + lane) * N;
    if (active && i < cols) acc += f(c.v[k]);
  }
  for (u32 i = (C * group + lane) * N; active && i < cols; i += group * N) acc += f(load_vec<T, N>(row + i));
  return acc;
}

// Final pass: y[i] = g(x[i], i) for the thread's share of the row (cached part from registers).
template <typename T, int N, int C, typename G>
DEVICE void row_write(const RowCache<T, N, C>& c, const T* row, T* out, u32 cols, u32 group, u32 lane, bool active,
                      G g) {
#pragma unroll
  for (int k = 0; k < C; ++k) {
    u32 i = (k * group + lane) * N;
    if (active && i < cols) store_vec<T, N>(out + i, g(c.v[k], i));
  }
  for (u32 i = (C * group + lane) * N; active && i < cols; i += group * N)
    store_vec<T, N>(out + i, g(load_vec<T, N>(row + i), i));
}

// An optional per-column vector (weight, bias): its N values at column i, or `fallback` when absent.
template <typename T, int N> DEVICE void column_f32(const T* p, bool present, u32 i, float fallback, float* out) {
  if (present) {
    Vec<T, N> w = load_vec<T, N>(p + i);
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = to_f32(w.v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = fallback;
  }
}
