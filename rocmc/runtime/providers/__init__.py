"""Providers of the extern-call imports (`miopen.<op>`) a compiled module may call.

The provider is chosen by the device the module is loaded on: numpy (reference) on local CPU
devices, cuDNN on cuda devices, MIOpen on hip devices. Every provider implements the one ABI in
abi.py; which library serves the call is a load-time choice, so a module compiled for a GPU target
never needs recompiling to change vendors' binding code.
"""
from __future__ import annotations

import importlib
import threading

from ...errors import DeviceError
from .abi import NAMESPACE, SIGNATURES, import_name
from .base import Provider

# device base name -> (module, class) of its provider, imported only when used
_BY_DEVICE = {"local-task": ("reference", "ReferenceProvider"), "local-sync": ("reference", "ReferenceProvider"),
              "cuda": ("cudnn", "CudnnProvider"), "hip": ("miopen", "MiopenProvider")}


_providers: dict = {}
_lock = threading.Lock()


def provider_for(device_name: str, hal_device) -> Provider:
    """The provider of a device, one per device: every module loaded there shares its library
    handle, stream, workspace and algorithm-search cache."""
    base = device_name.split(":")[0]
    if base not in _BY_DEVICE:
        raise DeviceError(f"no extern-call provider for device {device_name!r}; "
                          f"known: {', '.join(sorted(_BY_DEVICE))}")
    key = (device_name, id(hal_device))
    with _lock:
        if key not in _providers:
            mod, cls = _BY_DEVICE[base]
            _providers[key] = getattr(importlib.import_module(f"{__name__}.{mod}"), cls)(hal_device, device_name)
            _providers[key]._hal_device_ref = hal_device   # the id in the key stays this device's
        return _providers[key]


def modules_for(externs: list, hal_device, device_name: str, vm_instance) -> list:
    """The VM modules that satisfy a compiled module's extern imports on `hal_device`.

    Every extern is checked against the provider before anything runs, so an op, dtype or attribute
    the library can't take is a DeviceError at load time, not a failure inside a call.
    """
    provider = provider_for(device_name, hal_device)
    for x in externs:
        ns, _, name = x["import"].partition(".")
        if ns != NAMESPACE or x["op"] not in SIGNATURES or name != import_name(x["op"], x["dtype"]):
            raise DeviceError(f"{x['node']}: unknown extern import {x['import']!r} (op {x['op']}); "
                              f"the module was built by another rocmc version: recompile it")
        reason = provider.unsupported(x["op"], x["dtype"], x.get("attrs", {}))
        if reason:
            raise DeviceError(f"{x['node']} ({x['op']}, {x['dtype']}): {provider.library} on {device_name!r} "
                              f"can't run it: {reason}; recompile with impl={{'{x['op']}': 'generated'}}")
    return [provider.vm_module(sorted({x["import"] for x in externs}))]
