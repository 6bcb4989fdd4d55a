"""The compile targets rocmc knows, by name. Neutral: read by the lowering (to parse targets) and by
artifact loading (to check a module's metadata) alike."""
from __future__ import annotations

# Architectures IREE 3.13 generates code for (its known-target tables). sm_90 is missing there;
# sm_80 PTX runs on Hopper through the driver's JIT.
ROCM_ARCHS = ("gfx908", "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1200", "gfx1201")
CUDA_ARCHS = ("sm_80", "sm_86", "sm_87", "sm_89")


def known_targets() -> list[str]:
    return ["cpu"] + [f"rocm:{a}" for a in ROCM_ARCHS] + [f"cuda:{a}" for a in CUDA_ARCHS]
