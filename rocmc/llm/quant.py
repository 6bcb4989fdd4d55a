"""Quantized Hugging Face checkpoints: GPTQ and AWQ weight-only int4/int8 linear layers, read in their published
formats and converted once at load, in host memory, to quantized_linear's packed layout (rocmc.frontend.ops.quant:
uint8 (N, K * bits / 8), (N, G) scales and zeros, act-order's permutation of the input features).

The formats, as their writers define them (K input features, N output features, G groups of gs = group_size
features; group_size -1: one group):
- GPTQ (`quant_method: gptq`, bits 4 or 8): `qweight` int32 (K * bits / 32, N), value k of column n in bits
  bits * (k % (32 / bits)) of word k // (32 / bits); `qzeros` int32 (G, N * bits / 32), packed the same way along
  N; `scales` (G, N); `g_idx` int32 (K), each input feature's group (act-order, `desc_act`, scatters them). The
  weight is (q - zero) * scale. `checkpoint_format` "gptq" (v1, the default) stores each zero minus one (its
  packed value + 1 is the zero, per value, so a stored 2**bits - 1 reads 2**bits), "gptq_v2" the zero itself.
- AWQ (`quant_method: awq`, version "gemm", 4 bits): `qweight` int32 (K, N / 8) and `qzeros` int32 (G, N / 8),
  both packed along N in the order [0, 2, 4, 6, 1, 3, 5, 7] (bits 4i of word c hold column 8c + order[i]);
  `scales` (G, N); the weight is (q - zero) * scale.
- fp8 (Hugging Face's `quant_method: fp8`, `weight_block_size` [bn, bk]): `weight` float8 e4m3fn (N, K) and
  `weight_scale_inv` float32 (ceil(N / bn), ceil(K / bk)); the weight is w * the scale of its block.
  compressed-tensors' float quantization (`quant_method: compressed-tensors`, one config group of 8-bit
  `float` weights, strategy `tensor`, `channel` or `block`): `weight` float8 e4m3fn (N, K) and `weight_scale`
  (1,), (N, 1) or (ceil(N / bn), ceil(K / bk)). Weight-only: the activations stay in the compute dtype (an
  activation scheme of the checkpoint, dynamic or static, is not applied). The bytes load as they are (safetensors'
  F8_E4M3 reads as uint8) and quantized_linear decodes them in integer arithmetic (format "e4m3fn"), which every
  target compiles (IREE's CUDA backend takes no float8 element type); the scales stay float32 (fp8 scales are
  often below f16's normal range).

Every linear layer of the decoder is quantized, except those `modules_to_not_convert` names; embeddings and
lm_head stay as stored. q/k/v and gate/up are joined at load as for float checkpoints: their packed rows
concatenated (a GPTQ act-order join needs one order for all of them, which a shared input gives them).
Tensor parallelism (rocmc.llm.sharding) splits the converted tensors as the float ones: q/k/v and gate/up by
output rows, o and down by input features (their groups whole on a rank); act-order is refused there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError, ModelImportError
from ..frontend.ops.quant import pack

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(frozen=True)
class QuantConfig:
    """A checkpoint's `quantization_config`, as rocmc reads it."""

    method: str  # "gptq", "awq", "fp8" or "compressed-tensors"
    bits: int
    group_size: int  # -1: one group a row
    desc_act: bool  # GPTQ act-order: g_idx scatters the groups
    zero_offset: int  # added to each stored zero (GPTQ v1: 1)
    skip: tuple  # modules_to_not_convert
    format: str = "uint"  # the weight's values: unsigned integers, or "e4m3fn" (float8)
    block_rows: int = 0  # fp8: output rows one scale covers (a block's, 1 a channel's; 0: the tensor's)

    def groups(self, k: int) -> int:
        return 1 if self.group_size == -1 else -(-k // self.group_size)

    def quantized(self, module: str) -> bool:
        """Whether a decoder linear layer (its full name) is stored quantized."""
        return not any(s in module for s in self.skip)

    def describe(self) -> str:
        if self.format == "e4m3fn":
            scales = {0: "a scale a tensor", 1: "a scale a row"}.get(
                self.block_rows, f"a scale a block of {self.block_rows} x {self.group_size}"
            )
            return f"{self.method} float8 e4m3fn weights, {scales}"
        gs = "one group a row" if self.group_size == -1 else f"groups of {self.group_size}"
        act = ", act-order" if self.desc_act else ""
        return f"{self.method.upper()} {self.bits}-bit, {gs}{act}"

    @property
    def scale_name(self) -> str:
        """The checkpoint tensor of a layer's scales (its module's suffix)."""
        return {"fp8": "weight_scale_inv", "compressed-tensors": "weight_scale"}.get(self.method, "scales")

    def kinds(self) -> tuple:
        """The suffixes of the tensors a quantized layer stores."""
        if self.format == "e4m3fn":
            return ("weight", self.scale_name)
        return ("qweight", "qzeros", "scales") + (("g_idx",) if self.method == "gptq" else ())


def parse(raw, source: str) -> QuantConfig:
    """A config.json's `quantization_config`; ModelImportError naming the field for what rocmc does not read."""

    def fail(key, value, expected):
        raise ModelImportError(f"{source}: quantization_config.{key} = {value!r}: {expected}")

    if not isinstance(raw, dict):
        fail("", raw, "expected an object")
    method = raw.get("quant_method")
    if method in ("fp8", "compressed-tensors"):
        return _parse_fp8(raw, method, fail)
    if method not in ("gptq", "awq"):
        fail(
            "quant_method", method, "supported: 'gptq', 'awq', 'fp8', 'compressed-tensors' (rocmc reads their formats)"
        )
    bits = raw.get("bits", raw.get("w_bit"))
    if bits not in ((4, 8) if method == "gptq" else (4,)):
        fail("bits", bits, "supported: 4 and 8 for gptq, 4 for awq")
    gs = raw.get("group_size", raw.get("q_group_size", -1 if method == "gptq" else 128))
    if isinstance(gs, bool) or not isinstance(gs, int) or not (gs == -1 or gs >= 1):
        fail("group_size", gs, "expected -1 (one group) or a positive integer")
    desc_act = raw.get("desc_act", False) if method == "gptq" else False
    if not isinstance(desc_act, bool):
        fail("desc_act", desc_act, "expected true or false")
    fmt = raw.get("checkpoint_format", "gptq") if method == "gptq" else None
    if method == "gptq" and fmt not in ("gptq", "gptq_v2"):
        fail("checkpoint_format", fmt, "supported: 'gptq' (v1) and 'gptq_v2'")
    if method == "awq" and str(raw.get("version", "gemm")).lower() != "gemm":
        fail("version", raw.get("version"), "supported: 'gemm' (the packing of AutoAWQ's GEMM kernels)")
    if raw.get("zero_point", True) is not True and method == "awq":
        fail("zero_point", raw.get("zero_point"), "supported: true")
    for key in ("dynamic", "lm_head"):
        if raw.get(key):
            fail(key, raw.get(key), "not supported yet (every decoder linear layer quantized alike, lm_head not)")
    skip = raw.get("modules_to_not_convert") or ()
    if not isinstance(skip, (list, tuple)) or not all(isinstance(s, str) for s in skip):
        fail("modules_to_not_convert", skip, "expected a list of module names")
    return QuantConfig(method, bits, gs, desc_act, 1 if fmt == "gptq" else 0, tuple(skip))


def _parse_fp8(raw: dict, method: str, fail) -> QuantConfig:
    """Hugging Face's fp8 config, or compressed-tensors' of float8 weights (weight-only, see the module)."""
    if method == "fp8":
        block = raw.get("weight_block_size")
        if block is None:
            block = (0, -1)  # a scale a tensor
        elif not (isinstance(block, (list, tuple)) and len(block) == 2 and all(_positive(b) for b in block)):
            fail("weight_block_size", block, "expected [rows, columns] of a block, two positive integers")
        skip = raw.get("modules_to_not_convert") or ()
    else:
        fmt = raw.get("format")
        if fmt not in ("float-quantized", "naive-quantized"):
            fail("format", fmt, "supported: 'float-quantized', 'naive-quantized' (float8 weights as stored)")
        groups = raw.get("config_groups")
        if not isinstance(groups, dict) or len(groups) != 1:
            fail("config_groups", groups, "expected one group (every Linear alike)")
        group = next(iter(groups.values()))
        w = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(w, dict) or w.get("type") != "float" or w.get("num_bits") != 8:
            fail("config_groups.weights", w, "supported: 8-bit float weights (float8 e4m3fn)")
        if "Linear" not in (group.get("targets") or ()):
            fail("config_groups.targets", group.get("targets"), "expected ['Linear']")
        strategy = w.get("strategy")
        if strategy == "tensor":
            block = (0, -1)
        elif strategy == "channel":
            block = (1, -1)
        elif strategy == "block" and isinstance(w.get("block_structure"), (list, tuple)):
            block = tuple(w["block_structure"])
            if len(block) != 2 or not all(_positive(b) for b in block):
                fail("config_groups.weights.block_structure", block, "expected [rows, columns]")
        else:
            fail("config_groups.weights.strategy", strategy, "supported: 'tensor', 'channel', 'block'")
        skip = raw.get("ignore") or ()
        if any(isinstance(m, str) and m.startswith("re:") for m in skip):
            fail("ignore", skip, "supported: module names (not 're:' patterns)")
    if not isinstance(skip, (list, tuple)) or not all(isinstance(m, str) for m in skip):
        fail("modules_to_not_convert" if method == "fp8" else "ignore", skip, "expected a list of module names")
    return QuantConfig(method, 8, int(block[1]), False, 0, tuple(skip), "e4m3fn", int(block[0]))


def _positive(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _fp8_scale_shape(q: QuantConfig, n: int, k: int) -> tuple:
    if q.block_rows == 0:
        return (1,)
    if q.block_rows == 1 and q.group_size == -1:
        return (n, 1)
    return (-(-n // q.block_rows), -(-k // q.group_size))


def checkpoint_tensors(q: QuantConfig, module: str, n: int, k: int, dtype: str) -> list:
    """[(name, shape, dtype)] a quantized linear layer `module` (n outputs, k inputs) stores; dtype: the
    checkpoint's float dtype (the scales')."""
    if q.format == "e4m3fn":  # F8_E4M3 reads as its bytes; Hugging Face's fp8 scales are float32
        scale = (f"{module}.{q.scale_name}", _fp8_scale_shape(q, n, k), "f32" if q.method == "fp8" else dtype)
        return [(f"{module}.weight", (n, k), "u8"), scale]
    pack_n = 32 // q.bits
    g = q.groups(k)
    if q.method == "gptq":
        return [
            (f"{module}.qweight", (k // pack_n, n), "i32"),
            (f"{module}.qzeros", (g, n // pack_n), "i32"),
            (f"{module}.scales", (g, n), dtype),
            (f"{module}.g_idx", (k,), "i32"),
        ]
    return [
        (f"{module}.qweight", (k, n // pack_n), "i32"),
        (f"{module}.qzeros", (g, n // pack_n), "i32"),
        (f"{module}.scales", (g, n), dtype),
    ]


def split_axes(q: QuantConfig, k: int, row: bool) -> dict:
    """{tensor kind: the axis a rank's slice of it is cut along, or None: held whole} of a quantized layer's
    checkpoint tensors (checkpoint_tensors' layouts), split by input features (`row`: o, down) or by output
    features (q/k/v, gate/up). The caller checks that the slices are whole packed words, groups and blocks."""
    one_group = q.groups(k) == 1
    if q.format == "e4m3fn":  # weight (n, k); scales per tensor, per row (n, 1) or per block (n / bn, k / bk)
        if row:
            scale = None if one_group or q.block_rows == 0 else 1
        else:  # a block's scale rows are cut by the caller after widening them to one a row (rows_of)
            scale = 0 if q.block_rows == 1 else None
        return {"weight": 1 if row else 0, q.scale_name: scale}
    grouped = None if one_group else 0  # (g, ...): by groups along k
    axes = {"qweight": 0 if row else 1, "qzeros": grouped if row else 1, "scales": grouped if row else 1}
    if q.method == "gptq":
        axes["g_idx"] = 0 if row else None
    return axes


def rows_of(q: QuantConfig, scales: np.ndarray, n: int, rows: slice) -> tuple[QuantConfig, np.ndarray]:
    """fp8 block scales (ceil(n / bn), G) widened to one a row and cut to `rows`: (the config that reads them so,
    the scales), for a rank whose output rows may begin inside a block."""
    from dataclasses import replace

    return replace(q, block_rows=1), np.ascontiguousarray(_rows_widened(q, np.asarray(scales), n)[rows])


def _rows_widened(q: QuantConfig, s: np.ndarray, n: int) -> np.ndarray:
    """fp8 scales (a tensor's (1,), a row's (n, 1), a block's (n / bn, G)) as one a row: (n, G)."""
    if q.block_rows == 0:
        return np.full((n, 1), s.reshape(-1)[0], s.dtype)
    return np.repeat(s, q.block_rows, axis=0)[:n]


def check_sizes(q: QuantConfig, module: str, n: int, k: int) -> None:
    """The layer's sizes must pack: InputError naming the layer otherwise."""
    if q.format == "e4m3fn":
        if q.group_size != -1 and k % q.group_size:
            raise InputError(f"{module} ({n} x {k}): {q.describe()} needs in_features a multiple of {q.group_size}")
        return
    pack_n = 32 // q.bits
    problems = []
    if q.method == "gptq" and k % pack_n:
        problems.append(f"in_features a multiple of {pack_n} (the weight's packing)")
    if n % pack_n:
        problems.append(f"out_features a multiple of {pack_n} (the zeros' packing)")
    if q.group_size != -1 and k % q.group_size:
        problems.append(f"in_features ({k}) a multiple of group_size {q.group_size}")
    if problems:
        raise InputError(f"{module} ({n} x {k}): {q.method} {q.bits}-bit needs {' and '.join(problems)}")


def graph_tensors(q: QuantConfig, name: str, n: int, k: int, dtype: str) -> list:
    """[(graph parameter, shape, dtype)] of a (maybe joined) quantized projection `name` in rocmc's layout."""
    if q.format == "e4m3fn":  # no zero points; float32 scales
        return [(f"{name}.weight_q", (n, k), "u8"), (f"{name}.scales", (n, q.groups(k)), "f32")]
    out = [
        (f"{name}.weight_q", (n, k * q.bits // 8), "u8"),
        (f"{name}.scales", (n, q.groups(k)), dtype),
        (f"{name}.zeros", (n, q.groups(k)), dtype),
    ]
    return out + ([(f"{name}.perm", (k,), "i64")] if q.desc_act else [])


def _unpack_words(words: np.ndarray, bits: int, order=None) -> np.ndarray:
    """The values packed in int32 words along their last axis (value i at bits * i, or at bits * order[i])."""
    w = np.ascontiguousarray(words).view(np.uint32)
    per = 32 // bits
    shifts = np.arange(per, dtype=np.uint32) * np.uint32(bits)
    vals = ((w[..., None] >> shifts) & np.uint32((1 << bits) - 1)).astype(np.uint8)  # (..., C, per)
    if order is not None:
        vals = vals[..., np.argsort(order)]  # value at position j of the word's group is at bits * order^-1[j]
    return vals.reshape(w.shape[:-1] + (w.shape[-1] * per,))


# AWQ's word, as little-endian bytes: byte j holds the values at bits 8j (low nibble) and 8j + 4 (high), which
# are the columns AWQ_ORDER[2j] and AWQ_ORDER[2j + 1] of the word's 8.
_AWQ_LOW = [AWQ_ORDER[2 * j] for j in range(4)]
_AWQ_HIGH = [AWQ_ORDER[2 * j + 1] for j in range(4)]


def _awq_packed(qweight: np.ndarray) -> np.ndarray:
    """AWQ's 4-bit qweight (K, N / 8) as quantized_linear's packed (N, K / 2), in byte-wide steps."""
    k, words = qweight.shape
    b = np.ascontiguousarray(qweight).view(np.uint8).reshape(k, words, 4)
    vals = np.empty((k, words, 8), np.uint8)
    vals[..., _AWQ_LOW], vals[..., _AWQ_HIGH] = b & 0xF, b >> 4
    q = vals.reshape(k, words * 8).T  # (N, K)
    return np.ascontiguousarray(q[:, 0::2] | (q[:, 1::2] << 4))


def _gptq_packed(qweight: np.ndarray, bits: int) -> np.ndarray:
    """GPTQ's qweight (K * bits / 32, N) as quantized_linear's packed (N, K * bits / 8): the same bytes in another
    order (a word's values, little-endian, are its bytes' values in order; 4-bit: the even one low), no unpacking."""
    words, n = qweight.shape
    return np.ascontiguousarray(
        np.ascontiguousarray(qweight).view(np.uint8).reshape(words, n, 4).transpose(1, 0, 2)
    ).reshape(n, words * 4)


def convert(q: QuantConfig, tensors: list, name: str, k: int, dtype) -> dict:
    """rocmc's graph parameters of projection `name` from the checkpoint tensors of its modules (one, or the
    joined ones in order): each a dict {"qweight", "qzeros", "scales"[, "g_idx"]} of arrays. Checks what it
    reads (shapes, group indices, finite non-zero scales), naming the tensor."""
    if q.format == "e4m3fn":
        return _convert_fp8(q, tensors, name, k)
    qs, scales, zeros, perms = [], [], [], []
    for module, t in tensors:
        s = np.asarray(t["scales"])
        _check_shapes(q, module, t, k)
        _check_scales(f"{module}.scales", s)
        if q.method == "gptq":
            z = _unpack_words(np.asarray(t["qzeros"]), q.bits).astype(np.float32) + q.zero_offset  # (g, n)
            g_idx = np.asarray(t["g_idx"]).astype(np.int64)
            perm = _order(q, module, g_idx, k, s.shape[0])
            if perm is None:
                qs.append(_gptq_packed(np.asarray(t["qweight"]), q.bits))
            else:  # act-order: the input features permuted, value by value
                values = _unpack_words(np.asarray(t["qweight"]).T, q.bits).T[perm]  # (k, n)
                qs.append(pack(values.T, q.bits))
            perms.append(perm)
        else:
            qs.append(_awq_packed(np.asarray(t["qweight"])))
            z = _unpack_words(np.asarray(t["qzeros"]), q.bits, AWQ_ORDER).astype(np.float32)
        scales.append(np.ascontiguousarray(s.T).astype(dtype))
        zeros.append(np.ascontiguousarray(z.T).astype(dtype))
    out = {
        f"{name}.weight_q": np.concatenate(qs, axis=0),
        f"{name}.scales": np.concatenate(scales, axis=0),
        f"{name}.zeros": np.concatenate(zeros, axis=0),
    }
    if q.desc_act:
        first = perms[0]
        if any((p is None) != (first is None) or (p is not None and not np.array_equal(p, first)) for p in perms):
            names = ", ".join(m for m, _ in tensors)
            raise InputError(f"{names}: their g_idx orders differ, so they can't be joined into one projection")
        out[f"{name}.perm"] = np.arange(k, dtype=np.int64) if first is None else first
    return out


def _convert_fp8(q: QuantConfig, tensors: list, name: str, k: int) -> dict:
    """float8 weights as stored (their bytes) and their scales widened to one a row and group (float32)."""
    ws, scales = [], []
    for module, t in tensors:
        w, s = np.asarray(t["weight"]), np.asarray(t[q.scale_name], np.float32)
        n = w.shape[0] if w.ndim == 2 else -1
        if w.shape != (n, k):
            raise InputError(f"{module}.weight is {list(w.shape)}: expected [out_features, {k}]")
        want = _fp8_scale_shape(q, n, k)
        if s.shape != want:
            raise InputError(f"{module}.{q.scale_name} is {list(s.shape)}: expected {list(want)} ({q.describe()})")
        _check_scales(f"{module}.{q.scale_name}", s)
        nan = (w & 0x7F) == 0x7F  # e4m3fn's NaN: S.1111.111
        if nan.any():
            at = tuple(int(i) for i in np.argwhere(nan)[0])
            raise InputError(f"{module}.weight{list(at)} is NaN (float8 e4m3fn byte {int(w[at]):#04x})")
        ws.append(w)
        scales.append(np.ascontiguousarray(_rows_widened(q, s, n)))
    return {f"{name}.weight_q": np.concatenate(ws, axis=0), f"{name}.scales": np.concatenate(scales, axis=0)}


def _check_scales(name: str, s: np.ndarray) -> None:
    """InputError naming tensor `name` and the first scale that is zero or not finite."""
    bad = ~np.isfinite(s.astype(np.float32)) | (s == 0)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InputError(f"{name}{list(at)} is {s[at]}: expected a finite non-zero scale")


def _check_shapes(q: QuantConfig, module: str, t: dict, k: int) -> None:
    """Each packed tensor of a layer against the layer's k input features and its scales' n outputs."""
    s = np.shape(t["scales"])
    if len(s) != 2 or s[0] != q.groups(k):
        raise InputError(f"{module}.scales is {list(s)}: expected [{q.groups(k)}, out_features]")
    want = dict((name.rsplit(".", 1)[1], shape) for name, shape, _ in checkpoint_tensors(q, module, s[1], k, ""))
    for kind, shape in want.items():
        if tuple(np.shape(t[kind])) != tuple(shape):
            raise InputError(
                f"{module}.{kind} is {list(np.shape(t[kind]))}: expected {list(shape)} for {s[1]} x {k} "
                f"{q.method} {q.bits}-bit"
            )


def _order(q: QuantConfig, module: str, g_idx: np.ndarray, k: int, groups: int):
    """The permutation of the input features that makes GPTQ's groups contiguous (None: they are already);
    InputError when g_idx is not `groups` groups of group_size features."""
    gs = k if q.group_size == -1 else q.group_size
    if g_idx.shape != (k,) or g_idx.min() < 0 or g_idx.max() >= groups:
        raise InputError(f"{module}.g_idx: expected {k} group indices in [0, {groups})")
    if np.array_equal(g_idx, np.arange(k) // gs):
        return None
    if not q.desc_act:
        raise InputError(f"{module}.g_idx scatters the groups but the config says desc_act: false")
    perm = np.argsort(g_idx, kind="stable")
    if not np.array_equal(g_idx[perm], np.arange(k) // gs):
        raise InputError(f"{module}.g_idx: its groups are not {groups} groups of {gs} input features")
    return perm


# ---- writing: rocmc.llm.quantize ---------------------------------------------------------------------------

_ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "int32": "I32", "int64": "I64", "uint8": "U8"}


def quantize(src, dst, *, bits: int = 4, group_size: int = 128, sym: bool = True):
    """Write checkpoint `src` (a float Hugging Face checkpoint directory) to `dst` as a GPTQ checkpoint of its
    decoder's linear layers, by round-to-nearest: per output feature and group of `group_size` input features
    (-1: one group), scale = the group's range / (2**bits - 1) (symmetric: twice its largest magnitude, zero
    2**(bits - 1)), values round(w / scale) + zero clipped to [0, 2**bits). The format is GPTQ's v1
    (`checkpoint_format` "gptq", zeros stored minus one, so an asymmetric zero is at least 1), which
    transformers' GPTQ integrations, vLLM and rocmc read; the other tensors and files are copied as they are.
    Returns dst."""
    import json
    import shutil
    from pathlib import Path

    from ..parameters import Parameters
    from .config import linear_layers, load_config

    src, dst = Path(src), Path(dst)
    if bits not in (4, 8):
        raise InputError(f"quantize: bits={bits!r}: expected 4 or 8")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or not (group_size == -1 or group_size >= 1):
        raise InputError(f"quantize: group_size={group_size!r}: expected -1 (one group) or a positive integer")
    cfg = load_config(src)
    if cfg.quant is not None:
        raise InputError(f"quantize: {src} is quantized already ({cfg.quant.describe()})")
    if dst.exists() and any(dst.iterdir()):
        raise InputError(f"quantize: {dst} exists and is not empty")
    q = QuantConfig("gptq", bits, group_size, False, 1, ())
    params = Parameters.open(src)
    layers = {m: (n, k) for i in range(cfg.num_hidden_layers) for m, n, k in linear_layers(cfg, f"model.layers.{i}.")}
    for module, (n, k) in layers.items():
        check_sizes(q, module, n, k)
    out = {}
    for name in params.names():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and module in layers:
            out.update(_gptq_tensors(q, module, params.array(name), sym))
        else:
            out[name] = params.array(name)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if (
            f.is_file()
            and not f.name.endswith(".safetensors")
            and f.name not in ("config.json", "model.safetensors.index.json")
        ):
            shutil.copy2(f, dst / f.name)
    raw = json.loads((src / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": False,
                                  "sym": sym, "checkpoint_format": "gptq", "true_sequential": True}  # fmt: skip
    (dst / "config.json").write_text(json.dumps(raw, indent=2))
    write_safetensors(dst / "model.safetensors", out)
    return dst


def _gptq_tensors(q: QuantConfig, module: str, weight: np.ndarray, sym: bool) -> dict:
    w = np.asarray(weight, np.float32)
    n, k = w.shape
    gs = k if q.group_size == -1 else q.group_size
    top = (1 << q.bits) - 1
    g = w.reshape(n, k // gs, gs)
    if sym:
        scale = np.abs(g).max(-1) * 2 / top
        zero = np.full(scale.shape, (top + 1) // 2, np.float32)
    else:
        lo, hi = np.minimum(g.min(-1), 0), np.maximum(g.max(-1), 0)
        scale = (hi - lo) / top
        zero = np.clip(np.round(-lo / np.where(scale == 0, 1, scale)), 1, top)  # v1 stores zero - 1
    scale = scale.astype(np.float16)
    scale[scale == 0] = 1.0  # a group of zeros (or below f16's range): any scale serves
    s32 = scale.astype(np.float32)
    vals = np.clip(np.round(g / s32[..., None]) + zero[..., None], 0, top).astype(np.uint32).reshape(n, k)
    return {
        f"{module}.qweight": _pack_words(vals.T, q.bits),  # (k * bits / 32, n)
        f"{module}.qzeros": np.ascontiguousarray(_pack_words(zero.astype(np.uint32) - 1, q.bits).T),  # (G, n / per)
        f"{module}.scales": np.ascontiguousarray(scale.T),
        f"{module}.g_idx": (np.arange(k) // gs).astype(np.int32),
    }


def _pack_words(v: np.ndarray, bits: int) -> np.ndarray:
    """uint values (R, C) packed into int32 words along R: (R * bits / 32, C), value i of a word at bits * i."""
    per = 32 // bits
    out = np.zeros((v.shape[0] // per,) + v.shape[1:], np.uint32)
    for i in range(per):
        out |= (v[i::per].astype(np.uint32) & ((1 << bits) - 1)) << np.uint32(bits * i)
    return out.view(np.int32)


def write_safetensors(path, tensors: dict) -> None:
    """A .safetensors file of numpy arrays (the format: an 8-byte little-endian header length, the JSON header
    of each tensor's dtype, shape and byte range, then the bytes)."""
    import json

    header, offset, arrays = {}, 0, []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        kind = "bfloat16" if a.dtype.name == "bfloat16" else a.dtype.name
        if kind not in _ST_DTYPES:
            raise InputError(f"write_safetensors: tensor {name!r} has dtype {a.dtype}, which it does not write")
        header[name] = {"dtype": _ST_DTYPES[kind], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for a in arrays:
            f.write(a.tobytes())
