"""The compile targets rocmc knows, by name, and the runtime drivers that run each kind. Neutral: read by
the lowering (to parse targets) and by the runtime (to check a module's metadata, pick its device) alike."""

from __future__ import annotations

# Architectures IREE 3.13 generates code for (its known-target tables).
ROCM_ARCHS = ("gfx908", "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1200", "gfx1201")
CUDA_ARCHS = ("sm_80", "sm_86", "sm_87", "sm_89")

# NVIDIA architectures missing from IREE 3.13's tables (Hopper: H100/H200; Blackwell: B200), each with
# the architecture whose code a module for it holds. IREE's CUDA modules carry PTX, which the driver
# compiles for the GPU it loads on, so sm_80 PTX runs on these; the artifact says it was made so
# (its metadata's compile_note). The hand-written kernels are built for that architecture too: sm_80
# PTX is the code proven on these GPUs.
CUDA_PTX_ARCHS = {"sm_90": "sm_80", "sm_100": "sm_80"}
# Spellings of those targets: the arch-specific feature sets name the same GPUs, and the code made for
# them is the same sm_80 PTX.
CUDA_ARCH_SPELLINGS = {"sm_90a": "sm_90", "sm_100a": "sm_100"}


def known_targets() -> list[str]:
    return (
        ["cpu"]
        + [f"rocm:{a}" for a in ROCM_ARCHS]
        + [f"cuda:{a}" for a in CUDA_ARCHS]
        + [f"cuda:{a}" for a in CUDA_PTX_ARCHS]
    )


def code_arch(kind: str, arch: str) -> str:
    """The architecture IREE generates code for, for target `kind:arch` (sm_80 for sm_90 and sm_100)."""
    return CUDA_PTX_ARCHS.get(arch, arch) if kind == "cuda" else arch


# The IREE runtime drivers that run each target kind's modules; the first is the kind's default device.
DRIVERS = {"cpu": ("local-task", "local-sync"), "rocm": ("hip",), "cuda": ("cuda",)}
DEVICES = tuple(d for drivers in DRIVERS.values() for d in drivers)


def default_device(kind: str) -> str:
    return DRIVERS[kind][0]


def kind_of(device: str) -> str:
    """Target kind a device (such as 'hip' or 'cuda:1') runs: cpu, rocm or cuda; KeyError for an unknown one."""
    base = device.split(":")[0]
    for kind, drivers in DRIVERS.items():
        if base in drivers:
            return kind
    raise KeyError(base)
