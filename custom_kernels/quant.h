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

// An entry point `name` of `entry` (linear_q_bits or linear_qm_bits), compiled for `occ` resident workgroups a
// multiprocessor (NVPTX; 0: no register limit).
#define LINEAR_Q(name, entry, T, occ)                                            \
  KERNEL_OCC(BLOCK, occ) void name(KERNEL_PARAMS(T)) {                           \
    QShape q{{M, N, K, flags, __builtin_bit_cast(float, eps)}, G, bits};        \
    const unsigned char* wb = (const unsigned char*)w;                          \
    if (bits == 4) entry<T, 4>(x, wb, scales, zeros, bias, residual, norm, y, q); \
    else entry<T, 8>(x, wb, scales, zeros, bias, residual, norm, y, q);         \
  }
