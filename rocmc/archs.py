"""The compile targets rocmc knows, by name, and the runtime drivers that run each kind. Neutral: read by
the lowering (to parse targets) and by the runtime (to check a module's metadata, pick its device) alike."""
from __future__ import annotations

# Architectures IREE 3.13 generates code for (its known-target tables). sm_90 is missing there;
# sm_80 PTX runs on Hopper through the driver's JIT.
ROCM_ARCHS = ("gfx908", "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1200", "gfx1201")
CUDA_ARCHS = ("sm_80", "sm_86", "sm_87", "sm_89")


def known_targets() -> list[str]:
    return ["cpu"] + [f"rocm:{a}" for a in ROCM_ARCHS] + [f"cuda:{a}" for a in CUDA_ARCHS]


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
