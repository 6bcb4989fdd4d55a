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

// Tuning switches, set with -D by bench/kernel_sweep.py to compare versions; the defaults are the measured best
// (BENCHMARKS.md, "Hand-written kernels").
// ROCMC_STREAM: 0 plain accesses; 1 streaming (evict-first) stores of y; 2 streaming loads of x as well.
// ROCMC_SYNC1: 1 one barrier per cross-wave reduction (each reduction has its own shared-memory slots); 0 two.
// ROCMC_SHORT_MIN_BLOCKS: resident blocks per multiprocessor the C = 4 kernels are compiled for (NVPTX; 0: any).
// ROCMC_PREFETCH: 1 lets a group work through several rows (grids of fewer groups than rows), loading the next
//                 row before working on the current one.
// ROCMC_LN_ONEPASS: LayerNorm reduces shifted sums of x and x^2 together (one visit of the registers, one
//                   reduction) instead of the mean and then the centred sum of squares: 0 never, 1 for 16-bit
//                   storage types (the error it may add stays under their rounding, see layer_norm.hip), 2 always.
#ifndef ROCMC_STREAM
#define ROCMC_STREAM 0
#endif
#ifndef ROCMC_SYNC1
#define ROCMC_SYNC1 1
#endif
#ifndef ROCMC_SHORT_MIN_BLOCKS
#define ROCMC_SHORT_MIN_BLOCKS 0
#endif
#ifndef ROCMC_PREFETCH
#define ROCMC_PREFETCH 0
#endif
#ifndef ROCMC_LN_ONEPASS
#define ROCMC_LN_ONEPASS 1
#endif

// The entry-point attributes of a norm kernel with register cache C.
#define ROW_KERNEL(C) KERNEL_OCC(BLOCK, (C) == 4 ? ROCMC_SHORT_MIN_BLOCKS : 0)

// Row data is read and written once: the streaming variants of the vector accesses, per ROCMC_STREAM.
template <typename T, int N> DEVICE Vec<T, N> load_row(const T* p) {
  if constexpr (ROCMC_STREAM >= 2) return load_vec_cs<T, N>(p);
  else return load_vec<T, N>(p);
}
template <typename T, int N> DEVICE void store_row(T* p, const Vec<T, N>& x) {
  if constexpr (ROCMC_STREAM >= 1) store_vec_cs<T, N>(p, x);
  else store_vec<T, N>(p, x);
}

// Shared-memory slots of one cross-wave reduction of K floats.
template <int K> struct SumSlots {
  float v[K][BLOCK / WAVE];
};

// Sum each of v[0..K-1] over the `group` threads that share a row. Every thread of the workgroup must call it
// (it holds a barrier when a group spans several waves); `slots` must not be read by another reduction
// that may still be in flight (give each reduction of a kernel its own).
template <int K> DEVICE void group_sum(float (&v)[K], u32 group, SumSlots<K>* slots) {
  u32 width = group < WAVE ? group : WAVE;
  for (u32 off = width >> 1; off > 0; off >>= 1) {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] += shfl_xor(v[k], off);
  }
  if (group <= WAVE) return;
  u32 tid = thread_x();
  if (!ROCMC_SYNC1) sync_threads();  // earlier readers of the slots are done
  if ((tid & (WAVE - 1)) == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) slots->v[k][tid / WAVE] = v[k];
  }
  sync_threads();
  u32 waves = group / WAVE, first = (tid / group) * waves;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float s = 0.0f;
    for (u32 i = 0; i < waves; ++i) s += slots->v[k][first + i];
    v[k] = s;
  }
}

DEVICE float group_sum(float v, u32 group, SumSlots<1>* slots) {
  float a[1] = {v};
  group_sum<1>(a, group, slots);
  return a[0];
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

  // Vectors past the row's end load its last vector instead (never used): C unconditional loads, which the
  // scheduler issues back to back, where per-vector branches let it delay some behind the first one's use.
  DEVICE_MEMBER void load(const T* row, u32 cols, u32 group, u32 lane, bool active) {
    if (!active || cols < N) return;
#pragma unroll
    for (int k = 0; k < C; ++k) {
      u32 i = (k * group + lane) * N;
      v[k] = load_row<T, N>(row + (i < cols ? i : cols - N));
    }
  }
};

// Runs f(slot, cache, slots) for the row of the thread's group: row block_x * (BLOCK / group) + tid / group.
// With ROCMC_PREFETCH, then for every grid-wide stride after it (for grids of fewer groups than rows), each
// next row loaded before the current one is worked on. The trip count is the same for the whole workgroup,
// as the barriers in f require; reductions alternate between slots[0] and slots[1], so one round's writers
// never overtake the previous round's readers.
template <typename T, int N, int C, typename S, typename F>
DEVICE void for_rows(const T* x, u32 rows, u32 cols, u32 group, S* slots, F f) {
  RowSlot s = row_slot(rows, group);
  RowCache<T, N, C> c;
  c.load(x + (u64)s.row * cols, cols, group, s.lane, s.active);
  if constexpr (!ROCMC_PREFETCH) {
    f(s, c, slots);
  } else {
    u32 per_block = BLOCK / group, stride = grid_x() * per_block;
    for (u32 round = 0, first = block_x() * per_block;; ++round) {
      RowSlot n = {s.row + stride, s.lane, s.row + stride < rows};
      RowCache<T, N, C> next;
      next.load(x + (u64)n.row * cols, cols, group, n.lane, n.active);
      f(s, c, slots + (round & 1));
      first += stride;
      if (first >= rows || stride == 0) break;
      s = n;
      c = next;
    }
  }
}

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

// One pass over a thread's share of a row: `f(vec)` for the cached vectors and the streamed rest.
template <typename T, int N, int C, typename F>
DEVICE void row_visit(const RowCache<T, N, C>& c, const T* row, u32 cols, u32 group, u32 lane, bool active, F f) {
#pragma unroll
  for (int k = 0; k < C; ++k) {
    u32 i = (k * group + lane) * N;
    if (active && i < cols) f(c.v[k]);
  }
  for (u32 i = (C * group + lane) * N; active && i < cols; i += group * N)
    f(load_vec<T, N>(row + i));  // read again later: not streamed
}

// The sum of `f(vec)` over one pass.
template <typename T, int N, int C, typename F>
DEVICE float row_pass(const RowCache<T, N, C>& c, const T* row, u32 cols, u32 group, u32 lane, bool active, F f) {
  float acc = 0.0f;
  row_visit(c, row, cols, group, lane, active, [&](const Vec<T, N>& v) { acc += f(v); });
  return acc;
}

// Final pass: y[i] = g(x[i], i) for the thread's share of the row (cached part from registers).
template <typename T, int N, int C, typename G>
DEVICE void row_write(const RowCache<T, N, C>& c, const T* row, T* out, u32 cols, u32 group, u32 lane, bool active,
                      G g) {
#pragma unroll
  for (int k = 0; k < C; ++k) {
    u32 i = (k * group + lane) * N;
    if (active && i < cols) store_row<T, N>(out + i, g(c.v[k], i));
  }
  for (u32 i = (C * group + lane) * N; active && i < cols; i += group * N)
    store_row<T, N>(out + i, g(load_row<T, N>(row + i), i));
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
