// wgmma.h: the tiled matrix product of many rows on Hopper's warpgroup matrix instructions that linear_wgmma.hip
// (weights of x's type) and linear_qwgmma.hip (4- or 8-bit weights, dequantized on their way into shared memory)
// share; each .hip's header says what it computes.
//
// Work: a workgroup per BM x 128 tile of y (gated: 64 outputs, the tile's first 64 w rows their gate rows and the
// last 64 their up rows); BLOCK / 128 warpgroups, each the tile's 64 rows x 128 columns with wgmma.m64n128k16
// reading both operands from shared memory through matrix descriptors. K goes by in chunks of 64 (one 128-byte row
// a tile row), STAGES chunks in flight: cp.async copies them (zero-filled past M, N and K) into the 128-byte-swizzle
// layout the descriptors name (16-byte piece p of row r at p ^ (r % 8)); a chunk's copies are made visible to the
// matrix instructions (fence.proxy.async) before the barrier that starts its products. K % 8 != 0 or unaligned
// buffers take element loads (linear.h's load8) stored to shared memory directly. Packed weights (mm.h's layout and
// MmWeights) are loaded into registers an iteration before they are stored to their stage as x's type (mm.h's
// dequant8: linear_qmm's arithmetic); K and the group size are multiples of a chunk there.
//
// The tiles are dynamic shared memory (the export's workgroup_local_memory: the family's local_memory). Built for
// sm_90a only; elsewhere the entry points trap (never dispatched).
//
// Tuning switches, set with -D to compare versions (bench/mm_sweep.py): ROCMC_WG_STAGES, ROCMC_WG_OCC
// (resident workgroups a multiprocessor to fit registers for), ROCMC_WG_ASYNC; the family's BLOCK sets the rows
// (BLOCK / 128 warpgroups of 64). The defaults, 128 x 128 tiles, 3 stages, two workgroups a multiprocessor (122
// registers) and each chunk's products waited for, were the fastest on an H200 (BENCHMARKS.md): one workgroup of 4
// stages 1.37x slower at 512 rows; a group of products in flight 1.3-1.4x slower; 256 x 128 tiles (4 warpgroups)
// 1.07-1.15x slower; 128 x 256 tiles (m64n256, measured with an earlier version) spilled (100 to 3500 bytes) and ran
// 15-25x slower.
#pragma once
#include "mm.h"

#ifndef ROCMC_WG_STAGES
#define ROCMC_WG_STAGES 3  // 3 x 32 KB: two workgroups a multiprocessor in its 228 KB
#endif
#ifndef ROCMC_WG_OCC
#define ROCMC_WG_OCC 2
#endif
#ifndef ROCMC_WG_ASYNC
#define ROCMC_WG_ASYNC 0  // 1: a chunk's products still run while the next chunk's are issued (one group in flight)
#endif
// Chunks copied ahead of the one computed: a stage is free again once every warpgroup has waited for the products
// that read it, one iteration later with a group in flight.
#define WG_AHEAD (ROCMC_WG_STAGES - 1 - ROCMC_WG_ASYNC)
#define WG_BM (BLOCK / 128 * 64)  // rows of x a workgroup: a warpgroup's 64 each
#define WG_BN 128  // w rows a workgroup: wgmma's n
#define WG_BK 64    // k of a chunk: a 128-byte row of f16 / bf16
#define WG_ROW 128  // bytes of a tile row
#define WG_STAGES ROCMC_WG_STAGES
#define WG_STAGE_BYTES ((WG_BM + WG_BN) * WG_ROW)
#define WG_XP (WG_BM * 8 / BLOCK)  // x pieces a thread copies a chunk
#define WG_WP (WG_BN * 8 / BLOCK)  // w pieces
static_assert(BLOCK % 128 == 0 && WG_BN * 8 % BLOCK == 0, "whole warpgroups, and a chunk's w pieces over the threads");
static_assert(WG_STAGES * WG_STAGE_BYTES <= LOCAL_MEMORY, "the tiles fit the dynamic shared memory a dispatch gives");

#if defined(__NVPTX__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d (this thread's share of a 64 x 128 f32 tile) += a (64 x 16) . b (16 x 128), a and b K-major tiles in shared
// memory named by descriptors. d[4 j + e]: row 16 (warp % 4) + lane / 4 + 8 (e / 2), column 8 j + 2 (lane % 4) + e % 2.
template <typename T> DEVICE void wgmma(float (&d)[64], u64 a, u64 b, u32 accumulate);
// The accumulator's 64 registers as asm operands %0 .. %63.
#define WG_D64 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WG_MMA(T, TY)                                                                                         \
  template <> DEVICE void wgmma<T>(float (&d)[64], u64 a, u64 b, u32 accumulate) {                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
                 : WG_D64                                                                                       \
                 : "l"(a), "l"(b), "r"(accumulate));                                                           \
  }
WG_MMA(_Float16, "f16")
WG_MMA(bf16_t, "bf16")

DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> DEVICE void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// This thread's writes to shared memory (cp.async's, once waited for, and plain stores) seen by the async proxy
// the matrix instructions read through.
DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// The descriptor of a K-major tile at shared address `addr` (1024-byte aligned): 128-byte rows in the 128-byte
// swizzle, 8-row groups 1024 bytes apart (the leading offset is unused in this layout: 1).
DEVICE u64 tile_desc(u32 addr) {
  return (u64)((addr & 0x3FFFFu) >> 4) | (u64)1 << 16 | (u64)(1024 >> 4) << 32 | (u64)1 << 62;
}
// Byte offset of 16-byte piece p of row r in a tile.
DEVICE u32 wg_slot(u32 r, u32 p) { return r * WG_ROW + ((p ^ (r & 7u)) << 4); }

extern SHARED __attribute__((aligned(1024))) unsigned char wg_tiles[];

// A thread's packed w pieces of a chunk, in registers between their load and their store (linear_qwgmma).
template <int BITS> struct WgPacked {
  u32 q[WG_WP][BITS / 4];
  float s[WG_WP], nzs[WG_WP];
};

template <typename T, int BITS>
DEVICE void linear_wgmma_body(const T* x, const MmWeights<T>& W, const T* bias, const T* res, T* y, const LinShape& s) {
  const T* w = (const T*)W.w;
  const bool gated = s.flags & FLAG_GATED;
  const u32 outs = gated ? WG_BN / 2 : WG_BN;  // outputs a workgroup
  const u32 mtiles = (s.M + WG_BM - 1) / WG_BM;
  const u32 m0 = block_x() % mtiles * WG_BM, n0 = block_x() / mtiles * outs;
  const u32 tid = thread_x(), group = tid / 128, warp = tid / 32 % 4, lane = tid % 32;
  const u32 rows_w = gated ? 2 * s.N : s.N;
  const bool wide = s.K % 8 == 0 && aligned16(x, BITS ? x : w);
  const u32 chunks = (s.K + WG_BK - 1) / WG_BK;
  u32 xrow[WG_XP], wrow[WG_WP];  // the source rows of this thread's pieces (past the end: M / rows_w)
#pragma unroll
  for (u32 i = 0; i < WG_XP; ++i) xrow[i] = m0 + (tid + i * BLOCK) / 8;
#pragma unroll
  for (u32 i = 0; i < WG_WP; ++i) {
    const u32 r = (tid + i * BLOCK) / 8, half = WG_BN / 2;
    const u32 o = n0 + (gated && r >= half ? r - half : r);  // the output this row feeds
    wrow[i] = o >= s.N ? rows_w : gated && r >= half ? s.N + o : o;
  }
  constexpr u32 LOADS = BITS ? WG_XP : WG_XP + WG_WP;  // pieces a thread copies as they are
  auto load = [&](u32 c, u32 stage) __attribute__((always_inline)) {
    unsigned char* tile = wg_tiles + stage * WG_STAGE_BYTES;
#pragma unroll
    for (u32 i = 0; i < LOADS; ++i) {
      const bool is_x = i < WG_XP;
      const u32 id = tid + (is_x ? i : i - WG_XP) * BLOCK, r = id / 8, p = id % 8, k = c * WG_BK + p * 8;
      const u32 row = is_x ? xrow[i] : wrow[i - WG_XP], rows = is_x ? s.M : rows_w;
      const T* src = is_x ? x : w;
      unsigned char* dst = tile + (is_x ? 0u : WG_BM * WG_ROW) + wg_slot(r, p);
      if (wide) {
        const bool in = row < rows && k < s.K;
        cp_async16(dst, in ? src + (u64)row * s.K + k : src, in ? 16u : 0u);
      } else {
        *(U4*)dst = load8(src, row, rows, k, s.K, false, false);
      }
    }
  };
  // Packed w (BITS 4 or 8; K and the group size multiples of a chunk): a thread's pieces of chunk c into registers
  // with their group's scale and -zero * scale (rows past the end: zeros), then as x's type to shared memory.
  WgPacked<BITS ? BITS : 4> pk;
  auto fetch = [&](u32 c) __attribute__((always_inline)) {
    const unsigned char* wb = (const unsigned char*)W.w;
    const u32 group = c * WG_BK / W.gs;
#pragma unroll
    for (u32 i = 0; i < WG_WP; ++i) {
      const u32 id = tid + i * BLOCK, k = c * WG_BK + id % 8 * 8, row = wrow[i];
      const bool in = row < rows_w;
      const u32 rr = in ? row : 0u, g = rr * W.G + group;
      const unsigned char* p = wb + (u64)rr * (s.K / 8 * BITS) + k / 8 * BITS;
      u32 v[BITS ? BITS / 4 : 1];
      if (!W.aligned) {
#pragma unroll
        for (int j = 0; j < BITS / 4; ++j) v[j] = word_at(p + 4 * j);
      } else if constexpr (BITS == 8) {
        const RawBytes<8>::type b = *(const RawBytes<8>::type*)p;
        v[0] = b.x, v[1] = b.y;
      } else {
        v[0] = *(const u32*)p;
      }
#pragma unroll
      for (int j = 0; j < BITS / 4; ++j) pk.q[i][j] = in ? v[j] : 0u;
      const float sc = in ? to_f32(W.scales[g]) : 0.0f;
      pk.s[i] = sc, pk.nzs[i] = in ? -to_f32(W.zeros[g]) * sc : 0.0f;
    }
  };
  auto put = [&](u32 stage) __attribute__((always_inline)) {
    unsigned char* tile = wg_tiles + stage * WG_STAGE_BYTES + WG_BM * WG_ROW;
#pragma unroll
    for (u32 i = 0; i < WG_WP; ++i) {
      const u32 id = tid + i * BLOCK;
      *(U4*)(tile + wg_slot(id / 8, id % 8)) = dequant8<T, BITS ? BITS : 4>(pk.q[i], pk.s[i], pk.nzs[i]);
    }
  };
  float d[WG_BN / 2];
#pragma unroll
  for (int i = 0; i < WG_BN / 2; ++i) d[i] = 0.0f;
#pragma unroll
  for (u32 st = 0; st < WG_AHEAD; ++st) {
    if (st < chunks) {
      load(st, st);
      if constexpr (BITS != 0) fetch(st), put(st);
    }
    cp_commit();
  }
  // Packed w goes through registers: each chunk's bytes are loaded an iteration before they are stored.
  if constexpr (BITS != 0)
    if (WG_AHEAD < chunks) fetch(WG_AHEAD);
  const u32 base = shared_addr(wg_tiles);
  for (u32 c = 0; c < chunks; ++c) {
    cp_wait<WG_AHEAD - 1>();
    fence_proxy_async();
    sync_threads();  // chunk c is in; every warpgroup is done with the stage the next copy overwrites
    const u32 tile = base + c % WG_STAGES * WG_STAGE_BYTES;
    const u64 da = tile_desc(tile + group * 64 * WG_ROW), db = tile_desc(tile + WG_BM * WG_ROW);
    wgmma_fence();
#pragma unroll
    for (u32 kk = 0; kk < WG_BK / 16; ++kk) wgmma<T>(d, da + 2 * kk, db + 2 * kk, 1u);  // +32 bytes a step
    wgmma_commit();
    const u32 next = c + WG_AHEAD;
    if (next < chunks) load(next, next % WG_STAGES);  // the stage of chunk c - 1 (c - 2 with a group in flight)
    if constexpr (BITS != 0) {
      if (next < chunks) put(next % WG_STAGES);  // fetched an iteration ago
      if (next + 1 < chunks) fetch(next + 1);
    }
    cp_commit();
    wgmma_wait<ROCMC_WG_ASYNC>();
  }
  wgmma_wait<0>();
  cp_wait<0>();
#pragma unroll
  for (int j = 0; j < WG_BN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const u32 m = m0 + group * 64 + warp * 16 + lane / 4 + 8 * (e / 2), col = 8 * j + 2 * (lane % 4) + e % 2;
      if (m >= s.M) continue;
      if (gated) {
        if (j >= WG_BN / 16) continue;  // up columns: taken with their gate column
        if (n0 + col < s.N) store_out<T>(d[4 * j + e], d[4 * (j + WG_BN / 16) + e], true, 1.0f, m, n0 + col, bias, res, y, s);
      } else if (n0 + col < s.N) {
        store_out<T>(d[4 * j + e], 0.0f, false, 1.0f, m, n0 + col, bias, res, y, s);
      }
    }
}
#else
template <typename T, int BITS>
DEVICE void linear_wgmma_body(const T*, const MmWeights<T>&, const T*, const T*, T*, const LinShape&) {
  __builtin_trap();  // no warpgroup matrix instructions: never dispatched here
}
#endif

