// Attention of a few query rows per head against keys and values as stored (rocmc's sdpa when the queries are
// few: a decode step's one new token per row), reading only the positions the mask keeps: one workgroup per (batch
// row, kv head) writes its rows' output. The body and the layouts: attention_decode.h.
//
// Symbols: attention_decode_{f32,f16,bf16}_e{1,2,4,8} (at most FEW_ROWS query rows a workgroup: hq / hkv * sq <= 2;
// E = d / WAVE elements a lane) and attention_decode_rows_{dtype}_e{E} (at most MAX_ROWS, as a lane's registers hold:
// GQA, several queries). ABI
// (bindings, push constants, FLAG_* bits, BLOCK): the "attention_decode" KernelFamily in rocmc/lowering/kernels.py.
// Workgroup: BLOCK x 1 x 1. Grid: b * hkv.
#include "attention_decode.h"

#define ATTENTION_DECODE(name, T, INST, OCC)                                                                   \
  KERNEL_OCC(BLOCK, OCC) void name(KERNEL_PARAMS(T)) {                                                         \
    AttnShape s{hq, hkv, sq, S, d, kb, vb, mask_b, mask_h, mask_q, flags, __builtin_bit_cast(float, scale), 1u}; \
    attention_rows<T, INST>(q, k, v, mask, out, (float*)0, s);                                                 \
  }
ATTENTION_ENTRIES(ATTENTION_DECODE, attention_decode)
