"""The collective bootstrap: what lets IREE's NCCL/RCCL channels span the processes of a rocmc run.

IREE's CUDA and HIP drivers build the communicator of `flow.channel.default` from a channel provider;
the provider the runtime installs (when PMI_SIZE is set) asks "libmpi.so" for the rank, the world size
and a broadcast of the communicator's unique id. `install(group)` answers those from rocmc's process
group: it builds mpi_bootstrap.c once (a host C compiler, cached like the kernels), loads it under that
name and sets PMI_RANK/PMI_SIZE, all before the device is opened. The collective library itself is the
vendor's, loaded by IREE: `collective_library(kind)` checks that it can be found and names what to
install when it can't.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ... import children
from ...errors import DistributedError
from ...files import cache_root
from ..devices import _loadable

SOURCE = Path(__file__).with_name("mpi_bootstrap.c")
# What IREE's drivers dlopen, and where the field installs it.
LIBRARIES = {
    "cuda": (
        "libnccl.so",
        "NCCL",
        "pip install nvidia-nccl-cu12 (PyTorch's CUDA wheels bring it), or the libnccl2 + libnccl-dev packages",
    ),
    "rocm": ("librccl.so", "RCCL", "install ROCm's rccl package (it puts librccl.so in /opt/rocm/lib)"),
}
_COMPILERS = ("CC", "clang-19", "clang", "gcc", "cc")
_BROADCAST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
_installed: dict = {}


def work_dir() -> Path:
    """Where the native pieces are made: the compile cache, or a per-user temporary directory."""
    return (cache_root() or Path(tempfile.gettempdir()) / f"rocmc-{os.getuid()}") / "native"


def build(out_dir: Path | None = None) -> Path:
    """The bootstrap library, built once per source (cached beside the compiled kernels)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    lib = (Path(out_dir) / "native" if out_dir else work_dir()) / digest / "libmpi.so"
    if lib.is_file():
        return lib
    cc = next((c for c in (os.environ.get("CC"), *_COMPILERS[1:]) if c and shutil.which(c)), None)
    if cc is None:
        raise DistributedError(
            "tensor parallelism on a GPU builds a small C library at first use and found no C "
            "compiler (set CC, or install clang or gcc)"
        )
    lib.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    proc = children.run(
        [cc, "-shared", "-fPIC", "-O2", "-Wl,-soname,libmpi.so", "-o", str(tmp), str(SOURCE)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise DistributedError(f"building the collective bootstrap with {cc} failed:\n{proc.stderr.strip()}")
    os.replace(tmp, lib)
    return lib


def install(group) -> None:
    """Make IREE's default collective channel span `group`'s ranks; call before opening the device."""
    if group.world_size == 1 or "lib" in _installed:
        return
    lib = ctypes.CDLL(str(build()), mode=ctypes.RTLD_GLOBAL)

    def broadcast(buffer, nbytes, root):
        try:
            data = group.broadcast(ctypes.string_at(buffer, nbytes) if group.rank == root else None, root)
            if len(data) != nbytes:
                return 1
            ctypes.memmove(buffer, data, nbytes)
            return 0
        except Exception as e:  # noqa: BLE001 - reported, and IREE gets an MPI error code
            print(f"rocmc: rank {group.rank}: exchanging the collective id failed: {e}", file=sys.stderr)
            return 1

    callback = _BROADCAST(broadcast)
    if lib.rocmc_bootstrap_configure(group.rank, group.world_size, callback) != 0:
        raise DistributedError(f"the collective bootstrap refused rank {group.rank} of {group.world_size}")
    _installed.update(lib=lib, callback=callback)  # kept alive for IREE's calls
    os.environ["PMI_SIZE"] = str(group.world_size)
    os.environ["PMI_RANK"] = str(group.rank)


def collective_library(kind: str) -> None:
    """DistributedError naming what to install when IREE's driver for `kind` won't find its collective
    library (NCCL for cuda, RCCL for rocm)."""
    if kind not in LIBRARIES:
        return
    name, what, how = LIBRARIES[kind]
    if _loadable(name):
        return
    found = find_pip_library(kind)
    where = (
        f" ({what} is at {found}, but not under the name {name}: `rocmc launch` links it for its ranks; "
        f"with another launcher put a directory holding {name} -> {found.name} on LD_LIBRARY_PATH)"
        if found
        else ""
    )
    raise DistributedError(
        f"tensor parallelism on {kind} needs {what} ({name}), which the loader can't find: {how}{where}"
    )


def find_pip_library(kind: str) -> Path | None:
    """A collective library installed by pip (NCCL's wheel) that the loader's search does not see."""
    if kind != "cuda":
        return None
    for entry in sys.path:
        hits = sorted(glob.glob(os.path.join(entry, "nvidia", "nccl", "lib", "libnccl.so*")))
        if hits:
            return Path(hits[0])
    return None


def library_dir(kind: str, root: Path | None = None) -> Path | None:
    """A directory to put on the ranks' LD_LIBRARY_PATH so that IREE finds a pip-installed collective
    library under the name it loads (None when the loader finds it already, or it is not installed)."""
    if kind not in LIBRARIES or _loadable(LIBRARIES[kind][0]):
        return None
    found = find_pip_library(kind)
    if found is None:
        return None
    d = (Path(root) / "native" if root else work_dir()) / "collective-libs"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    link = d / LIBRARIES[kind][0]
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(found)
    return d
