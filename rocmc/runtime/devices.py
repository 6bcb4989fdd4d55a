"""Runtime devices: names, driver availability, and the errors that say what is missing."""

from __future__ import annotations

import ctypes.util
import threading

import numpy as np

from ..archs import DEVICES
from ..dtypes import pack_nibbles
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


_bound = threading.local()  # .devices: the GPU devices whose context is current on this thread
_contexts: dict = {}  # device name -> its driver's primary context, retained for the process's life


def bind_thread(device: str) -> None:
    """Make `device`'s GPU context current on the calling thread (once per thread; CPU devices need nothing).

    IREE's CUDA driver makes its context (the device's primary context) current on the thread that created the
    device only, so a call from another thread (a server's engine thread, a thread pool) fails with
    CUDA_ERROR_INVALID_CONTEXT; rocmc's modules call this before each call, so they run on any thread."""
    base, gpu = _gpu(device)
    if gpu is None:
        return
    seen = _bound.__dict__.setdefault("devices", set())
    if device in seen:
        return
    ctx, lib = _context(gpu), _driver(base)
    rc = lib.cuCtxSetCurrent(ctx) if base == "cuda" else lib.hipCtxSetCurrent(ctx)
    if rc != 0:
        raise DeviceError(f"device {device!r}: its context could not be made current on this thread (error {rc})")
    seen.add(device)


def _gpu(device: str) -> tuple[str, str | None]:
    """(the driver's name, 'cuda:N' / 'hip:N' with the index made explicit; None for the CPU drivers)."""
    base, _, index = device.partition(":")
    if base not in _DRIVER_LIBRARY:
        return base, None
    return base, f"{base}:{int(index) if index.isdigit() else 0}"


def _driver(base: str) -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1" if base == "cuda" else "libamdhip64.so")


def _context(device: str) -> ctypes.c_void_p:
    """The primary context of `device` ('cuda:N' or 'hip:N'; the one IREE's drivers use), retained once."""
    with _lock:
        ctx = _contexts.get(device)
        if ctx is not None:
            return ctx
        base, _, index = device.partition(":")
        lib, dev, ctx = _driver(base), ctypes.c_int(), ctypes.c_void_p()
        p = "cu" if base == "cuda" else "hip"
        rc = (
            getattr(lib, p + "Init")(0)
            or getattr(lib, p + "DeviceGet")(ctypes.byref(dev), int(index))
            or getattr(lib, p + "DevicePrimaryCtxRetain")(ctypes.byref(ctx), dev)
        )
        if rc != 0:
            raise DeviceError(f"device {device!r}: its primary context could not be retained (error {rc})")
        _contexts[device] = ctx
        return ctx


def _loadable(lib: str) -> bool:
    try:
        ctypes.CDLL(lib)
        return True
    except OSError:
        return False


# Results read back through host memory the device writes (pinned on CUDA and HIP), one buffer kept per device.
# IREE's DeviceArray.to_host pins a new host array (or allocates a staging buffer) for every read of a GPU
# buffer: 0.36-0.46 ms for the few bytes of a decode step's tokens on an H200 (BENCHMARKS.md).
READ_BACK_MAX = 16 << 20  # bytes: larger results are read through IREE's path (it pins the result's own array)
_readers: dict = {}


def read_back(array) -> np.ndarray:
    """A device array's values on the host: an array of its own read through the device's kept host buffer, or
    where the host maps the buffer (the CPU) or the result is large, IREE's `to_host` (a view of a mapped buffer
    there: `rocmc.runtime.module.host_copy` copies it)."""
    view = array._buffer_view
    if array._is_mappable() or view.get_buffer().byte_length() > READ_BACK_MAX:
        return array.to_host()
    device = array._device
    reader = _readers.get(id(device))
    if reader is None:
        with _lock:
            reader = _readers.setdefault(id(device), _Reader(device))
    out = reader.read(view)
    return out if out is not None else array.to_host()


class _Reader:
    """One buffer of host memory the device writes, kept per device and grown as needed: a read is a queue
    copy into it, a wait, and a copy out of it (the buffer serves the next read)."""

    def __init__(self, device):
        self.device, self.lock = device, threading.Lock()
        self.buffer, self.size, self.semaphore, self.value, self.broken = None, 0, None, 0, False

    def read(self, view) -> np.ndarray | None:
        from iree import runtime as rt

        source = view.get_buffer()
        n = source.byte_length()
        dtype = np.dtype(rt.HalElementType.map_to_dtype(view.element_type))
        shape = tuple(int(d) for d in view.shape)
        if n == 0:
            return np.empty(shape, dtype)
        with self.lock:
            if self.broken:
                return None
            try:
                if n > self.size:
                    self.buffer = None
                    self.size = max(n, 2 * self.size, 4096)
                    self.buffer = host_buffer(self.device, self.size, rt.BufferUsage.TRANSFER)
                if self.semaphore is None:
                    self.semaphore = self.device.create_semaphore(0)
            except RuntimeError:  # no host memory the device writes: IREE's own path
                self.broken = True
                return None
            self.value += 1
            done = rt.HalFence.create_at(self.semaphore, self.value)
            try:
                self.device.queue_copy(source, self.buffer, rt.HalFence(0), done)
                done.wait()
            except RuntimeError:
                self.semaphore, self.value = None, 0  # a failed copy fails its semaphore: a new one next time
                raise
            return np.array(self.buffer.map().asarray(shape, dtype))


def host_buffer(device, nbytes: int, usage):
    """A buffer of host memory the device reads and writes (pinned), mapped on the host; `usage`: what the device
    does with it (IREE's BufferUsage bits) besides the host's mapping. RuntimeError where the device has none."""
    from iree import runtime as rt

    return device.allocator.allocate_buffer(
        memory_type=int(rt.MemoryType.HOST_LOCAL) | int(rt.MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(usage) | int(rt.BufferUsage.MAPPING),
        allocation_size=nbytes,
    )


def upload(device, arr, dtype, element_type):
    """A host array of storage type `dtype` as a new device buffer view tagged `element_type`."""
    from iree import runtime as rt

    arr = np.ascontiguousarray(arr)
    if dtype.packed:  # 4-bit values travel as their bytes, two a byte (DType.abi_shape)
        arr, element_type = pack_nibbles(arr), rt.HalElementType.INT_8
    raw = arr if dtype.raw is None else arr.view(dtype.raw)  # bf16 travels as its raw bits
    return device.allocator.allocate_buffer_copy(
        memory_type=rt.MemoryType.DEVICE_LOCAL,
        allowed_usage=rt.BufferUsage.DEFAULT,
        device=device,
        buffer=raw,
        element_type=element_type,
    )


def memory(device: str) -> tuple[int, int] | None:
    """(free, total) bytes of `device`'s memory as its driver reports them now: for the CPU drivers the host's
    available and total memory (/proc/meminfo), for cuda/hip the GPU's (cuMemGetInfo / hipMemGetInfo). None
    where it can't be asked (no driver, another OS); never opens an IREE device."""
    base, gpu = _gpu(device)
    if base not in DEVICES:
        raise DeviceError(f"unknown device {device!r}; expected one of {', '.join(DEVICES)} (optionally ':<index>')")
    if gpu is None:
        try:
            return _host_memory()
        except OSError:
            return None
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    try:
        ctx = _context(gpu)
        lib = _driver(base)
    except (OSError, DeviceError):
        return None
    push, query, pop = (
        (lib.cuCtxPushCurrent_v2, lib.cuMemGetInfo_v2, lib.cuCtxPopCurrent_v2)
        if base == "cuda"
        else (lib.hipCtxPushCurrent, lib.hipMemGetInfo, lib.hipCtxPopCurrent)
    )
    if push(ctx) != 0:
        return None
    try:
        ok = query(ctypes.byref(free), ctypes.byref(total)) == 0
    finally:
        pop(ctypes.byref(ctypes.c_void_p()))
    return (free.value, total.value) if ok else None


def _host_memory() -> tuple[int, int] | None:
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[name] = int(parts[0]) * 1024  # kB
    if "MemAvailable" not in fields or "MemTotal" not in fields:
        return None
    return fields["MemAvailable"], fields["MemTotal"]
