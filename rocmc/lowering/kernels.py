"""Hand-written GPU kernels: their ABI table and the builder that turns custom_kernels/*.hip into code objects.

One HIP source builds for AMDGPU (an hsaco code object per gfx arch) and NVPTX (PTX text per sm arch) with a
stock clang and no vendor headers or device libraries (custom_kernels/rocmc_gpu.h maps the few primitives).
Objects are cached by (sources hash, arch, flags, clang version) under the rocmc cache directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .. import children
from ..errors import CompileError
from ..files import write_atomic
from ..progress import step
from .cache import cache_root, distrust


def _kernel_dir(package: Path) -> Path:
    """ROCMC_KERNEL_DIR, else the sources a wheel installs as rocmc/kernels/, else a checkout's (or an editable
    install's) custom_kernels/ beside the package."""
    if os.environ.get("ROCMC_KERNEL_DIR"):
        return Path(os.environ["ROCMC_KERNEL_DIR"])
    installed, checkout = package / "kernels", package.parent / "custom_kernels"
    return installed if installed.is_dir() or not checkout.is_dir() else checkout


KERNEL_DIR = _kernel_dir(Path(__file__).resolve().parents[1])
DTYPES = ("f32", "f16", "bf16")
ABI_HEADER = "kernel_abi.h"  # generated into each build (abi_header): the sources include it by this name


@dataclass(frozen=True)
class Binding:
    """One buffer a kernel is dispatched with: a pointer parameter of its entry point."""

    name: str  # the parameter's name in the kernel source
    writes: bool  # written (the result) or read-only
    doc: str
    ctype: str = "T"  # the C element type: T (the kernel's storage type) or a fixed one
    # An operand the kernel updates in place (writes): dispatched as an input and returned as a result tied
    # to it, sharing its buffer (a state such as a KV cache is updated without a copy).
    tied: bool = False


@dataclass(frozen=True)
class KernelFamily:
    """The dispatch ABI of one kernel source: the single definition both sides use.

    The lowering orders a dispatch's operands by it (kernel/dispatch.py); the build generates from it the
    header every kernel of the source includes (abi_header): BLOCK, a FLAG_<NAME> mask per bit of the
    `flags` constant, and KERNEL_PARAMS(T), the entry point's parameter list (the bindings as pointers,
    read-only ones first, then the push constants as u32: what IREE's custom dispatches pass).
    """

    source: str  # file name under custom_kernels/
    symbols: tuple  # its exported kernels
    bindings: tuple  # Binding, in dispatch order
    constants: tuple  # (name, doc) of each i32 push constant, in order
    flags: tuple = ()  # (name, doc) of each bit of the constant `flags`, bit 0 first
    block: int = 256  # threads of a workgroup (1-D), every kernel of the family
    # Bytes of dynamic shared memory a workgroup takes (NVIDIA; the export's workgroup_local_memory): past static
    # shared memory's 48 KB a kernel declares its tiles extern and the driver sizes them at launch.
    local_memory: int = 0
    # The one architecture its kernels build for, whatever the target's code architecture (None: that one): a
    # family written for one GPU generation's instructions, dispatched only where the target is that generation.
    arch: str | None = None

    def __post_init__(self):
        writes = [b.writes for b in self.bindings]
        assert writes == sorted(writes), f"{self.source}: read-only bindings come first"
        assert not self.flags or "flags" in self.constant_names, f"{self.source}: flag bits need a flags constant"

    @property
    def constant_names(self) -> tuple:
        return tuple(n for n, _ in self.constants)

    @property
    def binding_names(self) -> tuple:
        return tuple(b.name for b in self.bindings)

    def flag_bits(self, **present: bool) -> int:
        """The `flags` constant with the named bits set (every bit named, so none is forgotten)."""
        names = [n for n, _ in self.flags]
        assert set(present) == set(names), (self.source, sorted(present), names)
        return sum(1 << i for i, n in enumerate(names) if present[n])


_NORM_CONSTANTS = (
    ("rows", "rows of x"),
    ("cols", "elements of a row"),
    ("group", "threads per row: a power of two in [1, BLOCK]"),
    ("eps", "f32 bits"),
    ("flags", "FLAG_* bits"),
)
_NORM_X = Binding("x", False, "rows x cols, row-major")
_NORM_Y = Binding("y", True, "rows x cols, x's element type")
_VARIANTS = tuple(f"{dt}{sfx}" for dt in DTYPES for sfx in ("", "_short"))

# The flags of the linear-layer kernels (linear.h's epilogue reads them by these names).
_LINEAR_FLAGS = (
    ("bias", "bias present"),
    ("residual", "residual present (not with FLAG_GATED)"),
    ("gated", "y = act(x @ gate^T + b) * (x @ up^T + b)"),
    ("relu", "the activation is relu"),
    ("silu", "the activation is silu"),
    ("gelu_tanh", "the activation is gelu, tanh approximation (none of the three: no activation)"),
    ("norm", "x is RMSNorm(x, norm, eps) first (rms_norm_linear)"),
)

# The linear-layer kernels' bindings after x and the weight (linear.h's epilogue and norm).
_EPILOGUE_BINDINGS = (
    Binding("bias", False, "(N,) or (2N,) (a placeholder when absent)"),
    Binding("residual", False, "(M, N) (a placeholder when absent)"),
    Binding("norm", False, "(K,): RMSNorm's weight, with FLAG_NORM (a placeholder when absent)"),
    Binding("y", True, "(M, N)"),
)
# wgmma.h's tiles: 3 stages of 128 rows of x and 128 of w, 128 bytes a row.
_WGMMA_TILES = 3 * (128 + 128) * 128

# The tiled GEMMs' bindings (linear_mm.hip, linear_wgmma.hip): x of any row count, the weight, the epilogue's.
_TILED_BINDINGS = (
    Binding("x", False, "(M, K), any M"),
    Binding("w", False, "(N, K), or (2N, K) with FLAG_GATED: the gate's rows, then the up's"),
    *_EPILOGUE_BINDINGS,
)

# The linear-layer kernels' push constants (linear.h's LinShape).
_LINEAR_CONSTANTS = (
    ("M", "rows of x"),
    ("N", "outputs a row"),
    ("K", "inputs a row"),
    ("flags", "FLAG_* bits"),
    ("eps", "f32 bits: RMSNorm's epsilon (FLAG_NORM)"),
)

# The quantized linear kernels' bindings and constants (linear_q.hip, linear_qm.hip, linear_qmm.hip: quant.h).
_QUANT_ABI = (
    (
        Binding("x", False, "(M, K), M <= 2 (linear_qm: M <= 32; linear_qmm: any M)"),
        Binding(
            "w", False, "(N, K * bits / 8) bytes, or (2N, ...) with FLAG_GATED: the gate's rows, then the up's", "void"
        ),
        Binding("scales", False, "(N, G) (2N with FLAG_GATED), x's type"),
        Binding("zeros", False, "(N, G) as scales"),
        *_EPILOGUE_BINDINGS,
    ),
    (
        *_LINEAR_CONSTANTS[:2],  # M, N
        ("K", "inputs a row: a multiple of 128 / bits"),
        ("G", "groups a row: K / G a multiple of 128 / bits"),
        ("bits", "4 or 8"),
        *_LINEAR_CONSTANTS[3:],  # flags, eps
    ),
)

# attention_decode's and attention_prefill's ABI: the same operands and constants, read by both kernels.
_ATTENTION_BINDINGS = (
    Binding("q", False, "(b, hq, sq, d)"),
    Binding("k", False, "(kb + b or more, hkv, S, d): batch row i reads entry kb + i"),
    Binding("v", False, "(vb + b or more, hkv, S, d): batch row i reads entry vb + i"),
    Binding("mask", False, "bool, 1 = keep, by the mask_* strides (a placeholder when absent)", "unsigned char"),
    Binding("out", True, "(b, hq, sq, d)"),
)
_ATTENTION_CONSTANTS = (
    ("hq", "query heads"),
    ("hkv", "key/value heads"),
    ("sq", "queries per head"),
    ("S", "positions of k and v"),
    ("d", "head dim"),
    ("kb", "k's entry of batch row 0"),
    ("vb", "v's entry of batch row 0"),
    ("mask_b", "mask elements per batch row (0: broadcast)"),
    ("mask_h", "mask elements per query head (0: broadcast)"),
    ("mask_q", "mask elements per query (0: broadcast)"),
    ("scale", "f32 bits: the scores' scale"),
    ("flags", "FLAG_* bits"),
)
_ATTENTION_FLAGS = (("mask", "mask present"), ("causal", "keep j <= i + S - sq"))
# attention_decode.h's elements a lane (E = head dim / wave) and its entries: few rows (<= 2 a workgroup), or more.
ATTENTION_LANE_ELEMENTS = (1, 2, 4, 8)


def _attention_symbols(prefix: str) -> tuple:
    return tuple(
        f"{prefix}_{rows}{dt}_e{e}" for e in ATTENTION_LANE_ELEMENTS for rows in ("", "rows_") for dt in DTYPES
    )


FAMILIES: dict[str, KernelFamily] = {
    "rms_norm": KernelFamily(
        "rms_norm.hip",
        tuple(f"rms_norm_{v}" for v in _VARIANTS),
        (_NORM_X, Binding("w", False, "cols (a placeholder when absent)"), _NORM_Y),
        _NORM_CONSTANTS,
        flags=(("w", "w is present"),),
    ),
    "layer_norm": KernelFamily(
        "layer_norm.hip",
        tuple(f"layer_norm_{v}" for v in _VARIANTS),
        (
            _NORM_X,
            Binding("w", False, "cols (a placeholder when absent)"),
            Binding("b", False, "cols (a placeholder when absent)"),
            _NORM_Y,
        ),
        _NORM_CONSTANTS,
        flags=(("w", "w is present"), ("b", "b is present")),
    ),
    "rope": KernelFamily(
        "rope.hip",
        tuple(f"rope_{v}_{dt}" for dt in DTYPES for v in ("half", "interleaved")),
        (
            Binding("x", False, "(b, h, t, d), or (b, t, h, d) with FLAG_BSHD"),
            Binding("cs", False, "cos: rows of r values, (T, r) or (b or 1, T, r)"),
            Binding("sn", False, "sin: as cos"),
            Binding("pos", False, "position_ids (b or 1, t), i32 or i64 (a placeholder when absent)", "u32"),
            Binding("y", True, "x's shape"),
        ),
        (
            ("b", "batch"),
            ("h", "heads"),
            ("t", "time"),
            ("d", "head dim"),
            ("r", "rotary_dim / 2"),
            ("table_stride", "table rows per batch (0: one table for all batches)"),
            ("pos_stride", "position_ids per batch (t, or 0 when shared)"),
            ("nblocks", "workgroups in the grid"),
            ("flags", "FLAG_* bits"),
        ),
        flags=(("bshd", "x is (b, t, h, d)"), ("pos", "position_ids present"), ("pos_i64", "they are i64")),
    ),
    "rope_store_kv": KernelFamily(
        "rope_store_kv.hip",
        tuple(f"rope_store_kv_{v}_{dt}" for dt in DTYPES for v in ("half", "interleaved")),
        (
            Binding("qkv", False, "(n tokens, hq + 2 hkv heads, d): query, then key, then value heads"),
            Binding("cs", False, "cos: (P, r) rows of r values by position, f32/f16/bf16 (FLAG_TAB_*)", "void"),
            Binding("sn", False, "sin: as cos", "void"),
            Binding("pos", False, "positions (b or 1, t), i32 or i64", "u32"),
            Binding("slots", False, "each row's slot (b or 1,), i32 or i64 (a placeholder when absent)", "u32"),
            Binding("cache", True, "(E, hkv, S, d), updated in place", tied=True),
            Binding("q", True, "(n, hq, d): the rotated query heads"),
        ),
        (
            ("n", "tokens: b * t"),
            ("t", "tokens per row"),
            ("hq", "query heads"),
            ("hkv", "key/value heads"),
            ("d", "head dim"),
            ("r", "rotary_dim / 2"),
            ("S", "positions of a cache entry"),
            ("E", "cache entries"),
            ("P", "table rows"),
            ("k0", "the keys' first entry"),
            ("v0", "the values' first entry"),
            ("pos_stride", "positions per row (t, or 0 when shared)"),
            ("slot_stride", "slots per row (1, or 0 when shared)"),
            ("nblocks", "workgroups in the grid"),
            ("flags", "FLAG_* bits"),
        ),
        flags=(
            ("pos_i64", "positions are i64"),
            ("slots", "slots present (absent: row i is slot i)"),
            ("slots_i64", "slots are i64"),
            ("tab_f32", "the tables are f32"),
            ("tab_f16", "the tables are f16 (neither: bf16)"),
        ),
    ),
    # attention_decode.h's two instantiations: at most 2 query rows a workgroup (MHA decode), and more (GQA).
    "attention_decode": KernelFamily(
        "attention_decode.hip",
        _attention_symbols("attention_decode"),
        _ATTENTION_BINDINGS,
        _ATTENTION_CONSTANTS,
        flags=_ATTENTION_FLAGS,
        # 4 waves of 32 (NVIDIA) / 2 of 64 (AMD): on an H200 (bench/attn_sweep.py, BENCHMARKS.md) 7B decode
        # attention at 8 / 32 rows took 37.9 / 120.4 us against 39.4 / 135.3 with 256 threads.
        block=128,
    ),
    # The same, the positions split over workgroups: partial results for attention_combine.
    "attention_split": KernelFamily(
        "attention_split.hip",
        _attention_symbols("attention_split"),
        (
            *_ATTENTION_BINDINGS[:4],
            Binding("part", True, "(b * hq * sq, splits, d + 2) f32: a split's weighted values, max, sum", "float"),
        ),
        (*_ATTENTION_CONSTANTS, ("splits", "workgroups a (batch row, kv head)")),
        flags=_ATTENTION_FLAGS,
        block=128,
    ),
    "attention_combine": KernelFamily(
        "attention_combine.hip",
        tuple(f"attention_combine_{dt}" for dt in DTYPES),
        (
            Binding("part", False, "(rows, splits, d + 2) f32, as attention_split writes it", "float"),
            Binding("out", True, "(rows, d)"),
        ),
        (("rows", "rows of out"), ("d", "head dim"), ("splits", "partial results a row")),
        block=128,
    ),
    "attention_prefill": KernelFamily(
        "attention_prefill.hip",
        tuple(f"attention_prefill_{dt}_d{d}" for dt in ("f16", "bf16") for d in (64, 128, 256)),
        (
            *_ATTENTION_BINDINGS[:4],
            Binding("slots", False, "each row's slot (b,), i32 or i64 (a placeholder when absent)", "u32"),
            _ATTENTION_BINDINGS[4],
        ),
        (
            *_ATTENTION_CONSTANTS,
            ("stride", "positions of k and v as stored (S: those attended, the first S)"),
            ("E", "entries of k's and v's buffer (a slot past them reads the last)"),
        ),
        flags=(
            *_ATTENTION_FLAGS,
            ("slots", "slots present: row i reads entries kb + slots[i], vb + slots[i] (absent: kb + i, vb + i)"),
            ("slots_i64", "slots are i64"),
        ),
        block=128,  # 4 waves of 32 (NVIDIA: 64 query rows a workgroup) / 2 of 64 (AMD: 32 rows)
    ),
    "linear_rows": KernelFamily(
        "linear_rows.hip",
        ("linear_rows_f16", "linear_rows_bf16", "linear_vec_f16", "linear_vec_bf16"),
        (
            Binding("x", False, "(M, K), M <= 32 (linear_vec: M <= 2)"),
            Binding("w", False, "(N, K), or (2N, K) with FLAG_GATED: the gate's rows, then the up's"),
            *_EPILOGUE_BINDINGS,
        ),
        _LINEAR_CONSTANTS,
        # 128 threads: on an H100 (bench/linear_sweep.py, BENCHMARKS.md) a 7B layer's four projections took
        # 185 / 186 / 229 us at 1 / 8 / 32 rows against 193 / 196 / 276 with 256.
        block=128,
        flags=_LINEAR_FLAGS,
    ),
    "linear_mm": KernelFamily(
        "linear_mm.hip",
        ("linear_mm_f16", "linear_mm_bf16"),
        _TILED_BINDINGS,
        _LINEAR_CONSTANTS,
        block=256,  # 8 waves of 32 (NVIDIA) / 4 of 64 (AMD) over a 128 x 128 tile
        flags=_LINEAR_FLAGS,
    ),
    # linear_mm on Hopper's warpgroup matrix instructions (built for sm_90a, dispatched for cuda:sm_90 targets):
    # 128 x 128 tiles, chunks of 64 in 3 stages of 32 KB in dynamic shared memory.
    "linear_wgmma": KernelFamily(
        "linear_wgmma.hip",
        ("linear_wgmma_f16", "linear_wgmma_bf16"),
        _TILED_BINDINGS,
        _LINEAR_CONSTANTS,
        block=256,  # two warpgroups of 128 threads, 64 rows of the tile each
        flags=_LINEAR_FLAGS,
        local_memory=_WGMMA_TILES,
        arch="sm_90a",
    ),
    "linear_q": KernelFamily(
        "linear_q.hip", ("linear_q_f16", "linear_q_bf16"), *_QUANT_ABI, block=128, flags=_LINEAR_FLAGS
    ),
    "linear_qm": KernelFamily(
        "linear_qm.hip", ("linear_qm_f16", "linear_qm_bf16"), *_QUANT_ABI, block=256, flags=_LINEAR_FLAGS
    ),
    "linear_qmm": KernelFamily(
        "linear_qmm.hip", ("linear_qmm_f16", "linear_qmm_bf16"), *_QUANT_ABI, block=256, flags=_LINEAR_FLAGS
    ),
    # linear_qmm on Hopper's warpgroup matrix instructions: linear_wgmma's tiles over packed weights.
    "linear_qwgmma": KernelFamily(
        "linear_qwgmma.hip",
        ("linear_qwgmma_f16", "linear_qwgmma_bf16"),
        *_QUANT_ABI,
        block=256,
        flags=_LINEAR_FLAGS,
        local_memory=_WGMMA_TILES,
        arch="sm_90a",
    ),
}


@dataclass(frozen=True)
class KernelSpec:
    """One exported kernel: its symbol and the ABI of its family."""

    symbol: str
    family: KernelFamily

    @property
    def source(self) -> str:
        return self.family.source

    @property
    def inputs(self) -> int:
        return sum(not b.writes for b in self.family.bindings)

    @property
    def outputs(self) -> int:
        return sum(b.writes for b in self.family.bindings)

    @property
    def constants(self) -> int:
        return len(self.family.constants)

    @property
    def workgroup(self) -> tuple:
        return (self.family.block, 1, 1)


KERNELS: dict[str, KernelSpec] = {sym: KernelSpec(sym, f) for f in FAMILIES.values() for sym in f.symbols}
SOURCES: tuple = tuple(sorted(f.source for f in FAMILIES.values()))


def family_of(source: str) -> KernelFamily:
    """The KernelFamily of kernel source `source` (a CompileError naming the known ones if it has none)."""
    fam = next((f for f in FAMILIES.values() if f.source == source), None)
    if fam is None:
        raise CompileError(
            f"kernel source {source!r} has no KernelFamily (known: {', '.join(SOURCES)})", stage="kernel-build"
        )
    return fam


def abi_header(source: str) -> str:
    """The generated header of `source`'s family (see KernelFamily), included as ABI_HEADER."""
    fam = family_of(source)
    lines = [
        f"// {ABI_HEADER} of {source}: generated by rocmc/lowering/kernels.py from its KernelFamily; do not edit.",
        "#pragma once",
        "",
        f"#define BLOCK {fam.block}",
        f"#define LOCAL_MEMORY {fam.local_memory}  // bytes of dynamic shared memory a workgroup is given",
        "",
    ]
    lines += [f"#define FLAG_{n.upper()} {1 << i}u  // {doc}" for i, (n, doc) in enumerate(fam.flags)]
    params = [f"{'' if b.writes else 'const '}{b.ctype}* __restrict__ {b.name}" for b in fam.bindings]
    params += [f"u32 {n}" for n in fam.constant_names]
    lines += ["", "// Bindings:"] + [
        f"//   {b.name}: {b.doc}{'' if b.writes else ' (read-only)'}" for b in fam.bindings
    ]
    lines += ["// Push constants (i32):"] + [f"//   {n}: {doc}" for n, doc in fam.constants]
    lines += [f"#define KERNEL_PARAMS(T) {', '.join(params)}", ""]
    return "\n".join(lines)


# ---- targets -----------------------------------------------------------------------------------------------


def split_arch(arch: str) -> tuple[str, str]:
    """'gfx942' / 'rocm:gfx942' -> ('rocm', 'gfx942'); 'sm_90' / 'cuda:sm_80' -> ('cuda', 'sm_90')."""
    a = str(arch).strip().lower().rpartition(":")[2]
    if re.fullmatch(r"gfx[0-9a-f]+", a):
        return "rocm", a
    if re.fullmatch(r"sm_\d+a?", a):
        return "cuda", a
    raise CompileError(
        f"unknown kernel architecture {arch!r}: expected gfxNNN (AMDGPU) or sm_NN (NVIDIA)", stage="kernel-build"
    )


# Why each flag: no HIP/CUDA headers or device libraries exist here (-nogpuinc/-nogpulib); one code object,
# not an offload bundle, which IREE would accept and then fail to load (--no-gpu-bundle-output); PTX 7.8 so
# drivers older than clang's default PTX version load it; the resource remarks report scratch and spills.
def clang_flags(kind: str, arch: str) -> list[str]:
    common = ["-O3", "-std=c++17", "-Wall", "-Wno-unknown-cuda-version"]
    if kind == "rocm":
        return [
            "-x",
            "hip",
            "--offload-device-only",
            f"--offload-arch={arch}",
            "-nogpulib",
            "-nogpuinc",
            "-fuse-cuid=none",
            "--no-gpu-bundle-output",
            "-Rpass-analysis=kernel-resource-usage",
            *common,
        ]
    return [
        "-x",
        "cuda",
        "--cuda-device-only",
        f"--cuda-gpu-arch={arch}",
        "-nocudainc",
        "-nocudalib",
        "-S",
        # PTX 7.8 so that older drivers load it; sm_90a's warpgroup instructions need PTX 8.0
        "--cuda-feature=+ptx80" if arch.endswith("a") else "--cuda-feature=+ptx78",
        *common,
    ]


# ---- finding clang -----------------------------------------------------------------------------------------

_BACKEND = {"rocm": "amdgcn", "cuda": "nvptx64"}
_INSTALL = (
    "install clang and lld 19 or newer (Debian/Ubuntu: apt-get install clang-19 lld-19), or ROCm "
    "(/opt/rocm/llvm/bin/clang), or point ROCMC_CLANG at a clang that can"
)


def _candidates() -> list[str]:
    env = os.environ.get("ROCMC_CLANG")
    if env:
        return [env]  # an explicit choice is the only one tried
    found = ["/opt/rocm/llvm/bin/clang"] if os.path.exists("/opt/rocm/llvm/bin/clang") else []
    for v in range(30, 18, -1):
        p = shutil.which(f"clang-{v}")
        if p:
            found.append(p)
    p = shutil.which("clang")
    if p and (_clang_major(p) or 0) >= 19:
        found.append(p)
    return found


@lru_cache(maxsize=None)
def _clang_version(path: str) -> str:
    try:
        out = children.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.splitlines()[0] if out else ""


def _clang_major(path: str) -> int | None:
    m = re.search(r"version (\d+)", _clang_version(path))
    return int(m.group(1)) if m else None


@lru_cache(maxsize=None)
def _backends(path: str) -> str:
    try:
        return children.run([path, "--print-targets"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def find_clang(kind: str) -> str:
    """A clang that can build kernels for `kind` ("rocm" or "cuda"); CompileError naming what to install."""
    tried = _candidates()
    for path in tried:
        if re.search(rf"^\s*{_BACKEND[kind]}\b", _backends(path), re.M):
            return path
    what = "AMDGPU" if kind == "rocm" else "NVPTX"
    looked = ", ".join(tried) or "ROCMC_CLANG, /opt/rocm/llvm/bin/clang, clang-19+ on PATH"
    msg = f"no clang that can target {what} was found (tried: {looked}); {_INSTALL}"
    raise CompileError(msg, stage="kernel-build")


def arch_problem(arch: str) -> str | None:
    """Why kernels can't be built for `arch` with the clang found here (None: they can, or no clang was
    found at all, which build() reports as an error naming what to install)."""
    kind, arch = split_arch(arch)
    try:
        clang = find_clang(kind)
    except CompileError:
        return None
    return _arch_problem(clang, kind, arch)


@lru_cache(maxsize=None)
def _arch_problem(clang: str, kind: str, arch: str) -> str | None:
    flags = [f for f in clang_flags(kind, arch) if not f.startswith("-R")]
    with tempfile.TemporaryDirectory(prefix="rocmc-kernel-") as tmp:
        src = Path(tmp) / "empty.hip"
        src.write_text("")
        proc = children.run([clang, *flags, "-E", str(src), "-o", os.devnull], capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    first = next((l for l in proc.stderr.splitlines() if "error" in l), proc.stderr.strip())
    return f"{Path(clang).name} cannot build for {arch}: {first.strip()}"


# ---- building ----------------------------------------------------------------------------------------------


@dataclass
class KernelObject:
    """A built code object: hsaco bytes (rocm) or PTX text bytes (cuda)."""

    source: str
    kind: str
    arch: str
    data: bytes
    path: Path | None
    resources: dict = field(default_factory=dict)  # symbol -> {"VGPRs": .., "ScratchSize": .., ...} (AMDGPU)

    @property
    def symbols(self) -> list[str]:
        return object_symbols(self.data, self.kind)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def only(self, symbol: str) -> "KernelObject":
        """The object with one entry point: PTX (cuda) without the other entries' bodies, which the driver would
        otherwise compile at every first load of a module (an AMDGPU code object is returned whole)."""
        if self.kind != "cuda":
            return self
        out = _PTX_ENTRY_BLOCK.sub(lambda m: m.group(0) if m.group(1) == symbol else "", self.data.decode()).encode()
        if object_symbols(out, "cuda") == [symbol]:
            return KernelObject(self.source, self.kind, self.arch, out, None, self.resources)
        if symbol in self.symbols:  # an entry written otherwise than the pattern expects: the object whole, still right
            return self
        raise CompileError(f"{self.source} for {self.arch} has no entry point {symbol!r}", stage="kernel-build")


def sources_digest() -> str:
    """Hash of every kernel source and header, generated ones included: a header or ABI change rebuilds
    every kernel."""
    h = hashlib.sha256()
    for p in sorted(KERNEL_DIR.glob("*")):
        if p.suffix in (".hip", ".h"):
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    for source in SOURCES:
        h.update(f"{source}:{ABI_HEADER}".encode() + b"\0" + abi_header(source).encode() + b"\0")
    return h.hexdigest()


def build(source: str, arch: str, extra_flags=()) -> KernelObject:
    """Build custom_kernels/<source> for `arch` (gfxNNN or sm_NN), from the cache when possible."""
    kind, arch = split_arch(arch)
    src = KERNEL_DIR / source
    if not src.is_file():
        raise CompileError(
            f"kernel source {source!r} not found in {KERNEL_DIR}: set ROCMC_KERNEL_DIR to the "
            "directory of the kernel sources (custom_kernels/ in a checkout)",
            stage="kernel-build",
        )
    clang = find_clang(kind)
    flags = clang_flags(kind, arch) + list(extra_flags)
    key = hashlib.sha256(json.dumps([sources_digest(), source, arch, flags, _clang_version(clang)]).encode())
    ext = ".hsaco" if kind == "rocm" else ".ptx"
    root = cache_root()
    if root is not None:
        path = root / "kernels" / f"{Path(source).stem}-{arch}-{key.hexdigest()[:24]}{ext}"
        meta = path.with_suffix(ext + ".json")
        if path.is_file() and meta.is_file() and not _untrusted(path, meta):
            try:
                res = json.loads(meta.read_text())
                data = path.read_bytes()
                if hashlib.sha256(data).hexdigest() == res["sha256"]:
                    return KernelObject(source, kind, arch, data, path, res["resources"])
            except (OSError, ValueError, KeyError):
                pass  # corrupt entry: rebuild
    with step(f"building kernel {source} for {arch}", logger=__name__):
        data, resources = _run_clang(clang, src, flags, ext, abi_header(source))
    obj = KernelObject(source, kind, arch, data, None, resources)
    if root is not None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(path, data)
        write_atomic(meta, json.dumps({"sha256": obj.sha256, "resources": resources}).encode())
        obj.path = path
    return obj


def _run_clang(clang: str, src: Path, flags: list, ext: str, header: str) -> tuple[bytes, dict]:
    """Compile `src` with its generated ABI header on the include path."""
    with tempfile.TemporaryDirectory(prefix="rocmc-kernel-") as tmp:
        out = Path(tmp) / ("kernel" + ext)
        (Path(tmp) / ABI_HEADER).write_text(header)
        flags = [*flags, f"-I{tmp}"]
        proc = children.run([clang, *flags, str(src), "-o", str(out)], capture_output=True, text=True)
        if proc.returncode != 0 or not out.is_file():
            diag = "\n".join(l for l in proc.stderr.splitlines() if "remark:" not in l)
            raise CompileError(
                f"building kernel {src.name} failed ({Path(clang).name})", stage="kernel-build", diagnostics=diag
            )
        return out.read_bytes(), _resource_remarks(proc.stderr)


def _untrusted(*paths: Path) -> bool:
    """A cached kernel is embedded in modules as it is: use it only if its files are this user's and no
    one else can write them (as compile-cache entries, lowering/cache.py)."""
    try:
        return bool(
            distrust(os.lstat(paths[0].parent), directory=True)
            or any(distrust(os.lstat(p), directory=False) for p in paths)
        )
    except OSError:
        return True


_REMARK = re.compile(r"remark:\s+(Function Name: (\w+)|([\w ]+?)(?: \[[^\]]*\])?: (\d+))")


def _resource_remarks(stderr: str) -> dict:
    """AMDGPU's kernel-resource-usage remarks, per function: VGPRs, ScratchSize, VGPRs Spill, ..."""
    out: dict = {}
    current = None
    for m in _REMARK.finditer(stderr):
        if m.group(2):
            current = out.setdefault(m.group(2), {})
        elif current is not None:
            current[m.group(3).strip()] = int(m.group(4))
    return out


# ---- reading built objects ---------------------------------------------------------------------------------

# One entry point's PTX, as clang writes it: the `.entry`, its body, the end-of-function comment and brace.
_PTX_ENTRY_BLOCK = re.compile(r"^\.visible \.entry (\w+)\(.*?// -- End function\n\}\n", re.S | re.M)
_PTX_ENTRY = re.compile(rb"^\s*\.visible\s+\.entry\s+(\w+)\s*\(", re.M)


def object_symbols(data: bytes, kind: str) -> list[str]:
    """Kernel entry points of a code object: PTX `.entry`s, or an AMDGPU ELF's exported functions."""
    if kind == "cuda":
        return [m.decode() for m in _PTX_ENTRY.findall(data)]
    return [name for name, typ, bind in elf_symbols(data) if typ == 2 and bind in (1, 2)]  # FUNC, GLOBAL|WEAK


def elf_symbols(data: bytes) -> list[tuple[str, int, int]]:
    """(name, type, binding) of every .symtab entry of a little-endian ELF64 file."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise CompileError("not an ELF64 code object", stage="kernel-build")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for sh in sections:
        if sh[1] != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sh[6]]
        for off in range(sh[4], sh[4] + sh[5], sh[9]):
            name_off, info = struct.unpack_from("<IB", data, off)
            s = strtab[4] + name_off
            name = data[s : data.index(b"\0", s)].decode()
            out.append((name, info & 0xF, info >> 4))
    return out


def elf_machine(data: bytes) -> tuple[int, int]:
    """(e_machine, e_flags) of an ELF64 file: 224 is EM_AMDGPU; e_flags & 0xff is the gfx arch."""
    (machine,) = struct.unpack_from("<H", data, 0x12)
    (flags,) = struct.unpack_from("<I", data, 0x30)
    return machine, flags


def source_arch(source: str, arch: str) -> str:
    """The architecture `source` builds for among kernels built for `arch`: a family written for one generation
    (linear_wgmma: sm_90a) builds for it where `arch` is that generation, as a module for that GPU embeds it."""
    family = family_of(source)
    own = family.arch is not None and split_arch(arch)[1].rstrip("a") == family.arch.rstrip("a")
    return family.arch if own else arch


def build_all(arch: str) -> list[dict]:
    """Build every kernel source for `arch`; one row per exported kernel (for `rocmc kernels build`)."""
    rows = []
    for source in SOURCES:
        obj = build(source, source_arch(source, arch))
        present = set(obj.symbols)
        for spec in (s for s in KERNELS.values() if s.source == source):
            res = obj.resources.get(spec.symbol, {})
            rows.append(
                {
                    "symbol": spec.symbol,
                    "source": source,
                    "arch": obj.arch,
                    "kind": obj.kind,
                    "present": spec.symbol in present,
                    "bytes": len(obj.data),
                    "sha256": obj.sha256[:16],
                    "workgroup": list(spec.workgroup),
                    "bindings": spec.inputs + spec.outputs,
                    "constants": spec.constants,
                    "path": str(obj.path) if obj.path else None,
                    "vgprs": res.get("VGPRs"),
                    "scratch": res.get("ScratchSize"),
                    "spills": (res.get("VGPRs Spill", 0) + res.get("SGPRs Spill", 0)) if res else None,
                }
            )
    return rows
