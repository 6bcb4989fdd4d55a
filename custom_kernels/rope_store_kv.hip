// A decoder's attention inputs for one call (rocmc's rope_store_kv op): RoPE of the query and key heads of a
// fused q/k/v projection, the rotated queries written out and the keys (rotated) and values stored into the KV
// cache at each token's own slot and position, in one pass over qkv.
//
// qkv is (n tokens, H = hq + 2 hkv heads, d): query heads, then key heads, then value heads. A token (bi, ti)
// (n = b * t) has position p = pos[bi * pos_stride + ti] and slot s = slots[bi * slot_stride] (bi with FLAG_SLOTS
// clear); its key head h goes
// to cache[((k0 + s) * hkv + h) * S + p], its value head h to cache[((v0 + s) * hkv + h) * S + p] (each d elements;
// the cache is (E entries, hkv, S positions, d)), its query heads to q (n, hq, d). Positions and entries past the
// ends are clamped to them. Rotation as rope.hip: y0 = x0 * cos[p, i] - x1 * sin[p, i], y1 = x0 * sin[p, i] +
// x1 * cos[p, i] in f32, pairs (i, i + r) half-split or (2i, 2i + 1) interleaved, head dims past 2r copied.
//
// Work: every (token, head) row of d elements is split into d / U items of U elements, one item per thread; an
// item writes its own U outputs (a half-split item reads its partner vector r elements away: every thread writes
// once and no thread idles). Tables are f32, f16 or bf16 (FLAG_TAB_*), read element by element (they stay cached).
//
// Symbols: rope_store_kv_{half,interleaved}_{f32,f16,bf16}. ABI (bindings, push constants, FLAG_* bits, BLOCK):
// the "rope_store_kv" KernelFamily in rocmc/lowering/kernels.py. The cache binding is updated in place.
// Workgroup: BLOCK x 1 x 1. Grid: nblocks (any grid is correct).
#include "rocmc_gpu.h"
#include "kernel_abi.h"

struct StoreShape {
  u32 t, hq, hkv, d, r, S, E, P, k0, v0, pos_stride, slot_stride, flags;
};

// N table values from element i on, in f32 (one branch on the table's dtype for all of them).
template <int N> DEVICE void table_at(const void* tab, u32 flags, u64 i, float (&out)[N]) {
  if (flags & FLAG_TAB_F32) {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = ((const float*)tab)[i + k];
  } else if (flags & FLAG_TAB_F16) {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = to_f32(((const _Float16*)tab)[i + k]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = to_f32(((const bf16_t*)tab)[i + k]);
  }
}

template <typename T, int U, bool Interleaved>
DEVICE void rope_store_kv(const T* qkv, const void* cs, const void* sn, const u32* pos, const u32* slots, T* cache,
                          T* q, const StoreShape& s, u32 n, u32 nblocks) {
  const u32 H = s.hq + 2 * s.hkv, items = s.d / U, rot = 2 * s.r;
  const u32 total = n * H * items;
  for (u32 it = block_x() * BLOCK + thread_x(); it < total; it += nblocks * BLOCK) {
    u32 j = it % items, row = it / items, h = row % H, token = row / H;
    u32 bi = token / s.t, ti = token % s.t, i = j * U;
    const T* x = qkv + (u64)row * s.d;
    u32 p = read_index(pos, (u64)bi * s.pos_stride + ti, s.flags & FLAG_POS_I64, 0xffffffffu);
    T* y;
    if (h < s.hq) {
      y = q + ((u64)token * s.hq + h) * s.d;
    } else {
      u32 kv = h - s.hq, base = s.k0;
      if (kv >= s.hkv) kv -= s.hkv, base = s.v0;
      u32 last = s.E - 1 - base,
          slot = (s.flags & FLAG_SLOTS) ? read_index(slots, (u64)bi * s.slot_stride, s.flags & FLAG_SLOTS_I64, last)
                                        : (bi < last ? bi : last);
      u32 at = p < s.S ? p : s.S - 1;
      y = cache + (((u64)(base + slot) * s.hkv + kv) * s.S + at) * s.d;
    }
    Vec<T, U> a = load_vec<T, U>(x + i);
    if (h < s.hq + s.hkv && i < rot) {
      u64 trow = (u64)(p < s.P ? p : s.P - 1) * s.r;
      if constexpr (Interleaved) {
        constexpr int H = U / 2;
        float c[H], sv[H];
        table_at<H>(cs, s.flags, trow + i / 2, c);
        table_at<H>(sn, s.flags, trow + i / 2, sv);
#pragma unroll
        for (int k = 0; k < H; ++k) {
          float x0 = to_f32(a.v[2 * k]), x1 = to_f32(a.v[2 * k + 1]);
          a.v[2 * k] = from_f32<T>(x0 * c[k] - x1 * sv[k]);
          a.v[2 * k + 1] = from_f32<T>(x0 * sv[k] + x1 * c[k]);
        }
      } else {
        bool first = i < s.r;
        u32 m = first ? i : i - s.r;
        Vec<T, U> b = load_vec<T, U>(x + (first ? i + s.r : i - s.r));
        float c[U], sv[U], sign = first ? -1.0f : 1.0f;
        table_at<U>(cs, s.flags, trow + m, c);
        table_at<U>(sn, s.flags, trow + m, sv);
#pragma unroll
        for (int k = 0; k < U; ++k)  // first: own * c - other * s; second: other * s + own * c
          a.v[k] = from_f32<T>(to_f32(a.v[k]) * c[k] + sign * to_f32(b.v[k]) * sv[k]);
      }
    }
    store_vec<T, U>(y + i, a);
  }
}

template <typename T, bool Interleaved>
DEVICE void rope_store_kv(const T* qkv, const void* cs, const void* sn, const u32* pos, const u32* slots, T* cache,
                          T* q, const StoreShape& s, u32 n, u32 nblocks) {
  constexpr int W = Wide<T>::N;
  // 16-byte items need every row and half-row to start 16-byte aligned; else pairs (interleaved) or elements.
  if (s.d % W == 0 && s.r % W == 0 && aligned16(qkv, cache, q))
    rope_store_kv<T, W, Interleaved>(qkv, cs, sn, pos, slots, cache, q, s, n, nblocks);
  else
    rope_store_kv<T, Interleaved ? 2 : 1, Interleaved>(qkv, cs, sn, pos, slots, cache, q, s, n, nblocks);
}

#define ROPE_STORE_KV(name, interleaved, T)                                                                   \
  KERNEL(BLOCK) void name(KERNEL_PARAMS(T)) {                                                                 \
    StoreShape s{t, hq, hkv, d, r, S, E, P, k0, v0, pos_stride, slot_stride, flags};                        \
    rope_store_kv<T, interleaved>(qkv, cs, sn, pos, slots, cache, q, s, n, nblocks);                          \
  }
ROPE_STORE_KV(rope_store_kv_half_f32, false, float)
ROPE_STORE_KV(rope_store_kv_half_f16, false, _Float16)
ROPE_STORE_KV(rope_store_kv_half_bf16, false, bf16_t)
ROPE_STORE_KV(rope_store_kv_interleaved_f32, true, float)
ROPE_STORE_KV(rope_store_kv_interleaved_f16, true, _Float16)
ROPE_STORE_KV(rope_store_kv_interleaved_bf16, true, bf16_t)
