// Linear layers of a few rows: a decode step's projections (rocmc's linear, fused_linear, gated_linear and
// rms_norm_linear when x has at most MAX_M rows): linear_vec_* on the vector units for 1 to VMAX_M rows (a matrix
// instruction's tile would be mostly empty; a wave reads the weights row by row in whole 512-byte runs),
// linear_rows_* on the matrix units for more.
//
// y (M, N) = epilogue(x (M, K) @ w^T), w (N, K) as stored (out_features x in_features), or (2N, K) when gated
// (FLAG_GATED: the gate's N rows, then the up's N rows). The product is accumulated in f32 and rounded once with
// the bias (as linear's), then, as the separate ops would, in f32 and rounded once: + residual (M, N) and the
// activation (fused_linear: activation(linear + residual)); gated: activation(gate) rounded, times up, rounded.
// FLAG_NORM (rms_norm_linear; linear_vec only): x is RMSNorm(x, norm, eps) first. Every wave reads x whole and sums
// its squares on the way; x * norm is rounded to the storage type (as rms_norm's product is) and each row's
// 1 / rms, a factor of all its dot products, scales the f32 sums.
//
// Work: a workgroup per TILE rows of w (and the matching TILE up rows when gated). Its waves split K in chunks of
// KC: in a chunk every lane loads 16 contiguous bytes of w rows and of x rows and the wave feeds them to the matrix
// unit (NVIDIA sm_80+: mma.sync m16n8k16; AMD gfx90a / gfx94x: MFMA 16x16x16) with w's rows as the instruction's
// M dimension and x's rows as its N, so the weights are read once whatever the rows, in 16-byte loads of whole
// 32-byte sectors. A dot product does not care in which order its k terms come, so a lane's 16 contiguous bytes
// serve as its fragment's k elements, the same permutation for both operands. The waves' partial sums meet in
// shared memory; the workgroup finishes its TILE x M outputs with the epilogue. Rows of w past N, x rows past M
// and k past K read as zeros; K % 8 != 0 or unaligned buffers take element loads.
//
// Symbols: linear_rows_{f16,bf16}, linear_vec_{f16,bf16}. ABI (bindings, push constants, FLAG_* bits, BLOCK): the
// "linear_rows" KernelFamily in rocmc/lowering/kernels.py. Workgroup: BLOCK x 1 x 1. Grid: ceil(N / TILE) for
// linear_rows, ceil(N / VOUT) for linear_vec (VOUT: VROWS, or VROWS / 2 when gated).
// linear_vec builds for every architecture. linear_rows elsewhere (gfx1100's WMMA, sm < 80) is an entry point that
// traps: the lowering never dispatches it there (kernel/linear.py says why and IREE's code takes the op).
#include "linear.h"

#define VROWS 8   // linear_vec: rows of w a workgroup (gated: VROWS / 2 gate rows and their up rows)
#define VMAX_M 2  // linear_vec: rows of x
#if WAVE == 64
#define VU 2  // linear_vec: 16-byte pieces of each row a lane loads together (a 64-wide wave: 1 KB a row each)
#else
#define VU 4
#endif

// Tuning switches, set with -D by bench/linear_sweep.py to compare versions (the defaults: the measured best):
// ROCMC_LIN_U1/U2/U4: chunks whose loads a wave issues together, for 1, 2 and 4 blocks of x rows; ROCMC_LIN_PIPE:
// 1 = two such groups in registers, the next loading while one computes; ROCMC_LIN_OCC: NVPTX resident
// workgroups a multiprocessor to fit registers for (0 = none); ROCMC_LIN_CONTIG: 1 = a wave's chunks one contiguous
// run of k (0: every NW-th chunk).
#ifndef ROCMC_LIN_U1
#define ROCMC_LIN_U1 4
#endif
#ifndef ROCMC_LIN_U2
#define ROCMC_LIN_U2 4
#endif
#ifndef ROCMC_LIN_U4
#define ROCMC_LIN_U4 2
#endif
#ifndef ROCMC_LIN_PIPE
#define ROCMC_LIN_PIPE 1
#endif
#ifndef ROCMC_LIN_OCC
#define ROCMC_LIN_OCC 0
#endif
#ifndef ROCMC_LIN_CONTIG
#define ROCMC_LIN_CONTIG 0
#endif



#if HAS_MMA

template <typename T, int TILES, int MB>
DEVICE void linear_rows(const T* x, const T* w, const T* bias, const T* res, T* y, const LinShape& s, Partials& part) {
  constexpr int U = MB >= 4 ? ROCMC_LIN_U4 : MB >= 2 ? ROCMC_LIN_U2 : ROCMC_LIN_U1;  // chunks a group
  const u32 wave = thread_x() / WAVE, lane = thread_x() % WAVE;
  const u32 n0 = block_x() * TILE, chunks = (s.K + KC - 1) / KC, kl = lane_k(lane);
  const bool wide = s.K % 8 == 0 && aligned16(x, w);
  float acc[TILES][MB][4];
#pragma unroll
  for (int t = 0; t < TILES; ++t)
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][b][i] = 0.0f;
#if ROCMC_LIN_CONTIG
  // A wave's chunks are one contiguous run of k: a group's loads read U * 64 consecutive bytes of each w row.
  constexpr u32 DU = 1;
  const u32 per = (chunks + NW - 1) / NW, start = wave * per < chunks ? wave * per : chunks;
  const u32 end = start + per < chunks ? start + per : chunks, step = U;
#else
  // A wave takes every NW-th chunk: the workgroup's waves read each w row's consecutive chunks together.
  constexpr u32 DU = NW;
  const u32 start = wave, end = chunks, step = NW * U;
#endif
  // A group: U chunks of this wave (every NW-th), their loads issued together, then their matrix instructions.
  // (Whether a chunk exists is the same for the whole wave.)
  typedef U4 WGroup[U][TILES][WV];
  typedef U4 XGroup[U][MB];
  auto load_group = [&](u32 c0, WGroup& wv, XGroup& xv) __attribute__((always_inline)) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const u32 c = c0 + u * DU, k = c * KC + kl;
      if (c >= end) continue;
#pragma unroll
      for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int i = 0; i < WV; ++i)
          wv[u][t][i] = load8(w + (u64)t * s.N * s.K, n0 + w_row(lane, i), s.N, k, s.K, wide, true);
#pragma unroll
      for (int b = 0; b < MB; ++b) xv[u][b] = load8(x, b * MT + x_row(lane), s.M, k, s.K, wide, false);
    }
  };
  auto mma_group = [&](u32 c0, const WGroup& wv, const XGroup& xv) __attribute__((always_inline)) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c0 + u * DU >= end) continue;
#pragma unroll
      for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int b = 0; b < MB; ++b) mma_chunk<T>(acc[t][b], wv[u][t], xv[u][b]);
    }
  };
#if ROCMC_LIN_PIPE
  // Two groups in registers: the next one's loads in flight while this one's instructions run.
  WGroup wa, wb;
  XGroup xa, xb;
  if (start < end) load_group(start, wa, xa);
  for (u32 c0 = start; c0 < end; c0 += 2 * step) {
    if (c0 + step < end) load_group(c0 + step, wb, xb);
    mma_group(c0, wa, xa);
    if (c0 + step >= end) break;
    if (c0 + 2 * step < end) load_group(c0 + 2 * step, wa, xa);
    mma_group(c0 + step, wb, xb);
  }
#else
  for (u32 c0 = start; c0 < end; c0 += step) {
    WGroup wv;
    XGroup xv;
    load_group(c0, wv, xv);
    mma_group(c0, wv, xv);
  }
#endif
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

template <typename T>
DEVICE void linear_rows_entry(const T* x, const T* w, const T* bias, const T* res, const T*, T* y,
                              const LinShape& s) {
  SHARED Partials part;
  const u32 mb = (s.M + MT - 1) / MT;  // the host admits M <= MAX_M (and no FLAG_NORM)
  if (s.flags & FLAG_GATED) {
    if (mb <= 1) linear_rows<T, 2, 1>(x, w, bias, res, y, s, part);
    else if (mb <= 2) linear_rows<T, 2, 2>(x, w, bias, res, y, s, part);
#if MT < 16
    else linear_rows<T, 2, 4>(x, w, bias, res, y, s, part);
#endif
  } else {
    if (mb <= 1) linear_rows<T, 1, 1>(x, w, bias, res, y, s, part);
    else if (mb <= 2) linear_rows<T, 1, 2>(x, w, bias, res, y, s, part);
#if MT < 16
    else linear_rows<T, 1, 4>(x, w, bias, res, y, s, part);
#endif
  }
}
#else
template <typename T>
DEVICE void linear_rows_entry(const T*, const T*, const T*, const T*, const T*, T*, const LinShape&) {
  __builtin_trap();  // no matrix instructions the kernel is written for: never dispatched here
}
#endif

// ---- linear_vec: 1 to VMAX_M rows on the vector units ------------------------------------------------------
// A workgroup takes VROWS rows of w (gated: VROWS / 2 outputs, each a gate row and its up row), a wave WR of them.
// A wave's lanes read 16 contiguous bytes each of every row it has, so a load instruction reads 32 (64 on AMD)
// pieces one after another of one row; VU such loads of each row in flight a lane. x (and the norm) come
// through the caches: every wave reads them whole, so with FLAG_NORM each wave has its rows' sums of squares.

template <typename T, int MB, bool GATED, bool NORM>
DEVICE void linear_vec(const T* x, const T* w, const T* bias, const T* res, const T* norm, T* y, const LinShape& s) {
  constexpr int WR = VROWS / NW;                // rows of w a wave
  constexpr int OUTS = GATED ? WR / 2 : WR;     // its outputs
  static_assert(WR >= 2 && WR % 2 == 0, "a wave takes gate and up rows in pairs");
  const u32 wave = thread_x() / WAVE, lane = thread_x() % WAVE;
  const u32 o0 = (block_x() * NW + wave) * OUTS;  // the wave's first output
  const u32 pieces = (s.K + 7) / 8, rows_w = GATED ? 2 * s.N : s.N;
  const bool wide = s.K % 8 == 0 && aligned16(x, w, norm);
  u32 wrow[WR];  // row r of the wave: output o0 + r, or (gated) the up row of output o0 + r - OUTS
#pragma unroll
  for (int r = 0; r < WR; ++r) {
    const u32 o = o0 + (r < OUTS ? r : r - OUTS);
    wrow[r] = o >= s.N ? rows_w : r < OUTS ? o : s.N + o;  // past N: reads zeros
  }
  float acc[WR][MB], ss[MB];
#pragma unroll
  for (int b = 0; b < MB; ++b) {
    ss[b] = 0.0f;
#pragma unroll
    for (int r = 0; r < WR; ++r) acc[r][b] = 0.0f;
  }
  for (u32 p0 = lane; p0 < pieces; p0 += WAVE * VU) {
    U4 wv[VU][WR], xv[VU][MB + NORM];
#pragma unroll
    for (int u = 0; u < VU; ++u) {
      const u32 p = p0 + u * WAVE, k = p * 8;
      if (p >= pieces) continue;
#pragma unroll
      for (int r = 0; r < WR; ++r) wv[u][r] = load8(w, wrow[r], rows_w, k, s.K, wide, true);
#pragma unroll
      for (int b = 0; b < MB; ++b) xv[u][b] = load8(x, (u32)b, s.M, k, s.K, wide, false);
      if (NORM) xv[u][MB] = load8(norm, 0u, 1u, k, s.K, wide, false);
    }
#pragma unroll
    for (int u = 0; u < VU; ++u) {
      if (p0 + u * WAVE >= pieces) continue;
      float wf[WR][8];
#pragma unroll
      for (int r = 0; r < WR; ++r) unpack8<T>(wv[u][r], wf[r]);
#pragma unroll
      for (int b = 0; b < MB; ++b) {
        float f[8];
        unpack8<T>(xv[u][b], f);
        if (NORM) normalize8<T>(f, xv[u][MB], ss[b]);
#pragma unroll
        for (int r = 0; r < WR; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][b] += wf[r][e] * f[e];
      }
    }
  }
  // Every lane ends with the wave's sums; lane r * MB + b stores output (o0 + r, row b).
#pragma unroll
  for (int b = 0; b < MB; ++b) {
    const float rs = NORM ? inv_rms(wave_sum(ss[b]), s) : 1.0f;
#pragma unroll
    for (int r = 0; r < WR; ++r) acc[r][b] = wave_sum(acc[r][b]);
#pragma unroll
    for (int r = 0; r < OUTS; ++r)
      if (lane == (u32)(r * MB + b) && (u32)b < s.M && o0 + r < s.N)
        store_out<T>(acc[r][b], GATED ? acc[OUTS + r][b] : 0.0f, GATED, rs, b, o0 + r, bias, res, y, s);
  }
}

template <typename T, bool GATED, bool NORM>
DEVICE void linear_vec_mb(const T* x, const T* w, const T* bias, const T* res, const T* norm, T* y,
                          const LinShape& s) {
  if (s.M <= 1) linear_vec<T, 1, GATED, NORM>(x, w, bias, res, norm, y, s);
  else linear_vec<T, VMAX_M, GATED, NORM>(x, w, bias, res, norm, y, s);  // the host admits M <= VMAX_M
}

template <typename T>
DEVICE void linear_vec_entry(const T* x, const T* w, const T* bias, const T* res, const T* norm, T* y,
                             const LinShape& s) {
  const bool gated = s.flags & FLAG_GATED, normed = s.flags & FLAG_NORM;
  if (gated && normed) linear_vec_mb<T, true, true>(x, w, bias, res, norm, y, s);
  else if (gated) linear_vec_mb<T, true, false>(x, w, bias, res, norm, y, s);
  else if (normed) linear_vec_mb<T, false, true>(x, w, bias, res, norm, y, s);
  else linear_vec_mb<T, false, false>(x, w, bias, res, norm, y, s);
}

#define LINEAR_ROWS(name, entry, T)                                    \
  KERNEL_OCC(BLOCK, ROCMC_LIN_OCC) void name(KERNEL_PARAMS(T)) {       \
    LinShape s{M, N, K, flags, __builtin_bit_cast(float, eps)};        \
    entry<T>(x, w, bias, residual, norm, y, s);                        \
  }
LINEAR_ROWS(linear_rows_f16, linear_rows_entry, _Float16)
LINEAR_ROWS(linear_rows_bf16, linear_rows_entry, bf16_t)
LINEAR_ROWS(linear_vec_f16, linear_vec_entry, _Float16)
LINEAR_ROWS(linear_vec_bf16, linear_vec_entry, bf16_t)
