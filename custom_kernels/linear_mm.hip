// Linear layers of many rows on the matrix units: a prefill's projections (rocmc's linear, fused_linear and
// gated_linear when x has more rows than linear_rows takes, or a symbolic number of them), on IREE's stream like
// every dispatch of the module, with the epilogue of linear.h: bias, residual add, activation, act(gate) * up.
//
// y (M, N) = epilogue(x (M, K) @ w^T), w (N, K) as stored, or (2N, K) when gated (FLAG_GATED: the gate's N rows,
// then the up's N rows), accumulated in f32 and rounded as linear_rows.hip's header says. No FLAG_NORM (the norm is
// rms_norm's kernel before it).
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
// Symbols: linear_mm_{f16,bf16}. ABI: the "linear_mm" KernelFamily in rocmc/lowering/kernels.py (linear_rows'
// bindings and constants). Workgroup: BLOCK x 1 x 1. Grid: ceil(M / BM) * ceil(N / (gated ? BN / 2 : BN)), the
// workgroups of one column of tiles (the same w rows) consecutive. Elsewhere (gfx1100's WMMA, sm < 80) the entry
// point traps: the lowering never dispatches it there (kernel/linear.py says why and IREE's code takes the op).
//
// Tuning switch, set with -D to compare versions: ROCMC_MM_OCC, NVPTX resident workgroups a multiprocessor to fit
// registers for (1: up to 255 registers a thread, 154 used; 2: 128, no spills at sm_90's ptxas). 2 is the default:
// on an H200 it took a 4096^3 GEMM from 129 to 216 TFLOP/s and a 7B prefill's projections 1.2-1.7x faster at 512
// and 2048 rows (bench/prefill_gpu.py, BENCHMARKS.md).
#include "linear.h"

#define BM 128    // rows of x a workgroup
#define BN 128    // rows of w a workgroup
#define BK 32     // k of a chunk
#define PIECES 4  // 16-byte pieces of a chunk's row
#if defined(__NVPTX__)
#define STAGES 3  // chunks in shared memory: 3 x 16 KB, static shared memory's 48 KB
#else
#define STAGES 2
#endif
#define WROWS (BM / 2)         // x rows a wave
#define WCOLS (BN / (NW / 2))  // w rows a wave
#define MI (WROWS / 16)        // the wave's 16-row tiles of x
#ifndef ROCMC_MM_OCC
#define ROCMC_MM_OCC 2  // NVPTX: resident workgroups a multiprocessor to fit registers for
#endif

#if HAS_MMA

struct MmTiles {
  U4 x[STAGES][BM * PIECES];
  U4 w[STAGES][BN * PIECES];
};

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

// The chunk at k0 of this workgroup's x rows and w rows, piece by piece over the threads.
struct Loader {
  const u16 *x, *w;
  u32 xrow[BM * PIECES / BLOCK], wrow[BN * PIECES / BLOCK];  // rows of this thread's pieces, past the end: M / rows_w
  u32 M, rows_w, K;
  bool wide;
};


// Piece i of this thread's share of a chunk (i < (BM + BN) * PIECES / BLOCK): x's pieces first, then w's.
template <typename T>
DEVICE void load_piece(const Loader& L, MmTiles& t, u32 stage, u32 k0, u32 i) {
  constexpr u32 XP = BM * PIECES / BLOCK;
  const bool is_x = i < XP;
  const u32 id = thread_x() + (is_x ? i : i - XP) * BLOCK, r = id / PIECES, p = id % PIECES, k = k0 + p * 8;
  const u32 row = is_x ? L.xrow[i] : L.wrow[i - XP], rows = is_x ? L.M : L.rows_w;
  const u16* base = is_x ? L.x : L.w;
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

template <typename T>
DEVICE void linear_mm(const T* x, const T* w, const T* bias, const T* res, T* y, const LinShape& s, MmTiles& t) {
  const bool gated = s.flags & FLAG_GATED;
  const u32 outs = gated ? BN / 2 : BN;  // outputs a workgroup
  const u32 mtiles = (s.M + BM - 1) / BM;
  const u32 m0 = block_x() % mtiles * BM, n0 = block_x() / mtiles * outs;
  const u32 wave = thread_x() / WAVE, lane = thread_x() % WAVE;
  const u32 wm = wave % 2 * WROWS, wn = wave / 2 * WCOLS;  // the wave's block of the tile
  Loader L;
  L.x = (const u16*)x, L.w = (const u16*)w, L.M = s.M, L.rows_w = gated ? 2 * s.N : s.N, L.K = s.K;
  L.wide = s.K % 8 == 0 && aligned16(x, w);
#pragma unroll
  for (u32 i = 0; i < BM * PIECES / BLOCK; ++i) L.xrow[i] = m0 + (thread_x() + i * BLOCK) / PIECES;
#pragma unroll
  for (u32 i = 0; i < BN * PIECES / BLOCK; ++i)
    L.wrow[i] = w_row_of((thread_x() + i * BLOCK) / PIECES, n0, gated, s.N);
  constexpr u32 LOADS = (BM + BN) * PIECES / BLOCK;
  const u32 chunks = (s.K + BK - 1) / BK;

#if defined(__NVPTX__)
  constexpr int NI = WCOLS / 8;  // the wave's 8-row tiles of w
  float acc[MI][NI][4];
#pragma unroll
  for (int a = 0; a < MI; ++a)
#pragma unroll
    for (int b = 0; b < NI; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[a][b][i] = 0.0f;
#pragma unroll
  for (u32 st = 0; st < STAGES - 1; ++st) {
    if (st < chunks)
#pragma unroll
      for (u32 i = 0; i < LOADS; ++i) load_piece<T>(L, t, st, st * BK, i);
    cp_commit();
  }
  for (u32 c = 0; c < chunks; ++c) {
    cp_wait<STAGES - 2>();
    sync_threads();  // chunk c is in; every wave is done with the stage the next copy overwrites
    const u32 next = c + STAGES - 1;
    if (next < chunks)
#pragma unroll
      for (u32 i = 0; i < LOADS; ++i) load_piece<T>(L, t, next % STAGES, next * BK, i);
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
  }
  cp_wait<0>();
  // acc[i][j][e]: x row wm + 16 i + lane / 4 + 8 (e / 2), tile row of w wn + 8 j + 2 (lane % 4) + e % 2.
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const u32 m = m0 + wm + i * 16 + lane / 4 + 8 * (e / 2);
      if (m >= s.M) continue;
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const u32 col = 8 * j + 2 * (lane % 4) + e % 2;  // within the wave's WCOLS
        if (gated) {
          if (j >= NI / 2) continue;  // up rows: taken with their gate row
          const u32 n = n0 + wave / 2 * (WCOLS / 2) + col;
          if (n < s.N) store_out<T>(acc[i][j][e], acc[i][j + NI / 2][e], true, 1.0f, m, n, bias, res, y, s);
        } else {
          const u32 n = n0 + wn + col;
          if (n < s.N) store_out<T>(acc[i][j][e], 0.0f, false, 1.0f, m, n, bias, res, y, s);
        }
      }
    }
#else
  // AMD: lane (r = lane % 16, q = lane / 16) reads piece q of row r of each 16-row tile; the pieces' 8 elements
  // feed two MFMA 16x16x16 (linear.h's mma_chunk), the same order for x and w. acc[i][j][e]: x row 16 i + 4 q + e,
  // w row 16 j + r of the wave's block.
  constexpr int NI = WCOLS / 16;
  float acc[MI][NI][4];
#pragma unroll
  for (int a = 0; a < MI; ++a)
#pragma unroll
    for (int b = 0; b < NI; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[a][b][i] = 0.0f;
  const u32 r = lane % 16, q = lane / 16;
  U4 held[LOADS];  // the next chunk, in registers while this one computes
  auto fetch = [&](u32 k0) __attribute__((always_inline)) {
#pragma unroll
    for (u32 i = 0; i < LOADS; ++i) {
      constexpr u32 XP = BM * PIECES / BLOCK;
      const bool is_x = i < XP;
      const u32 id = thread_x() + (is_x ? i : i - XP) * BLOCK;
      held[i] = load8(is_x ? x : w, is_x ? L.xrow[i] : L.wrow[i - XP], is_x ? L.M : L.rows_w, k0 + id % PIECES * 8,
                      s.K, L.wide, !is_x);
    }
  };
  auto put = [&](u32 stage) __attribute__((always_inline)) {
#pragma unroll
    for (u32 i = 0; i < LOADS; ++i) {
      constexpr u32 XP = BM * PIECES / BLOCK;
      const bool is_x = i < XP;
      const u32 id = thread_x() + (is_x ? i : i - XP) * BLOCK;
      (is_x ? t.x[stage] : t.w[stage])[slot(id / PIECES, id % PIECES)] = held[i];
    }
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
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const u32 col = 16 * j + r;
        if (gated) {
          if (j >= NI / 2) continue;
          const u32 n = n0 + wave / 2 * (WCOLS / 2) + col;
          if (n < s.N) store_out<T>(acc[i][j][e], acc[i][j + NI / 2][e], true, 1.0f, m, n, bias, res, y, s);
        } else {
          const u32 n = n0 + wn + col;
          if (n < s.N) store_out<T>(acc[i][j][e], 0.0f, false, 1.0f, m, n, bias, res, y, s);
        }
      }
    }
#endif
}

template <typename T>
DEVICE void linear_mm_entry(const T* x, const T* w, const T* bias, const T* res, const T*, T* y, const LinShape& s) {
  SHARED MmTiles tiles;
  linear_mm<T>(x, w, bias, res, y, s, tiles);
}
#else
template <typename T>
DEVICE void linear_mm_entry(const T*, const T*, const T*, const T*, const T*, T*, const LinShape&) {
  __builtin_trap();  // no matrix instructions the kernel is written for: never dispatched here
}
#endif

#define LINEAR_MM(name, T)                                       \
  KERNEL_OCC(BLOCK, ROCMC_MM_OCC) void name(KERNEL_PARAMS(T)) {  \
    LinShape s{M, N, K, flags, __builtin_bit_cast(float, eps)};  \
    linear_mm_entry<T>(x, w, bias, residual, norm, y, s);        \
  }
LINEAR_MM(linear_mm_f16, _Float16)
LINEAR_MM(linear_mm_bf16, bf16_t)
