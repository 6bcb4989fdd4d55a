"""Compile targets: parsing from strings and the iree-compile flags of each."""

from __future__ import annotations

from dataclasses import dataclass

from ..archs import (
    CUDA_ARCH_SPELLINGS,
    CUDA_ARCHS,
    CUDA_PTX_ARCHS,
    DRIVERS,
    ROCM_ARCHS,  # noqa: F401
    code_arch,
    default_device,
    known_targets,
)
from ..errors import TargetError

_CPU_NAMES = ("cpu", "host", "llvm-cpu", "local")


# The float8 types each AMD GPU converts in hardware and its matrix units take (MI300's fnuz variants, OCP's from
# gfx950 and RDNA4); IREE converts the others in software when asked to.
FNUZ, OCP = frozenset({"f8e4m3fnuz", "f8e5m2fnuz"}), frozenset({"f8e4m3fn", "f8e5m2"})
_NATIVE_FLOAT8 = {"gfx940": FNUZ, "gfx941": FNUZ, "gfx942": FNUZ, "gfx950": OCP, "gfx1200": OCP, "gfx1201": OCP}


def native_float8(target: "Target") -> frozenset:
    """The float8 types (rocmc's names) `target`'s hardware takes: none on the CPU, CUDA and other AMD GPUs."""
    return _NATIVE_FLOAT8.get(target.arch, frozenset()) if target.kind == "rocm" else frozenset()


@dataclass(frozen=True)
class Target:
    kind: str  # "cpu", "rocm" or "cuda"
    arch: str  # "host", "gfx942", "sm_80", "sm_90"

    @staticmethod
    def parse(spec) -> "Target":
        if isinstance(spec, Target):
            return spec
        if not isinstance(spec, str) or not spec:
            raise TargetError(f"target {spec!r}: expected a string such as {', '.join(known_targets()[:4])}")
        s = spec.strip().lower()
        if s in _CPU_NAMES:
            return Target("cpu", "host")
        kind, _, arch = s.rpartition(":")
        if kind in ("rocm", "hip", "amdgpu", "") and arch in ROCM_ARCHS:
            return Target("rocm", arch)
        arch = CUDA_ARCH_SPELLINGS.get(arch, arch)
        if kind in ("cuda", "") and (arch in CUDA_ARCHS or arch in CUDA_PTX_ARCHS):
            return Target("cuda", arch)
        raise TargetError(f"unknown target {spec!r}; known targets: {', '.join(known_targets())}")

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"{self.kind}:{self.arch}"

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("rocm", "cuda")

    @property
    def code_arch(self) -> str:
        """The architecture IREE generates code for: the target's own, or the one whose PTX runs on it
        (sm_80 for sm_90 and sm_100, which IREE 3.13 has no tables for)."""
        return code_arch(self.kind, self.arch)

    @property
    def code_note(self) -> str | None:
        """What the artifact records when its code was made for another architecture than its target's."""
        if self.code_arch == self.arch:
            return None
        return (
            f"{self.code_arch} code generated for {self.arch}: IREE {_IREE_TABLES} has no {self.arch} "
            f"target; the driver compiles the {self.code_arch} PTX for the GPU when the module loads"
            + (
                "; hand-written kernels written for Hopper are sm_90a PTX (an sm_90 GPU runs the module)"
                if self.arch == "sm_90"
                else ""
            )
        )

    @property
    def default_device(self) -> str:
        return default_device(self.kind)

    @property
    def drivers(self) -> tuple:
        """Runtime drivers that can run this target's artifacts."""
        return DRIVERS[self.kind]

    def tuning_flags(self) -> list[str]:
        """Options tried first; dropped when IREE cannot compile a module with them."""
        return list(CPU_TUNING) if self.kind == "cpu" else []

    def iree_flags(self) -> list[str]:
        return self._device_flags() + KEEP_F64

    def _device_flags(self) -> list[str]:
        if self.kind == "cpu":
            return [
                "--iree-hal-target-device=local",
                "--iree-hal-local-target-device-backends=llvm-cpu",
                "--iree-llvmcpu-target-cpu=host",
            ]
        if self.kind == "rocm":
            return ["--iree-hal-target-device=hip", f"--iree-rocm-target={self.arch}"]
        return ["--iree-hal-target-device=cuda", f"--iree-cuda-target={self.code_arch}"]


_IREE_TABLES = "3.13"  # the IREE release whose target tables archs.py lists


# iree-compile demotes f64 to f32 unless told not to: an f64 graph would compute in f32 and its
# module would expect f32 buffers.
KEEP_F64 = ["--iree-input-demote-f64-to-f32=false"]


# Performance options tried first on CPU targets: data tiling (packed matmul layouts, ukernel-style
# inner loops) and im2col for convolutions measured 2x on matmuls and 3-4x on ResNet-18 (BENCHMARKS.md).
# IREE 3.13 fails to compile some graphs with them (e.g. a decomposed attention feeding a matmul:
# "all stack allocations need to be hoisted"); those are compiled without them.
CPU_TUNING = ("--iree-opt-data-tiling", "--iree-global-opt-use-im2col-for-convs")
