"""Loading and calling compiled modules."""
from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np

from .. import symbolic
from ..artifact import Artifact
from ..errors import ArtifactError, DeviceError, InputError
from ..signature import bind, np_dtype as _np_dtype
from .devices import get_device, kind_of


class Module:
    """A compiled graph loaded on a device; call it with numpy arrays (or device arrays)."""

    def __init__(self, artifact: Artifact, device: str | None = None):
        from iree import runtime as rt
        self.artifact = artifact
        meta = artifact.metadata
        target_kind = meta["target"].split(":")[0]
        if device is None:
            device = {"cpu": "local-task", "rocm": "hip", "cuda": "cuda"}[target_kind]
        try:
            dev_kind = kind_of(device)
        except KeyError:
            raise DeviceError(f"unknown device {device!r}; expected local-task, local-sync, hip or cuda") from None
        if dev_kind != target_kind:
            raise DeviceError(f"artifact was compiled for {meta['target']} but device {device!r} runs "
                              f"{dev_kind} code; recompile with the matching target or pick another device")
        self.device_name = device
        self.device = get_device(device)
        self._sig = meta["signature"]
        self._constraints = _constraints(meta.get("constraints", []))
        self._long = _long_form(meta.get("long_form"))
        self._lock = threading.Lock()
        self._ctx = rt.SystemContext(config=rt.Config(device=self.device))
        self._providers = []
        if meta.get("externs"):
            from .providers import modules_for
            self._providers = modules_for(meta["externs"], self.device, device, self._ctx.instance)
            for m in self._providers:
                self._ctx.add_vm_module(m)
        try:
            self._vm_module = _vm_module(self._ctx.instance, artifact)
            self._ctx.add_vm_module(self._vm_module)
        except Exception as e:
            raise DeviceError(f"could not load the module on {device!r}: {e}") from None
        self._fn = self._ctx.modules.module["main"]
        # A second function for inputs whose attention scores would not fit (lowering/module.py).
        self._fn_long = self._ctx.modules.module[self._long["function"]] if self._long else None

    @property
    def signature(self) -> dict:
        return self._sig

    def __repr__(self) -> str:
        ins = ", ".join(f"{i['name']}:{i['dtype']}[{','.join(map(str, i['shape']))}]" for i in self._sig["inputs"])
        return f"<rocmc.Module {self.artifact.metadata.get('graph')}({ins}) on {self.device_name}>"

    def _validate(self, args, kwargs) -> tuple[list, dict]:
        """The inputs as the module takes them, and the size of each symbolic dim."""
        from iree import runtime as rt
        values, sizes = bind(self._sig["inputs"], args, kwargs, self._constraints,
                             arrays=(np.ndarray, rt.DeviceArray))
        out = []
        for v in values:
            if isinstance(v, np.ndarray):
                v = np.asarray(v, order="C")
                if v.dtype == np.bool_:
                    v = v.view(np.int8)
                elif v.dtype.name == "bfloat16":
                    v = self._bf16_view(v)
            out.append(v)
        return out, sizes

    def _bf16_view(self, v: np.ndarray):
        """A device array with IREE's bf16 element type (numpy's asarray path maps it to a raw 16-bit type)."""
        from iree import runtime as rt
        bv = self.device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=self.device,
            buffer=v.view(np.uint16), element_type=rt.HalElementType.BFLOAT_16)
        return rt.DeviceArray(self.device, bv, override_dtype=v.dtype)

    def __call__(self, *args, **kwargs):
        """Run the module on inputs given by position or by name.

        output="numpy" (the default) copies results to host; "device" keeps them on the device. An
        array passed as `output=` is the graph input of that name, not this option.
        """
        from iree import runtime as rt
        output = "numpy"
        if "output" in kwargs and not isinstance(kwargs["output"], (np.ndarray, rt.DeviceArray)):
            output = kwargs.pop("output")
        if output not in ("numpy", "device"):
            raise InputError(f"output={output!r}: expected 'numpy' or 'device'")
        if self._ctx is None:
            raise DeviceError("module was closed; load the artifact again to call it")
        inputs, sizes = self._validate(args, kwargs)
        fn = self._fn_long if self._long and self._too_long(sizes) else self._fn
        with self._lock:
            try:
                results = fn(*inputs)
            except RuntimeError as e:
                raise _call_error(e, self.device_name) from None
        if not isinstance(results, (tuple, list)):
            results = (results,)
        outs = []
        for spec, r in zip(self._sig["outputs"], results):
            if output == "numpy":
                a = r.to_host() if hasattr(r, "to_host") else np.asarray(r)
                if spec["dtype"] == "bool":
                    a = a.view(np.bool_)
                elif spec["dtype"] == "bf16":
                    a = a.view(_np_dtype("bf16"))
                outs.append(a)
            else:
                outs.append(r)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _too_long(self, sizes: dict) -> bool:
        """Whether some attention's b * hq * s * skv, at these sizes, exceeds the decomposition's limit."""
        for term in self._long["scores"]:
            n = 1
            for d in term:
                n *= d.evaluate(sizes)
            if n > self._long["limit"]:
                return True
        return False

    def close(self) -> None:
        """Free runtime objects now (they are also freed when the module is collected); calls after
        this raise DeviceError."""
        self._fn = self._fn_long = None
        self._vm_module = None
        self._ctx = None
        self._providers = []


def _long_form(meta) -> dict | None:
    """The metadata's `long_form` with each score term's sizes parsed (they are evaluated per call)."""
    if meta is None:
        return None
    ok = (isinstance(meta, dict) and isinstance(meta.get("function"), str) and isinstance(meta.get("limit"), int)
          and isinstance(meta.get("scores"), list) and all(isinstance(t, list) for t in meta["scores"]))
    if not ok:
        raise ArtifactError(f"metadata long_form {meta!r}: expected {{function, scores: [[sizes]], limit: int}}")
    scores = [[symbolic.parse(d, ArtifactError) for d in term] for term in meta["scores"]]
    return {"function": meta["function"], "scores": scores, "limit": meta["limit"]}


def _constraints(meta) -> list:
    """The metadata's constraints on input sizes, parsed (they are checked per call)."""
    if not isinstance(meta, list):
        raise ArtifactError(f"metadata constraints {meta!r}: expected a list")
    return [symbolic.Constraint.from_json(c, ArtifactError) for c in meta]


# What a failed assert of the module (lowering/module.py) says: "... rocmc check: <fact>; ..."
_CHECK = re.compile(r"rocmc check: ([^;]*)")


def _call_error(e: RuntimeError, device: str) -> Exception:
    """A typed error for a call IREE failed: the module's own input check, or the device."""
    m = _CHECK.search(str(e))
    if m:
        return InputError(f"the module rejected the call: {m.group(1).strip()}")
    return DeviceError(f"the call failed on {device!r}: {e}")


def _vm_module(instance, artifact: Artifact):
    """Map the module's file when there is one and its bytes were never read (no copy of the weights):
    an Artifact of the compile cache, which verified the file. Copy the bytes otherwise: those of a
    loaded file are the ones `Artifact.load` verified, so the file can't change in between."""
    from iree import runtime as rt
    if getattr(artifact, "_vmfb", None) is None and artifact.path:
        return rt.VmModule.mmap(instance, str(artifact.path))
    return rt.VmModule.copy_buffer(instance, artifact.vmfb)


def load(artifact, device: str | None = None, *, verify: bool = True) -> Module:
    """Load an Artifact, a .vmfb path or .vmfb bytes on a device (default: the one the artifact's target
    runs on). A file or bytes are checked first (see `Artifact.load`); verify=False skips their integrity
    check, for a file you trust that has none."""
    if isinstance(artifact, (str, Path)):
        artifact = Artifact.load(artifact, verify=verify)
    elif isinstance(artifact, (bytes, bytearray)):
        artifact = Artifact.from_bytes(bytes(artifact), "bytes", verify=verify)
    elif not isinstance(artifact, Artifact):
        raise InputError(f"load: expected an Artifact or a .vmfb path, got {type(artifact).__name__}")
    return Module(artifact, device)
