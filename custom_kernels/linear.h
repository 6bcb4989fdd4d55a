// linear.h: what the linear-layer kernels share (linear_rows.hip, linear_q.hip): the shape they are dispatched
// with, 16-byte loads of 8 elements, the epilogue (bias, residual, activation, the gate's act(gate) * up, as the
// separate ops round them) and the prologue of a fused RMSNorm.
#pragma once
#include "rocmc_gpu.h"
#include "mma.h"
#include "kernel_abi.h"  // generated from the including kernel's KernelFamily: FLAG_BIAS .. FLAG_NORM by those names

typedef RawBytes<16>::type U4;

#define NW (BLOCK / WAVE)
#define TILE 16   // rows of w a workgroup: one matrix-instruction tile
#define KC 32     // k of a chunk: two matrix instructions of k 16
#define MAX_M 32  // rows of x
#if HAS_MMA && defined(__NVPTX__)
#define MT 8  // x rows one matrix instruction takes
#elif HAS_MMA
#define MT 16
#else
#define MT 8
#endif

// w vectors (16 bytes) a lane loads per tile and chunk: TILE x KC elements over a wave's lanes.
#define WV (TILE * KC * 2 / (WAVE * 16))

// ---- the matrix instructions: acc (this lane's 4 of the 16 x MT tile) += w (16 x 32) . x (32 x MT) ----------
#if HAS_MMA && defined(__NVPTX__)
// Lane (g = lane / 4, t = lane % 4) holds w rows g and g + 8 (w[0], w[1]) and x row g, each at k = 8t .. 8t + 7;
// logical k (2t, 2t+1, 2t+8, 2t+9) of the first instruction are its elements 0..3, of the second 4..7. acc[i]:
// w row g + 8 (i / 2), x row 2t + i % 2.
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

#if HAS_MMA
// Partial sums of the waves: [wave][tile][row of w * MAX_M + row of x].
struct Partials {
  float v[NW][2][TILE * MAX_M];
};
#endif


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

// f16 pairs: two f16 values in a 32-bit register (the quantized kernels build them from packed values' bits).
typedef _Float16 h2_t __attribute__((ext_vector_type(2)));
DEVICE h2_t as_h2(u32 v) { return __builtin_bit_cast(h2_t, v); }
DEVICE u32 h2_bits(h2_t v) { return __builtin_bit_cast(u32, v); }
DEVICE h2_t splat_h2(float v) { return h2_t{(_Float16)v, (_Float16)v}; }

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

// The sum of v over a wave's lanes, in every lane.
DEVICE float wave_sum(float v) {
#pragma unroll
  for (u32 o = WAVE / 2; o >= 1; o /= 2) v += shfl_xor(v, o);
  return v;
}
