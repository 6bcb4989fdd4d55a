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

from ..artifact import write_atomic
from ..errors import CompileError
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
WORKGROUP = (256, 1, 1)   # every kernel's block: KERNEL(BLOCK) in the sources


@dataclass(frozen=True)
class KernelSpec:
    """One exported kernel and its dispatch ABI (see the header comment of its source)."""
    symbol: str
    source: str            # file name under custom_kernels/
    inputs: int            # read-only bindings, first
    outputs: int           # written bindings, after the inputs
    constants: int         # i32 push constants
    workgroup: tuple = WORKGROUP


def _specs() -> dict[str, KernelSpec]:
    specs = []
    for dt in DTYPES:
        for sfx in ("", "_short"):
            specs.append(KernelSpec(f"rms_norm_{dt}{sfx}", "rms_norm.hip", inputs=2, outputs=1, constants=5))
            specs.append(KernelSpec(f"layer_norm_{dt}{sfx}", "layer_norm.hip", inputs=3, outputs=1, constants=5))
        for variant in ("half", "interleaved"):
            specs.append(KernelSpec(f"rope_{variant}_{dt}", "rope.hip", inputs=4, outputs=1, constants=9))
    return {s.symbol: s for s in specs}


KERNELS: dict[str, KernelSpec] = _specs()
SOURCES: tuple = tuple(sorted({s.source for s in KERNELS.values()}))


# ---- targets -----------------------------------------------------------------------------------------------

def split_arch(arch: str) -> tuple[str, str]:
    """'gfx942' / 'rocm:gfx942' -> ('rocm', 'gfx942'); 'sm_90' / 'cuda:sm_80' -> ('cuda', 'sm_90')."""
    a = str(arch).strip().lower().rpartition(":")[2]
    if re.fullmatch(r"gfx[0-9a-f]+", a):
        return "rocm", a
    if re.fullmatch(r"sm_\d+a?", a):
        return "cuda", a
    raise CompileError(f"unknown kernel architecture {arch!r}: expected gfxNNN (AMDGPU) or sm_NN (NVIDIA)",
                       stage="kernel-build")


# Why each flag: no HIP/CUDA headers or device libraries exist here (-nogpuinc/-nogpulib); one code object,
# not an offload bundle, which IREE would accept and then fail to load (--no-gpu-bundle-output); PTX 7.8 so
# drivers older than clang's default PTX version load it; the resource remarks report scratch and spills.
def clang_flags(kind: str, arch: str) -> list[str]:
    common = ["-O3", "-std=c++17", "-Wall", "-Wno-unknown-cuda-version"]
    if kind == "rocm":
        return ["-x", "hip", "--offload-device-only", f"--offload-arch={arch}", "-nogpulib", "-nogpuinc",
                "-fuse-cuid=none", "--no-gpu-bundle-output", "-Rpass-analysis=kernel-resource-usage", *common]
    return ["-x", "cuda", "--cuda-device-only", f"--cuda-gpu-arch={arch}", "-nocudainc", "-nocudalib", "-S",
            "--cuda-feature=+ptx78", *common]


# ---- finding clang -----------------------------------------------------------------------------------------

_BACKEND = {"rocm": "amdgcn", "cuda": "nvptx64"}
_INSTALL = ("install clang and lld 19 or newer (Debian/Ubuntu: apt-get install clang-19 lld-19), or ROCm "
            "(/opt/rocm/llvm/bin/clang), or point ROCMC_CLANG at a clang that can")


def _candidates() -> list[str]:
    env = os.environ.get("ROCMC_CLANG")
    if env:
        return [env]   # an explicit choice is the only one tried
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
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.splitlines()[0] if out else ""


def _clang_major(path: str) -> int | None:
    m = re.search(r"version (\d+)", _clang_version(path))
    return int(m.group(1)) if m else None


@lru_cache(maxsize=None)
def _backends(path: str) -> str:
    try:
        return subprocess.run([path, "--print-targets"], capture_output=True, text=True, timeout=30).stdout
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
        proc = subprocess.run([clang, *flags, "-E", str(src), "-o", os.devnull], capture_output=True, text=True)
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
    resources: dict = field(default_factory=dict)    # symbol -> {"VGPRs": .., "ScratchSize": .., ...} (AMDGPU)

    @property
    def symbols(self) -> list[str]:
        return object_symbols(self.data, self.kind)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def sources_digest() -> str:
    """Hash of every kernel source and header: a header change rebuilds every kernel."""
    h = hashlib.sha256()
    for p in sorted(KERNEL_DIR.glob("*")):
        if p.suffix in (".hip", ".h"):
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def build(source: str, arch: str, extra_flags=()) -> KernelObject:
    """Build custom_kernels/<source> for `arch` (gfxNNN or sm_NN), from the cache when possible."""
    kind, arch = split_arch(arch)
    src = KERNEL_DIR / source
    if not src.is_file():
        raise CompileError(f"kernel source {source!r} not found in {KERNEL_DIR}: set ROCMC_KERNEL_DIR to the "
                           "directory of the kernel sources (custom_kernels/ in a checkout)", stage="kernel-build")
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
                pass   # corrupt entry: rebuild
    data, resources = _run_clang(clang, src, flags, ext)
    obj = KernelObject(source, kind, arch, data, None, resources)
    if root is not None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(path, data)
        write_atomic(meta, json.dumps({"sha256": obj.sha256, "resources": resources}).encode())
        obj.path = path
    return obj


def _run_clang(clang: str, src: Path, flags: list, ext: str) -> tuple[bytes, dict]:
    with tempfile.TemporaryDirectory(prefix="rocmc-kernel-") as tmp:
        out = Path(tmp) / ("kernel" + ext)
        proc = subprocess.run([clang, *flags, str(src), "-o", str(out)], capture_output=True, text=True)
        if proc.returncode != 0 or not out.is_file():
            diag = "\n".join(l for l in proc.stderr.splitlines() if "remark:" not in l)
            raise CompileError(f"building kernel {src.name} failed ({Path(clang).name})", stage="kernel-build",
                               diagnostics=diag)
        return out.read_bytes(), _resource_remarks(proc.stderr)


def _untrusted(*paths: Path) -> bool:
    """A cached kernel is embedded in modules as it is: use it only if its files are this user's and no
    one else can write them (as compile-cache entries, lowering/cache.py)."""
    try:
        return bool(distrust(os.lstat(paths[0].parent), directory=True)
                    or any(distrust(os.lstat(p), directory=False) for p in paths))
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

_PTX_ENTRY = re.compile(rb"^\s*\.visible\s+\.entry\s+(\w+)\s*\(", re.M)


def object_symbols(data: bytes, kind: str) -> list[str]:
    """Kernel entry points of a code object: PTX `.entry`s, or an AMDGPU ELF's exported functions."""
    if kind == "cuda":
        return [m.decode() for m in _PTX_ENTRY.findall(data)]
    return [name for name, typ, bind in elf_symbols(data) if typ == 2 and bind in (1, 2)]   # FUNC, GLOBAL|WEAK


def elf_symbols(data: bytes) -> list[tuple[str, int, int]]:
    """(name, type, binding) of every .symtab entry of a little-endian ELF64 file."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise CompileError("not an ELF64 code object", stage="kernel-build")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for sh in sections:
        if sh[1] != 2:    # SHT_SYMTAB
            continue
        strtab = sections[sh[6]]
        for off in range(sh[4], sh[4] + sh[5], sh[9]):
            name_off, info = struct.unpack_from("<IB", data, off)
            s = strtab[4] + name_off
            name = data[s:data.index(b"\0", s)].decode()
            out.append((name, info & 0xF, info >> 4))
    return out


def elf_machine(data: bytes) -> tuple[int, int]:
    """(e_machine, e_flags) of an ELF64 file: 224 is EM_AMDGPU; e_flags & 0xff is the gfx arch."""
    machine, = struct.unpack_from("<H", data, 0x12)
    flags, = struct.unpack_from("<I", data, 0x30)
    return machine, flags


def build_all(arch: str) -> list[dict]:
    """Build every kernel source for `arch`; one row per exported kernel (for `rocmc kernels build`)."""
    rows = []
    for source in SOURCES:
        obj = build(source, arch)
        present = set(obj.symbols)
        for spec in (s for s in KERNELS.values() if s.source == source):
            res = obj.resources.get(spec.symbol, {})
            rows.append({"symbol": spec.symbol, "source": source, "arch": obj.arch, "kind": obj.kind,
                         "present": spec.symbol in present, "bytes": len(obj.data), "sha256": obj.sha256[:16],
                         "workgroup": list(spec.workgroup), "bindings": spec.inputs + spec.outputs,
                         "constants": spec.constants, "path": str(obj.path) if obj.path else None,
                         "vgprs": res.get("VGPRs"), "scratch": res.get("ScratchSize"),
                         "spills": (res.get("VGPRs Spill", 0) + res.get("SGPRs Spill", 0)) if res else None})
    return rows
