// Linear layers of many rows on Hopper's warpgroup matrix instructions (wgmma, NVIDIA sm_90a: H100, H200): a
// prefill's projections where the module is compiled for cuda:sm_90, as linear_mm.hip computes them elsewhere (the
// same ABI, epilogue and rounding: linear.h), at the instruction rate mma.sync can't reach on these GPUs.
//
// y (M, N) = epilogue(x (M, K) @ w^T), w (N, K) as stored, or (2N, K) with FLAG_GATED (the gate's N rows, then the
// up's), accumulated in f32. No FLAG_NORM (rms_norm's kernel runs before it).
//
// Work: a workgroup per BM x BN tile of y (gated: BN / 2 outputs, the tile's first BN / 2 w rows their gate rows and
// the last BN / 2 their up rows); two warpgroups of 128 threads, each the tile's 64 rows x BN columns with
// wgmma.m64nBNk16 reading both operands from shared memory through matrix descriptors. K goes by in chunks of 64
// (one 128-byte row a tile row), STAGES chunks in flight: cp.async copies them (zero-filled past M, N and K) into
// the 128-byte-swizzle layout the descriptors name (16-byte piece p of row r at p ^ (r % 8)); a chunk's copies are
// made visible to the matrix instructions (fence.proxy.async) before the barrier that starts its products. K % 8 != 0
// or unaligned buffers take element loads (linear.h's load8) stored to shared memory directly.
//
// Symbols: linear_wgmma_{f16,bf16}. ABI: the "linear_wgmma" KernelFamily in rocmc/lowering/kernels.py (linear_mm's
// bindings and constants); the tiles are dynamic shared memory (the export's workgroup_local_memory: the family's
// local_memory). Workgroup: BLOCK x 1 x 1. Grid: ceil(M / BM) * ceil(N / (gated ? BN / 2 : BN)), the workgroups of
// one column of tiles consecutive. Built for sm_90a only; elsewhere the entry point traps (never dispatched).
//
// Tuning switches, set with -D to compare versions (bench/mm_sweep.py): ROCMC_WG_BN, ROCMC_WG_STAGES, ROCMC_WG_OCC
// (resident workgroups a multiprocessor to fit registers for), ROCMC_WG_ASYNC; the family's BLOCK sets the rows
// (BLOCK / 128 warpgroups of 64). The defaults, 128 x 128 tiles, 3 stages, two workgroups a multiprocessor (122
// registers) and each chunk's products waited for, were the fastest on an H200 (BENCHMARKS.md): one workgroup of 4
// stages 1.37x slower at 512 rows; a group of products in flight 1.3-1.4x slower; 256 x 128 tiles (4 warpgroups)
// 1.07-1.15x slower; 128 x 256 tiles spill (100 to 3500 bytes) and run 15-25x slower.
#include "linear.h"

#ifndef ROCMC_WG_BN
#define ROCMC_WG_BN 128
#endif
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
#define WG_BN ROCMC_WG_BN
#define WG_BK 64    // k of a chunk: a 128-byte row of f16 / bf16
#define WG_ROW 128  // bytes of a tile row
#define WG_STAGES ROCMC_WG_STAGES
#define WG_STAGE_BYTES ((WG_BM + WG_BN) * WG_ROW)
#define WG_XP (WG_BM * 8 / BLOCK)  // x pieces a thread copies a chunk
#define WG_WP (WG_BN * 8 / BLOCK)  // w pieces
static_assert(BLOCK % 128 == 0 && WG_BN * 8 % BLOCK == 0, "whole warpgroups, and a chunk's w pieces over the threads");

#if defined(__NVPTX__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d (this thread's share of a 64 x N f32 tile) += a (64 x 16) . b (16 x N), a and b K-major tiles in shared memory
// named by descriptors. d[4 j + e]: row 16 (warp % 4) + lane / 4 + 8 (e / 2), column 8 j + 2 (lane % 4) + e % 2.
template <int N, typename T> DEVICE void wgmma(float (&d)[N / 2], u64 a, u64 b, u32 accumulate);
template <> DEVICE void wgmma<128, _Float16>(float (&d)[64], u64 a, u64 b, u32 accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      :
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
}
template <> DEVICE void wgmma<128, bf16_t>(float (&d)[64], u64 a, u64 b, u32 accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      :
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
}
template <> DEVICE void wgmma<256, _Float16>(float (&d)[128], u64 a, u64 b, u32 accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      :
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(accumulate));
}
template <> DEVICE void wgmma<256, bf16_t>(float (&d)[128], u64 a, u64 b, u32 accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      :
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(accumulate));
}

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

template <typename T>
DEVICE void linear_wgmma_body(const T* x, const T* w, const T* bias, const T* res, T* y, const LinShape& s) {
  const bool gated = s.flags & FLAG_GATED;
  const u32 outs = gated ? WG_BN / 2 : WG_BN;  // outputs a workgroup
  const u32 mtiles = (s.M + WG_BM - 1) / WG_BM;
  const u32 m0 = block_x() % mtiles * WG_BM, n0 = block_x() / mtiles * outs;
  const u32 tid = thread_x(), group = tid / 128, warp = tid / 32 % 4, lane = tid % 32;
  const u32 rows_w = gated ? 2 * s.N : s.N;
  const bool wide = s.K % 8 == 0 && aligned16(x, w);
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
  auto load = [&](u32 c, u32 stage) __attribute__((always_inline)) {
    unsigned char* tile = wg_tiles + stage * WG_STAGE_BYTES;
#pragma unroll
    for (u32 i = 0; i < WG_XP + WG_WP; ++i) {
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
  float d[WG_BN / 2];
#pragma unroll
  for (int i = 0; i < WG_BN / 2; ++i) d[i] = 0.0f;
#pragma unroll
  for (u32 st = 0; st < WG_AHEAD; ++st) {
    if (st < chunks) load(st, st);
    cp_commit();
  }
  const u32 base = shared_addr(wg_tiles);
  for (u32 c = 0; c < chunks; ++c) {
    cp_wait<WG_AHEAD - 1>();
    fence_proxy_async();
    sync_threads();  // chunk c is in; every warpgroup is done with the stage the next copy overwrites
    const u32 tile = base + c % WG_STAGES * WG_STAGE_BYTES;
    const u64 da = tile_desc(tile + group * 64 * WG_ROW), db = tile_desc(tile + WG_BM * WG_ROW);
    wgmma_fence();
#pragma unroll
    for (u32 kk = 0; kk < WG_BK / 16; ++kk) wgmma<WG_BN, T>(d, da + 2 * kk, db + 2 * kk, 1u);  // +32 bytes a step
    wgmma_commit();
    const u32 next = c + WG_AHEAD;
    if (next < chunks) load(next, next % WG_STAGES);  // the stage of chunk c - 1 (c - 2 with a group in flight)
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
template <typename T> DEVICE void linear_wgmma_body(const T*, const T*, const T*, const T*, T*, const LinShape&) {
  __builtin_trap();  // no warpgroup matrix instructions: never dispatched here
}
#endif

#define LINEAR_WGMMA(name, T)                                                   \
  KERNEL_OCC(BLOCK, ROCMC_WG_OCC) void name(KERNEL_PARAMS(T)) {                 \
    LinShape s{M, N, K, flags, __builtin_bit_cast(float, eps)};                 \
    linear_wgmma_body<T>(x, w, bias, residual, y, s);                           \
  }
LINEAR_WGMMA(linear_wgmma_f16, _Float16)
LINEAR_WGMMA(linear_wgmma_bf16, bf16_t)
