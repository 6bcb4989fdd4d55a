"""Loading and calling compiled modules."""
from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np

from ..artifact import Artifact
from ..errors import DeviceError, InputError
from .devices import get_device, kind_of

_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "i32": np.dtype(np.int32),
           "i64": np.dtype(np.int64), "bool": np.dtype(np.bool_)}


def _np_dtype(name: str) -> np.dtype:
    if name == "bf16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return _DTYPES[name]


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
        self._long = meta.get("long_form")
        self._fn_long = self._ctx.modules.module[self._long["function"]] if self._long else None

    @property
    def signature(self) -> dict:
        return self._sig

    def __repr__(self) -> str:
        ins = ", ".join(f"{i['name']}:{i['dtype']}[{','.join(map(str, i['shape']))}]" for i in self._sig["inputs"])
        return f"<rocmc.Module {self.artifact.metadata.get('graph')}({ins}) on {self.device_name}>"

    def _validate(self, args, kwargs) -> tuple[list, dict]:
        """The inputs as the module takes them, and the size of each symbolic dim."""
        specs = self._sig["inputs"]
        names = [s["name"] for s in specs]
        if len(args) > len(specs):
            raise InputError(f"expected {len(specs)} input(s) ({', '.join(names)}), got {len(args)}")
        values = list(args) + [None] * (len(specs) - len(args))
        for k, v in kwargs.items():
            if k not in names:
                raise InputError(f"unknown input {k!r}; inputs are {', '.join(names)}")
            i = names.index(k)
            if values[i] is not None:
                raise InputError(f"input {k!r} given twice")
            values[i] = v
        missing = [n for n, v in zip(names, values) if v is None]
        if missing:
            raise InputError(f"missing input(s) {', '.join(missing)}; expected {len(specs)}: {', '.join(names)}")
        symbols: dict = {}
        out = []
        from iree import runtime as rt
        for spec, v in zip(specs, values):
            name = spec["name"]
            if not isinstance(v, (np.ndarray, rt.DeviceArray)):
                raise InputError(f"input {name!r}: expected a numpy array, got {type(v).__name__}")
            want = _np_dtype(spec["dtype"])
            if v.dtype != want:
                raise InputError(f"input {name!r}: dtype {v.dtype} but the module expects {spec['dtype']} ({want})")
            shape = tuple(v.shape)
            if len(shape) != len(spec["shape"]):
                raise InputError(f"input {name!r}: rank {len(shape)} {list(shape)}, expected rank "
                                 f"{len(spec['shape'])} {spec['shape']}")
            for axis, (got, d) in enumerate(zip(shape, spec["shape"])):
                if isinstance(d, int):
                    if got != d:
                        raise InputError(f"input {name!r}: dim {axis} is {got}, expected {d} (shape {list(shape)} vs {spec['shape']})")
                else:
                    if d in symbols and symbols[d][0] != got:
                        raise InputError(f"input {name!r}: dim {axis} ({d}) is {got}, but {d}={symbols[d][0]} "
                                         f"from input {symbols[d][1]!r}")
                    symbols.setdefault(d, (got, name))
            if isinstance(v, np.ndarray):
                v = np.asarray(v, order="C")
                if v.dtype == np.bool_:
                    v = v.view(np.int8)
                elif v.dtype.name == "bfloat16":
                    v = self._bf16_view(v)
            out.append(v)
        return out, {d: n for d, (n, _) in symbols.items()}

    def _bf16_view(self, v: np.ndarray):
        """A device array with IREE's bf16 element type (numpy's asarray path maps it to a raw 16-bit type)."""
        from iree import runtime as rt
        bv = self.device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=self.device,
            buffer=v.view(np.uint16), element_type=rt.HalElementType.BFLOAT_16)
        return rt.DeviceArray(self.device, bv, override_dtype=v.dtype)

    def __call__(self, *args, output: str = "numpy", **kwargs):
        """Run the module. output="numpy" copies results to host; "device" keeps them on the device."""
        if output not in ("numpy", "device"):
            raise InputError(f"output={output!r}: expected 'numpy' or 'device'")
        inputs, sizes = self._validate(args, kwargs)
        fn = self._fn_long if self._long and self._too_long(sizes) else self._fn
        with self._lock:
            results = fn(*inputs)
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

    def _too_long(self, symbols: dict) -> bool:
        """Whether some attention's b * hq * s * skv, at these sizes, exceeds the decomposition's limit."""
        limit = self._long["limit"]
        for term in self._long["scores"]:
            n = 1
            for d in term:
                n *= d if isinstance(d, int) else _size_of(d, symbols)
            if n > limit:
                return True
        return False

    def close(self) -> None:
        """Free runtime objects now (they are also freed when the module is collected)."""
        self._fn = None
        self._vm_module = None
        self._ctx = None
        self._providers = []


_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _size_of(expr: str, symbols: dict) -> int:
    """A symbolic dim's size: a symbol, or an arithmetic expression of symbols (from reshapes)."""
    text = _SYMBOL.sub(lambda m: str(symbols.get(m.group(0), 0)), expr)
    if not re.fullmatch(r"[0-9+\-*/() ]*", text):
        return 0
    try:
        return int(eval(text, {"__builtins__": {}}))   # digits and + - * / ( ) only, checked above
    except (SyntaxError, ZeroDivisionError, ValueError):
        return 0


def _vm_module(instance, artifact: Artifact):
    """Map the module's file when there is one and its bytes were never read (no copy of the weights);
    copy the bytes otherwise."""
    from iree import runtime as rt
    if getattr(artifact, "_vmfb", None) is None and artifact.path:
        return rt.VmModule.mmap(instance, str(artifact.path))
    return rt.VmModule.copy_buffer(instance, artifact.vmfb)


def load(artifact, device: str | None = None) -> Module:
    """Load an Artifact or a .vmfb path on a device (default: the one the artifact's target runs on)."""
    if isinstance(artifact, (str, Path)):
        artifact = Artifact.load(artifact)
    elif isinstance(artifact, (bytes, bytearray)):
        from ..artifact import read_metadata
        artifact = Artifact(bytes(artifact), read_metadata(bytes(artifact)))
    elif not isinstance(artifact, Artifact):
        raise InputError(f"load: expected an Artifact or a .vmfb path, got {type(artifact).__name__}")
    return Module(artifact, device)
