// Attention of many query rows per head (rocmc's sdpa and sdpa_cached in a prefill: a prompt's tokens against
// themselves and any cached prefix), flash attention on the matrix units: no score matrix in memory.
//
// q (b, hq, sq, d), k and v (E, hkv, stride, d) of which batch row i reads entries kb + i and vb + i, or kb + slots[i]
// and vb + slots[i] with FLAG_SLOTS, at their first S positions (a KV cache's entries read in place: k and v may be
// one buffer; plain sdpa: E = b, stride = S), out (b, hq, sq, d); the hq / hkv query heads of a kv head
// share its keys and values (GQA). mask (bool, 1 = keep), optional, addressed as
// mask[bi * mask_b + hi * mask_h + i * mask_q + j] (a stride 0 broadcasts); FLAG_CAUSAL keeps j <= i + S - sq.
// scores = q . k * scale accumulated in f32; the online softmax in f32; the probabilities are rounded to the
// element type for their product with v (as flash attention does), accumulated in f32; out is rounded once. A row
// that keeps no position gives NaN (0 / 0), as the float64 reference does.
//
// Work: a workgroup per (batch row, query head, BQ query rows); each wave takes 16 of the rows. The keys and values
// go by in tiles of P positions through shared memory. A tile's keep bits (mask, causal, S) are staged in shared
// memory first; a tile that no row of the workgroup keeps is skipped, its keys and values never read (the causal
// triangle, a sliding window, padding). NVIDIA sm_80+: the keys and values copied by cp.async (the values' copy
// in flight while the scores compute), scores and the weighted sum by mma.sync m16n8k16 with q held in registers
// as the first operand, the probabilities reused from the scores' registers, fragments by ldmatrix (.trans for
// v). AMD gfx90a / gfx94x: MFMA 16x16x16 computing the transposed products (scores^T = k q^T, out^T = v^T p^T),
// so the scores' registers are the next product's operand with no exchange between lanes. Shared rows are d / 8
// pieces of 16 bytes, a piece's place XORed with the row's low 3 bits (8 rows read at one piece: 8 bank groups).
//
// Symbols: attention_prefill_{f16,bf16}_d{64,128,256}, one a head dim. ABI (bindings,
// push constants, FLAG_* bits, BLOCK): the "attention_prefill" KernelFamily in rocmc/lowering/kernels.py (the
// bindings and constants of attention_decode). Workgroup: BLOCK x 1 x 1. Grid: b * hq * ceil(sq / BQ), BQ = 16
// query rows a wave. Elsewhere (no matrix instructions) the entry point traps: the lowering never dispatches it.
#include "rocmc_gpu.h"
#include "mma.h"
#include "kernel_abi.h"

typedef RawBytes<16>::type U4;

#define NW (BLOCK / WAVE)
#define BQ (NW * 16)        // query rows of a workgroup: 16 a wave
// 16-byte pieces of a key tile (and of a value tile), 8 KB each: 64 positions of d 64, 32 of d 128, 16 of d 256.
// Larger tiles hold more scores in registers: at 64 positions of d 128 ptxas spilled (sm_90, 255 registers).
#define TILE_PIECES 512
#define KEEP_WORDS 2        // keep bits of a row of a tile: P <= 64

struct AttnShape {
  u32 hq, hkv, sq, S, d, kb, vb, mask_b, mask_h, mask_q, flags;
  float scale;
  u32 stride, E;
};

struct Smem {
  U4 k[TILE_PIECES], v[TILE_PIECES];
  u32 keep[2][BQ][KEEP_WORDS];  // a tile's keep bits (row, 32 positions a word), by the tile's parity
  u32 any[3];                   // whether any row keeps any position of a tile, by the tile's count mod 3
};

// Where piece p of row r lives (in pieces), rows of `pieces` pieces.
template <int PIECES> DEVICE u32 slot(u32 r, u32 p) { return r * PIECES + (p ^ (r & 7)); }

template <typename T> DEVICE u32 pack2(float a, float b) {
  const float f[2] = {a, b};
  return __builtin_bit_cast(u32, round_vec<T, 2>(f));
}

// 8 elements at p (16 bytes), zeros when `in` is false; `wide`: p is 16-byte aligned.
DEVICE U4 piece(const u16* p, bool in, bool wide) {
  if (!in) return U4{0u, 0u, 0u, 0u};
  if (wide) return *(const U4*)p;
  u32 h[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) h[e] = (u32)p[2 * e] | (u32)p[2 * e + 1] << 16;
  return U4{h[0], h[1], h[2], h[3]};
}

#if HAS_MMA

// The keys (or values) of positions j0 .. j0 + P - 1 of one kv head, `base` at its position 0, into `tile`; zeros
// past S. NVIDIA: asynchronously where `wide` (the caller commits and waits).
template <int D, int P> DEVICE void load_tile(U4* tile, const u16* base, u32 j0, u32 S, bool wide) {
  constexpr u32 PIECES = D / 8;
#pragma unroll
  for (u32 n = 0; n < P * PIECES / BLOCK; ++n) {
    const u32 id = thread_x() + n * BLOCK, r = id / PIECES, p = id % PIECES;
    const bool in = j0 + r < S;
    const u16* src = base + (u64)(in ? j0 + r : 0) * D + p * 8;
    U4* dst = tile + slot<PIECES>(r, p);
#if defined(__NVPTX__)
    if (wide) {
      cp_async16(dst, src, in ? 16u : 0u);
      continue;
    }
#endif
    *dst = piece(src, in, wide);
  }
}

template <typename T, int D>
DEVICE void attend(const T* q, const T* k, const T* v, const unsigned char* mask, const u32* slots, T* out,
                   const AttnShape& s, Smem& sm) {
  constexpr int P = TILE_PIECES * 8 / D > 64 ? 64 : TILE_PIECES * 8 / D;  // positions a tile: 64, 32, 16
  constexpr u32 PIECES = D / 8, WORDS = (P + 31) / 32;
  const u32 qtiles = (s.sq + BQ - 1) / BQ, id = block_x();
  const u32 qt = qtiles - 1 - id % qtiles;  // the longest rows (causal) first
  const u32 h = id / qtiles % s.hq, bi = id / qtiles / s.hq, hk = h / (s.hq / s.hkv);
  const u32 q0 = qt * BQ, wave = thread_x() / WAVE, lane = thread_x() % WAVE;
  const bool causal = s.flags & FLAG_CAUSAL, has_mask = s.flags & FLAG_MASK;
  const bool wide = aligned16(q, k, v, out);
  const u32 top = s.kb > s.vb ? s.kb : s.vb, last = s.E - 1 - top;  // the last slot inside the buffer
  const u32 slot = (s.flags & FLAG_SLOTS) ? read_index(slots, bi, s.flags & FLAG_SLOTS_I64, last) : bi;
  const u16* kbase = (const u16*)k + ((u64)(s.kb + slot) * s.hkv + hk) * s.stride * D;
  const u16* vbase = (const u16*)v + ((u64)(s.vb + slot) * s.hkv + hk) * s.stride * D;
  const u16* qrows = (const u16*)q + ((u64)bi * s.hq + h) * s.sq * D;
  T* orows = out + ((u64)bi * s.hq + h) * s.sq * D;
  const unsigned char* mrows = mask + (u64)bi * s.mask_b + (u64)h * s.mask_h;
  const float scale = s.scale * 1.4426950408889634f;  // scores in log2 units: exp2 below
  const float NEG = -__builtin_inff();

  // Positions past the last one the causal rule lets this workgroup's last row see: never visited.
  u32 end = s.S;
  if (causal) {
    const long last = (long)(q0 + BQ < s.sq ? q0 + BQ : s.sq) - 1 + (long)s.S - (long)s.sq;
    end = last < 0 ? 0 : (last + 1 < (long)s.S ? (u32)(last + 1) : s.S);
  }
  if (thread_x() < 3) sm.any[thread_x()] = 0u;
  sync_threads();

  // The keep bits of tile j0 into sm.keep[par]; whether the workgroup keeps any of it.
  auto stage_keep = [&](u32 j0, u32 par, u32 count) __attribute__((always_inline)) {
    for (u32 w = thread_x(); w < BQ * WORDS; w += BLOCK) {
      const u32 r = w / WORDS, c0 = w % WORDS * 32, i = q0 + r;
      u32 bits = 0;
      if (i < s.sq) {
        const unsigned char* m = mrows + (u64)i * s.mask_q + j0 + c0;
#pragma unroll 8
        for (u32 e = 0; e < 32; ++e) {
          const u32 j = j0 + c0 + e;
          bool keep = c0 + e < (u32)P && j < s.S && (!causal || j + s.sq <= i + s.S);
          if (keep && has_mask) keep = m[e] != 0;
          bits |= (u32)keep << e;
        }
      }
      sm.keep[par][r][w % WORDS] = bits;
      if (bits) sm.any[count % 3] = 1u;
    }
    if (thread_x() == 0) sm.any[(count + 1) % 3] = 0u;  // the next tile's flag (last read two tiles ago)
    sync_threads();
    return sm.any[count % 3] != 0u;
  };

#if defined(__NVPTX__)
  // Lane (g = lane / 4, t = lane % 4) of wave w: query rows r0 = 16 w + g and r0 + 8 of the workgroup.
  const u32 g = lane / 4, t = lane % 4, r0 = wave * 16 + g;
  // q's rows as mma's first operand, k 16 at a time: held in registers up to d 128; d 256 reads them again each
  // tile (from the cache: the registers would spill).
  constexpr bool QREG = D <= 128;
  auto qfrag = [&](int kk, u32(&a)[4]) __attribute__((always_inline)) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const u32 i = q0 + r0 + 8 * (e % 2), c = kk * 16 + 2 * t + 8 * (e / 2);
      const u16* p = qrows + (u64)i * D + c;
      a[e] = i >= s.sq ? 0u : (wide ? *(const u32*)p : (u32)p[0] | (u32)p[1] << 16);
    }
  };
  u32 qa[QREG ? D / 16 : 1][4];
  if constexpr (QREG)
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) qfrag(kk, qa[kk]);
  // This lane's ldmatrix addresses, for pieces 8 m + 2 u (+ 1): the swizzle XORs a row's low 3 bits (lane % 8
  // for every row a lane addresses) into the piece's, so 4 bases and constant offsets cover every piece (a base
  // per piece would be loop-invariant registers by the dozen). Keys: rows 8 (lane / 16) + lane % 8 of each 16,
  // piece 2 kk + (lane / 8) % 2; values (.trans): rows 8 ((lane / 8) % 2) + lane % 8, piece j + lane / 16.
  const U4 *kl[4], *vl[4];
#pragma unroll
  for (u32 u = 0; u < 4; ++u) {
    kl[u] = sm.k + ((lane / 16) * 8 + lane % 8) * PIECES + ((2 * u + (lane / 8) % 2) ^ (lane % 8));
    vl[u] = sm.v + ((lane / 8) % 2 * 8 + lane % 8) * PIECES + ((2 * u + lane / 16) ^ (lane % 8));
  }
  float o[D / 8][4], mx[2] = {NEG, NEG}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;

  u32 count = 0;
  for (u32 j0 = 0; j0 < end; j0 += P, ++count) {
    const u32 par = count & 1;
    if (!stage_keep(j0, par, count)) continue;
    load_tile<D, P>(sm.k, kbase, j0, s.S, wide);
    cp_commit();
    load_tile<D, P>(sm.v, vbase, j0, s.S, wide);
    cp_commit();
    cp_wait<1>();
    sync_threads();  // the keys are in
    float sc[P / 8][4];
#pragma unroll
    for (int j = 0; j < P / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[j][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      u32 a[4];
      if constexpr (QREG)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = qa[kk][e];
      else
        qfrag(kk, a);
#pragma unroll
      for (int j = 0; j < P / 8; j += 2) {  // matrices (keys 8j.., piece 2kk), (8j.., 2kk+1), (8j+8.., 2kk), (.., 2kk+1)
        u32 r[4];
        ldmatrix4(r, kl[kk % 4] + j * 8 * PIECES + 8 * (kk / 4));
        mma16<T>(sc[j], a[0], a[1], a[2], a[3], r[0], r[1]);
        mma16<T>(sc[j + 1], a[0], a[1], a[2], a[3], r[2], r[3]);
      }
    }
    // sc[j][e]: row r0 + 8 (e / 2), position 8 j + 2 t + e % 2 of the tile.
    float tmax[2] = {NEG, NEG};
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const u32* bits = sm.keep[par][r0 + 8 * hr];
#pragma unroll
      for (int j = 0; j < P / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const u32 c = 8 * j + 2 * t + e;
          const float x = (bits[c / 32] >> (c % 32)) & 1u ? sc[j][2 * hr + e] * scale : NEG;
          sc[j][2 * hr + e] = x;
          tmax[hr] = x > tmax[hr] ? x : tmax[hr];
        }
    }
    float alpha[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      tmax[hr] = __builtin_fmaxf(tmax[hr], shfl_xor(tmax[hr], 1));
      tmax[hr] = __builtin_fmaxf(tmax[hr], shfl_xor(tmax[hr], 2));
      const float mnew = __builtin_fmaxf(mx[hr], tmax[hr]);
      alpha[hr] = mnew == NEG ? 1.0f : exp2_f32(mx[hr] - mnew);
      mx[hr] = mnew;
      const float base = mnew == NEG ? 0.0f : mnew;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < P / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = exp2_f32(sc[j][2 * hr + e] - base);
          sc[j][2 * hr + e] = p;
          sum += p;
        }
      l[hr] = l[hr] * alpha[hr] + sum;
    }
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][e] *= alpha[e / 2];
    cp_wait<0>();
    sync_threads();  // the values are in
#pragma unroll
    for (int kk = 0; kk < P / 16; ++kk) {
      // The probabilities of positions 16 kk .. 16 kk + 15 as the first operand: the scores' registers of tiles
      // 2 kk and 2 kk + 1 are its layout.
      const u32 a0 = pack2<T>(sc[2 * kk][0], sc[2 * kk][1]), a1 = pack2<T>(sc[2 * kk][2], sc[2 * kk][3]);
      const u32 a2 = pack2<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), a3 = pack2<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
      for (int j = 0; j < D / 8; j += 2) {  // matrices (positions 16kk.., piece j), (16kk+8.., j), (.., j+1), (.., j+1)
        u32 r[4];
        ldmatrix4_trans(r, vl[j / 2 % 4] + kk * 16 * PIECES + 8 * (j / 8));
        mma16<T>(o[j], a0, a1, a2, a3, r[0], r[1]);
        mma16<T>(o[j + 1], a0, a1, a2, a3, r[2], r[3]);
      }
    }
  }
  cp_wait<0>();
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    l[hr] += shfl_xor(l[hr], 1);
    l[hr] += shfl_xor(l[hr], 2);
    const u32 i = q0 + r0 + 8 * hr;
    if (i >= s.sq) continue;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const u32 c = 8 * j + 2 * t;
      const u32 two = pack2<T>(o[j][2 * hr] / l[hr], o[j][2 * hr + 1] / l[hr]);
      u16* p = (u16*)(orows + (u64)i * D + c);
      if (wide) {
        *(u32*)p = two;
      } else {
        p[0] = (u16)two, p[1] = (u16)(two >> 16);
      }
    }
  }
#else
  // AMD: lane (r = lane % 16, qd = lane / 16) of wave w works for query row 16 w + r of the workgroup. scores^T
  // (positions x rows) = k q^T: k's row r and q's row r at the same k (pieces 4c + qd of d); st[n][e] is position
  // 16 n + 4 qd + e. out^T (d x rows) += v^T p^T: v^T's row (d 16 dt + r) at positions 4 qd .. 4 qd + 3 read from
  // shared memory, p^T's column r at the same positions: st's registers. ot[dt][e] is d 16 dt + 4 qd + e.
  const u32 r = lane % 16, qd = lane / 16, row = wave * 16 + r, i = q0 + row;
  U4 qb[D / 32];
#pragma unroll
  for (int c = 0; c < D / 32; ++c) qb[c] = piece(qrows + (u64)i * D + (4 * c + qd) * 8, i < s.sq, wide);
  float ot[D / 16][4], mx = NEG, l = 0.0f;
#pragma unroll
  for (int j = 0; j < D / 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) ot[j][e] = 0.0f;
  const u16* vs = (const u16*)sm.v;
  u32 count = 0;
  for (u32 j0 = 0; j0 < end; j0 += P, ++count) {
    const u32 par = count & 1;
    if (!stage_keep(j0, par, count)) continue;
    load_tile<D, P>(sm.k, kbase, j0, s.S, wide);
    load_tile<D, P>(sm.v, vbase, j0, s.S, wide);
    sync_threads();
    float st[P / 16][4], tmax = NEG;
#pragma unroll
    for (int n = 0; n < P / 16; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[n][e] = 0.0f;
#pragma unroll
      for (int c = 0; c < D / 32; ++c) {
        const U4 a = sm.k[slot<PIECES>(n * 16 + r, 4 * c + qd)];
        mfma16<T>(st[n], a.x, a.y, qb[c].x, qb[c].y);
        mfma16<T>(st[n], a.z, a.w, qb[c].z, qb[c].w);
      }
      const u32* bits = sm.keep[par][row];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const u32 c = 16 * n + 4 * qd + e;
        st[n][e] = (bits[c / 32] >> (c % 32)) & 1u ? st[n][e] * scale : NEG;
        tmax = st[n][e] > tmax ? st[n][e] : tmax;
      }
    }
    tmax = __builtin_fmaxf(tmax, shfl_xor(tmax, 16));
    tmax = __builtin_fmaxf(tmax, shfl_xor(tmax, 32));
    const float mnew = __builtin_fmaxf(mx, tmax), alpha = mnew == NEG ? 1.0f : exp2_f32(mx - mnew);
    const float base = mnew == NEG ? 0.0f : mnew;
    mx = mnew;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < P / 16; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        st[n][e] = exp2_f32(st[n][e] - base);
        sum += st[n][e];
      }
    l = l * alpha + sum;
#pragma unroll
    for (int dt = 0; dt < D / 16; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) ot[dt][e] *= alpha;
#pragma unroll
    for (int n = 0; n < P / 16; ++n) {
      const u32 b0 = pack2<T>(st[n][0], st[n][1]), b1 = pack2<T>(st[n][2], st[n][3]);
#pragma unroll
      for (int dt = 0; dt < D / 16; ++dt) {
        const u32 d = 16 * dt + r;
        u32 e4[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) e4[e] = vs[slot<PIECES>(16 * n + 4 * qd + e, d / 8) * 8 + d % 8];
        mfma16<T>(ot[dt], e4[0] | e4[1] << 16, e4[2] | e4[3] << 16, b0, b1);
      }
    }
  }
  l += shfl_xor(l, 16);
  l += shfl_xor(l, 32);
  if (i < s.sq) {
#pragma unroll
    for (int dt = 0; dt < D / 16; ++dt) {
      u16* p = (u16*)(orows + (u64)i * D + 16 * dt + 4 * qd);
      const u32 lo = pack2<T>(ot[dt][0] / l, ot[dt][1] / l), hi = pack2<T>(ot[dt][2] / l, ot[dt][3] / l);
      p[0] = (u16)lo, p[1] = (u16)(lo >> 16), p[2] = (u16)hi, p[3] = (u16)(hi >> 16);
    }
  }
#endif
}

template <typename T, int D>
DEVICE void prefill_entry(const T* q, const T* k, const T* v, const unsigned char* mask, const u32* slots, T* out,
                          const AttnShape& s) {
  SHARED Smem sm;
  attend<T, D>(q, k, v, mask, slots, out, s, sm);
}
#else
template <typename T, int D>
DEVICE void prefill_entry(const T*, const T*, const T*, const unsigned char*, const u32*, T*, const AttnShape&) {
  __builtin_trap();  // no matrix instructions the kernel is written for: never dispatched here
}
#endif

// One entry point a head dim: each gets the registers its own arrays need.
#define ATTENTION_PREFILL(name, T, D)                                                             \
  KERNEL_OCC(BLOCK, 2) void name(KERNEL_PARAMS(T)) {                                              \
    AttnShape s{hq,    hkv,   sq,                                                                 \
                S < stride ? S : stride, /* never past the positions stored */                    \
                d,     kb,    vb, mask_b, mask_h, mask_q, flags, __builtin_bit_cast(float, scale), \
                stride, E};                                                                       \
    prefill_entry<T, D>(q, k, v, mask, slots, out, s);                                            \
  }
ATTENTION_PREFILL(attention_prefill_f16_d64, _Float16, 64)
ATTENTION_PREFILL(attention_prefill_f16_d128, _Float16, 128)
ATTENTION_PREFILL(attention_prefill_f16_d256, _Float16, 256)
ATTENTION_PREFILL(attention_prefill_bf16_d64, bf16_t, 64)
ATTENTION_PREFILL(attention_prefill_bf16_d128, bf16_t, 128)
ATTENTION_PREFILL(attention_prefill_bf16_d256, bf16_t, 256)
