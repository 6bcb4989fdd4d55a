// Quantized linear layers of one or two rows: a decode step's projections over 4- or 8-bit weights (rocmc's
// quantized_linear when x has at most QMAX_M rows), on the vector units. The packed bytes are what streams from
// memory; each is dequantized in registers on its way into the dot products, never stored.
//
// y (M, N) = epilogue(x (M, K) @ W^T), W[n, k] = (q[n, k] - zeros[n, g]) * scales[n, g], g = k / (K / G): q the
// unsigned `bits`-bit values of w (N, K * bits / 8) bytes (8-bit: a byte each; 4-bit: two a byte, k even in the
// low nibble), scales and zeros (N, G) in x's type. With FLAG_GATED w has 2N rows (the gate's, then the up's) and
// scales and zeros 2N rows likewise. The epilogue is linear_rows.hip's (linear.h): bias, residual add, activation,
// act(gate) * up, FLAG_NORM's RMSNorm of x, rounded as the separate ops round.
//
// Work: a workgroup takes QROWS rows of w (gated: QROWS / 2 outputs, each a gate row and its up row), a wave WR of
// them. A lane reads 16 contiguous bytes of a row at a time (a piece: V = 128 / bits values, all in one group: the
// host admits group sizes that are multiples of V), QU pieces of each of its rows in flight with their scales and
// zeros. A group's scale and zero factor out of its values' sum: sum_k (q_k - z) s x_k = s (sum_k q_k x_k - z sum_k
// x_k); the piece's sum of x serves every row of w. 8-bit: a value costs a byte permutation or conversion (byte_value) and one f32 FMA a row of
// x. 4-bit: two values at a time in f16 pairs, q - round(z) made exact by its bits (q_pairs) and x's 8 values
// scaled by a power of two (x_pairs), four pair FMAs a chunk of 8 before the sum goes to f32; the zero's fraction
// stays in the f32 correction.
// x (and the norm) come through the caches: every wave reads them whole, so with FLAG_NORM each wave has its rows'
// sums of squares (as linear_vec).
//
// Symbols: linear_q_{f16,bf16}. ABI (bindings, push constants, FLAG_* bits, BLOCK): the "linear_q" KernelFamily in
// rocmc/lowering/kernels.py. Workgroup: BLOCK x 1 x 1. Grid: ceil(N / (QROWS, or QROWS / 2 when gated)), QROWS =
// 4 rows a wave times the workgroup's waves. The host admits K a multiple of V, a group size a multiple of V,
// M <= QMAX_M; w and x may be unaligned (element loads).
// It needs no matrix instructions and builds for every architecture.
#include "quant.h"

#ifndef QWR
#define QWR 4  // rows of w a wave: a piece of x (and its sum) serves 4 rows
#endif
#define QROWS (QWR * NW)  // rows of w a workgroup: 16 (NVIDIA, RDNA), 8 (CDNA's 64-wide waves)
#define QMAX_M 2  // rows of x
// Pieces of each row a lane loads together: 8-bit 2 on 32-wide waves, else 1 (an H200 sweep, bench/quant_sweep.py:
// 4-bit 2 rows 1.3x faster at 1 than at 2, one row the same; 8-bit one row 1.1x faster at 2).
#ifndef QU4
#define QU4 1
#endif
#ifndef QU8
#define QU8 (WAVE == 64 ? 1 : 2)
#endif

// sum_e a[e] * b[e] and sum_e b[e] in four independent chains, so the FMAs of a word do not wait on each other
// (one chain of 32 a piece made the kernel latency-bound).
DEVICE float dot8(const float (&a)[8], const float (&b)[8]) {
  float c[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) c[e] = a[e + 4] * b[e + 4] + a[e] * b[e];
  return (c[0] + c[1]) + (c[2] + c[3]);
}
DEVICE float sum8(const float (&b)[8]) {
  return ((b[0] + b[4]) + (b[1] + b[5])) + ((b[2] + b[6]) + (b[3] + b[7]));
}

// 4-bit products in f16 pairs (x_pairs, q_pairs; 0: through f32 as 8-bit's). 8-bit stays in f32: its pairs were
// 1.05-1.1x slower at one row on an H200 (bench/quant_sweep.py).
#ifndef ROCMC_Q_H2
#define ROCMC_Q_H2 1
#endif

// 8 values of an x row (f, f32) as 4 f16 pairs in x_order's order, scaled by a power of two p so that every |f p|
// < 4, and ip = 1 / p: products with |q - round(z)| < 2^BITS and their sums of four stay far inside f16's range
// whatever x holds. f16 and bf16 values are exact in f16 after the scaling (those 2^14 times smaller than the
// largest round).
template <int BITS> DEVICE void x_pairs(const float (&f)[8], h2_t (&xp)[4], float& ip) {
  float m = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) m = __builtin_fmaxf(m, __builtin_fabsf(f[e]));
  u32 e = __builtin_bit_cast(u32, m) >> 23;  // m's biased exponent: m < 2^(e - 126)
  e = e < 1u ? 1u : e > 253u ? 253u : e;
  const float p = __builtin_bit_cast(float, (254u - e) << 23);  // 2^(127 - e)
  ip = __builtin_bit_cast(float, e << 23);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int lo = BITS == 4 ? i : (i / 2) * 4 + i % 2, hi = lo + (BITS == 4 ? 4 : 2);
    xp[i] = h2_t{(_Float16)(f[lo] * p), (_Float16)(f[hi] * p)};
  }
}

template <typename T, int BITS, int MB, bool NORM>
DEVICE void linear_q(const T* x, const unsigned char* w, const T* scales, const T* zeros, const T* bias, const T* res,
                     const T* norm, T* y, const QShape& q) {
  const LinShape& s = q.s;
  constexpr int V = 128 / BITS;             // values a piece
  constexpr int WR = QWR;                   // rows of w a wave
  constexpr int QU = BITS == 4 ? QU4 : QU8;  // pieces of each row a lane loads together
  constexpr bool H2 = ROCMC_Q_H2 && BITS == 4;
  static_assert(WR >= 2 && WR % 2 == 0, "a wave takes gate and up rows in pairs");
  const bool gated = s.flags & FLAG_GATED;  // not a template parameter: one body serves both (smaller PTX)
  const u32 outs = gated ? WR / 2 : WR;     // the wave's outputs
  const u32 wave = thread_x() / WAVE, lane = thread_x() % WAVE;
  const u32 o0 = (block_x() * NW + wave) * outs;
  const u32 pieces = s.K / V, rows_w = gated ? 2 * s.N : s.N, gs = s.K / q.G, row_bytes = s.K / 8 * BITS;
  const bool wide = aligned16(x, norm), wide_w = aligned16(w, w);
  u32 wrow[WR];  // row r of the wave: output o0 + r, or (gated) the up row of output o0 + r - outs; rows_w past N
#pragma unroll
  for (int r = 0; r < WR; ++r) {
    const u32 o = o0 + ((u32)r < outs ? r : r - outs);
    wrow[r] = o >= s.N ? rows_w : (u32)r < outs ? o : s.N + o;
  }
  float acc[WR][MB], ss[MB];
#pragma unroll
  for (int b = 0; b < MB; ++b) {
    ss[b] = 0.0f;
#pragma unroll
    for (int r = 0; r < WR; ++r) acc[r][b] = 0.0f;
  }
  // A set of pieces in registers: QU pieces of each of the wave's rows, with their groups' scales and zeros (loaded
  // with the bytes, so the products wait on one round trip to memory, not two).
  struct Pieces {
    U4 w[QU][WR];
    T sc[QU][WR], z[QU][WR];
  };
  auto load = [&](u32 p0, Pieces& set) __attribute__((always_inline)) {
#pragma unroll
    for (int u = 0; u < QU; ++u) {
      const u32 p = p0 + u * WAVE;
#pragma unroll
      for (int r = 0; r < WR; ++r) {
        if (p >= pieces || wrow[r] >= rows_w) {
          set.w[u][r] = U4{0u, 0u, 0u, 0u};
          set.sc[u][r] = set.z[u][r] = from_f32<T>(0.0f);
          continue;
        }
        const unsigned char* at = w + (u64)wrow[r] * row_bytes + (u64)p * 16;
        set.w[u][r] = wide_w ? load_cs<U4>((const U4*)at) : load16_bytes(at);
        const u64 g = (u64)wrow[r] * q.G + p * V / gs;
        set.sc[u][r] = scales[g];
        set.z[u][r] = zeros[g];
      }
    }
  };
  auto products = [&](u32 p0, const Pieces& set) __attribute__((always_inline)) {
#pragma unroll
    for (int u = 0; u < QU; ++u) {
      const u32 p = p0 + u * WAVE, k = p * V;
      if (p >= pieces) continue;
      float sc[WR], zr[WR], zi[WR], dot[WR][MB], xs[MB];
#pragma unroll
      for (int r = 0; r < WR; ++r) {
        sc[r] = to_f32(set.sc[u][r]);
        zr[r] = to_f32(set.z[u][r]);
        // f16 pairs: the zero's integer part goes into the pairs, the rest (zr) into the group's correction
        zi[r] = H2 ? __builtin_fminf(__builtin_fmaxf(__builtin_rintf(zr[r]), 0.0f), (float)((1 << BITS) - 1)) : 0.0f;
        zr[r] -= zi[r];
#pragma unroll
        for (int b = 0; b < MB; ++b) dot[r][b] = 0.0f;
      }
#pragma unroll
      for (int b = 0; b < MB; ++b) xs[b] = 0.0f;
#pragma unroll
      for (int j = 0; j < V / 8; ++j) {
        float f[MB][8];
#pragma unroll
        for (int b = 0; b < MB; ++b) {
          unpack8<T>(load8(x, (u32)b, s.M, k + 8 * j, s.K, wide, false), f[b]);
          if (NORM) normalize8<T>(f[b], load8(norm, 0u, 1u, k + 8 * j, s.K, wide, false), ss[b]);
          xs[b] += sum8(f[b]);
        }
        if constexpr (H2) {
          h2_t xp[MB][4];
          float ip[MB];
#pragma unroll
          for (int b = 0; b < MB; ++b) x_pairs<BITS>(f[b], xp[b], ip[b]);
#pragma unroll
          for (int r = 0; r < WR; ++r) {
            const u32 h[4] = {set.w[u][r].x, set.w[u][r].y, set.w[u][r].z, set.w[u][r].w};
            h2_t qv[4];
            q_pairs<BITS>(h, j, zi[r], qv);
#pragma unroll
            for (int b = 0; b < MB; ++b) {
              h2_t d = qv[0] * xp[b][0];
#pragma unroll
              for (int i = 1; i < 4; ++i) d = __builtin_elementwise_fma(qv[i], xp[b][i], d);
              dot[r][b] += ((float)d.x + (float)d.y) * ip[b];
            }
          }
        } else {
#pragma unroll
          for (int r = 0; r < WR; ++r) {
            const u32 h[4] = {set.w[u][r].x, set.w[u][r].y, set.w[u][r].z, set.w[u][r].w};
            float qv[8];
            values8<BITS>(h, j, qv);
#pragma unroll
            for (int b = 0; b < MB; ++b) dot[r][b] += dot8(qv, f[b]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < WR; ++r)
#pragma unroll
        for (int b = 0; b < MB; ++b) acc[r][b] += sc[r] * (dot[r][b] - zr[r] * xs[b]);
    }
  };
  Pieces set;
  for (u32 p0 = lane; p0 < pieces; p0 += WAVE * QU) {
    load(p0, set);
    products(p0, set);
  }
  // Every lane ends with the wave's sums; lane r * MB + b stores output (o0 + r, row b).
#pragma unroll
  for (int b = 0; b < MB; ++b) {
    const float rs = NORM ? inv_rms(wave_sum(ss[b]), s) : 1.0f;
#pragma unroll
    for (int r = 0; r < WR; ++r) acc[r][b] = wave_sum(acc[r][b]);
#pragma unroll
    for (int r = 0; r < WR; ++r)
      if ((u32)r < outs && lane == (u32)(r * MB + b) && (u32)b < s.M && o0 + r < s.N)
        store_out<T>(acc[r][b], gated ? acc[(r + WR / 2) % WR][b] : 0.0f, gated, rs, b, o0 + r, bias, res, y, s);
  }
}

template <typename T, int BITS, bool NORM>
DEVICE void linear_q_mb(const T* x, const unsigned char* w, const T* sc, const T* z, const T* bias, const T* res,
                        const T* norm, T* y, const QShape& q) {
  if (q.s.M <= 1) linear_q<T, BITS, 1, NORM>(x, w, sc, z, bias, res, norm, y, q);
  else linear_q<T, BITS, QMAX_M, NORM>(x, w, sc, z, bias, res, norm, y, q);  // the host admits M <= QMAX_M
}

template <typename T, int BITS>
DEVICE void linear_q_bits(const T* x, const unsigned char* w, const T* sc, const T* z, const T* bias, const T* res,
                          const T* norm, T* y, const QShape& q) {
  if (q.s.flags & FLAG_NORM) linear_q_mb<T, BITS, true>(x, w, sc, z, bias, res, norm, y, q);
  else linear_q_mb<T, BITS, false>(x, w, sc, z, bias, res, norm, y, q);
}

// Tuning switch (-D): ROCMC_Q_OCC, NVPTX resident workgroups a multiprocessor to fit registers for. Unbounded, the
// kernel took 243 registers (2 workgroups, 12% occupancy: latency-bound, ncu); 3 (170 registers) gave a 7B 4-bit
// decode step 5.46 ms against 5.98 on an H100, 4 (128 registers, spilling) 5.43 (BENCHMARKS.md).
#ifndef ROCMC_Q_OCC
#define ROCMC_Q_OCC 3
#endif
LINEAR_Q(linear_q_f16, linear_q_bits, _Float16, ROCMC_Q_OCC)
LINEAR_Q(linear_q_bf16, linear_q_bits, bf16_t, ROCMC_Q_OCC)
