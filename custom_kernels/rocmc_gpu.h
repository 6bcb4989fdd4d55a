// rocmc_gpu.h: the few GPU primitives rocmc's kernels need, for AMDGPU (HIP mode) and NVPTX (CUDA mode).
//
// Kernels are built with -nogpuinc/-nocudainc: no HIP or CUDA headers, no device libraries. Everything here
// is a clang builtin, so one source builds with a stock clang for gfx9 (wave64), gfx11 (wave32) and sm_NN.
// Kernel ABI (what IREE's custom dispatches pass): the bindings as pointers in layout order, then the push
// constants as 32-bit integers; each source's are declared once, in Python (KernelFamily in
// rocmc/lowering/kernels.py), and reach the source as the generated kernel_abi.h (KERNEL_PARAMS, BLOCK, FLAG_*).
#pragma once

#if !defined(__AMDGCN__) && !defined(__NVPTX__)
#error "rocmc_gpu.h: build for an amdgcn or nvptx device (hip/cuda device-only compilation)"
#endif

// Tuning switches, set with -D by bench/kernel_sweep.py to compare versions (the defaults: the measured best):
// ROCMC_HW_BF16: round f32 to bf16 with the hardware conversion where there is one (NVIDIA sm_80+): 0 never
//                (integer arithmetic), 1 one element an instruction, 2 two where a kernel rounds a vector at
//                once (round_vec). The rounding is the same: to nearest even, NaN stays NaN.
// ROCMC_LOAD_NC: NVPTX streaming loads through the read-only path without L1 allocation (ld.global.nc
//                .L1::no_allocate) instead of ld.global.cs.
#ifndef ROCMC_HW_BF16
#define ROCMC_HW_BF16 2
#endif
#ifndef ROCMC_LOAD_NC
#define ROCMC_LOAD_NC 0
#endif

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#define DEVICE __attribute__((device)) static inline __attribute__((always_inline))
#define DEVICE_MEMBER __attribute__((device)) inline __attribute__((always_inline))
#define SHARED __attribute__((shared))

// KERNEL(threads) void name(...): an exported entry point whose block holds at most `threads` threads.
// KERNEL_OCC(threads, blocks): the same, compiled to fit `blocks` resident blocks per multiprocessor (a register
// limit; NVPTX only, 0 = none).
#if defined(__AMDGCN__)
#define KERNEL(threads) \
  extern "C" __attribute__((global, amdgpu_flat_work_group_size(1, threads))) __attribute__((visibility("default")))
#define KERNEL_OCC(threads, blocks) KERNEL(threads)
#else
#define KERNEL(threads) extern "C" __attribute__((global, launch_bounds(threads)))
#define KERNEL_OCC(threads, blocks) extern "C" __attribute__((global, launch_bounds(threads, blocks)))
#endif

// ---- thread geometry ---------------------------------------------------------------------------------
#if defined(__AMDGCN__)
// __AMDGCN_WAVEFRONT_SIZE is 64 on gfx9 (CDNA) and 32 on gfx10+ (RDNA, built wave32 by default).
#define WAVE __AMDGCN_WAVEFRONT_SIZE
DEVICE u32 thread_x() { return __builtin_amdgcn_workitem_id_x(); }
DEVICE u32 block_x() { return __builtin_amdgcn_workgroup_id_x(); }
DEVICE u32 lane_id() { return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }
// Workgroups in the grid (the dispatch packet holds the grid size in work-items).
DEVICE u32 grid_x() { return __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(); }
#else
#define WAVE 32
DEVICE u32 thread_x() { return __nvvm_read_ptx_sreg_tid_x(); }
DEVICE u32 block_x() { return __nvvm_read_ptx_sreg_ctaid_x(); }
DEVICE u32 lane_id() { return __nvvm_read_ptx_sreg_laneid(); }
DEVICE u32 grid_x() { return __nvvm_read_ptx_sreg_nctaid_x(); }
#endif

// ---- synchronization and cross-lane exchange -------------------------------------------------------------
#if defined(__AMDGCN__)
DEVICE void sync_threads() {
  // Make shared-memory writes of this workgroup visible around the barrier (what HIP's __syncthreads does).
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
DEVICE float shfl_xor(float v, u32 mask) {
  // ds_bpermute addresses lanes in bytes; it reaches every lane of the wave (64 on gfx9).
  int src = (int)((lane_id() ^ mask) << 2);
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src, __builtin_bit_cast(int, v)));
}
#else
DEVICE void sync_threads() { __nvvm_bar_sync(0); }
DEVICE float shfl_xor(float v, u32 mask) { return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, mask, 0x1f); }
#endif

// An index read from an i32 or i64 tensor (i64: low word first, little endian), clamped to [0, hi].
DEVICE u32 read_index(const u32* p, u64 at, bool wide, u32 hi) {
  u32 lo = wide ? p[2 * at] : p[at];
  u32 top = wide ? p[2 * at + 1] : ((int)lo < 0 ? 0xffffffffu : 0u);
  if ((int)top < 0) return 0;  // negative
  return top != 0 || lo > hi ? hi : lo;
}

// True when every pointer allows 16-byte accesses (IREE binding offsets are not promised to be that aligned).
DEVICE bool aligned16(const void* a, const void* b, const void* c = 0, const void* d = 0) {
  return (((u64)a | (u64)b | (u64)c | (u64)d) & 15u) == 0;
}

DEVICE float rsqrt_f32(float x) { return 1.0f / __builtin_sqrtf(x); }
// 2^x in f32 with the hardware's approximation (v_exp_f32 / ex2.approx.ftz.f32: about 2 ulp; 2^-inf = 0), and
// e^x through it: what softmax kernels use (no device library here to supply expf).
#if defined(__AMDGCN__)
DEVICE float exp2_f32(float x) { return __builtin_amdgcn_exp2f(x); }
#else
DEVICE float exp2_f32(float x) { return __nvvm_ex2_approx_ftz_f(x); }
#endif
DEVICE float exp_f32(float x) { return exp2_f32(x * 1.4426950408889634f); }

// ---- storage types: f32, f16 and bf16 in memory, f32 in registers ------------------------------------------
// bf16 is handled as raw bits so the same code builds on every target, whatever clang's __bf16 support.
struct bf16_t { u16 bits; };

DEVICE float to_f32(float x) { return x; }
DEVICE float to_f32(_Float16 x) { return (float)x; }
DEVICE float to_f32(bf16_t x) { return __builtin_bit_cast(float, (u32)x.bits << 16); }

template <typename T> struct Tag {};
DEVICE float round_to(float x, Tag<float>) { return x; }
DEVICE _Float16 round_to(float x, Tag<_Float16>) { return (_Float16)x; }
DEVICE bf16_t round_to(float x, Tag<bf16_t>) {
#if defined(__NVPTX__) && __CUDA_ARCH__ >= 800 && ROCMC_HW_BF16
  return __builtin_bit_cast(bf16_t, __nvvm_f2bf16_rn(x));  // cvt.rn.bf16.f32: the same rounding, one instruction
#else
  u32 u = __builtin_bit_cast(u32, x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{(u16)((u >> 16) | 0x40)};  // NaN stays a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                                // round to nearest even
  return bf16_t{(u16)(u >> 16)};
#endif
}
template <typename T> DEVICE T from_f32(float x) { return round_to(x, Tag<T>()); }

// Vec<T, N>: N consecutive elements moved with one load/store of N*sizeof(T) bytes (16 at most).
template <int Bytes> struct RawBytes;
template <> struct RawBytes<2> { typedef u16 type; };
template <> struct RawBytes<4> { typedef u32 type; };
template <> struct RawBytes<8> { typedef u32 type __attribute__((ext_vector_type(2))); };
template <> struct RawBytes<16> { typedef u32 type __attribute__((ext_vector_type(4))); };

template <typename T, int N> struct Vec {
  T v[N];
};

// N floats rounded to T, as one Vec.
template <typename T, int N> DEVICE Vec<T, N> round_vec(const float (&f)[N]) {
  Vec<T, N> o;
#if defined(__NVPTX__) && __CUDA_ARCH__ >= 800 && ROCMC_HW_BF16 >= 2
  if constexpr (__is_same(T, bf16_t) && N % 2 == 0) {
#pragma unroll
    for (int j = 0; j < N; j += 2) {  // cvt.rn.bf16x2.f32: two elements an instruction, element j in the low half
      u32 two = __builtin_bit_cast(u32, __nvvm_ff2bf16x2_rn(f[j + 1], f[j]));
      o.v[j] = bf16_t{(u16)two};
      o.v[j + 1] = bf16_t{(u16)(two >> 16)};
    }
    return o;
  }
#endif
#pragma unroll
  for (int j = 0; j < N; ++j) o.v[j] = from_f32<T>(f[j]);
  return o;
}

template <typename T, int N> DEVICE Vec<T, N> load_vec(const T* p) {
  typedef typename RawBytes<sizeof(T) * N>::type R;
  R raw = *(const R*)p;
  return __builtin_bit_cast(Vec<T, N>, raw);
}
template <typename T, int N> DEVICE void store_vec(T* p, const Vec<T, N>& x) {
  typedef typename RawBytes<sizeof(T) * N>::type R;
  *(R*)p = __builtin_bit_cast(R, x);
}

// Streaming accesses: data touched once (a norm's rows), hinted to be evicted first so it displaces less of
// what is reused (weights, other kernels' data). AMDGPU: the nontemporal bit; NVPTX (whose backend drops
// !nontemporal): the .cs ("cache streaming") variants of ld/st. The loads are not volatile: their memory is
// read-only while a kernel runs, so the compiler may schedule them like plain loads.
#if defined(__AMDGCN__)
template <typename R> DEVICE R load_cs(const R* p) { return __builtin_nontemporal_load(p); }
template <typename R> DEVICE void store_cs(R* p, R v) { __builtin_nontemporal_store(v, p); }
#else
#if ROCMC_LOAD_NC
#define LD_STREAM "ld.global.nc.L1::no_allocate"
#else
#define LD_STREAM "ld.global.cs"
#endif
template <typename R> DEVICE R load_cs(const R* p);
template <typename R> DEVICE void store_cs(R* p, R v);
template <> DEVICE u16 load_cs(const u16* p) {
  u16 r;
  asm(LD_STREAM ".u16 %0, [%1];" : "=h"(r) : "l"(p));
  return r;
}
template <> DEVICE u32 load_cs(const u32* p) {
  u32 r;
  asm(LD_STREAM ".u32 %0, [%1];" : "=r"(r) : "l"(p));
  return r;
}
template <> DEVICE RawBytes<8>::type load_cs(const RawBytes<8>::type* p) {
  RawBytes<8>::type r;
  asm(LD_STREAM ".v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}
template <> DEVICE RawBytes<16>::type load_cs(const RawBytes<16>::type* p) {
  RawBytes<16>::type r;
  asm(LD_STREAM ".v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
template <> DEVICE void store_cs(u16* p, u16 v) {
  asm volatile("st.global.cs.u16 [%0], %1;" ::"l"(p), "h"(v) : "memory");
}
template <> DEVICE void store_cs(u32* p, u32 v) {
  asm volatile("st.global.cs.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
template <> DEVICE void store_cs(RawBytes<8>::type* p, RawBytes<8>::type v) {
  asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}
template <> DEVICE void store_cs(RawBytes<16>::type* p, RawBytes<16>::type v) {
  asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
#endif

template <typename T, int N> DEVICE Vec<T, N> load_vec_cs(const T* p) {
  typedef typename RawBytes<sizeof(T) * N>::type R;
  return __builtin_bit_cast(Vec<T, N>, load_cs<R>((const R*)p));
}
template <typename T, int N> DEVICE void store_vec_cs(T* p, const Vec<T, N>& x) {
  typedef typename RawBytes<sizeof(T) * N>::type R;
  store_cs<R>((R*)p, __builtin_bit_cast(R, x));
}

// Elements per 16-byte access.
template <typename T> struct Wide { static constexpr int N = 16 / sizeof(T); };
