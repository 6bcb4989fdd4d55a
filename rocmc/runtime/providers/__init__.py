"""Providers of the extern-call imports (`<library>.<op>`) a compiled module may call.

Each library of rocmc.externs has a provider per device kind: numpy (reference) on local CPU
devices (and rocmc's process group for the CPU's `collectives` calls); on cuda devices cuDNN for `miopen` calls and cuBLASLt for `hipblaslt` calls; on hip devices
MIOpen and hipBLASLt themselves. A device has one provider per library it is asked for; which
vendor serves a call is a load-time choice, so a module compiled for a GPU target never needs
recompiling to change vendors' binding code.
"""
from __future__ import annotations

import importlib
import threading

from ...errors import DeviceError
from ...artifact import FORMAT
from ...externs import LIBRARIES, parse_import
from .base import Provider

# (library, device base name) -> (module, class) of its provider, imported only when used
_PROVIDERS = {
    **{(lib, cpu): ("reference", "ReferenceProvider") for lib in LIBRARIES for cpu in ("local-task", "local-sync")},
    **{("collectives", cpu): ("collectives", "HostCollectivesProvider") for cpu in ("local-task", "local-sync")},
    ("miopen", "cuda"): ("cudnn", "CudnnProvider"), ("miopen", "hip"): ("miopen", "MiopenProvider"),
    ("hipblaslt", "cuda"): ("blas", "CublasLtProvider"), ("hipblaslt", "hip"): ("blas", "HipblasLtProvider"),
}

_providers: dict = {}
_lock = threading.Lock()


def provider_for(device_name: str, hal_device, library: str = "miopen") -> Provider:
    """The provider of `library` on a device, one per (device, library): every module loaded there
    shares its library handle, stream, workspace and algorithm-search cache."""
    base = device_name.split(":")[0]
    if (library, base) not in _PROVIDERS:
        known = sorted({d for _, d in _PROVIDERS})
        raise DeviceError(f"no {library} provider for device {device_name!r}; devices with extern-call providers: "
                          f"{', '.join(known)}")
    key = (device_name, id(hal_device), library)
    with _lock:
        if key not in _providers:
            mod, cls = _PROVIDERS[(library, base)]
            made = getattr(importlib.import_module(f"{__name__}.{mod}"), cls)(hal_device, device_name)
            made.abi = LIBRARIES[library]
            made._hal_device_ref = hal_device   # the id in the key stays this device's
            _providers[key] = made
        return _providers[key]


def library_of(entry: dict, fmt: int) -> str:
    """The library an extern entry of the metadata calls (format 1 modules called MIOpen only)."""
    return entry.get("library", "miopen") if fmt >= 2 else "miopen"


def modules_for(externs: list, hal_device, device_name: str, vm_instance, fmt: int = FORMAT) -> list:
    """The VM modules that satisfy a compiled module's extern imports on `hal_device`: one per library.

    Every extern is checked against its provider before anything runs, so an op, dtype or attribute
    the library can't take is a DeviceError at load time, not a failure inside a call.
    """
    by_library: dict = {}
    for x in externs:
        parsed = parse_import(x["import"])
        lib = library_of(x, fmt)
        if parsed is None or parsed[0].name != lib or parsed[2] != x["dtype"]:
            raise DeviceError(f"{x['node']}: unknown extern import {x['import']!r} (op {x['op']}); "
                              f"the module was built by another rocmc version: recompile it")
        provider = provider_for(device_name, hal_device, lib)
        reason = provider.unsupported(parsed[1].op, x["dtype"], x.get("attrs", {}))
        if reason:
            raise DeviceError(f"{x['node']} ({x['op']}, {x['dtype']}): {provider.library} on {device_name!r} "
                              f"can't run it: {reason}; recompile with impl={{'{x['op']}': 'generated'}}")
        by_library.setdefault(lib, (provider, set()))[1].add(x["import"])
    return [provider.vm_module(sorted(names)) for provider, names in by_library.values()]
