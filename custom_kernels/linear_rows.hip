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
#include "rocmc_gpu.h"
#include "kernel_abi.h"

#define NW (BLOCK / WAVE)
#define TILE 16   // rows of w a workgroup: one matrix-instruction tile
#define KC 32     // k of a chunk: two matrix instructions of k 16
#define MAX_M 32  // rows of x
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

#if defined(__NVPTX__) && __CUDA_ARCH__ >= 800
#define HAS_MMA 1
#define MT 8  // x rows one matrix instruction takes
#elif defined(__AMDGCN__) && (defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__))
#define HAS_MMA 1
#define MT 16
#else
#define HAS_MMA 0
#define MT 8
#endif
// w vectors (16 bytes) a lane loads per tile and chunk: TILE x KC elements over a wave's lanes.
#define WV (TILE * KC * 2 / (WAVE * 16))

typedef RawBytes<16>::type U4;

struct LinShape {
  u32 M, N, K, flags;
  float eps;
};

// The first n (< 8 or unaligned) elements at p one by one, zeros after them: an out-of-line call, so the unrolled
// loops below carry one call instruction for it instead of eight guarded loads at every piece.
template <typename T> __attribute__((device, noinline)) static U4 load8_edge(const T* p, u32 n) {
  u32 h[8];
#pragma unroll
  for (u32 e = 0; e < 8; ++e) h[e] = e < n ? (u32)__builtin_bit_cast(u16, p[e]) : 0u;
  U4 r;
  r.x = h[0] | h[1] << 16;
  r.y = h[2] | h[3] << 16;
  r.z = h[4] | h[5] << 16;
  r.w = h[6] | h[7] << 16;
  return r;
}

// 8 elements of row `row` (of `rows`, K apart) from k on, as raw bits; zeros past the rows or K.
template <typename T>
DEVICE U4 load8(const T* base, u32 row, u32 rows, u32 k, u32 K, bool wide, bool stream) {
  if (row >= rows || k >= K) return U4{0u, 0u, 0u, 0u};
  const T* p = base + (u64)row * K + k;
  if (wide && k + 8 <= K) return stream ? load_cs<U4>((const U4*)p) : *(const U4*)p;
  return load8_edge(p, K - k < 8 ? K - k : 8);
}

// ---- the matrix instructions: acc (this lane's 4 of the 16 x MT tile) += w (16 x 32) . x (32 x MT) ----------
#if HAS_MMA && defined(__NVPTX__)
// Lane (g = lane / 4, t = lane % 4) holds w rows g and g + 8 (w[0], w[1]) and x row g, each at k = 8t .. 8t + 7;
// logical k (2t, 2t+1, 2t+8, 2t+9) of the first instruction are its elements 0..3, of the second 4..7. acc[i]:
// w row g + 8 (i / 2), x row 2t + i % 2.
template <typename T> DEVICE void mma16(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  if constexpr (__is_same(T, _Float16)) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}
template <typename T> DEVICE void mma_chunk(float (&c)[4], const U4 (&w)[WV], const U4& x) {
  mma16<T>(c, w[0].x, w[1].x, w[0].y, w[1].y, x.x, x.y);
  mma16<T>(c, w[0].z, w[1].z, w[0].w, w[1].w, x.z, x.w);
}
DEVICE u32 w_row(u32 lane, int i) { return (lane >> 2) + 8 * i; }
DEVICE u32 x_row(u32 lane) { return lane >> 2; }
DEVICE u32 lane_k(u32 lane) { return (lane & 3) * 8; }
DEVICE u32 acc_n(u32 lane, int i) { return (lane >> 2) + 8 * (i >> 1); }
DEVICE u32 acc_m(u32 lane, int i) { return (lane & 3) * 2 + (i & 1); }
#elif HAS_MMA
// Lane (r = lane % 16, q = lane / 16) holds w row r and x row r at k = 8q .. 8q + 7; logical k 4q .. 4q + 3 of the
// first instruction are its elements 0..3, of the second 4..7. acc[i]: w row 4q + i, x row r.
typedef _Float16 half4_t __attribute__((ext_vector_type(4)));
typedef short short4_t __attribute__((ext_vector_type(4)));
typedef float float4_t __attribute__((ext_vector_type(4)));
typedef u32 u32x2_t __attribute__((ext_vector_type(2)));
template <typename T> DEVICE void mfma16(float (&c)[4], u32 a0, u32 a1, u32 b0, u32 b1) {
  u32x2_t a = {a0, a1}, b = {b0, b1};
  float4_t acc = {c[0], c[1], c[2], c[3]};
  if constexpr (__is_same(T, _Float16)) {
    acc = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(half4_t, a), __builtin_bit_cast(half4_t, b), acc,
                                                0, 0, 0);
  } else {
    acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(short4_t, a), __builtin_bit_cast(short4_t, b),
                                                    acc, 0, 0, 0);
  }
  c[0] = acc.x, c[1] = acc.y, c[2] = acc.z, c[3] = acc.w;
}
template <typename T> DEVICE void mma_chunk(float (&c)[4], const U4 (&w)[WV], const U4& x) {
  mfma16<T>(c, w[0].x, w[0].y, x.x, x.y);
  mfma16<T>(c, w[0].z, w[0].w, x.z, x.w);
}
DEVICE u32 w_row(u32 lane, int) { return lane & 15; }
DEVICE u32 x_row(u32 lane) { return lane & 15; }
DEVICE u32 lane_k(u32 lane) { return (lane >> 4) * 8; }
DEVICE u32 acc_n(u32 lane, int i) { return (lane >> 4) * 4 + i; }
DEVICE u32 acc_m(u32 lane, int) { return lane & 15; }
#endif

// ---- the epilogue's activations, in f32 -------------------------------------------------------------------
DEVICE float tanh_f32(float u) { return 1.0f - 2.0f / (exp_f32(2.0f * u) + 1.0f); }
DEVICE float activate(float v, u32 flags) {
  if (flags & FLAG_RELU) return v > 0.0f ? v : 0.0f;
  if (flags & FLAG_SILU) return v / (1.0f + exp_f32(-v));
  if (flags & FLAG_GELU_TANH) return 0.5f * v * (1.0f + tanh_f32(0.7978845608028654f * (v + 0.044715f * v * v * v)));
  return v;
}
template <typename T> DEVICE float rounded(float v) { return to_f32(from_f32<T>(v)); }

// The 8 elements of a 16-byte piece as f32.
template <typename T> DEVICE void unpack8(const U4& v, float (&f)[8]) {
  const u32 h[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = to_f32(__builtin_bit_cast(T, (u16)(h[e / 2] >> (16 * (e % 2)))));
}
// FLAG_NORM's prologue on 8 elements of an x row (f, in f32): their squares added to ss, then f = round(f * norm).
template <typename T> DEVICE void normalize8(float (&f)[8], const U4& norm, float& ss) {
  float g[8];
  unpack8<T>(norm, g);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    ss += f[e] * f[e];
    f[e] = rounded<T>(f[e] * g[e]);
  }
}

// y[m, n] from the f32 sums of its dot product (and of the up row's, gated), as the separate ops would round them.
template <typename T>
DEVICE void store_out(float v, float up, bool gated, float rs, u32 m, u32 n, const T* bias, const T* res, T* y,
                      const LinShape& s) {
  if (s.flags & FLAG_NORM) v *= rs, up *= rs;
  if (s.flags & FLAG_BIAS) v += to_f32(bias[n]);
  v = rounded<T>(v);  // linear's result
  if (gated) {
    if (s.flags & FLAG_BIAS) up += to_f32(bias[s.N + n]);
    v = rounded<T>(activate(v, s.flags)) * rounded<T>(up);
  } else {
    if (s.flags & FLAG_RESIDUAL) v += to_f32(res[(u64)m * s.N + n]);
    v = activate(v, s.flags);
  }
  y[(u64)m * s.N + n] = from_f32<T>(v);
}

// 1 / rms of a row from the sum of its squares (FLAG_NORM).
DEVICE float inv_rms(float ss, const LinShape& s) { return rsqrt_f32(ss / (float)s.K + s.eps); }

#if HAS_MMA
// Partial sums of the waves: [wave][tile][row of w * MAX_M + row of x].
struct Partials {
  float v[NW][2][TILE * MAX_M];
};

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
DEVICE float wave_sum(float v) {
#pragma unroll
  for (u32 o = WAVE / 2; o >= 1; o /= 2) v += shfl_xor(v, o);
  return v;
}

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
