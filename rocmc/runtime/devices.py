"""Runtime devices: names, driver availability, and the errors that say what is missing."""

from __future__ import annotations

import ctypes.util
import threading

import numpy as np

from ..archs import DEVICES
from ..errors import DeviceError

# The library each GPU driver loads, named in the error when it is absent.
_DRIVER_LIBRARY = {
    "hip": ("libamdhip64.so", "amdhip64", "install ROCm (the HIP runtime) or set IREE_HIP_DYLIB_PATH"),
    "cuda": ("libcuda.so", "cuda", "install the NVIDIA driver"),
}
_devices: dict = {}
_lock = threading.Lock()


def get_device(device: str):
    """Return (and share) the iree HalDevice for a name such as 'local-task', 'hip', 'cuda:1'."""
    base = device.split(":")[0] if isinstance(device, str) else None
    if base not in DEVICES:
        raise DeviceError(f"unknown device {device!r}; expected one of {', '.join(DEVICES)} (optionally ':<index>')")
    with _lock:
        if device in _devices:
            return _devices[device]
        if base in _DRIVER_LIBRARY:
            lib, short, how = _DRIVER_LIBRARY[base]
            if ctypes.util.find_library(short) is None and not _loadable(lib):
                raise DeviceError(f"device {device!r} needs {lib}, which was not found: {how}")
        from iree import runtime as rt

        try:
            options = {}
            if base == "cuda":
                # Synchronous allocations behind IREE's caching allocator: their buffers can be exported
                # as raw pointers to vendor libraries (cuDNN extern calls), which IREE's default pooled
                # asynchronous ones can't, and they measured no slower (BENCHMARKS.md, external calls).
                rt.flags.parse_flags("--cuda_async_allocations=false")
                options["allocators"] = ["caching"]
            drv = rt.get_driver(base)
            infos = drv.query_available_devices()
            idx = int(device.split(":", 1)[1]) if ":" in device else 0
            if idx >= len(infos):
                raise DeviceError(f"device {device!r}: only {len(infos)} {base} device(s) present")
            dev = drv.create_device(infos[idx], **options)
        except DeviceError:
            raise
        except Exception as e:  # noqa: BLE001
            raise DeviceError(f"device {device!r} could not be opened: {e}") from None
        _devices[device] = dev
        return dev


def _loadable(lib: str) -> bool:
    try:
        ctypes.CDLL(lib)
        return True
    except OSError:
        return False


def upload(device, arr, dtype, element_type):
    """A host array of storage type `dtype` as a new device buffer view tagged `element_type`."""
    from iree import runtime as rt

    arr = np.ascontiguousarray(arr)
    raw = arr if dtype.raw is None else arr.view(dtype.raw)  # bf16 travels as its raw bits
    return device.allocator.allocate_buffer_copy(
        memory_type=rt.MemoryType.DEVICE_LOCAL,
        allowed_usage=rt.BufferUsage.DEFAULT,
        device=device,
        buffer=raw,
        element_type=element_type,
    )
