// quant.h: what the quantized linear kernels share (linear_q.hip on the vector units, linear_qm.hip on the matrix
// units): the shape they are dispatched with, unaligned 16-byte loads of packed bytes, exact conversion of packed
// values to f32, and the entry point's dispatch on the bit width. The ABI: the "linear_q" / "linear_qm"
// KernelFamily (rocmc/lowering/kernels.py), one list of bindings and constants for both.
#pragma once
#include "linear.h"

struct QShape {
  LinShape s;
  u32 G, bits;
};

// 16 bytes of w from p, unaligned: byte by byte (out of line, as load8_edge).
__attribute__((device, noinline)) static U4 load16_bytes(const unsigned char* p) {
  u32 h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = p[4 * i] | p[4 * i + 1] << 8 | p[4 * i + 2] << 16 | (u32)p[4 * i + 3] << 24;
  return U4{h[0], h[1], h[2], h[3]};
}

// Byte i of w as f32, exactly. NVIDIA: one byte permutation puts it under the exponent of 2^23 (0x4B0000bb),
// then 2^23 is subtracted (integer to float conversions run at a quarter of the FMA rate); AMD: v_cvt_f32_ubyte<i>.
DEVICE float byte_value(u32 w, int i) {
#if defined(__NVPTX__)
  u32 d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(w), "r"(0x4B000000u), "r"(0x7540u | (u32)i));
  return __builtin_bit_cast(float, d) - 8388608.0f;
#else
  return (float)((w >> (8 * i)) & 0xFFu);
#endif
}

// Values j * 8 .. j * 8 + 7 of a piece (h: its 4 words) as f32. 4-bit: word j's even nibbles are the bytes of
// w & 0x0F0F0F0F, its odd ones those of (w >> 4) & 0x0F0F0F0F; 8-bit: words 2j and 2j + 1, a byte each.
template <int BITS> DEVICE void values8(const u32 (&h)[4], int j, float (&q)[8]) {
  if (BITS == 4) {
    const u32 lo = h[j] & 0x0F0F0F0Fu, hi = (h[j] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int e = 0; e < 8; ++e) q[e] = byte_value(e % 2 ? hi : lo, e / 2);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) q[e] = byte_value(h[2 * j + e / 4], e % 4);
  }
}

// ---- f16 pairs: the packed values as (1024 + q) by their bits, two a register ------------------------------------
// 0x6400 | q is the f16 1024 + q for q < 1024; a high nibble's 0x6400 | 16 q is 1024 + 16 q, times 1/16 minus 64 is
// q. The pairs come out of a word in another order than k's (4-bit: values 0 and 4, 1 and 5, ...; 8-bit: 0 and 2, 1
// and 3, ...); x_order puts x's 8 values in that order too (a dot product does not care in which order its terms
// come).
DEVICE u32 lo_pair(u32 a, u32 b) { return (a & 0xFFFFu) | (b << 16); }  // (a's low half, b's low half)
DEVICE u32 hi_pair(u32 a, u32 b) { return (a >> 16) | (b & 0xFFFF0000u); }

// x's 8 elements (k order, raw 16-bit values) in the order q_pairs gives the weights'.
template <int BITS> DEVICE U4 x_order(const U4& v) {
  if (BITS == 4) return U4{lo_pair(v.x, v.z), hi_pair(v.x, v.z), lo_pair(v.y, v.w), hi_pair(v.y, v.w)};
  return U4{lo_pair(v.x, v.y), hi_pair(v.x, v.y), lo_pair(v.z, v.w), hi_pair(v.z, v.w)};
}

// Chunk j (values 8j .. 8j + 7) of a piece (h: its 4 words) as q - zi in 4 f16 pairs, x_order's order: exact for an
// integer zi in [0, 2^BITS) (every value an integer below 2^11).
template <int BITS> DEVICE void q_pairs(const u32 (&h)[4], int j, float zi, h2_t (&q)[4]) {
  const h2_t base = splat_h2(1024.0f + zi);
  if (BITS == 4) {
    const h2_t sixteenth = splat_h2(0.0625f), high = splat_h2(-64.0f - zi);
    const u32 a = h[j], b = a >> 8;
    q[0] = as_h2((a & 0x000F000Fu) | 0x64006400u) - base;
    q[1] = __builtin_elementwise_fma(as_h2((a & 0x00F000F0u) | 0x64006400u), sixteenth, high);
    q[2] = as_h2((b & 0x000F000Fu) | 0x64006400u) - base;
    q[3] = __builtin_elementwise_fma(as_h2((b & 0x00F000F0u) | 0x64006400u), sixteenth, high);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = as_h2(((h[2 * j + i / 2] >> (8 * (i % 2))) & 0x00FF00FFu) | 0x64006400u) - base;
  }
}

// An entry point `name` of `entry` (linear_q_bits or linear_qm_bits), compiled for `occ` resident workgroups a
// multiprocessor (NVPTX; 0: no register limit).
#define LINEAR_Q(name, entry, T, occ)                                            \
  KERNEL_OCC(BLOCK, occ) void name(KERNEL_PARAMS(T)) {                           \
    QShape q{{M, N, K, flags, __builtin_bit_cast(float, eps)}, G, bits};        \
    const unsigned char* wb = (const unsigned char*)w;                          \
    if (bits == 4) entry<T, 4>(x, wb, scales, zeros, bias, residual, norm, y, q); \
    else entry<T, 8>(x, wb, scales, zeros, bias, residual, norm, y, q);         \
  }
