"""Providers of the extern-call imports (`<library>.<op>`) a compiled module may call.

Each library role of rocmc.externs has a provider per device kind (PROVIDERS): the float64 reference
(numpy) on local CPU devices for `dnn` and `blas` (and rocmc's process group for the CPU's
`collectives` calls); on hip devices MIOpen for `dnn` calls and hipBLASLt for `blas` calls; on cuda
devices cuDNN and cuBLASLt. A device has one provider per role it is asked for; which vendor serves a
call is a load-time choice, so a module compiled for a GPU target never needs recompiling to change
vendors' binding code. A module of artifact format 2 or earlier imports the old namespaces `miopen`
and `hipblaslt`; the providers of `dnn` and `blas` serve them (rocmc.aliases).
"""

from __future__ import annotations

import importlib
import threading

from ...aliases import ALIASES, CURRENT_NAMES_FORMAT, current
from ...archs import DRIVERS
from ...errors import DeviceError
from ...artifact import FORMAT
from ...externs import LIBRARIES, parse_import
from .base import Provider

_REFERENCE = ("reference", "ReferenceProvider")
# role -> device kind -> (module, class) of its provider there, imported only when used
PROVIDERS = {
    "dnn": {"cpu": _REFERENCE, "rocm": ("miopen", "MiopenProvider"), "cuda": ("cudnn", "CudnnProvider")},
    "blas": {"cpu": _REFERENCE, "rocm": ("blas", "HipblasLtProvider"), "cuda": ("blas", "CublasLtProvider")},
    "collectives": {"cpu": ("collectives", "HostCollectivesProvider")},
}
# (role, device base name) -> (module, class): PROVIDERS over each kind's device names
_PROVIDERS = {
    (role, device): where
    for role, kinds in PROVIDERS.items()
    for kind, where in kinds.items()
    for device in DRIVERS[kind]
}
# The import namespaces of modules made before format 3 -> the role serving them
_OLD_NAMESPACES = {old: new for old, new in ALIASES.items() if new in LIBRARIES}

_providers: dict = {}
_lock = threading.Lock()


def provider_for(device_name: str, hal_device, library: str = "dnn") -> Provider:
    """The provider of `library` on a device, one per (device, library): every module loaded there
    shares its library handle, stream, workspace and algorithm-search cache."""
    base = device_name.split(":")[0]
    if (library, base) not in _PROVIDERS:
        known = sorted({d for _, d in _PROVIDERS})
        raise DeviceError(
            f"no {library} provider for device {device_name!r}; devices with extern-call providers: {', '.join(known)}"
        )
    key = (device_name, id(hal_device), library)
    with _lock:
        if key not in _providers:
            mod, cls = _PROVIDERS[(library, base)]
            made = getattr(importlib.import_module(f"{__name__}.{mod}"), cls)(hal_device, device_name)
            made.abi = LIBRARIES[library]
            made._hal_device_ref = hal_device  # the id in the key stays this device's
            _providers[key] = made
        return _providers[key]


def library_of(entry: dict, fmt: int) -> str:
    """The library role an extern entry of the metadata calls (format 1 modules called the DNN
    library only; formats 1 and 2 name the roles by their old names)."""
    return current(entry.get("library", "dnn")) if fmt >= 2 else "dnn"


def modules_for(externs: list, hal_device, device_name: str, vm_instance, fmt: int = FORMAT) -> list:
    """The VM modules that satisfy a compiled module's extern imports on `hal_device`: one per import namespace.

    Every extern is checked against its provider before anything runs, so an op, dtype or attribute
    the library can't take is a DeviceError at load time, not a failure inside a call.
    """
    by_namespace: dict = {}
    namespaces = _OLD_NAMESPACES if fmt < CURRENT_NAMES_FORMAT else None
    for x in externs:
        parsed = parse_import(x["import"], namespaces)
        lib = library_of(x, fmt)
        if parsed is None or parsed[0].name != lib or parsed[2] != x["dtype"]:
            raise DeviceError(
                f"{x['node']}: unknown extern import {x['import']!r} (op {x['op']}); "
                f"the module was built by another rocmc version: recompile it"
            )
        provider = provider_for(device_name, hal_device, lib)
        reason = provider.unsupported(parsed[1].op, x["dtype"], x.get("attrs", {}))
        if reason:
            raise DeviceError(
                f"{x['node']} ({x['op']}, {x['dtype']}): {provider.library} on {device_name!r} "
                f"can't run it: {reason}; recompile with impl={{'{x['op']}': 'generated'}}"
            )
        # one VM module per import namespace, named as the module imports it (an old module's `miopen`)
        namespace = x["import"].split(".")[0]
        by_namespace.setdefault(namespace, (provider, set()))[1].add(x["import"])
    return [provider.vm_module(sorted(names), namespace) for namespace, (provider, names) in by_namespace.items()]
