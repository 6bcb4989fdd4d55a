// Attention of a few query rows per head against keys and values as stored: the body of attention_decode.hip
// (one workgroup per batch row and kv head writes the output) and attention_split.hip (the positions split over
// several workgroups, each writing its partial result for attention_combine.hip).
//
// q (b, hq, sq, d), k and v (b, hkv, S, d) from entry kb and vb on (a KV cache's entries, read in place: k and v
// may be one buffer); the hq / hkv query heads of a kv head share its keys and values (GQA). mask (bool, 1 =
// keep), optional, addressed as mask[bi * mask_b + hi * mask_h + i * mask_q + j] (a stride 0 broadcasts);
// FLAG_CAUSAL keeps j <= i + S - sq. scores = q . k * scale in f32; softmax and the weighted sum of v in f32
// (online, as flash attention); out is rounded once. A row that keeps no position gives NaN (0 / 0), as the
// float64 reference does.
//
// Work: a workgroup takes one (batch row, kv head) and its R = (hq / hkv) * sq query rows, against all positions
// or (split) against its share of the positions the mask keeps. Each wave takes tiles of P positions (every
// NW-th tile: NW waves), the next tile's keys and values loaded while one is worked on; a lane holds E = d / WAVE
// elements of every row (q in registers); a tile's scores are summed across the wave together and the online
// softmax rescales once a tile. A position no row keeps is skipped: its keys and values are never read. Decode's
// mask (one row for every query row) is staged as bits in shared memory first, so no tile's loads wait on a mask
// load from global memory, and the kept positions' span found from them: the workgroups of a split divide that
// span. The waves' partial results (running max, sum, weighted values) are combined in shared memory at the end.
//
// Each source instantiates, for each head dim's E = d / WAVE (1, 2, 4, 8), a few-rows entry (R <= 2: MHA decode;
// more positions a tile) and a rows entry (GQA, several queries) as kernels of their own, so that each is given
// only the registers and shared memory its own tiles need.
#pragma once
#include "rocmc_gpu.h"
#include "kernel_abi.h"

#define NW (BLOCK / WAVE)
#if defined(__AMDGCN__)
#define MAX_ROWS 4    // query rows of a workgroup (R): AMDGPU holds a row's running max and sum in scalar registers
#else
#define MAX_ROWS 16   // query rows of a workgroup (R)
#endif
#define FEW_ROWS 2    // the few-rows entries' R
#define MAX_CELLS 32  // R * E: the registers a lane gives q and the weighted sum each
#define MAX_KEEP_WORDS 1024  // positions whose shared mask bits are staged in shared memory: 32 a word
// Positions a wave works on at once, at most: AMDGPU keeps a tile's per-position values (keep bits, addresses)
// in scalar registers, of which more would spill.
#ifndef MAX_TILE
#if defined(__AMDGCN__)
#define MAX_TILE 4
#else
#define MAX_TILE 16
#endif
#endif
// Bytes of keys a lane holds for one tile (and as many of values): the tile's positions P = this / (E * sizeof(T)).
#ifndef ROCMC_ATT_TILE_BYTES
#define ROCMC_ATT_TILE_BYTES 64
#endif
// Workgroups a multiprocessor is compiled to hold (a register bound, NVIDIA): the few-rows and the rows entries.
#ifndef ROCMC_ATT_OCC
#define ROCMC_ATT_OCC 1
#endif
#ifndef ROCMC_ATT_ROWS_OCC
#define ROCMC_ATT_ROWS_OCC 1
#endif

struct AttnShape {
  u32 hq, hkv, sq, S, d, kb, vb, mask_b, mask_h, mask_q, flags;
  float scale;
  u32 splits;  // workgroups a (batch row, kv head) (1: no split; the result is written to out)
};

// The waves' partial results, in shared memory: CELLS = a row's cells (R * E) at most.
template <int RMAX, int CELLS> struct Partial {
  float m[NW][RMAX], l[NW][RMAX], acc[NW][CELLS * WAVE];
  u32 lo, hi;  // the kept positions' span (a split's workgroups divide it)
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

// The attention of one workgroup (see the top). `part` null: the result to out; else (a split) the workgroup's
// (weighted values, max, sum) of each row to part[((row * splits + split) * (d + 2)]: d values, then max and sum.
template <typename T, int E, int RMAX, int PR, int CELLS>
DEVICE void attend(const T* q, const T* k, const T* v, const unsigned char* mask, T* out, float* part_out,
                   const AttnShape& s, Partial<PR, CELLS>& part, u32* keep_words) {
  static_assert(RMAX <= PR && RMAX * E <= CELLS, "a row's cells exceed the partial results' room");
  // Positions a wave takes at once: its scores (P * RMAX) and its keys and values (2 * P * E elements) stay in
  // registers; the next tile's are loaded while this one is worked on.
  constexpr int P1 = 32 / RMAX, P2 = ROCMC_ATT_TILE_BYTES / (E * (int)sizeof(T)), P0 = P1 < P2 ? P1 : P2;
  constexpr int P = P0 < 1 ? 1 : (P0 > MAX_TILE ? MAX_TILE : P0);
  const u32 g = s.hq / s.hkv, R = g * s.sq;
  const u32 wg = block_x() / s.splits, split = block_x() % s.splits, bi = wg / s.hkv, kh = wg % s.hkv;
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
  // loads wait on no mask load from global memory, and the span of the kept positions found.
  const bool staged = shared_mask && s.S <= MAX_KEEP_WORDS * 32;
  u32 begin = 0, end = s.S;
  if (staged) {
    if (thread_x() == 0) part.lo = ~0u, part.hi = 0u;
    sync_threads();
    u32 lo = ~0u, hi = 0u;
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
      if (bits) {
        lo = lo < j0 + __builtin_ctz(bits) ? lo : j0 + __builtin_ctz(bits);
        hi = j0 + 32 - __builtin_clz(bits);  // one past the word's last kept position (the words rise)
      }
    }
    if (lo != ~0u) {
      __atomic_fetch_min(&part.lo, lo, __ATOMIC_RELAXED);
      __atomic_fetch_max(&part.hi, hi, __ATOMIC_RELAXED);
    }
    sync_threads();
    begin = part.lo == ~0u ? 0u : part.lo;
    end = part.hi;
  }
  if (s.splits > 1) {  // this workgroup's share of the span, in runs of 32 positions
    const u32 chunk = ((end - begin + s.splits - 1) / s.splits + 31u) & ~31u;
    const u32 b0 = begin + split * chunk;
    begin = b0 < end ? b0 : end;
    end = end - begin < chunk ? end : begin + chunk;
  }
  auto fetch = [&](u32 j0, Tile<T, E, P>& t) __attribute__((always_inline)) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      u32 j = j0 + p, bits = 0;
      if (j < end && staged) {
        bits = (keep_words[j >> 5] >> (j & 31)) & 1u ? all : 0u;
      } else if (j < end && shared_mask) {
        bits = mask[mask_row + j] ? all : 0u;
      } else if (j < end) {
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
  fetch(begin + wave * P, cur);
  for (u32 j0 = begin + wave * P; j0 < end; j0 += stride) {
    if (j0 + stride < end) fetch(j0 + stride, next);
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
    const u64 row = ((u64)bi * s.hq + hi) * s.sq + i;
    if (part_out) {
      float* p = part_out + (row * s.splits + split) * (s.d + 2);
      p[c] = val;
      if (c == 0) p[s.d] = mx, p[s.d + 1] = sum;
    } else {
      out[row * s.d + c] = from_f32<T>(val / sum);
    }
  }
}

// The workgroup's attention at the instantiation for its rows (RMAX query rows at most; CELLS: the shared room a
// row's cells take) and its head dim (E = d / WAVE elements a lane: 1, 2, 4 or 8). Every (RMAX, E) is an entry of
// its own, given the registers its own tiles take.
template <typename T, int E, int RMAX, int CELLS>
DEVICE void attention_rows(const T* q, const T* k, const T* v, const unsigned char* mask, T* out, float* part_out,
                           const AttnShape& s) {
  SHARED Partial<RMAX, CELLS> part;
  SHARED u32 keep_words[MAX_KEEP_WORDS];
  attend<T, E, RMAX>(q, k, v, mask, out, part_out, s, part, keep_words);
}

// The few-rows (R <= FEW_ROWS) and the rows (R <= MAX_ROWS, R * E <= MAX_CELLS) instantiations at E.
#define FEW_ARGS(E) E, FEW_ROWS, FEW_ROWS * E
#define ROWS_MAX(E) (MAX_CELLS / E < MAX_ROWS ? MAX_CELLS / E : MAX_ROWS)
#define ROWS_ARGS(E) E, ROWS_MAX(E), ROWS_MAX(E) * E
// Every entry of a source: BODY(name, T, instantiation, OCC) for each dtype, E and few / rows.
#define ATTENTION_ENTRIES_E(BODY, prefix, E)                                                  \
  BODY(prefix##_f32_e##E, float, FEW_ARGS(E), ROCMC_ATT_OCC)                                  \
  BODY(prefix##_f16_e##E, _Float16, FEW_ARGS(E), ROCMC_ATT_OCC)                               \
  BODY(prefix##_bf16_e##E, bf16_t, FEW_ARGS(E), ROCMC_ATT_OCC)                                \
  BODY(prefix##_rows_f32_e##E, float, ROWS_ARGS(E), ROCMC_ATT_ROWS_OCC)                       \
  BODY(prefix##_rows_f16_e##E, _Float16, ROWS_ARGS(E), ROCMC_ATT_ROWS_OCC)                    \
  BODY(prefix##_rows_bf16_e##E, bf16_t, ROWS_ARGS(E), ROCMC_ATT_ROWS_OCC)
#define ATTENTION_ENTRIES(BODY, prefix)  \
  ATTENTION_ENTRIES_E(BODY, prefix, 1)   \
  ATTENTION_ENTRIES_E(BODY, prefix, 2)   \
  ATTENTION_ENTRIES_E(BODY, prefix, 4)   \
  ATTENTION_ENTRIES_E(BODY, prefix, 8)
