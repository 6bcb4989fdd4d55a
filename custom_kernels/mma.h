// mma.h: the matrix instructions rocmc's kernels use, one interface for NVIDIA sm_80+ (mma.sync m16n8k16,
// ldmatrix, cp.async) and AMD gfx90a / gfx94x (MFMA 16x16x16): HAS_MMA says whether the target has them.
#pragma once
#include "rocmc_gpu.h"

#if defined(__NVPTX__) && __CUDA_ARCH__ >= 800
#define HAS_MMA 1
#elif defined(__AMDGCN__) && (defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__))
#define HAS_MMA 1
#else
#define HAS_MMA 0
#endif

#if HAS_MMA && defined(__NVPTX__)
// c (16 x 8, f32) += a (16 x 16) . b (16 x 8): a row-major, b column-major, as mma.sync m16n8k16 lays them out
// over the lanes (g = lane / 4, t = lane % 4): a0 (row g, k 2t, 2t + 1), a1 (row g + 8), a2 (row g, k 2t + 8, +9),
// a3 (row g + 8, k 2t + 8, +9); b0 (k 2t, 2t + 1, column g), b1 (k 2t + 8, +9); c[i] (row g + 8 (i / 2), column
// 2t + i % 2).
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
DEVICE u32 shared_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
// 16 bytes from global memory to shared memory, asynchronously; zeros where `bytes` is 0.
DEVICE void cp_async16(void* dst, const void* src, u32 bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_addr(dst)), "l"(src), "r"(bytes)
               : "memory");
}
DEVICE void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> DEVICE void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
DEVICE void ldmatrix4(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_addr(p))
               : "memory");  // ordered after the barrier that makes the chunk visible
}
// The same as ldmatrix4, each 8 x 8 matrix transposed (lane l gets elements (2 (l % 4), l / 4) and (2 (l % 4) + 1,
// l / 4) of each).
DEVICE void ldmatrix4_trans(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_addr(p))
               : "memory");
}
#elif HAS_MMA
// c (16 x 16, f32) += a (16 x 4k) . b (4k x 16) with k 16 over the lanes (r = lane % 16, q = lane / 16): a0, a1
// hold a's row r at k 4q .. 4q + 3, b0, b1 b's column r at the same k; c[i] is (row 4q + i, column r).
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
#endif
