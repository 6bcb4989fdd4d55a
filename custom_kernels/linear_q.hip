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
// host admits group sizes that are multiples of V) with the group's scale and zero; a round is a piece of each of
// its rows, and QX_AHEAD rounds are in flight while a round's products run. A group's scale and zero factor out of
// its values' sum: sum_k (q_k - z) s x_k = s (sum_k q_k x_k - z sum_k x_k); the piece's sum of x serves every row.
// x is staged once a workgroup in shared memory (stage_x): the norm's weight applied, each piece's values as f16
// pairs scaled by a power of two (so that products and sums of four cannot overflow f16, whatever x holds), the
// piece's 1 / p and its sum of x. The products run in f16 pairs: q - round(z) made exact by its bits (q_pairs,
// quant.h), four pair FMAs a chunk of 8 values before the sum goes to f32; the zero's fraction stays in the f32
// correction. K longer than the buffer is staged in passes (a barrier before and after each), so any K fits. With
// FLAG_NORM the workgroup's threads add up the squares of the pieces they staged.
// (An H200 sweep, bench/quant_sweep.py, BENCHMARKS.md: a 7B layer's four decode projections at one / two rows of
// 4-bit weights 83 / 107 us against 120 / 161 when every wave converted all of x in its registers, 8-bit 115 / 134
// against 146 / 193; keeping the staging out of the rounds' loop gave 1.15x of that, fewer instruction fetch stalls.)
//
// Symbols: linear_q_{f16,bf16}. ABI (bindings, push constants, FLAG_* bits, BLOCK): the "linear_q" KernelFamily in
// rocmc/lowering/kernels.py. Workgroup: BLOCK x 1 x 1. Grid: ceil(N / (QROWS, or QROWS / 2 when gated)), QROWS =
// 4 rows a wave times the workgroup's waves. The host admits K a multiple of V, a group size a multiple of V,
// M <= QMAX_M; w and x may be unaligned (element loads).
// It needs no matrix instructions and builds for every architecture.
#include "quant.h"

#ifndef QWR
#define QWR 4  // rows of w a wave: a staged piece of x serves 4 rows (2: 1.25x slower, 8: 1.25x slower at one row)
#endif
#define QROWS (QWR * NW)  // rows of w a workgroup: 16 (NVIDIA, RDNA), 8 (CDNA's 64-wide waves)
#define QMAX_M 2  // rows of x
// Rounds of pieces in flight during a round's products: 1 (2: 1.03x slower at one 4-bit row, 3: 1.12x, spilling).
#ifndef QX_AHEAD
#define QX_AHEAD 1
#endif
// Tuning switch: rounds of pieces further ahead asked into the L2 cache (NVIDIA's prefetch.global.L2, no registers
// held); 0 none. An H200 sweep (bench/quant_sweep.py, a 7B layer's four projections): 1 round made one 8-bit row
// 1.07x faster (108.0 against 115.5 us) and 4-bit none, 2 to 16 rounds slower for both; a 7B 8-bit decode step
// built with 1 for 8-bit ran as fast as without (4.06 against 4.07 ms, bench/quant_gpu.py), so none is kept.
#ifndef QX_PF
#define QX_PF 0
#endif
// The staging buffer: a multiple of 16 bytes (AMD's CDNA: 64 KB of LDS a compute unit, so less there). 16 KB on an
// H200 was as fast at one row, 1.17x slower at two (two passes for K 4096).
#ifndef QX_BYTES
#define QX_BYTES (WAVE == 64 ? 16384 : 32768)
#endif

DEVICE float sum8(const float (&b)[8]) {
  return ((b[0] + b[4]) + (b[1] + b[5])) + ((b[2] + b[6]) + (b[3] + b[7]));
}

// Pieces of x a pass stages: a multiple of WAVE (a round's pieces are in one pass), each piece V / 8 pairs of
// 16 bytes and its 1 / p and sum of x (8 bytes) for each of the MB rows.
template <int BITS, int MB> constexpr u32 qx_pass() {
  return QX_BYTES / (MB * ((128 / BITS) * 2 + 8)) / WAVE * WAVE;
}
typedef float float2_t __attribute__((ext_vector_type(2)));
SHARED static U4 qx_buffer[QX_BYTES / 16];
SHARED static float qx_sums[NW][QMAX_M];

// 8 values of x (f, in k order) times p as 4 f16 pairs in x_order's order. p is a power of two, so f16 and bf16
// values stay exact (those 2^14 times smaller than the piece's largest round).
template <int BITS> DEVICE void scaled_pairs(const float (&f)[8], float p, h2_t (&xp)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int lo = BITS == 4 ? i : (i / 2) * 4 + i % 2, hi = lo + (BITS == 4 ? 4 : 2);
    xp[i] = h2_t{(_Float16)(f[lo] * p), (_Float16)(f[hi] * p)};
  }
}

// Stage pieces p0 .. p0 + n - 1 of x's MB rows: pair j of piece i of row b at qx_buffer[(b * V / 8 + j) * PASS + i]
// (a round's lanes read consecutive 16 bytes), its (1 / p, sum of x) after all pairs at [b * PASS + i]. With
// NORM, x is round(x * norm) as normalize8 makes it and ss[b] gathers the squares of the pieces this thread staged.
template <typename T, int BITS, int MB, bool NORM>
DEVICE void stage_x(const T* x, const T* norm, u32 p0, u32 n, bool wide, const LinShape& s, float (&ss)[MB]) {
  constexpr u32 V = 128 / BITS, PASS = qx_pass<BITS, MB>();
  float2_t* rec = (float2_t*)(qx_buffer + MB * (V / 8) * PASS);
#pragma unroll
  for (int b = 0; b < MB; ++b)
    for (u32 i = thread_x(); i < n; i += BLOCK) {
      const u32 k = (p0 + i) * V;
      float f[V / 8][8], m = 0.0f, sum = 0.0f;
#pragma unroll
      for (int j = 0; j < (int)(V / 8); ++j) {
        unpack8<T>(load8(x, (u32)b, s.M, k + 8 * j, s.K, wide, false), f[j]);
        if (NORM) normalize8<T>(f[j], load8(norm, 0u, 1u, k + 8 * j, s.K, wide, false), ss[b]);
        sum += sum8(f[j]);
#pragma unroll
        for (int e = 0; e < 8; ++e) m = __builtin_fmaxf(m, __builtin_fabsf(f[j][e]));
      }
      // p = 2^(127 - e) for m's biased exponent e (m < 2^(e - 126)): every |f p| < 4, so products with
      // |q - round(z)| < 2^BITS and their sums of four stay far inside f16's range; 1 / p = 2^(e - 127)
      u32 e = __builtin_bit_cast(u32, m) >> 23;
      e = e < 1u ? 1u : e > 253u ? 253u : e;
      const float p = __builtin_bit_cast(float, (254u - e) << 23);
#pragma unroll
      for (int j = 0; j < (int)(V / 8); ++j) {
        h2_t xp[4];
        scaled_pairs<BITS>(f[j], p, xp);
        qx_buffer[((u32)b * (V / 8) + j) * PASS + i] =
            U4{h2_bits(xp[0]), h2_bits(xp[1]), h2_bits(xp[2]), h2_bits(xp[3])};
      }
      rec[(u32)b * PASS + i] = float2_t{__builtin_bit_cast(float, e << 23), sum};
    }
}

template <typename T, int BITS, int MB, bool NORM>
DEVICE void linear_q(const T* x, const unsigned char* w, const T* scales, const T* zeros, const T* bias, const T* res,
                     const T* norm, T* y, const QShape& q) {
  const LinShape& s = q.s;
  constexpr int V = 128 / BITS;  // values a piece
  constexpr int WR = QWR;        // rows of w a wave
  constexpr u32 PASS = qx_pass<BITS, MB>();
  static_assert(PASS >= WAVE, "the staging buffer holds a round's pieces");
  static_assert(WR >= 2 && WR % 2 == 0, "a wave takes gate and up rows in pairs");
  const bool gated = s.flags & FLAG_GATED;
  const u32 outs = gated ? WR / 2 : WR;
  const u32 wave = thread_x() / WAVE, lane = thread_x() % WAVE;
  u32 o0 = (block_x() * NW + wave) * outs;
#if defined(__AMDGCN__)
  // the wave's rows in a vector register: held in scalar ones, their addresses took more than CDNA's 102
  asm volatile("v_mov_b32 %0, %1" : "=v"(o0) : "v"(o0));
#endif
  const u32 pieces = s.K / V, rows_w = gated ? 2 * s.N : s.N, gs = s.K / q.G, row_bytes = s.K / 8 * BITS;
  const bool wide = aligned16(x, norm), wide_w = aligned16(w, w);
  u32 wrow[WR];
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
  struct Pieces {
    U4 w[WR];
    T sc[WR], z[WR];
  };
  // Pieces past K or rows past N are never used (products skips them, no output takes them): their loads read the
  // last piece or row again instead of branching around them (on AMD's CDNA the branches' masks cost scalar
  // registers, which spilled).
  auto row_of = [&](int r) __attribute__((always_inline)) { return wrow[r] < rows_w ? wrow[r] : rows_w - 1; };
  auto load = [&](u32 p, Pieces& set) __attribute__((always_inline)) {
    p = p < pieces ? p : pieces - 1;
#pragma unroll
    for (int r = 0; r < WR; ++r) {
      const u32 row = row_of(r);
      const unsigned char* at = w + (u64)row * row_bytes + (u64)p * 16;
      set.w[r] = wide_w ? load_cs<U4>((const U4*)at) : load16_bytes(at);
      const u64 g = (u64)row * q.G + p * V / gs;
      set.sc[r] = scales[g];
      set.z[r] = zeros[g];
    }
  };
  // Round p's pieces into L2 (NVIDIA's prefetch.global.L2; a no-op elsewhere).
  auto prefetch = [&](u32 p) __attribute__((always_inline)) {
#if defined(__NVPTX__)
    if (p >= pieces) return;
#pragma unroll
    for (int r = 0; r < WR; ++r)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(w + (u64)row_of(r) * row_bytes + (u64)p * 16));
#else
    (void)p;
#endif
  };
  // The products of piece p (i: its place in the staged pass) with the wave's rows.
  auto products = [&](u32 p, u32 i, const Pieces& set) __attribute__((always_inline)) {
    if (p >= pieces) return;
    const float2_t* rec = (const float2_t*)(qx_buffer + MB * (V / 8) * PASS);
    h2_t xp[MB][V / 8][4];
    float ip[MB], xs[MB];
#pragma unroll
    for (int b = 0; b < MB; ++b) {
#pragma unroll
      for (int j = 0; j < V / 8; ++j) {
        const U4 v = qx_buffer[((u32)b * (V / 8) + j) * PASS + i];
        xp[b][j][0] = as_h2(v.x), xp[b][j][1] = as_h2(v.y), xp[b][j][2] = as_h2(v.z), xp[b][j][3] = as_h2(v.w);
      }
      const float2_t r = rec[(u32)b * PASS + i];
      ip[b] = r.x, xs[b] = r.y;
    }
#pragma unroll
    for (int r = 0; r < WR; ++r) {
      const float sc = to_f32(set.sc[r]);
      float zr = to_f32(set.z[r]);
      // the zero's integer part goes into the pairs, the rest (zr) into the group's correction
      const float zi = __builtin_fminf(__builtin_fmaxf(__builtin_rintf(zr), 0.0f), (float)((1 << BITS) - 1));
      zr -= zi;
      const u32 h[4] = {set.w[r].x, set.w[r].y, set.w[r].z, set.w[r].w};
      float dot[MB];
#pragma unroll
      for (int b = 0; b < MB; ++b) dot[b] = 0.0f;
#pragma unroll
      for (int j = 0; j < V / 8; ++j) {
        h2_t qv[4];
        q_pairs<BITS>(h, j, zi, qv);
#pragma unroll
        for (int b = 0; b < MB; ++b) {
          h2_t d = qv[0] * xp[b][j][0];
#pragma unroll
          for (int t = 1; t < 4; ++t) d = __builtin_elementwise_fma(qv[t], xp[b][j][t], d);
          dot[b] += (float)d.x + (float)d.y;
        }
      }
#pragma unroll
      for (int b = 0; b < MB; ++b) acc[r][b] += sc * (dot[b] * ip[b] - zr * xs[b]);
    }
  };
  // Rounds: every wave's lanes take pieces p0 + lane; p0 walks K in steps of WAVE, passes start at multiples of PASS.
  // set[a] holds round a ahead of this one: QX_AHEAD rounds of pieces are in flight during a round's products.
  constexpr int A = QX_AHEAD, PF = QX_PF;
  Pieces set[A + 1];
#pragma unroll
  for (int a = 0; a < A; ++a) load((u32)a * WAVE + lane, set[a]);
#pragma unroll
  for (int a = 0; a < PF; ++a) prefetch((u32)(A + a) * WAVE + lane);
  for (u32 s0 = 0; s0 < pieces; s0 += PASS) {  // passes (one up to PASS pieces)
    if (s0) sync_threads();  // the last pass's reads are done
    const u32 end = pieces - s0 < PASS ? pieces : s0 + PASS;
    stage_x<T, BITS, MB, NORM>(x, norm, s0, end - s0, wide, s, ss);
    sync_threads();
    for (u32 p0 = s0; p0 < end; p0 += WAVE) {  // rounds: a tight loop, the staging outside it
      load(p0 + (u32)A * WAVE + lane, set[A]);
      if (PF) prefetch(p0 + (u32)(A + PF) * WAVE + lane);
      products(p0 + lane, p0 - s0 + lane, set[0]);
#pragma unroll
      for (int a = 0; a < A; ++a) set[a] = set[a + 1];
    }
  }
  // The norm's sum of squares over the workgroup's threads (each staged its own pieces).
  float rs[MB];
  if (NORM) {
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      const float t = wave_sum(ss[b]);
      if (lane == 0) qx_sums[wave][b] = t;
    }
    sync_threads();
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      float t = 0.0f;
#pragma unroll
      for (int v = 0; v < NW; ++v) t += qx_sums[v][b];
      rs[b] = inv_rms(t, s);
    }
  }
#pragma unroll
  for (int b = 0; b < MB; ++b) {
#pragma unroll
    for (int r = 0; r < WR; ++r) acc[r][b] = wave_sum(acc[r][b]);
#pragma unroll
    for (int r = 0; r < WR; ++r)
      if ((u32)r < outs && lane == (u32)(r * MB + b) && (u32)b < s.M && o0 + r < s.N)
        store_out<T>(acc[r][b], gated ? acc[(r + WR / 2) % WR][b] : 0.0f, gated, NORM ? rs[b] : 1.0f, b, o0 + r,
                     bias, res, y, s);
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

// Tuning switch (-D): ROCMC_Q_OCC, NVPTX resident workgroups a multiprocessor to fit registers for. 3: 165
// registers, none spilled (sm_90); 4 (128 registers, spilling) was 1.02x faster at one 4-bit row and 1.1x slower at
// two, 5 1.6x slower, 2 (unbounded) with 3 rounds ahead 1.18x slower (an H200 sweep, bench/quant_sweep.py).
#ifndef ROCMC_Q_OCC
#define ROCMC_Q_OCC 3
#endif
LINEAR_Q(linear_q_f16, linear_q_bits, _Float16, ROCMC_Q_OCC)
LINEAR_Q(linear_q_bf16, linear_q_bits, bf16_t, ROCMC_Q_OCC)
