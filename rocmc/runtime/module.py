"""Loading and calling compiled modules."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np

from .. import symbolic
from ..arrays import is_tensor
from ..archs import DEVICES, default_device, kind_of
from ..artifact import PARAMETER_SCOPE, STATE_BUFFERS, Artifact, functions
from ..errors import ArtifactError, DeviceError, InputError
from ..dtypes import ALL as DTYPES, DType, unpack_nibbles
from ..progress import format_bytes, step
from ..signature import bind
from .devices import bind_thread, get_device, host_buffer, read_back, upload


class _Entry:
    """One function of the module as the runtime calls it: its signature, the constraints on its sizes,
    and its long form (when attention scores may not fit the short one)."""

    def __init__(self, ctx, info: dict):
        self.name = info["name"]
        self.sig = info["signature"]
        self.constraints = _constraints(info.get("constraints", []))
        self.long = _long_form(info.get("long_form"))
        self.fn = ctx.modules.module[self.name]
        self.fn_long = ctx.modules.module[self.long["function"]] if self.long else None
        # The stream-ordered form (IREE's coarse-fences ABI), called through the VM directly: Module.submit.
        self.fn_async = ctx.modules.module[info["asynchronous"]].vm_function if "asynchronous" in info else None
        # Held states (lowering/entry_points.py): the states the function takes after its inputs
        # (None: the module holds its states) and those it assigns (trailing results of the synchronous form).
        self.states = info.get("held_states")
        self.assigns = info.get("assigned_states", [])
        # Of those, the ones whose new value goes to another buffer (not written in place): `$async` takes it.
        self.moved = [n for n in self.assigns if n not in info.get("states_in_place", [])]
        # The stream-ordered form takes its results' buffers and its transient storage from the caller.
        self.transients = None
        if self.fn_async is not None and info.get("async_storage") == "caller":
            size = self.fn_async.reflection.get("iree.abi.transients.size.constant")
            if size is None or not str(size).isdigit():
                raise ArtifactError(
                    f"{info['asynchronous']}: the module names no constant transient storage size for it "
                    f"(iree.abi.transients.size.constant: {size!r})"
                )
            self.transients = int(size)


class Module:
    """A compiled graph loaded on a device; call it with numpy arrays (or device arrays). A module of
    several functions is called by function name: `mod.decode(...)` or `mod.call("decode", ...)`."""

    def __init__(self, artifact: Artifact, device: str | None = None, parameters=None):
        from iree import runtime as rt

        self.artifact = artifact
        meta = artifact.metadata
        device = device_for(meta["target"], device)
        # A tensor-parallel rank's program: join the run's group before the device opens, so that IREE's
        # collective channel spans the ranks; each rank takes its own GPU (distributed.prepare).
        self.world_size = int(meta.get("world_size", 1))
        self.rank = 0
        if self.world_size > 1:
            from . import distributed

            group, device = distributed.prepare(self.world_size, meta["target"].split(":")[0], device)
            self.rank = group.rank
        self.device_name = device
        self.device = get_device(device)
        self._lock = threading.Lock()
        self._timeline = None  # the semaphore that orders submissions (Module.submit), made on first use
        self._submitted = 0  # the value the last submission signals
        self._in_flight = []  # (timeline value, buffers the caller gave a submission), until it has run
        # IREE 3.13's CUDA device runs all queue work on one stream, in the order it was issued (measured: steps
        # issued without waits ran in order, BENCHMARKS.md). Its HIP device orders its queue on the device itself
        # and has not run here: it keeps the waits and IREE's transfers.
        self._in_order = kind_of(device) == "cuda"
        # Parameters are found and checked (names, shapes, dtypes) before anything reaches the device.
        self._parameters, specs, self.parameter_notes = _parameters_for(artifact, parameters)
        self._ctx = rt.SystemContext(config=rt.Config(device=self.device))
        self._providers = []
        if meta.get("externs"):
            from .providers import modules_for

            self._providers = modules_for(
                meta["externs"], self.device, device, self._ctx.instance, meta.get("format", 1)
            )
            for m in self._providers:
                self._ctx.add_vm_module(m)
        weights = f" with {len(specs)} parameters ({format_bytes(sum(s.nbytes for s in specs))})" if specs else ""
        with step(f"loading {meta.get('graph', 'the module')} on {device}{weights}", logger=__name__):
            try:
                if self._parameters is not None:
                    self._providers.append(
                        self._parameters.provider(self._ctx.instance, scope=PARAMETER_SCOPE, specs=specs)
                    )
                    self._ctx.add_vm_module(self._providers[-1])
                self._vm_module = _vm_module(self._ctx.instance, artifact)
                self._ctx.add_vm_module(self._vm_module)
            except Exception as e:  # noqa: BLE001
                hopper = any(k.get("arch") == "sm_90a" for k in meta.get("kernels", []))
                hint = (
                    " (its hand-written kernels are sm_90a code, Hopper's instructions: it loads on an sm_90 GPU, "
                    "such as an H100 or H200; compile for cuda:sm_80 for other NVIDIA GPUs)"
                    if hopper
                    else ""
                )
                raise DeviceError(f"could not load the module on {device!r}: {e}{hint}") from None
        # Each function, with a second one for inputs whose attention scores would not fit (lowering/module.py).
        self._entries = {f["name"]: _Entry(self._ctx, f) for f in functions(meta)}
        self._default = next(iter(self._entries.values()))
        # States the module's functions take from their caller: this module holds them, zeros at load.
        self._states = {}
        if any(e.states is not None for e in self._entries.values()):
            try:
                make = self._ctx.modules.module[STATE_BUFFERS]
            except (KeyError, AttributeError):
                raise ArtifactError(
                    f"the module takes its states from its caller but lacks {STATE_BUFFERS!r}"
                ) from None
            made = make()
            made = made if isinstance(made, (tuple, list)) else (made,)
            specs = meta.get("states", [])
            if len(made) != len(specs):  # (each function's states are checked against these at load: schema.py)
                raise ArtifactError(f"{STATE_BUFFERS!r} makes {len(made)} buffers for {len(specs)} states")
            self._state_specs = {s["name"]: s for s in specs}
            self._states = {s["name"]: v._buffer_view for s, v in zip(specs, made)}

    @property
    def signature(self) -> dict:
        """The signature of the module's first (or only) function."""
        return self._default.sig

    @property
    def functions(self) -> list[str]:
        return list(self._entries)

    def __repr__(self) -> str:
        def one(e):
            ins = ", ".join(f"{i['name']}:{i['dtype']}[{','.join(map(str, i['shape']))}]" for i in e.sig["inputs"])
            return f"{e.name}({ins})"

        return f"<rocmc.Module {'; '.join(one(e) for e in self._entries.values())} on {self.device_name}>"

    def __getattr__(self, name: str):
        entries = self.__dict__.get("_entries", {})
        if name in entries:
            return lambda *args, **kwargs: self._call(entries[name], args, kwargs)
        raise AttributeError(
            f"rocmc.Module has no attribute or function {name!r}"
            + (f"; its functions are {', '.join(entries)}" if entries else "")
        )

    def call(self, function: str, *args, **kwargs):
        """Call the module's function of that name (see __call__ for the arguments)."""
        return self._call(self._entry("call", function), args, kwargs)

    def _entry(self, verb: str, function: str) -> _Entry:
        """The function of that name, for `verb` (call, submit); DeviceError once the module is closed."""
        if self._ctx is None:
            raise DeviceError("module was closed; load the artifact again to call it")
        if function not in self._entries:
            raise InputError(
                f"{verb}({function!r}): the module has no such function; it has {', '.join(self._entries)}"
            )
        return self._entries[function]

    def _validate(self, entry: _Entry, args, kwargs) -> tuple[list, dict]:
        """The inputs as the module takes them, and the size of each symbolic dim. Inputs are numpy
        arrays, the module's device arrays, or CPU torch tensors (bind reads those as numpy arrays sharing
        their memory; a copy only where the module needs a contiguous array)."""
        from iree import runtime as rt

        values, sizes = bind(entry.sig["inputs"], args, kwargs, entry.constraints, arrays=(np.ndarray, rt.DeviceArray))
        out = []
        for spec, v in zip(entry.sig["inputs"], values):
            if isinstance(v, np.ndarray):
                v = self._as_module_takes(np.asarray(v, order="C"), DTYPES[spec["dtype"]])
            out.append(v)
        return out, sizes

    def _as_module_takes(self, v: np.ndarray, d: DType):
        """A host array in the numpy type of the module's boundary (DType.abi_np), or, for a type
        numpy's path into IREE lacks (DType.raw: bf16), a device array of its bits tagged with IREE's
        element type."""
        if not d.passed_as_bits:
            return v if v.dtype == d.abi_np else v.view(d.abi_np)
        from iree import runtime as rt

        view = upload(self.device, v, d, d.hal_element_type())
        return rt.DeviceArray(self.device, view, override_dtype=np.dtype(np.int8) if d.packed else d.np)

    def __call__(self, *args, **kwargs):
        """Run the module's (first) function on inputs given by position or by name.

        output="numpy" (the default) copies results to host arrays of the caller's own, which no later
        call changes; "device" keeps them on the device as IREE DeviceArrays. A DeviceArray's
        `.to_host()` may be a view of its buffer (on the CPU), valid only while that DeviceArray lives:
        `host_copy(result, dtype)` (or `np.array(result.to_host())`) keeps the values. An array passed as
        `output=` is the graph input of that name, not this option.
        """
        if self._ctx is None:
            raise DeviceError("module was closed; load the artifact again to call it")
        return self._call(self._default, args, kwargs)

    def _call(self, entry: _Entry, args, kwargs):
        from iree import runtime as rt

        kwargs = dict(kwargs)
        output = "numpy"
        if "output" in kwargs and not (
            isinstance(kwargs["output"], (np.ndarray, rt.DeviceArray)) or is_tensor(kwargs["output"])
        ):
            output = kwargs.pop("output")
        if output not in ("numpy", "device"):
            raise InputError(f"output={output!r}: expected 'numpy' or 'device'")
        if self._ctx is None:
            raise DeviceError("module was closed; load the artifact again to call it")
        bind_thread(self.device_name)  # a GPU module may be called from any thread
        inputs, sizes = self._validate(entry, args, kwargs)
        fn = entry.fn_long if entry.long and _too_long(entry.long, sizes) else entry.fn
        states = [rt.DeviceArray(self.device, self._states[n]) for n in entry.states or []]
        with self._lock:
            self._drain()  # a call is ordered after every submission before it
            try:
                results = fn(*inputs, *states)
            except RuntimeError as e:
                raise _call_error(e, self.device_name) from None
        if not isinstance(results, (tuple, list)):
            results = (results,)
        if entry.assigns:  # the states' buffers after the call (the same ones where written in place)
            n = len(results) - len(entry.assigns)
            self._states.update((name, r._buffer_view) for name, r in zip(entry.assigns, results[n:]))
            results = results[:n]
        outs = []
        if not entry.sig["outputs"]:
            return None
        for spec, r in zip(entry.sig["outputs"], results):
            outs.append(host_copy(r, DTYPES[spec["dtype"]], spec["shape"]) if output == "numpy" else r)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def submit(self, function: str, *args, **kwargs) -> "Submission":
        """Issue a call of `function` and return at once, before the device has run it: the next call can be
        prepared and issued while this one runs (a decode loop issues step n+1 while the GPU runs step n).

        Inputs are those of `call`; among them the outputs of earlier submissions (`Submission.outputs`),
        which need not be ready. Every submission runs on the device after the submissions (and calls) of
        this module before it, in the order issued. `Submission.result()` waits for it and returns its
        results as `call` does. The function must have been compiled with `asynchronous=` naming it."""
        from iree import runtime as rt

        entry = self._entry("submit", function)
        if entry.fn_async is None:
            raise InputError(
                f"submit({function!r}): the function was compiled without its stream-ordered form; compile "
                f"with asynchronous=[{function!r}] (or True), or use call()"
            )
        bind_thread(self.device_name)
        inputs, sizes = self._validate(entry, args, kwargs)
        if entry.long and _too_long(entry.long, sizes):  # the long form has no stream-ordered twin
            return Submission.done(self, entry, self._call(entry, inputs, {"output": "device"}))
        views = [
            v._buffer_view if isinstance(v, rt.DeviceArray) else self._view(v, spec)
            for v, spec in zip(inputs, entry.sig["inputs"])
        ]
        with self._lock:
            if self._timeline is None:
                self._timeline = self.device.create_semaphore(0)
            if not self._overlaps(entry):
                self._drain()
            # Each submission waits on the one before it and signals the next value of the module's timeline.
            # A device whose queue runs its work in the order issued needs no wait on the submission before: a wait
            # there would hold this one on the host until the one before is done (IREE's CUDA HAL waits on its
            # semaphores on the host), and the GPU would idle while this one's work is issued.
            ordered = self._submitted == 0 or self._in_order
            wait = rt.HalFence(0) if ordered else rt.HalFence.create_at(self._timeline, self._submitted)
            signal = rt.HalFence.create_at(self._timeline, self._submitted + 1)
            views += [self._states[n] for n in entry.states or []]
            moved = [
                _view_of(_allocate(self.device, _nbytes(self._state_specs[n])), self._state_specs[n])
                for n in entry.moved
            ]
            views += moved
            given = []  # the results' buffers, when the caller gives them (then the transient storage too)
            if entry.transients is not None:
                given = [self._result_view(spec) for spec in entry.sig["outputs"]]
                views += given
            args_list = rt.VmVariantList(len(views) + 3)
            for v in views:
                args_list.push_ref(v)
            transients = None
            if entry.transients is not None:
                transients = _allocate(self.device, max(entry.transients, 1))
                args_list.push_ref(transients)
            # The buffers the call reads and writes stay allocated until the device has run it (IREE's allocator
            # could otherwise hand one to another allocation, an upload say, while the call still uses it).
            done = self._timeline.query()
            self._in_flight = [(n, kept) for n, kept in self._in_flight if n > done]
            self._in_flight.append((self._submitted + 1, (views, transients)))
            args_list.push_ref(wait)
            args_list.push_ref(signal)
            rets = rt.VmVariantList(len(entry.sig["outputs"]))
            try:
                self._ctx.vm_context.invoke(entry.fn_async, args_list, rets)
            except RuntimeError as e:
                raise _call_error(e, self.device_name) from None
            self._submitted += 1
            self._states.update(zip(entry.moved, moved))  # later calls read the states' new buffers
        # As IREE's own call path returns them (host_copy reads them as the signature's dtypes).
        results = given or [rets.get_as_object(i, rt.HalBufferView) for i in range(len(entry.sig["outputs"]))]
        outputs = [rt.DeviceArray(self.device, v, implicit_host_transfer=True) for v in results]
        return Submission(self, entry, outputs, self._submitted)

    def _result_view(self, spec: dict):
        """The buffer a submission writes one of its results into: for a small result (a step's tokens), memory of
        the host that the device writes, so the host reads it once the submission is done, without a copy on
        the device's queue (which would wait behind the submissions issued after it); device memory otherwise."""
        n = _nbytes(spec)
        buffer = self._host_buffer(n) if n <= HOST_RESULT_MAX and self._in_order else None
        return _view_of(buffer if buffer is not None else _allocate(self.device, n), spec)

    def can_submit(self, function: str) -> bool:
        """Whether `function` has its stream-ordered form (compiled with `asynchronous=`), so `submit` takes it."""
        entry = self._entries.get(function)
        return entry is not None and entry.fn_async is not None

    def on_device(self, function: str, **inputs) -> dict:
        """Some inputs of `function`, by name, uploaded once as device arrays, to pass to many calls or
        submissions (settings that stay the same every step, say) without a copy each time. Each must have the
        input's dtype and its static sizes."""
        from iree import runtime as rt

        entry = self._entry("on_device", function)
        specs = {spec["name"]: spec for spec in entry.sig["inputs"]}
        out = {}
        for name, v in inputs.items():
            if name not in specs:
                raise InputError(
                    f"on_device({function!r}): {function} has no input {name!r} (it takes {', '.join(specs)})"
                )
            spec, v = specs[name], np.asarray(v)
            d = DTYPES[spec["dtype"]]
            shape = spec["shape"]
            if (
                v.dtype != d.np
                or v.ndim != len(shape)
                or any(isinstance(s, int) and s != n for s, n in zip(shape, v.shape))
            ):
                raise InputError(
                    f"on_device({function!r}): input {name!r} is {v.dtype}{list(v.shape)}; "
                    f"{function} takes {spec['dtype']}{list(shape)}"
                )
            view = self._view(np.ascontiguousarray(self._as_module_takes(v, d)) if not d.passed_as_bits else v, spec)
            out[name] = rt.DeviceArray(self.device, view, implicit_host_transfer=True)
        return out

    def _view(self, v: np.ndarray, spec: dict):
        """A host input of a submission as a device buffer view of the module's boundary type. A small one (a step's
        positions) is written into host memory the device reads: IREE's upload is a copy on the device's queue
        that waits behind the submissions still running there."""
        d = DTYPES[spec["dtype"]]
        element = _element_type(v.dtype) if not d.passed_as_bits else d.hal_element_type()
        if self._in_order and not d.passed_as_bits and 0 < v.nbytes <= HOST_RESULT_MAX:
            buffer = self._host_buffer(v.nbytes)
            if buffer is not None:
                buffer.map().asarray(v.shape, v.dtype)[...] = v
                return _buffer_view(buffer, v.shape, element)
        view = upload(self.device, v, d, element)
        # IREE's upload gives a scalar the shape [1]
        return _buffer_view(view.get_buffer(), [], element) if v.ndim == 0 else view

    def _host_buffer(self, nbytes: int):
        """Host memory the device reads and writes, mapped on the host (None where the device has none)."""
        from iree import runtime as rt

        try:
            return host_buffer(self.device, nbytes, rt.BufferUsage.DEFAULT)
        except RuntimeError:
            return None

    def _overlaps(self, entry: _Entry) -> bool:
        """Whether a submission of `entry` may be issued while earlier ones still run. IREE records the
        command buffer of a function with symbolic sizes at the call, with its input buffers as they are then:
        an earlier submission's output whose allocation is still queued is refused there ("transient buffer
        has not been committed"); a function of static sizes replays a command buffer recorded once, its
        buffers bound when it runs. On the CPU the host is the device: a submission waits for the ones before."""
        if kind_of(self.device_name) == "cpu":
            return False
        return all(isinstance(d, int) for spec in entry.sig["inputs"] for d in spec["shape"])

    def _drain(self) -> None:
        """Wait (the lock held) until every submission has run: a synchronous call is not ordered after them
        by the device."""
        if self._submitted and self._timeline.query() < self._submitted:
            self._timeline.wait(self._submitted)

    def close(self) -> None:
        """Free runtime objects now (they are also freed when the module is collected); calls after
        this raise DeviceError."""
        self._entries = {}
        self._default = None
        self._vm_module = None
        self._ctx = None
        self._providers = []


class Submission:
    """A call issued by `Module.submit`: `outputs` are its results as device arrays, to pass to later
    submissions (not to read before `wait`); `result()` waits and returns them as `Module.call` does."""

    def __init__(self, module: Module, entry: _Entry, outputs: list, value: int | None):
        self.module, self.function, self.outputs = module, entry.name, outputs
        self._entry, self._value = entry, value  # the module timeline's value it signals (None: run already)

    @classmethod
    def done(cls, module: Module, entry: _Entry, results) -> "Submission":
        """A submission run synchronously (its results are ready)."""
        results = results if isinstance(results, tuple) else () if results is None else (results,)
        return cls(module, entry, list(results), None)

    @property
    def ready(self) -> bool:
        """Whether the device has run it (never blocks)."""
        return self._value is None or self.module._timeline.query() >= self._value

    def wait(self) -> None:
        """Block until the device has run it; DeviceError if the device failed it."""
        if self._value is None:
            return
        try:
            self.module._timeline.wait(self._value)
        except RuntimeError as e:
            raise _call_error(e, self.module.device_name) from None
        self._value = None

    def output(self, index: int, output: str = "numpy"):
        """Wait, then its result `index` alone (output="numpy" or "device")."""
        if output not in ("numpy", "device"):
            raise InputError(f"output(output={output!r}): expected 'numpy' or 'device'")
        self.wait()
        r = self.outputs[index]
        spec = self._entry.sig["outputs"][index]
        return host_copy(r, DTYPES[spec["dtype"]], spec["shape"]) if output == "numpy" else r

    def result(self, output: str = "numpy"):
        """Wait, then its results as `Module.call` returns them (output="numpy" or "device")."""
        if output not in ("numpy", "device"):
            raise InputError(f"result(output={output!r}): expected 'numpy' or 'device'")
        outs = [self.output(i, output) for i in range(len(self.outputs))]
        return None if not outs else outs[0] if len(outs) == 1 else tuple(outs)

    def __repr__(self) -> str:
        return f"<rocmc.Submission {self.function} {'ready' if self.ready else 'queued'}>"


# Results of a submission up to this size go to host memory the device writes (Module._result_view).
HOST_RESULT_MAX = 64 << 10


def _allocate(device, nbytes: int):
    """A new buffer of device memory (not initialised)."""
    from iree import runtime as rt

    return device.allocator.allocate_buffer(
        memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, allocation_size=nbytes
    )


def _view_of(buffer, spec: dict):
    """`buffer` as a view of the static tensor `spec` ({dtype, shape}) in the storage IREE's ABI gives it (bools
    as i8)."""
    from iree import runtime as rt

    d = DTYPES[spec["dtype"]]
    if d.packed:  # 4-bit values cross as their bytes, two a byte
        return _buffer_view(buffer, d.abi_shape(spec["shape"]), rt.HalElementType.INT_8)
    element = rt.HalElementType.INT_8 if d.kind == "bool" else d.hal_element_type()
    return _buffer_view(buffer, spec["shape"], element)


def _buffer_view(buffer, shape, element):
    from iree import runtime as rt

    return rt.HalBufferView(buffer, [int(n) for n in shape], element)


def _nbytes(spec: dict) -> int:
    """Bytes of the static tensor `spec` at IREE's ABI (bools and 4-bit pairs a byte each)."""
    d = DTYPES[spec["dtype"]]
    if d.packed:
        return max(int(np.prod(d.abi_shape(spec["shape"]), dtype=np.int64)), 1)
    n = int(np.prod(spec["shape"], dtype=np.int64))
    return max(n if d.kind == "bool" else n * d.np.itemsize, 1)


def reshaped(array, shape):
    """A device array's buffer seen with another shape of as many elements (no copy): a submission's output
    passed to a later one that takes it in that shape."""
    from iree import runtime as rt

    view = array._buffer_view
    shape = [int(d) for d in shape]
    if int(np.prod(shape)) != int(np.prod(view.shape)):
        raise InputError(
            f"reshaped: {list(view.shape)} has {int(np.prod(view.shape))} elements, {shape} has {int(np.prod(shape))}"
        )
    return rt.DeviceArray(
        array._device, rt.HalBufferView(view.get_buffer(), shape, view.element_type), implicit_host_transfer=True
    )


def _element_type(dtype: np.dtype):
    """IREE's element type of a host array, as its own call path tags it."""
    from iree.runtime.array_interop import map_dtype_to_element_type

    return map_dtype_to_element_type(dtype)


def host_copy(result, dtype: DType, shape=None) -> np.ndarray:
    """A result on the host, in an array of its own (of `shape`, for 4-bit values: the module passes their bytes).

    On a device whose memory the host can map (the CPU's), IREE's `to_host` is a view of the result's
    buffer; once the result is dropped, the buffer goes back to IREE's pool and a later call writes into
    it. So a result that does not own its memory is copied (once). The runtime names the element type by
    its MLIR spelling (bool as i8, u8 as the signless i8, bf16 as raw bits): the same bytes are viewed as
    the signature's dtype."""
    a = read_back(result) if hasattr(result, "_buffer_view") else np.asarray(result)
    if dtype.packed:  # the bytes of 4-bit values, two a byte: unpacked into an array of their own
        return unpack_nibbles(a, dtype, tuple(shape))
    owned = a.flags.owndata and a.base is None
    if a.dtype != dtype.np:
        a = a.view(dtype.np)
    return a if owned else a.copy()


def _too_long(long: dict, sizes: dict) -> bool:
    """Whether some attention's b * hq * s * skv, at these sizes, exceeds the decomposition's limit."""
    for term in long["scores"]:
        n = 1
        for d in term:
            n *= d.evaluate(sizes)
        if n > long["limit"]:
            return True
    return False


def _parameters_for(artifact: Artifact, given):
    """The parameters a module loads, checked against what it needs: `given` (a file, a checkpoint
    directory, arrays, or a list of these), else the constants compiled as parameters, else the .irpa
    saved beside the artifact. Returns (Parameters or None, the module's parameter specs, notes on
    conversions made at load)."""
    needed = artifact.parameters
    if not needed:
        if given is not None:
            raise InputError("load(parameters=...): this module takes no parameters")
        return None, [], []
    from ..parameters import Parameters, Spec

    if given is None:
        given = artifact.default_parameters()
        if given is None:
            names = ", ".join(repr(p["name"]) for p in needed[:3]) + (", ..." if len(needed) > 3 else "")
            raise InputError(
                f"the module needs {len(needed)} parameter(s) ({names}) and none were given: pass "
                f"load(..., parameters=) an .irpa, a .safetensors file, a checkpoint directory or "
                f"a dict of arrays"
            )
    params = Parameters.open(given)
    specs = [Spec(p["name"], tuple(p["shape"]), p["dtype"]) for p in needed]
    return params, specs, params.check(specs)


def _long_form(meta) -> dict | None:
    """The metadata's `long_form` with each score term's sizes parsed (they are evaluated per call)."""
    if meta is None:
        return None
    ok = (
        isinstance(meta, dict)
        and isinstance(meta.get("function"), str)
        and isinstance(meta.get("limit"), int)
        and isinstance(meta.get("scores"), list)
        and all(isinstance(t, list) for t in meta["scores"])
    )
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


def device_for(target: str, device: str | None) -> str:
    """The device a module compiled for `target` runs on: `device`, checked to run the target's kind of
    code, or the kind's default device."""
    target_kind = target.split(":")[0]
    if device is None:
        device = default_device(target_kind)
    try:
        dev_kind = kind_of(device)
    except KeyError:
        expected = f"{', '.join(DEVICES[:-1])} or {DEVICES[-1]}"
        raise DeviceError(f"unknown device {device!r}; expected {expected}") from None
    if dev_kind != target_kind:
        raise DeviceError(
            f"artifact was compiled for {target} but device {device!r} runs "
            f"{dev_kind} code; recompile with the matching target or pick another device"
        )
    return device


def load(artifact, device: str | None = None, *, verify: bool = True, parameters=None) -> Module:
    """Load an Artifact, a .vmfb path or .vmfb bytes on a device (default: the one the artifact's target
    runs on). A file or bytes are checked first (see `Artifact.load`); verify=False skips their integrity
    check, for a file you trust that has none.

    parameters: where a module of external parameters takes them: an .irpa, a .safetensors file, a
    sharded checkpoint's index.json, a checkpoint directory, a dict of numpy arrays, or a list of
    these. Every parameter is checked (present, shape, dtype) before the module is loaded; a float
    dtype that differs is converted once here (see `Module.parameter_notes`)."""
    if isinstance(artifact, (str, Path)):
        artifact = Artifact.load(artifact, verify=verify)
    elif isinstance(artifact, (bytes, bytearray)):
        artifact = Artifact.from_bytes(bytes(artifact), "bytes", verify=verify)
    elif not isinstance(artifact, Artifact):
        raise InputError(f"load: expected an Artifact or a .vmfb path, got {type(artifact).__name__}")
    return Module(artifact, device, parameters)
