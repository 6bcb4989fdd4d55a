// Attention of a few query rows per head, the positions split over `splits` workgroups a (batch row, kv head):
// each takes an equal share of the span of positions the mask keeps and writes its partial result (weighted values,
// running max and sum of every row, in f32) to `part`, which attention_combine.hip turns into the output. For decode
// steps of few rows (or long contexts) whose (batch row, kv head) pairs alone would leave most of the GPU idle. The
// body and the layouts: attention_decode.h.
//
// Symbols: attention_split_{f32,f16,bf16}_e{1,2,4,8} (at most FEW_ROWS query rows a workgroup) and
// attention_split_rows_{dtype}_e{E} (at most MAX_ROWS), as attention_decode.hip's. ABI: the "attention_split"
// KernelFamily in rocmc/lowering/kernels.py. Workgroup: BLOCK x 1 x 1. Grid: b * hkv * splits (the splits of a pair
// adjacent).
#include "attention_decode.h"

#define ATTENTION_SPLIT(name, T, INST, OCC)                                                                       \
  KERNEL_OCC(BLOCK, OCC) void name(KERNEL_PARAMS(T)) {                                                            \
    AttnShape s{hq, hkv, sq, S, d, kb, vb, mask_b, mask_h, mask_q, flags, __builtin_bit_cast(float, scale), splits}; \
    attention_rows<T, INST>(q, k, v, mask, (T*)0, part, s);                                                       \
  }
ATTENTION_ENTRIES(ATTENTION_SPLIT, attention_split)
