"""The `hip` implementation: hand-written kernels (custom_kernels/*.hip) as custom dispatches.

On rocm and cuda targets these are the default for the ops they cover; the CPU never sees them (a
GPU-only object in a CPU module crashes iree-compile). Each lowering checks what its kernel handles
and otherwise names the reason, so the registry falls back to the generated implementation.
"""
from . import norm, rope  # noqa: F401
