// Rotary position embedding. For a pair (x0, x1) at position p and pair index i:
//   y0 = x0 * cos[p, i] - x1 * sin[p, i],  y1 = x0 * sin[p, i] + x1 * cos[p, i]   (f32 arithmetic)
// Half-split ("neox") pairs are (i, i + r), interleaved pairs (2i, 2i + 1), for i < r = rotary_dim / 2; the
// head dims past rotary_dim are copied. x is (b, h, t, d) or, time-major, (b, t, h, d); every (b, h, t) row of
// d elements is split into items of U elements (U pairs when half-split, U/2 when interleaved, U copied
// elements past rotary_dim), one item per thread, grid-strided.
//
// Symbols: rope_half_{f32,f16,bf16}, rope_interleaved_{f32,f16,bf16} (x, cos, sin and y share the element type).
// ABI (bindings, push constants, FLAG_* bits, BLOCK): the "rope" KernelFamily in rocmc/lowering/kernels.py, which
// the build generates kernel_abi.h from.
// Table row of (batch bi, time ti): bi * table_stride + (FLAG_POS ? pos[bi * pos_stride + ti] : ti).
// Workgroup: BLOCK x 1 x 1. Grid: nblocks (the host sizes it for 16-byte items; any grid is correct).
#include "rocmc_gpu.h"
#include "kernel_abi.h"

struct RopeShape {
  u32 b, h, t, d, r, table_stride, pos_stride, flags;
};

// Element offset of row `row` (in memory order) in x, and the table offset of its position.
DEVICE void rope_row(const RopeShape& s, const u32* pos, u32 row, u64* x_off, u64* tab_off) {
  u32 bi, hi, ti;
  if (s.flags & FLAG_BSHD) {  // (b, t, h, d)
    hi = row % s.h;
    u32 q = row / s.h;
    ti = q % s.t;
    bi = q / s.t;
  } else {  // (b, h, t, d)
    ti = row % s.t;
    u32 q = row / s.t;
    hi = q % s.h;
    bi = q / s.h;
  }
  (void)hi;
  u32 p = ti;
  u64 at = (u64)bi * s.pos_stride + ti;
  if (s.flags & FLAG_POS) p = (s.flags & FLAG_POS_I64) ? pos[2 * at] : pos[at];  // i64 ids: the low word (little endian)
  u64 tab_row = (u64)bi * s.table_stride + p;
  *x_off = (u64)row * s.d;
  *tab_off = tab_row * s.r;
}

DEVICE void rotate(float x0, float x1, float c, float sn, float* y0, float* y1) {
  *y0 = x0 * c - x1 * sn;
  *y1 = x0 * sn + x1 * c;
}

// Half-split items: U pairs (i..i+U, i+r..i+r+U).
template <typename I, typename T, int U>
DEVICE void rope_half(const T* x, const T* cs, const T* sn, const u32* pos, T* y, const RopeShape& s, u32 nblocks) {
  u32 rot_items = s.r / U, items = s.d / U - rot_items;  // rot_items pairs of vectors, then copied vectors
  I total = (I)s.b * s.h * s.t * items;
  for (I it = (I)block_x() * BLOCK + thread_x(); it < total; it += (I)nblocks * BLOCK) {
    u32 row = (u32)(it / items), j = (u32)(it % items);
    u64 xo, to;
    rope_row(s, pos, row, &xo, &to);
    if (j < rot_items) {
      u32 i = j * U;
      Vec<T, U> a = load_vec<T, U>(x + xo + i), b = load_vec<T, U>(x + xo + i + s.r);
      Vec<T, U> c = load_vec<T, U>(cs + to + i), sv = load_vec<T, U>(sn + to + i), ya, yb;
#pragma unroll
      for (int k = 0; k < U; ++k) {
        float y0, y1;
        rotate(to_f32(a.v[k]), to_f32(b.v[k]), to_f32(c.v[k]), to_f32(sv.v[k]), &y0, &y1);
        ya.v[k] = from_f32<T>(y0);
        yb.v[k] = from_f32<T>(y1);
      }
      store_vec<T, U>(y + xo + i, ya);
      store_vec<T, U>(y + xo + i + s.r, yb);
    } else {
      u32 i = 2 * s.r + (j - rot_items) * U;
      store_vec<T, U>(y + xo + i, load_vec<T, U>(x + xo + i));
    }
  }
}

// Interleaved items: U consecutive elements = U/2 pairs (U even).
template <typename I, typename T, int U>
DEVICE void rope_interleaved(const T* x, const T* cs, const T* sn, const u32* pos, T* y, const RopeShape& s,
                             u32 nblocks) {
  u32 items = s.d / U, rot_items = 2 * s.r / U;
  I total = (I)s.b * s.h * s.t * items;
  for (I it = (I)block_x() * BLOCK + thread_x(); it < total; it += (I)nblocks * BLOCK) {
    u32 row = (u32)(it / items), j = (u32)(it % items), i = j * U;
    u64 xo, to;
    rope_row(s, pos, row, &xo, &to);
    Vec<T, U> a = load_vec<T, U>(x + xo + i);
    if (j < rot_items) {
      Vec<T, U / 2> c = load_vec<T, U / 2>(cs + to + i / 2), sv = load_vec<T, U / 2>(sn + to + i / 2);
#pragma unroll
      for (int k = 0; k < U / 2; ++k) {
        float y0, y1;
        rotate(to_f32(a.v[2 * k]), to_f32(a.v[2 * k + 1]), to_f32(c.v[k]), to_f32(sv.v[k]), &y0, &y1);
        a.v[2 * k] = from_f32<T>(y0);
        a.v[2 * k + 1] = from_f32<T>(y1);
      }
    }
    store_vec<T, U>(y + xo + i, a);
  }
}

template <typename T>
DEVICE void rope(bool interleaved, const T* x, const T* cs, const T* sn, const u32* pos, T* y, u32 b, u32 h, u32 t,
                 u32 d, u32 r, u32 table_stride, u32 pos_stride, u32 nblocks, u32 flags) {
  RopeShape s{b, h, t, d, r, table_stride, pos_stride, flags};
  constexpr int W = Wide<T>::N;
  // 16-byte items need every row, half-row and table row to start 16-byte aligned.
  bool wide = d % W == 0 && r % W == 0 && aligned16(x, cs, sn, y);
  // 32-bit item indices (64-bit division is a long software sequence) unless the tensor is too large.
  bool small = (u64)b * h * t * d + (u64)nblocks * BLOCK < (1ull << 32);
  if (interleaved) {
    if (wide && small) rope_interleaved<u32, T, W>(x, cs, sn, pos, y, s, nblocks);
    else if (small) rope_interleaved<u32, T, 2>(x, cs, sn, pos, y, s, nblocks);
    else rope_interleaved<u64, T, 2>(x, cs, sn, pos, y, s, nblocks);
  } else {
    if (wide && small) rope_half<u32, T, W>(x, cs, sn, pos, y, s, nblocks);
    else if (small) rope_half<u32, T, 1>(x, cs, sn, pos, y, s, nblocks);
    else rope_half<u64, T, 1>(x, cs, sn, pos, y, s, nblocks);
  }
}

#define ROPE(name, interleaved, T)                                                                          \
  KERNEL(BLOCK) void name(KERNEL_PARAMS(T)) {                                                               \
    rope<T>(interleaved, x, cs, sn, pos, y, b, h, t, d, r, table_stride, pos_stride, nblocks, flags);       \
  }
ROPE(rope_half_f32, false, float)
ROPE(rope_half_f16, false, _Float16)
ROPE(rope_half_bf16, false, bf16_t)
ROPE(rope_interleaved_f32, true, float)
ROPE(rope_interleaved_f16, true, _Float16)
ROPE(rope_interleaved_bf16, true, bf16_t)
