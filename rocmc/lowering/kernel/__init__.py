"""The `kernel` implementation: hand-written kernels as custom dispatches.

The kernels are HIP sources (custom_kernels/*.hip) that lowering/kernels.py builds for amdgcn (rocm
targets) and nvptx (cuda targets); this package emits their dispatches (dispatch.py) and registers
the lowerings of the ops they cover (norm.py, rope.py, attention.py, linear.py, quant.py).

On rocm and cuda targets these are the default for the ops they cover; the CPU never sees them (a
GPU-only object in a CPU module crashes iree-compile). Each lowering checks what its kernel handles
and otherwise names the reason, so the registry falls back to the generated implementation.
"""

from . import attention, linear, norm, quant, rope  # noqa: F401
