// mm.h: the tiled matrix product of many rows that linear_mm.hip (weights of x's type) and linear_qmm.hip (4- or
// 8-bit weights, dequantized on their way into shared memory) share; each .hip's header says what it computes.
//
// Work: a workgroup per BM x BN tile of y (gated: BN / 2 outputs, the tile's w rows their gate and up rows side by
// side, so a lane holds both sums of an output). K goes by in chunks of BK through shared memory, STAGES chunks in
// flight: NVIDIA sm_80+ copies them with cp.async (zero-filled past M, N and K) and reads the matrix instructions'
// fragments with ldmatrix; AMD gfx90a / gfx94x load a chunk into registers while the previous one computes and
// store it after. The workgroup's waves split the tile 2 x (NW / 2): each computes a (BM / 2) x (BN / (NW / 2))
// block with mma.sync m16n8k16 (NVIDIA) or MFMA 16x16x16 (AMD). Shared rows of a chunk are 64 bytes (4 pieces of 16
// bytes); a piece's place in its row is XORed with bits of the row so that 8 rows read at one piece hit 8 different
// bank groups. K % 8 != 0 or unaligned buffers take element loads (load8), stored to shared memory directly.
//
// Packed weights (BITS 4 or 8, rocmc's layout: row n's K values in K * BITS / 8 bytes, value k in bits
// (k * BITS) % 8 .. of byte k * BITS / 8, a scale and a zero point a group of K / G values): a thread's w pieces of
// a chunk are loaded into registers as their packed bytes (4 or 8 a piece) with the piece's scale and zero point,
// and stored to shared memory as x's type, W = q * s - z * s rounded once (linear_qm's arithmetic), after the
// matrix instructions of the chunk before: NVIDIA keeps cp.async for x. The host admits K and K / G multiples of
// BK (a chunk is in one group, no chunk runs past K).
#pragma once
#include "linear.h"

// The tile: a source (or a sweep's -D) may set ROCMC_MM_BN and ROCMC_MM_STAGES before including this header.
#ifndef ROCMC_MM_BN
#define ROCMC_MM_BN 128
#endif
#ifndef ROCMC_MM_STAGES
#if defined(__NVPTX__)
#define ROCMC_MM_STAGES 3  // 3 x 16 KB at BN 128: static shared memory's 48 KB
#else
#define ROCMC_MM_STAGES 2
#endif
#endif
#define BM 128           // rows of x a workgroup
#define BN ROCMC_MM_BN   // rows of w a workgroup
#define BK 32            // k of a chunk
#define PIECES 4         // 16-byte pieces of a chunk's row
#define STAGES ROCMC_MM_STAGES  // chunks in shared memory
#define MM_TILE_BYTES (STAGES * (BM + BN) * PIECES * 16)
#define WROWS (BM / 2)         // x rows a wave
#define WCOLS (BN / (NW / 2))  // w rows a wave
#define MI (WROWS / 16)        // the wave's 16-row tiles of x
#define XP (BM * PIECES / BLOCK)  // x pieces a thread loads a chunk
#define WP (BN * PIECES / BLOCK)  // w pieces a thread loads a chunk
#ifndef ROCMC_MM_OCC
#define ROCMC_MM_OCC 2  // NVPTX: resident workgroups a multiprocessor to fit registers for
#endif

// The weights: w (as x's type, BITS 0) or its packed bytes with a scale and a zero point a group of gs values.
template <typename T> struct MmWeights {
  const void* w;
  const T *scales, *zeros;
  u32 G, gs;
  bool aligned;  // packed: w's address a multiple of 8 (rows are multiples of 16 bytes): word loads
};

#if HAS_MMA

struct MmTiles {
  U4 x[STAGES][BM * PIECES];
  U4 w[STAGES][BN * PIECES];
};

// MM_TILES(name): the workgroup's MmTiles, in static shared memory up to its 48 KB; past it (NVIDIA) in the dynamic
// shared memory the dispatch gives (the export's workgroup_local_memory, kernels.py's KernelFamily.local_memory).
#if defined(__NVPTX__) && MM_TILE_BYTES > 49152
static_assert(MM_TILE_BYTES <= LOCAL_MEMORY, "the tiles fit the dynamic shared memory a dispatch gives");
extern SHARED U4 mm_dynamic_tiles[];
#define MM_TILES(name) MmTiles& name = *reinterpret_cast<MmTiles*>(mm_dynamic_tiles)
#else
#define MM_TILES(name) SHARED MmTiles name
#endif

// Where piece p of row r of a chunk lives (in pieces).
DEVICE u32 slot(u32 r, u32 p) { return r * PIECES + (p ^ ((r >> 1) & 3)); }

// The w row behind row r of the tile (of workgroup column n0: its first output): gated, each wave's WCOLS rows
// are WCOLS / 2 gate rows and then the matching up rows.
DEVICE u32 w_row_of(u32 r, u32 n0, bool gated, u32 N) {
  if (!gated) return n0 + r;
  const u32 wave = r / WCOLS, within = r % WCOLS, o = n0 + wave * (WCOLS / 2) + within % (WCOLS / 2);
  if (o >= N) return 2 * N;  // past the outputs: zeros
  return within < WCOLS / 2 ? o : N + o;
}

// 4 bytes at p as a little-endian word, byte by byte (an unaligned packed w; out of line).
__attribute__((device, noinline)) static u32 word_at(const unsigned char* p) {
  return p[0] | p[1] << 8 | p[2] << 16 | (u32)p[3] << 24;
}

// The chunk at k0 of this workgroup's x rows and w rows, piece by piece over the threads.
struct Loader {
  const u16* x;
  u32 xrow[XP], wrow[WP];  // rows of this thread's pieces, past the end: M / rows_w
  u32 M, rows_w, K;
  bool wide;
};

// A thread's packed w pieces of a chunk, in registers between their load and their store: 4 bytes a piece (4-bit)
// or 8 (8-bit), with the piece's scale and -zero * scale.
template <int BITS> struct Packed {
  u32 q[WP][BITS / 4];
  float s[WP], nzs[WP];
};

// The id of piece i of this thread's share of a chunk (i < XP: x's, else w's i - XP).
DEVICE u32 piece_id(u32 i) { return thread_x() + (i < XP ? i : i - XP) * BLOCK; }

// Piece i of this thread's x pieces (i < XP) or plain w pieces (XP <= i < XP + WP), to shared memory.
template <typename T>
DEVICE void load_piece(const Loader& L, const u16* w, MmTiles& t, u32 stage, u32 k0, u32 i) {
  const bool is_x = i < XP;
  const u32 id = piece_id(i), r = id / PIECES, p = id % PIECES, k = k0 + p * 8;
  const u32 row = is_x ? L.xrow[i] : L.wrow[i - XP], rows = is_x ? L.M : L.rows_w;
  const u16* base = is_x ? L.x : w;
  U4* dst = (is_x ? t.x[stage] : t.w[stage]) + slot(r, p);
#if defined(__NVPTX__)
  if (L.wide) {
    const bool in = row < rows && k < L.K;
    cp_async16(dst, in ? base + (u64)row * L.K + k : base, in ? 16u : 0u);
    return;
  }
#endif
  *dst = load8((const T*)base, row, rows, k, L.K, L.wide, false);
}

// This thread's packed w pieces of the chunk at k0, into registers (rows past the end: q = 0, s = nzs = 0).
template <typename T, int BITS>
DEVICE void fetch_packed(const Loader& L, const MmWeights<T>& W, u32 k0, Packed<BITS>& pk) {
  const unsigned char* w = (const unsigned char*)W.w;
  const u32 group = k0 / W.gs;  // the chunk's (BK divides the group size)
#pragma unroll
  for (u32 i = 0; i < WP; ++i) {
    const u32 k = k0 + piece_id(XP + i) % PIECES * 8, row = L.wrow[i];
    const bool in = row < L.rows_w;
    const u32 rr = in ? row : 0u, g = rr * W.G + group;
    const unsigned char* p = w + (u64)rr * (L.K / 8 * BITS) + k / 8 * BITS;
    u32 v[BITS / 4];
    if (!W.aligned) {
#pragma unroll
      for (int j = 0; j < BITS / 4; ++j) v[j] = word_at(p + 4 * j);
    } else if constexpr (BITS == 4) {
      v[0] = *(const u32*)p;
    } else {
      const RawBytes<8>::type d = *(const RawBytes<8>::type*)p;
      v[0] = d.x, v[1] = d.y;
    }
#pragma unroll
    for (int j = 0; j < BITS / 4; ++j) pk.q[i][j] = in ? v[j] : 0u;
    const float s = in ? to_f32(W.scales[g]) : 0.0f;
    pk.s[i] = s, pk.nzs[i] = in ? -to_f32(W.zeros[g]) * s : 0.0f;
  }
}

// An integer v < 2^23 as f32, exactly: under the exponent of 2^23, then 2^23 subtracted (integer to float
// conversions run at a quarter of the FMA rate).
DEVICE float small_int(u32 v) { return __builtin_bit_cast(float, 0x4B000000u | v) - 8388608.0f; }

// 8 packed values (4-bit: one word, 8-bit: two; k's order from the low bits) as x's type, W = q * s + nzs rounded
// once. f16: two values at a time, as f16 pairs by their bits (0x6400 | q is 1024 + q), 1024 subtracted exactly, then
// one packed fma with s and nzs in f16 (linear_qm's arithmetic); bf16: through f32. Also linear_qwgmma's (wgmma.h).
template <typename T, int BITS> DEVICE U4 dequant8(const u32 (&q)[BITS / 4], float s, float nzs) {
  u32 h[4];
  if constexpr (__is_same(T, _Float16)) {
    const h2_t sv = splat_h2(s), zv = splat_h2(nzs), base = splat_h2(1024.0f);
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // values 2j, 2j + 1
      const u32 v = BITS == 4 ? q[0] >> (8 * j) : q[j / 2] >> (16 * (j % 2));
      const u32 bits = BITS == 4 ? (v & 0xFu) | (v << 12 & 0xF0000u) : (v & 0xFFu) | (v << 8 & 0xFF0000u);
      h[j] = h2_bits(__builtin_elementwise_fma(as_h2(bits | 0x64006400u) - base, sv, zv));
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      float q0, q1;
      if constexpr (BITS == 4) {
        q0 = small_int((q[0] >> (4 * e)) & 15u), q1 = small_int((q[0] >> (4 * e + 4)) & 15u);
      } else {
        q0 = small_int((q[e / 4] >> (8 * (e % 4))) & 255u);
        q1 = small_int((q[e / 4] >> (8 * (e % 4 + 1))) & 255u);
      }
      const u32 w0 = __builtin_bit_cast(u16, from_f32<T>(q0 * s + nzs));
      const u32 w1 = __builtin_bit_cast(u16, from_f32<T>(q1 * s + nzs));
      h[e / 2] = w0 | w1 << 16;
    }
  }
  return U4{h[0], h[1], h[2], h[3]};
}

// The packed pieces as x's type (dequant8), to shared memory.
template <typename T, int BITS> DEVICE void put_packed(const Packed<BITS>& pk, MmTiles& t, u32 stage) {
#pragma unroll
  for (u32 i = 0; i < WP; ++i) {
    const u32 id = piece_id(XP + i);
    t.w[stage][slot(id / PIECES, id % PIECES)] = dequant8<T, BITS>(pk.q[i], pk.s[i], pk.nzs[i]);
  }
}

template <int A, int B> DEVICE void zero(float (&acc)[A][B][4]) {
#pragma unroll
  for (int a = 0; a < A; ++a)
#pragma unroll
    for (int b = 0; b < B; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[a][b][i] = 0.0f;
}

// Element e of x row m in the wave's accumulators a[j] (col_of(j): the tile column of a[j][e] within the wave's
// WCOLS) through the epilogue: a w row's sum, or with a gate the gate row's (j < NI / 2) with its up row's.
template <typename T, int NI, typename Col>
DEVICE void store_row(const float (&a)[NI][4], int e, u32 m, Col col_of, u32 n0, u32 wave, u32 wn, const T* bias,
                      const T* res, T* y, const LinShape& s) {
  const bool gated = s.flags & FLAG_GATED;
#pragma unroll
  for (int j = 0; j < NI; ++j) {
    if (gated && j >= NI / 2) continue;  // up rows: taken with their gate row
    const u32 col = col_of(j), n = gated ? n0 + wave / 2 * (WCOLS / 2) + col : n0 + wn + col;
    if (n < s.N) store_out<T>(a[j][e], gated ? a[(j + NI / 2) % NI][e] : 0.0f, gated, 1.0f, m, n, bias, res, y, s);
  }
}

template <typename T, int BITS>
DEVICE void linear_mm(const T* x, const MmWeights<T>& W, const T* bias, const T* res, T* y, const LinShape& s,
                      MmTiles& t) {
  const bool gated = s.flags & FLAG_GATED;
  const u32 outs = gated ? BN / 2 : BN;  // outputs a workgroup
  const u32 mtiles = (s.M + BM - 1) / BM;
  const u32 m0 = block_x() % mtiles * BM, n0 = block_x() / mtiles * outs;
  const u32 wave = thread_x() / WAVE, lane = thread_x() % WAVE;
  const u32 wm = wave % 2 * WROWS, wn = wave / 2 * WCOLS;  // the wave's block of the tile
  const u16* wplain = (const u16*)W.w;
  Loader L;
  L.x = (const u16*)x, L.M = s.M, L.rows_w = gated ? 2 * s.N : s.N, L.K = s.K;
  L.wide = s.K % 8 == 0 && aligned16(x, BITS ? x : (const T*)W.w);
#pragma unroll
  for (u32 i = 0; i < XP; ++i) L.xrow[i] = m0 + (thread_x() + i * BLOCK) / PIECES;
#pragma unroll
  for (u32 i = 0; i < WP; ++i) L.wrow[i] = w_row_of((thread_x() + i * BLOCK) / PIECES, n0, gated, s.N);
  constexpr u32 LOADS = BITS ? XP : XP + WP;  // pieces a thread copies as they are
  const u32 chunks = (s.K + BK - 1) / BK;
  Packed<BITS ? BITS : 4> pk, ahead;  // packed w of the chunk stored next; NVIDIA: of the one after it

#if defined(__NVPTX__)
  constexpr int NI = WCOLS / 8;  // the wave's 8-row tiles of w
  float acc[MI][NI][4];
  zero(acc);
#pragma unroll
  for (u32 st = 0; st < STAGES - 1; ++st) {
    if (st < chunks) {
#pragma unroll
      for (u32 i = 0; i < LOADS; ++i) load_piece<T>(L, wplain, t, st, st * BK, i);
      if constexpr (BITS != 0) {
        fetch_packed<T, BITS>(L, W, st * BK, pk);
        put_packed<T, BITS>(pk, t, st);
      }
    }
    cp_commit();
  }
  // Packed w goes through registers: each chunk's bytes are loaded an iteration before they are stored, two before
  // they are used (as cp.async's copies are issued STAGES - 1 chunks ahead).
  if constexpr (BITS != 0)
    if (STAGES - 1 < chunks) fetch_packed<T, BITS>(L, W, (STAGES - 1) * BK, pk);
  for (u32 c = 0; c < chunks; ++c) {
    cp_wait<STAGES - 2>();
    sync_threads();  // chunk c is in; every wave is done with the stage the next copy overwrites
    const u32 next = c + STAGES - 1;
    if (next < chunks) {
#pragma unroll
      for (u32 i = 0; i < LOADS; ++i) load_piece<T>(L, wplain, t, next % STAGES, next * BK, i);
    }
    if constexpr (BITS != 0) {
      // Chunk next's packed w (loaded an iteration ago) to its stage, which held chunk c - 1 (every wave finished
      // it before the barrier above), ahead of chunk c's products so that its arithmetic can issue among them.
      if (next < chunks) put_packed<T, BITS>(pk, t, next % STAGES);
      if (next + 1 < chunks) fetch_packed<T, BITS>(L, W, (next + 1) * BK, ahead);
    }
    cp_commit();
    const U4 *tx = t.x[c % STAGES], *tw = t.w[c % STAGES];
#pragma unroll
    for (u32 h = 0; h < 2; ++h) {  // the chunk's two k16 halves: pieces 2h, 2h + 1
      u32 a[MI][4], b[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i)  // lanes 0-15: rows 0-15 at piece 2h, lanes 16-31 at 2h + 1
        ldmatrix4(a[i], tx + slot(wm + i * 16 + lane % 16, 2 * h + lane / 16));
#pragma unroll
      for (int j = 0; j < NI; j += 2) {  // matrices (rows 0-7, 2h), (0-7, 2h+1), (8-15, 2h), (8-15, 2h+1)
        u32 r[4];
        ldmatrix4(r, tw + slot(wn + j * 8 + (lane / 16) * 8 + lane % 8, 2 * h + (lane / 8) % 2));
        b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) mma16<T>(acc[i][j], a[i][0], a[i][1], a[i][2], a[i][3], b[j][0], b[j][1]);
    }
    if constexpr (BITS != 0) pk = ahead;
  }
  cp_wait<0>();
  // acc[i][j][e]: x row wm + 16 i + lane / 4 + 8 (e / 2), tile row of w wn + 8 j + 2 (lane % 4) + e % 2.
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const u32 m = m0 + wm + i * 16 + lane / 4 + 8 * (e / 2);
      if (m >= s.M) continue;
      store_row<T, NI>(acc[i], e, m, [&](int j) { return 8u * j + 2 * (lane % 4) + e % 2; }, n0, wave, wn, bias, res, y, s);
    }
#else
  // AMD: lane (r = lane % 16, q = lane / 16) reads piece q of row r of each 16-row tile; the pieces' 8 elements
  // feed two MFMA 16x16x16 (linear.h's mma_chunk), the same order for x and w. acc[i][j][e]: x row 16 i + 4 q + e,
  // w row 16 j + r of the wave's block.
  constexpr int NI = WCOLS / 16;
  float acc[MI][NI][4];
  zero(acc);
  const u32 r = lane % 16, q = lane / 16;
  U4 held[LOADS];  // the next chunk, in registers while this one computes
  auto fetch = [&](u32 k0) __attribute__((always_inline)) {
#pragma unroll
    for (u32 i = 0; i < LOADS; ++i) {
      const bool is_x = i < XP;
      held[i] = load8(is_x ? x : (const T*)wplain, is_x ? L.xrow[i] : L.wrow[i - XP], is_x ? L.M : L.rows_w,
                      k0 + piece_id(i) % PIECES * 8, s.K, L.wide, !is_x);
    }
    if constexpr (BITS != 0) fetch_packed<T, BITS>(L, W, k0, pk);
  };
  auto put = [&](u32 stage) __attribute__((always_inline)) {
#pragma unroll
    for (u32 i = 0; i < LOADS; ++i) {
      const u32 id = piece_id(i);
      (i < XP ? t.x[stage] : t.w[stage])[slot(id / PIECES, id % PIECES)] = held[i];
    }
    if constexpr (BITS != 0) put_packed<T, BITS>(pk, t, stage);
  };
  if (chunks > 0) {
    fetch(0);
    put(0);
  }
  for (u32 c = 0; c < chunks; ++c) {
    sync_threads();  // chunk c is in shared memory; the other stage is free
    if (c + 1 < chunks) fetch((c + 1) * BK);
    const U4 *tx = t.x[c % STAGES], *tw = t.w[c % STAGES];
    U4 a[MI], b[NI];
#pragma unroll
    for (int i = 0; i < MI; ++i) a[i] = tx[slot(wm + i * 16 + r, q)];
#pragma unroll
    for (int j = 0; j < NI; ++j) b[j] = tw[slot(wn + j * 16 + r, q)];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        mfma16<T>(acc[i][j], a[i].x, a[i].y, b[j].x, b[j].y);
        mfma16<T>(acc[i][j], a[i].z, a[i].w, b[j].z, b[j].w);
      }
    if (c + 1 < chunks) put((c + 1) % STAGES);
  }
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const u32 m = m0 + wm + i * 16 + 4 * q + e;
      if (m >= s.M) continue;
      store_row<T, NI>(acc[i], e, m, [&](int j) { return 16u * j + r; }, n0, wave, wn, bias, res, y, s);
    }
#endif
}

#endif  // HAS_MMA
