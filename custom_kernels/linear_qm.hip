// Quantized linear layers of 1 to MAX_M rows on the matrix units: rocmc's quantized_linear in a decode step on
// NVIDIA sm_80+ (mma.sync) and AMD gfx90a / gfx94x (MFMA), the bytes of 4- or 8-bit weights streamed once and
// dequantized in registers into the matrix instructions' fragments. The layout and the arithmetic are linear_q.hip's
// (its header); the epilogue linear.h's: bias, residual add, activation, act(gate) * up. No FLAG_NORM: with more
// than one workgroup's worth of k split over waves, the norm is rms_norm's kernel before it.
//
// Symbols: linear_qm_{f16,bf16}. ABI: the "linear_qm" KernelFamily in rocmc/lowering/kernels.py (linear_q's).
// Workgroup: BLOCK x 1 x 1. Grid: ceil(N / TILE). The host admits K and group sizes multiples of 128 / bits.
// Elsewhere (gfx1100's WMMA, sm < 80) the entry point traps: the lowering never dispatches it there.
#include "quant.h"

// ---- linear_qm: 1 to MAX_M rows on the matrix units ----------------------------------------------------------
// linear_rows' scheme (linear_rows.hip) over packed weights: a workgroup takes TILE rows of w (and their TILE up rows
// when gated); its waves take every NW-th run of 4 pieces (4 V values of k), a piece a lane group (lane_k / 8), so a
// lane holds 16 packed bytes of each of its WV rows. For each of the piece's V / 8 chunks of k the lane
// dequantizes its 8 values of each row into an f16/bf16 fragment, W = q * s - z * s rounded once, and feeds it with
// x's matching 8 values to the matrix unit: the weights are read once whatever the rows, the products accumulate
// in f32. f16: the values become f16 pairs by their bits (0x6400 | q is 1024 + q; a high nibble 1024 + 16 q, times
// 1/16 minus 64) and two packed operations a pair scale them; bf16: through f32 (byte_value). Either way the pairs
// come out of a word in another order than k's (4-bit: values 0 and 4, 1 and 5, ...; 8-bit: 0 and 2, 1 and 3, ...),
// and x's 8 values are put in that order too (x_order): a dot product does not care in which order its terms come.
#if HAS_MMA
// Chunk j (values 8j .. 8j + 7) of a piece as 8 weights of type T, W = q * s + nzs (nzs = -z * s), in x_order's order.
template <typename T, int BITS> DEVICE U4 dequant_chunk(const U4& piece, int j, float s, float nzs) {
  const u32 h[4] = {piece.x, piece.y, piece.z, piece.w};
  if constexpr (__is_same(T, _Float16)) {
    const h2_t sv = {(_Float16)s, (_Float16)s}, zv = {(_Float16)nzs, (_Float16)nzs};
    u32 p[4];
    h2_t qp[4];
    q_pairs<BITS>(h, j, 0.0f, qp);
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = h2_bits(__builtin_elementwise_fma(qp[i], sv, zv));
    return U4{p[0], p[1], p[2], p[3]};
  } else {
    constexpr int ORDER4[8] = {0, 4, 1, 5, 2, 6, 3, 7}, ORDER8[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    float qv[8];
    values8<BITS>(h, j, qv);
    u32 p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e0 = BITS == 4 ? ORDER4[2 * i] : ORDER8[2 * i], e1 = BITS == 4 ? ORDER4[2 * i + 1] : ORDER8[2 * i + 1];
      const u32 w0 = __builtin_bit_cast(u16, from_f32<T>(qv[e0] * s + nzs));
      const u32 w1 = __builtin_bit_cast(u16, from_f32<T>(qv[e1] * s + nzs));
      p[i] = w0 | w1 << 16;
    }
    return U4{p[0], p[1], p[2], p[3]};
  }
}

template <typename T, int BITS, int TILES, int MB>
DEVICE void linear_qm(const T* x, const unsigned char* w, const T* scales, const T* zeros, const T* bias, const T* res,
                      T* y, const QShape& q, Partials& part) {
  constexpr int V = 128 / BITS, J = V / 8;
  constexpr int U = MB == 1 ? 2 : 1;  // runs a group: their loads issued together
  const LinShape& s = q.s;
  const u32 wave = thread_x() / WAVE, lane = thread_x() % WAVE, n0 = block_x() * TILE, lp = lane_k(lane) / 8;
  const u32 pieces = s.K / V, runs = (pieces + 3) / 4, gs = s.K / q.G, row_bytes = s.K / 8 * BITS;
  const bool wide_x = aligned16(x, x), wide_w = aligned16(w, w);
  float acc[TILES][MB][4];
#pragma unroll
  for (int t = 0; t < TILES; ++t)
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][b][i] = 0.0f;
  typedef U4 WGroup[U][TILES][WV];
  typedef float SGroup[U][TILES][WV];
  auto load_group = [&](u32 c0, WGroup& wv, SGroup& sv, SGroup& zv) __attribute__((always_inline)) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const u32 c = c0 + u * NW, p = c * 4 + lp;
#pragma unroll
      for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int i = 0; i < WV; ++i) {
          const u32 n = n0 + w_row(lane, i), row = n + t * s.N;
          if (c >= runs || p >= pieces || n >= s.N) {
            wv[u][t][i] = U4{0u, 0u, 0u, 0u}, sv[u][t][i] = zv[u][t][i] = 0.0f;
            continue;
          }
          const unsigned char* at = w + (u64)row * row_bytes + (u64)p * 16;
          wv[u][t][i] = wide_w ? load_cs<U4>((const U4*)at) : load16_bytes(at);
          const u64 g = (u64)row * q.G + p * V / gs;
          sv[u][t][i] = to_f32(scales[g]);
          zv[u][t][i] = -to_f32(zeros[g]) * sv[u][t][i];
        }
    }
  };
  auto mma_group = [&](u32 c0, const WGroup& wv, const SGroup& sv, const SGroup& zv) __attribute__((always_inline)) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const u32 c = c0 + u * NW, k = (c * 4 + lp) * V;
      if (c >= runs) continue;  // the same for the whole wave
#pragma unroll
      for (int j = 0; j < J; ++j) {
        U4 xv[MB];
#pragma unroll
        for (int b = 0; b < MB; ++b)
          xv[b] = x_order<BITS>(load8(x, b * MT + x_row(lane), s.M, k + 8 * j, s.K, wide_x, false));
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
          U4 wq[WV];
#pragma unroll
          for (int i = 0; i < WV; ++i) wq[i] = dequant_chunk<T, BITS>(wv[u][t][i], j, sv[u][t][i], zv[u][t][i]);
#pragma unroll
          for (int b = 0; b < MB; ++b) mma_chunk<T>(acc[t][b], wq, xv[b]);
        }
      }
    }
  };
  // Two groups in registers: the next one's loads in flight while this one's instructions run.
  const u32 step = NW * U;
  WGroup wa, wb;
  SGroup sa, sb, za, zb;
  if (wave < runs) load_group(wave, wa, sa, za);
  for (u32 c0 = wave; c0 < runs; c0 += 2 * step) {
    if (c0 + step < runs) load_group(c0 + step, wb, sb, zb);
    mma_group(c0, wa, sa, za);
    if (c0 + step >= runs) break;
    if (c0 + 2 * step < runs) load_group(c0 + 2 * step, wa, sa, za);
    mma_group(c0 + step, wb, sb, zb);
  }
#pragma unroll
  for (int t = 0; t < TILES; ++t)
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) part.v[wave][t][acc_n(lane, i) * MAX_M + b * MT + acc_m(lane, i)] = acc[t][b][i];
  sync_threads();
  for (u32 o = thread_x(); o < TILE * s.M; o += BLOCK) {
    const u32 m = o / TILE, nl = o % TILE, n = n0 + nl;
    if (n >= s.N) continue;
    float v = 0.0f, up = 0.0f;
    for (u32 wi = 0; wi < NW; ++wi) {
      v += part.v[wi][0][nl * MAX_M + m];
      if (TILES == 2) up += part.v[wi][TILES - 1][nl * MAX_M + m];
    }
    store_out<T>(v, up, TILES == 2, 1.0f, m, n, bias, res, y, s);
  }
}

template <typename T, int BITS, int TILES>
DEVICE void linear_qm_tiles(const T* x, const unsigned char* w, const T* sc, const T* z, const T* bias, const T* res,
                            T* y, const QShape& q, Partials& part) {
  const u32 mb = (q.s.M + MT - 1) / MT;  // the host admits M <= MAX_M (and no FLAG_NORM)
  if (mb <= 1) linear_qm<T, BITS, TILES, 1>(x, w, sc, z, bias, res, y, q, part);
  else if (mb <= 2) linear_qm<T, BITS, TILES, 2>(x, w, sc, z, bias, res, y, q, part);
#if MT < 16
  else linear_qm<T, BITS, TILES, 4>(x, w, sc, z, bias, res, y, q, part);
#endif
}

template <typename T, int BITS>
DEVICE void linear_qm_bits(const T* x, const unsigned char* w, const T* sc, const T* z, const T* bias, const T* res,
                           const T*, T* y, const QShape& q) {
  SHARED Partials part;
  if (q.s.flags & FLAG_GATED) linear_qm_tiles<T, BITS, 2>(x, w, sc, z, bias, res, y, q, part);
  else linear_qm_tiles<T, BITS, 1>(x, w, sc, z, bias, res, y, q, part);
}
#else
template <typename T, int BITS>
DEVICE void linear_qm_bits(const T*, const unsigned char*, const T*, const T*, const T*, const T*, const T*, T*,
                           const QShape&) {
  __builtin_trap();  // no matrix instructions the kernel is written for: never dispatched here
}
#endif

LINEAR_Q(linear_qm_f16, linear_qm_bits, _Float16, 0)
LINEAR_Q(linear_qm_bf16, linear_qm_bits, bf16_t, 0)
