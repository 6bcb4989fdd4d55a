// Attention of a few query rows per head against keys and values as stored (rocmc's sdpa when the queries are
// few: a decode step's one new token per row), reading only the positions the mask keeps.
//
// q (b, hq, sq, d), k and v (b, hkv, S, d) from entry kb and vb on (a KV cache's entries, read in place: k and v
// may be one buffer), out (b, hq, sq, d); the hq / hkv query heads of a kv head share its keys and values (GQA).
// mask (bool, 1 = keep), optional, addressed as mask[bi * mask_b + hi * mask_h + i * mask_q + j] (a stride 0
// broadcasts); FLAG_CAUSAL keeps j <= i + S - sq.
// scores = q . k * scale in f32; softmax and the weighted sum of v in f32 (online, as flash attention); out is
// rounded once. A row that keeps no position gives NaN (0 / 0), as the float64 reference does.
//
// Work: one workgroup per (batch row, kv head): its R = (hq / hkv) * sq query rows against the positions. Each
// wave takes tiles of P positions (every NW-th tile: NW waves), the next tile's keys and values loaded while one
// is worked on; a lane holds E = d / WAVE elements of every row (q in registers); a tile's scores are summed
// across the wave together and the online softmax rescales once a tile. A position no row keeps is skipped: its
// keys and values are never read. Decode's mask (one row for every query row) is staged as bits in shared memory
// first, so no tile's loads wait on a mask load from global memory. The waves' partial results (running max, sum,
// weighted values) are combined in shared memory at the end.
//
// Symbols: attention_decode_{f32,f16,bf16}. ABI (bindings, push constants, FLAG_* bits, BLOCK): the
// "attention_decode" KernelFamily in rocmc/lowering/kernels.py. Workgroup: BLOCK x 1 x 1. Grid: b * hkv.
#include "rocmc_gpu.h"
#include "kernel_abi.h"

#define NW (BLOCK / WAVE)
#if defined(__AMDGCN__)
#define MAX_ROWS 4    // query rows of a workgroup (R): AMDGPU holds a row's running max and sum in scalar registers
#else
#define MAX_ROWS 16   // query rows of a workgroup (R)
#endif
#define MAX_CELLS 32  // R * E: the registers a lane gives q and the weighted sum each
#define MAX_KEEP_WORDS 1024  // positions whose shared mask bits are staged in shared memory: 32 a word
// Positions a wave works on at once, at most: AMDGPU keeps a tile's per-position values (keep bits, addresses)
// in scalar registers, of which more would spill.
#if defined(__AMDGCN__)
#define MAX_TILE 4
#else
#define MAX_TILE 16
#endif

struct AttnShape {
  u32 hq, hkv, sq, S, d, kb, vb, mask_b, mask_h, mask_q, flags;
  float scale;
};

// The waves' partial results, in shared memory (one buffer for every instantiation of attend).
struct Partial {
  float m[NW][MAX_ROWS], l[NW][MAX_ROWS], acc[NW][MAX_CELLS * WAVE];
};

// One tile of a wave: P positions' keep bits (bit r: row r keeps it) and their keys and values as stored.
template <typename T, int E, int P> struct Tile {
  u32 keep[P];
  Vec<T, E> k[P], v[P];
};

// A lane's E elements of row `p` (a key or value: E consecutive elements at lane * E) as stored: one vector
// access when `wide` (every pointer aligned to it), else element by element.
template <typename T, int E> DEVICE Vec<T, E> load_raw(const T* p, bool wide) {
  constexpr int B = sizeof(T) * E;
  if constexpr (B == 2 || B == 4 || B == 8 || B == 16) {
    if (wide) return load_vec<T, E>(p);
  }
  Vec<T, E> x;
#pragma unroll
  for (int e = 0; e < E; ++e) x.v[e] = p[e];
  return x;
}

// The same in f32.
template <typename T, int E> DEVICE void load_slice(const T* p, float (&out)[E], bool wide) {
  Vec<T, E> x = load_raw<T, E>(p, wide);
#pragma unroll
  for (int e = 0; e < E; ++e) out[e] = to_f32(x.v[e]);
}

template <typename T, int E, int RMAX>
DEVICE void attend(const T* q, const T* k, const T* v, const unsigned char* mask, T* out, const AttnShape& s,
                   Partial& part, u32* keep_words) {
  // Positions a wave takes at once: its scores (P * RMAX) and its keys and values (2 * P * E elements) stay in
  // registers; the next tile's are loaded while this one is worked on.
  constexpr int P1 = 32 / RMAX, P2 = 64 / (E * (int)sizeof(T)), P0 = P1 < P2 ? P1 : P2;
  constexpr int P = P0 < 1 ? 1 : (P0 > MAX_TILE ? MAX_TILE : P0);
  const u32 g = s.hq / s.hkv, R = g * s.sq;
  const u32 wg = block_x(), bi = wg / s.hkv, kh = wg % s.hkv;
  const u32 wave = thread_x() / WAVE, lane = thread_x() % WAVE;
  const bool has_mask = s.flags & FLAG_MASK, causal = s.flags & FLAG_CAUSAL;
  const bool wide = (((u64)q | (u64)k | (u64)v) % (sizeof(T) * E)) == 0;
  // Row r = (query head kh * g + r / sq, query i = r % sq).
  float qr[RMAX][E], acc[RMAX][E], m[RMAX], l[RMAX];
#pragma unroll
  for (int r = 0; r < RMAX; ++r) {
    m[r] = -__builtin_inff();
    l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) qr[r][e] = acc[r][e] = 0.0f;
    if ((u32)r < R) {
      u32 hi = kh * g + r / s.sq, i = r % s.sq;
      load_slice<T, E>(q + (((u64)bi * s.hq + hi) * s.sq + i) * s.d + lane * E, qr[r], wide);
#pragma unroll
      for (int e = 0; e < E; ++e) qr[r][e] *= s.scale;
    }
  }
  const u64 k_base = ((u64)(s.kb + bi) * s.hkv + kh) * s.S * s.d + lane * E;
  const u64 v_base = ((u64)(s.vb + bi) * s.hkv + kh) * s.S * s.d + lane * E;
  // Every row reads one mask value per position (decode's (b, 1, 1, S) mask): one read a position.
  const bool shared_mask = has_mask && !causal && (s.mask_h == 0 || g == 1) && (s.mask_q == 0 || s.sq == 1);
  const u32 all = R >= 32 ? ~0u : (1u << R) - 1u;
  const u64 mask_row = (u64)bi * s.mask_b + (u64)kh * g * s.mask_h;
  // One mask row for every row (decode): its keep bits staged in shared memory first, so a tile's key and value
  // loads wait on no mask load from global memory.
  const bool staged = shared_mask && s.S <= MAX_KEEP_WORDS * 32;
  if (staged) {
    for (u32 wd = thread_x(); wd * 32 < s.S; wd += BLOCK) {
      const u32 j0 = wd * 32, n = s.S - j0 < 32 ? s.S - j0 : 32;
      u32 bits = 0;
      if (n == 32) {
#pragma unroll
        for (u32 i = 0; i < 32; ++i) bits |= (u32)(mask[mask_row + j0 + i] != 0) << i;
      } else {
        for (u32 i = 0; i < n; ++i) bits |= (u32)(mask[mask_row + j0 + i] != 0) << i;
      }
      keep_words[wd] = bits;
    }
    sync_threads();
  }
  auto fetch = [&](u32 j0, Tile<T, E, P>& t) __attribute__((always_inline)) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      u32 j = j0 + p, bits = 0;
      if (j < s.S && staged) {
        bits = (keep_words[j >> 5] >> (j & 31)) & 1u ? all : 0u;
      } else if (j < s.S && shared_mask) {
        bits = mask[mask_row + j] ? all : 0u;
      } else if (j < s.S) {
        for (u32 r = 0; r < R; ++r) {
          u32 hi = kh * g + r / s.sq, i = r % s.sq;
          bool ok = !has_mask || mask[(u64)bi * s.mask_b + (u64)hi * s.mask_h + (u64)i * s.mask_q + j];
          if (causal && j > i + s.S - s.sq) ok = false;
          bits |= (u32)ok << r;
        }
      }
      t.keep[p] = bits;
      if (bits) {  // a position no row keeps is never read
        t.k[p] = load_raw<T, E>(k + k_base + (u64)j * s.d, wide);
        t.v[p] = load_raw<T, E>(v + v_base + (u64)j * s.d, wide);
      }
    }
  };
  const u32 stride = NW * P;
  Tile<T, E, P> cur, next;
  fetch(wave * P, cur);
  for (u32 j0 = wave * P; j0 < s.S; j0 += stride) {
    if (j0 + stride < s.S) fetch(j0 + stride, next);
    u32 any = 0;
#pragma unroll
    for (int p = 0; p < P; ++p) any |= cur.keep[p];
    if (any) {
      // Every row's score at every position of the tile: the lanes' partial dots, then one butterfly for all
      // (independent shuffles, issued back to back).
      float sc[P][RMAX];
#pragma unroll
      for (int p = 0; p < P; ++p) {
#pragma unroll
        for (int r = 0; r < RMAX; ++r) {
          float dot = 0.0f;
#pragma unroll
          for (int e = 0; e < E; ++e) dot += qr[r][e] * to_f32(cur.k[p].v[e]);
          sc[p][r] = dot;
        }
      }
#pragma unroll
      for (u32 off = WAVE / 2; off > 0; off >>= 1) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
#pragma unroll
          for (int r = 0; r < RMAX; ++r) sc[p][r] += shfl_xor(sc[p][r], off);
        }
      }
      // Online softmax, one rescale a tile.
#pragma unroll
      for (int r = 0; r < RMAX; ++r) {
        if ((u32)r >= R) continue;
        float mt = m[r];
#pragma unroll
        for (int p = 0; p < P; ++p) {
          if ((cur.keep[p] >> r) & 1u) mt = sc[p][r] > mt ? sc[p][r] : mt;
        }
        if (mt == -__builtin_inff()) continue;  // the row keeps nothing here
        float corr = exp_f32(m[r] - mt);
        l[r] *= corr;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[r][e] *= corr;
#pragma unroll
        for (int p = 0; p < P; ++p) {
          if (!((cur.keep[p] >> r) & 1u)) continue;  // (its registers hold no value of this tile)
          float w = exp_f32(sc[p][r] - mt);
          l[r] += w;
#pragma unroll
          for (int e = 0; e < E; ++e) acc[r][e] += w * to_f32(cur.v[p].v[e]);
        }
        m[r] = mt;
      }
    }
    cur = next;
  }
  // Combine the waves: every wave's (m, l, acc) to shared memory, then each thread finishes some outputs.
#pragma unroll
  for (int r = 0; r < RMAX; ++r) {
    if ((u32)r >= R) continue;
    if (lane == 0) part.m[wave][r] = m[r], part.l[wave][r] = l[r];
#pragma unroll
    for (int e = 0; e < E; ++e) part.acc[wave][r * E * WAVE + lane * E + e] = acc[r][e];
  }
  sync_threads();
  for (u32 o = thread_x(); o < R * s.d; o += BLOCK) {
    u32 r = o / s.d, c = o % s.d;
    float mx = -__builtin_inff();
    for (u32 w = 0; w < NW; ++w) mx = part.m[w][r] > mx ? part.m[w][r] : mx;
    float sum = 0.0f, val = 0.0f;
    for (u32 w = 0; w < NW; ++w) {
      float f = part.m[w][r] == -__builtin_inff() ? 0.0f : exp_f32(part.m[w][r] - mx);
      sum += part.l[w][r] * f;
      val += part.acc[w][r * E * WAVE + c] * f;
    }
    u32 hi = kh * g + r / s.sq, i = r % s.sq;
    out[(((u64)bi * s.hq + hi) * s.sq + i) * s.d + c] = from_f32<T>(val / sum);
  }
}

template <typename T>
DEVICE void attention_decode(const T* q, const T* k, const T* v, const unsigned char* mask, T* out,
                             const AttnShape& s) {
  SHARED Partial part;
  SHARED u32 keep_words[MAX_KEEP_WORDS];
  // E = d / WAVE elements a lane; the host admits only d and R that fit one of these (R * E <= MAX_CELLS). Few
  // rows (MHA, decode) get a variant with more positions a tile.
  const u32 R = s.hq / s.hkv * s.sq;
  switch (s.d / WAVE) {
    case 1:
      if (R <= 2) attend<T, 1, 2>(q, k, v, mask, out, s, part, keep_words);
      else attend<T, 1, MAX_ROWS>(q, k, v, mask, out, s, part, keep_words);
      break;
    case 2:
      if (R <= 2) attend<T, 2, 2>(q, k, v, mask, out, s, part, keep_words);
      else attend<T, 2, MAX_ROWS>(q, k, v, mask, out, s, part, keep_words);
      break;
    case 4:
      if (R <= 2) attend<T, 4, 2>(q, k, v, mask, out, s, part, keep_words);
      else attend<T, 4, (MAX_CELLS / 4 < MAX_ROWS ? MAX_CELLS / 4 : MAX_ROWS)>(q, k, v, mask, out, s, part, keep_words);
      break;
    case 8:
      if (R <= 2) attend<T, 8, 2>(q, k, v, mask, out, s, part, keep_words);
      else attend<T, 8, (MAX_CELLS / 8 < MAX_ROWS ? MAX_CELLS / 8 : MAX_ROWS)>(q, k, v, mask, out, s, part, keep_words);
      break;
    default: break;
  }
}

#define ATTENTION_DECODE(name, T)                                                                          \
  KERNEL(BLOCK) void name(KERNEL_PARAMS(T)) {                                                              \
    AttnShape s{hq, hkv, sq, S, d, kb, vb, mask_b, mask_h, mask_q, flags, __builtin_bit_cast(float, scale)}; \
    attention_decode<T>(q, k, v, mask, out, s);                                                            \
  }
ATTENTION_DECODE(attention_decode_f32, float)
ATTENTION_DECODE(attention_decode_f16, _Float16)
ATTENTION_DECODE(attention_decode_bf16, bf16_t)
