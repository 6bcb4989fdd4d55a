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
// host admits group sizes that are multiples of V), QU pieces of each of its rows in flight. A group's scale and
// zero factor out of its values' sum: sum_k (q_k - z) s x_k = s (sum_k q_k x_k - z sum_k x_k), so a value costs a
// byte permutation or conversion (byte_value) and one FMA a row of x; the piece's sum of x serves every row of w.
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
#ifndef QU
#if WAVE == 64
#define QU 1  // pieces of each row a lane loads together
#else
#define QU 2
#endif
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

template <typename T, int BITS, int MB, bool NORM>
DEVICE void linear_q(const T* x, const unsigned char* w, const T* scales, const T* zeros, const T* bias, const T* res,
                     const T* norm, T* y, const QShape& q) {
  const LinShape& s = q.s;
  constexpr int V = 128 / BITS;             // values a piece
  constexpr int WR = QWR;                   // rows of w a wave
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
  for (u32 p0 = lane; p0 < pieces; p0 += WAVE * QU) {
    U4 wv[QU][WR];
#pragma unroll
    for (int u = 0; u < QU; ++u) {
      const u32 p = p0 + u * WAVE;
#pragma unroll
      for (int r = 0; r < WR; ++r) {
        if (p >= pieces || wrow[r] >= rows_w) {
          wv[u][r] = U4{0u, 0u, 0u, 0u};
          continue;
        }
        const unsigned char* at = w + (u64)wrow[r] * row_bytes + (u64)p * 16;
        wv[u][r] = wide_w ? load_cs<U4>((const U4*)at) : load16_bytes(at);
      }
    }
#pragma unroll
    for (int u = 0; u < QU; ++u) {
      const u32 p = p0 + u * WAVE, k = p * V;
      if (p >= pieces) continue;
      const u32 g = k / gs;
      float sc[WR], zr[WR], dot[WR][MB], xs[MB];
#pragma unroll
      for (int r = 0; r < WR; ++r) {
        const bool live = wrow[r] < rows_w;
        sc[r] = live ? to_f32(scales[(u64)wrow[r] * q.G + g]) : 0.0f;
        zr[r] = live ? to_f32(zeros[(u64)wrow[r] * q.G + g]) : 0.0f;
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
#pragma unroll
        for (int r = 0; r < WR; ++r) {
          const u32 h[4] = {wv[u][r].x, wv[u][r].y, wv[u][r].z, wv[u][r].w};
          float qv[8];
          values8<BITS>(h, j, qv);
#pragma unroll
          for (int b = 0; b < MB; ++b) dot[r][b] += dot8(qv, f[b]);
        }
      }
#pragma unroll
      for (int r = 0; r < WR; ++r)
#pragma unroll
        for (int b = 0; b < MB; ++b) acc[r][b] += sc[r] * (dot[r][b] - zr[r] * xs[b]);
    }
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
