"""One ctypes binding for MIOpen and cuDNN, driven by a small per-vendor table.

MIOpen's C API was modelled on cuDNN's legacy API: the same descriptors, the same operations, with
different function names, enum integers and argument orders. A vendor table (miopen.py, cudnn.py)
lists, for each role the shared code needs, the C function and the names of its arguments in C
order; `Api.call(role, **named)` puts the named values in that order. What differs beyond order
(workspace queries, perf-result layouts, an activation cuDNN lacks) is data in the table too.

Per device the provider keeps one library handle on one stream, a workspace that only grows, and
a plan cache keyed by (op, dtype, shapes, attributes): descriptors, the algorithm the library's
search picked and its workspace size. Search runs real kernels on scratch buffers once per key;
every later call only launches.

Convolutions go through each library's plan API, the one that keeps a chosen kernel as an object
run on a list of (tensor id, device pointer): cuDNN's backend graph (an execution plan run by
cudnnBackendExecute with a variant pack) and MIOpen's Find 2.0 (a solution run by
miopenRunSolution with tensor arguments). The shared planner describes the problem (`ConvProblem`)
and binds the ABI's pointers to the library's tensor roles x, w, y (b); the vendor module builds
the `TensorOp` (`conv_builder`). The legacy algorithm-enum path remains for a provider without a
builder and for a problem the plan API rejects. fused_conv2d is a convolution with an epilogue
(+ residual, then an activation): what the vendor's plan doesn't fuse runs after it as legacy calls.

Where the vendor table enables it (`graph_launch`, cuDNN), a plan's launch is captured into a stream
graph once per set of device pointers and replayed with one runtime call (`Replays`): the library's
host-side launch path, tens of microseconds for a cuDNN execution plan, runs only at capture.

The compiled module calls imports with IREE's synchronous model: IREE has waited for the inputs
before the call, and takes the result as ready when the call returns, so each call ends with a
stream synchronize.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from time import perf_counter as _now

from ...errors import DeviceError
from ...externs import CONV_ACTIVATIONS
from ...frontend import dtypes
from ...symbolic import INT, conv_size, conv_transpose_size
from .base import Provider, dtype_of

P = ctypes.c_void_p
ACTIVE: "weakref.WeakSet" = weakref.WeakSet()   # live providers (benchmarks read their stats)
# The C types a table's function declarations name: `"h alpha xD x algo:int ws ws_size:size_t"`
# declares each argument in C order, a pointer unless it says otherwise.
C_TYPES = {"ptr": P, "int": ctypes.c_int, "uint": ctypes.c_uint, "bool": ctypes.c_bool, "float": ctypes.c_float,
           "double": ctypes.c_double, "i64": ctypes.c_int64, "u64": ctypes.c_uint64, "size_t": ctypes.c_size_t}


def declared(args: str) -> list:
    """A table's argument declaration as [(name, ctypes type)] in C order."""
    out = []
    for item in args.split():
        name, _, kind = item.partition(":")
        if (kind or "ptr") not in C_TYPES:
            raise ValueError(f"argument {name!r}: unknown C type {kind!r}; known: {', '.join(C_TYPES)}")
        out.append((name, C_TYPES[kind or "ptr"]))
    return out


@dataclass(frozen=True)
class Perf:
    """Layout of one algorithm-search result record."""
    size: int
    algo: int
    time: int
    memory: int
    status: int | None = None   # offset of a per-record status (cuDNN), None when absent (MIOpen)


@dataclass(frozen=True)
class VendorTable:
    name: str                  # "MIOpen", "cuDNN"
    libraries: tuple           # file names tried, in order
    install: str               # how to get the library, for the error message
    functions: dict            # role -> (C function name, "arg names in C order")
    dtypes: dict               # rocmc dtype -> the library's data type enum
    enums: dict                # named enum values the shared code uses
    activations: dict          # op -> (mode, attribute passed as the mode's parameter or None)
    perf: Perf
    search_workspace: int | None   # bytes offered to the search when no query gives a size
    runtime: "RuntimeTable"
    dlpack_device: int         # DLPack device type of the library's device (kDLCUDA 2, kDLROCM 10)
    gate_order: dict = field(default_factory=dict)   # op -> the library's packed gate order ("ifog")
    rnn_weights: str = ""      # how weights enter the library's weight space (see recurrent.py)
    conv_ids: dict = field(default_factory=dict)     # conv tensor role (x, w, y, b) -> the plan API's id
    conv_api: str = ""         # the plan API convolutions run through (for reports)
    last_error: str = ""       # C function describing the last failure: void f(char *msg, size_t size)
    # replay each plan's launch as a captured stream graph (one host call instead of the library's
    # launch path); needs the runtime's capture roles
    graph_launch: bool = False


@dataclass(frozen=True)
class RuntimeTable:
    name: str
    libraries: tuple
    install: str
    functions: dict


def library_paths(names) -> list:
    """Where to look for a shared library: the loader's own search, then wheels on sys.path
    (nvidia-* packages, torch/lib), where pip-installed CUDA libraries live."""
    found = list(names)
    for base in sys.path:
        for name in names:
            for pattern in (f"nvidia/*/lib/{name}", f"nvidia/*/*/lib/{name}", f"torch/lib/{name}"):
                found += sorted(glob.glob(os.path.join(base, pattern)))
    return found


def load_library(names, what: str, install: str):
    tried = []
    for path in library_paths(names):
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append(f"{path} ({str(e).split(':')[-1].strip()})")
    raise DeviceError(f"{what} not found: looked for {', '.join(names)} on the loader path and in installed "
                      f"wheels; {install}")


class Api:
    """A loaded library bound through a table: `call(role, **named_args)`, checked status."""

    def __init__(self, lib, name: str, functions: dict, error_string: str | None, last_error: str = ""):
        self.lib, self.name, self.functions = lib, name, functions
        self._fns = {}
        self._error_string = error_string
        self._last_error = getattr(lib, last_error, None) if last_error else None
        for role, (cname, args) in functions.items():
            try:
                fn = getattr(lib, cname)
            except AttributeError:
                raise DeviceError(f"{name}: the library has no {cname} (needed for {role}); "
                                  f"install a newer version") from None
            if role == error_string:
                fn.restype = ctypes.c_char_p
            else:
                fn.restype = ctypes.c_int
            decl = declared(args)
            fn.argtypes = [t for _, t in decl]
            self._fns[role] = (fn, [n for n, _ in decl])

    def has(self, role: str) -> bool:
        return role in self._fns

    def call(self, role: str, **named):
        fn, args = self._fns[role]
        status = fn(*(named[a] for a in args))
        if status != 0:
            self.fail(role, status)

    def bound(self, role: str):
        """The role's C function taking its arguments positionally, in C order, status checked:
        for the per-call path, where `call`'s by-name marshalling would cost microseconds."""
        fn = self._fns[role][0]

        def call(*args):
            status = fn(*args)
            if status != 0:
                self.fail(role, status)
        return call

    def raw(self, role: str):
        """The role's C function, status unchecked."""
        return self._fns[role][0]

    def fail(self, role: str, status: int):
        msg = self._fns[self._error_string][0](status).decode() if self._error_string else ""
        detail = self.last_error()
        raise DeviceError(f"{self.name} {self.functions[role][0]} failed with status {status} {msg}"
                          f"{f' ({detail})' if detail else ''}".strip())

    def last_error(self) -> str:
        """The library's own description of its last failure, where it keeps one (the table's
        `last_error` function: `void f(char *message, size_t size)`)."""
        fn = self._last_error
        if fn is None:
            return ""
        buf = ctypes.create_string_buffer(512)
        fn.restype, fn.argtypes = None, [P, ctypes.c_size_t]
        fn(buf, len(buf))
        return buf.value.decode(errors="replace").strip()


# ---- DLPack: raw device pointers of IREE buffer views ---------------------------------------------

class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


_DATA = _DLTensor.data.offset
_BYTE_OFFSET = _DLTensor.byte_offset.offset
_read_ptr = ctypes.c_void_p.from_address
_read_u64 = ctypes.c_uint64.from_address


def capsule_address(capsule) -> int:
    t = _capsule_pointer(capsule, b"dltensor")
    return (_read_ptr(t + _DATA).value or 0) + _read_u64(t + _BYTE_OFFSET).value


# ---- descriptors -----------------------------------------------------------------------------------

def _ints(values):
    return (ctypes.c_int * len(values))(*values)


def packed_strides(dims):
    out, acc = [], 1
    for d in reversed(dims):
        out.append(acc)
        acc *= d
    return list(reversed(out))


@dataclass
class Plan:
    """Everything one (op, dtype, shapes, attributes) needs at call time."""
    out_shape: tuple
    run: object                               # fn(ptrs: list[int], y: int) -> None
    keep: list = field(default_factory=list)   # descriptors and arrays to keep alive
    info: dict = field(default_factory=dict)   # what the search chose (algorithm, workspace bytes)
    nbytes: int = 0                            # bytes of the result, set by the provider


class DnnProvider(Provider):
    table: VendorTable

    def __init__(self, hal_device, device_name: str):
        super().__init__(hal_device, device_name)
        t = self.table
        self.library = f"{t.name} ({t.libraries[0]})"
        self.device_index = int(device_name.split(":")[1]) if ":" in device_name else 0
        rt_lib = load_library(t.runtime.libraries, f"{t.runtime.name} runtime", t.runtime.install)
        self.rt = Api(rt_lib, t.runtime.name, t.runtime.functions, "error_string")
        self.api = Api(load_library(t.libraries, t.name, t.install), t.name, t.functions, "error_string",
                       t.last_error)
        self.rt.call("set_device", device=self.device_index)
        self._check_exportable()
        self.stream = self._out(P, "stream_create", rt=True)
        self.handle = self._out(P, "create_handle")
        if self.api.has("set_stream"):     # a library that takes the stream per call has none
            self.api.call("set_stream", h=self.handle, stream=self.stream)
        self._plans: dict = {}
        self._ws = (None, 0)
        self._lock = threading.Lock()
        # Cumulative seconds per phase of a call (pointers of the inputs, the output buffer, the
        # library launch, the stream synchronize): where the per-call overhead goes.
        self.stats = dict.fromkeys(("calls", "inputs_s", "output_s", "launch_s", "sync_s", "captures"), 0)
        ACTIVE.add(self)
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        # what every call uses, looked up once
        from iree import runtime as hal
        self._hal = hal
        self._allocate = self.device.allocator.allocate_buffer
        self._device_local, self._usage = hal.MemoryType.DEVICE_LOCAL, hal.BufferUsage.DEFAULT
        self._sync = self.rt.bound("stream_sync")

    exportable_hint = ""

    def _check_exportable(self):
        """A typed error now, not a failure inside the first call, when the device's buffers can't
        be handed to the library (IREE's pooled asynchronous allocations can't be exported)."""
        from iree import runtime as rt
        buf = self.device.allocator.allocate_buffer(memory_type=rt.MemoryType.DEVICE_LOCAL,
                                                    allowed_usage=rt.BufferUsage.DEFAULT, allocation_size=64)
        view = rt.HalBufferView(buf, [16], dtypes.f32.hal_element_type())
        try:
            self.device.create_dlpack_capsule(view, self.table.dlpack_device, self.device_index)
        except Exception as e:
            raise DeviceError(f"{self.device_name!r}: the device's buffers can't be handed to {self.table.name} "
                              f"({e}); {self.exportable_hint}") from None

    # ---- plumbing --------------------------------------------------------------------------------
    def _out(self, ctype, role, rt=False, **kw):
        v = ctype()
        (self.rt if rt else self.api).call(role, out=ctypes.byref(v), **kw)
        return v.value

    def _malloc(self, nbytes: int) -> int:
        return self._out(P, "malloc", rt=True, size=max(nbytes, 1))

    def workspace(self, nbytes: int):
        ptr, size = self._ws
        if nbytes > size:
            if ptr:
                self.rt.call("free", ptr=ptr)
            self._ws = (self._malloc(nbytes), nbytes)
        return self._ws[0]

    def release_workspace(self):
        if self._ws[0]:
            self.rt.call("free", ptr=self._ws[0])
        self._ws = (None, 0)

    def tensor(self, dims, dtype, keep, filter=False):
        """A packed NCHW tensor (or filter) descriptor."""
        kind = "filter" if filter else "tensor"
        d = self._out(P, f"create_{kind}")
        keep.append((f"destroy_{kind}", d))
        dims = list(dims)
        self.api.call(f"set_{kind}", desc=d, dtype=self.table.dtypes[dtype], n=len(dims), dims=_ints(dims),
                      strides=_ints(packed_strides(dims)), format=self.table.enums.get("nchw", 0))
        return d

    def unsupported(self, op, dtype, attrs):
        if dtype not in self.table.dtypes:
            return f"dtype {dtype} (takes {', '.join(self.table.dtypes)})"
        limit = self.table_limits(op, attrs)
        if limit is None and op not in (self.planners or PLANNERS):
            return f"{self.table.name} has no {op} call in this binding"
        return limit

    def table_limits(self, op, attrs):
        return None

    # ---- calls -----------------------------------------------------------------------------------
    def run(self, op, tensors, attrs):
        """One extern call: pointers of the inputs, a fresh IREE buffer for the result, the cached
        plan's launch, a stream synchronize (IREE's synchronous import model takes the result as
        ready on return). Phases are timed into `stats`."""
        t0 = _now()
        x = tensors[0]
        shapes = tuple(tuple(t.shape) for t in tensors)
        export, dl, index = self.device.create_dlpack_capsule, self.table.dlpack_device, self.device_index
        with self._lock:
            capsules = [export(t, dl, index) if s and all(s) else None for t, s in zip(tensors, shapes)]
            ptrs = [capsule_address(c) if c is not None else None for c in capsules]
            # A plan may depend on the pointers' alignment (cuDNN's graph API records it): one
            # built for 16-byte aligned buffers is not handed a sub-buffer at a smaller offset.
            cap = self.alignment_cap
            align = min(cap, min((p & -p for p in ptrs if p), default=cap))
            key = (op, x.element_type, shapes, getattr(attrs, "key", None) or tuple(sorted(attrs.items())), align)
            plan = self._plans.get(key)
            if plan is None:
                if len(self._plans) >= MAX_PLANS:     # a symbolic dim can make one per call: keep the newest
                    _release(self, self._plans.pop(next(iter(self._plans))).keep)
                dtype = dtype_of(x.element_type).name
                plan = self._plans[key] = self.plan(op, dtype, [tuple(s) for s in shapes], attrs, ptrs)
                plan.nbytes = max(_size(plan.out_shape) * itemsize(dtype), 1)
            t1 = _now()
            out = self._hal.HalBufferView(self._allocate(self._device_local, self._usage, plan.nbytes),
                                          plan.out_shape, x.element_type)
            ycap = export(out, dl, index)
            y = capsule_address(ycap)
            t2 = _now()
            plan.run(ptrs, y)
            t3 = _now()
            self._sync(self.stream)
            del capsules, ycap
            t4 = _now()
        st = self.stats
        st["calls"] += 1
        st["inputs_s"] += t1 - t0
        st["output_s"] += t2 - t1
        st["launch_s"] += t3 - t2
        st["sync_s"] += t4 - t3
        return out

    planners: dict = {}        # op -> planner, set by each vendor (PLANNERS plus what it adds)
    alignment_cap = 16         # plans are keyed by their inputs' pointer alignment, up to this many bytes
    # fn(provider, ConvProblem, {role: device pointer}, keep) -> TensorOp | None: the vendor's
    # plan-API convolution (None: the legacy calls)
    conv_builder = None

    def call_stats(self, reset: bool = False) -> dict:
        """A copy of the cumulative per-phase call timings (benchmarks read where a call's time goes);
        reset=True zeroes them after copying, so the next reading covers what runs from here on."""
        with self._lock:
            out = dict(self.stats)
            if reset:
                self.stats.update(dict.fromkeys(self.stats, 0))
        return out

    def cached_plans(self) -> list:
        """A snapshot of the plan cache, [(key, plan)] with key (op, element type, shapes, ...): what
        each call chose, and the plans a benchmark launches alone to time the library kernel."""
        with self._lock:
            return list(self._plans.items())

    def plan(self, op, dtype, shapes, attrs, ptrs) -> Plan:
        plan = (self.planners or PLANNERS)[op](self, op, dtype, shapes, attrs, ptrs)
        if op in REPLAYABLE and self.table.graph_launch:
            plan.run = _replayed(self, plan)
        return plan

    def close(self):
        for plan in self._plans.values():
            _release(self, plan.keep)
        self._plans.clear()
        self.release_workspace()
        self.api.call("destroy_handle", h=self.handle)
        self.rt.call("stream_destroy", stream=self.stream)


MAX_PLANS = 256


def itemsize(dtype: str) -> int:
    """Bytes per element of a storage type (f32, f16, bf16)."""
    return dtypes.ALL[dtype].np.itemsize


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# ---- planners: one per op family -------------------------------------------------------------------

def _as4d(shape):
    """Rank-3 (N, C, L) -> (N, C, 1, L): 1D ops run as 2D with a unit height."""
    return tuple(shape) if len(shape) == 4 else (shape[0], shape[1], 1, shape[2])


def _conv_geometry(attrs, nsp, transpose):
    axes = ["_h", "_w"] if nsp == 2 else [""]
    get = lambda k, unit: [a for a in ([unit] if nsp == 1 else []) + [attrs[k + s] for s in axes]]  # noqa: E731
    return (get("stride", 1), get("pad", 0), get("dilation", 1),
            get("output_padding", 0) if transpose else [0, 0])


@dataclass(frozen=True)
class ConvProblem:
    """A convolution in the library's terms: `forward` computes y from x and w; `backward_data`
    (a transposed convolution) computes x from y and w, so there x is the ABI's result and y its
    input. Shapes are 4-d NCHW (1-d convolutions run with a unit height)."""
    direction: str      # "forward" | "backward_data"
    x: tuple
    w: tuple
    y: tuple
    pad: tuple
    stride: tuple
    dilation: tuple
    groups: int
    dtype: str
    bias: bool          # a (1, C_out, 1, 1) bias is added to the result
    residual: bool = False      # then a tensor of the result's shape (fused_conv2d's epilogue)
    activation: str = "none"    # then this activation (CONV_ACTIVATIONS)

    @property
    def out(self) -> str:
        """The role the ABI's result binds to."""
        return "y" if self.direction == "forward" else "x"

    @property
    def epilogue(self) -> bool:
        """Whether anything follows the bias: a residual add, an activation."""
        return self.residual or self.activation != "none"


@dataclass
class TensorOp:
    """A library plan run on device pointers bound to tensor roles: `run(pointers, ws)` takes one
    pointer per role of `roles`, in that order, and a workspace of `workspace` bytes (None when
    0). `fused_bias`: the plan adds the bias itself; `fused_epilogue`: the residual and the
    activation too."""
    roles: tuple
    run: object
    workspace: int = 0
    fused_bias: bool = False
    fused_epilogue: bool = False
    info: dict = field(default_factory=dict)


CAPTURE_THREAD_LOCAL = 1     # cudaStreamCaptureModeThreadLocal == hipStreamCaptureModeThreadLocal
GRAPHS_PER_PLAN = 64


class Replays:
    """A plan's launch captured once per set of device pointers into a stream graph, then
    replayed with one `graph_launch`: the library's host-side launch path (tens of microseconds
    for a cuDNN execution plan) runs only at capture. `launch(key)` must enqueue work on the
    provider's stream and depend on nothing but `key`, which holds every pointer it uses. A launch
    that can't be captured (the library synchronizes inside, say) runs directly, every call.

    A set of pointers is captured the second time it comes (a capture costs hundreds of microseconds,
    several launches), and at most GRAPHS_PER_PLAN of them; the others launch directly. A plan that
    serves many layers' weights (an LLM's projections: one plan, a pointer set per layer and per
    result buffer) would otherwise capture on almost every call (measured: a 7B prefill 138 ms)."""

    def __init__(self, p: DnnProvider, launch):
        self.p, self.launch, self.cache = p, launch, {}
        self.seen: set = set()
        self._replay = p.rt.bound("graph_launch")

    def __call__(self, key: tuple):
        g = self.cache.get(key)
        if g is None:
            if key not in self.seen or len(self.cache) >= GRAPHS_PER_PLAN:
                if len(self.seen) < 16 * GRAPHS_PER_PLAN:
                    self.seen.add(key)
                self.launch(key)
                return
            g = self.cache[key] = self._capture(key)
            self.p.stats["captures"] += 1
        if g:
            self._replay(g, self.p.stream)
        else:
            self.launch(key)

    def _capture(self, key) -> int:
        rt, stream = self.p.rt, self.p.stream
        rt.call("capture_begin", stream=stream, capture_mode=CAPTURE_THREAD_LOCAL)
        graph = ctypes.c_void_p()
        try:
            self.launch(key)
            captured = True
        except DeviceError:
            captured = False
        finally:
            # the capture must end whatever happened inside it; its status is looked at below
            ended = rt.raw("capture_end")(stream, ctypes.byref(graph)) == 0
        if not (captured and ended and graph.value):
            rt.raw("get_last_error")()    # clear the error the failed capture left
            if graph.value:
                rt.call("graph_destroy", graph=graph.value)
            return 0
        exe = ctypes.c_void_p()
        try:
            rt.call("graph_instantiate", out=ctypes.byref(exe), graph=graph.value, flags=0)
        except DeviceError:
            return 0
        finally:
            rt.call("graph_destroy", graph=graph.value)
        return exe.value

    def _destroy(self, exe):
        if exe:
            self.p.rt.call("graph_exec_destroy", exec=exe)

    def release(self):
        for exe in self.cache.values():
            self._destroy(exe)
        self.cache.clear()


def _conv_problem(op, dtype, shapes, attrs, has_bias, residual=False) -> ConvProblem:
    """The ABI's convolution call in the library's terms; fused_conv2d's epilogue (`residual`, the
    `activation` scalar) rides along."""
    transpose = op.startswith("conv_transpose")
    nsp = 1 if op.endswith("1d") else 2
    xs, ws = _as4d(shapes[0]), _as4d(shapes[1])
    stride, pad, dil, opad = _conv_geometry(attrs, nsp, transpose)
    g = attrs["groups"]
    if transpose:
        spatial = [conv_transpose_size(INT, xs[2 + i], ws[2 + i], stride[i], pad[i], pad[i], dil[i], opad[i])
                   for i in range(2)]
        out = (xs[0], ws[1] * g, *spatial)
        return ConvProblem("backward_data", out, ws, xs, tuple(pad), tuple(stride), tuple(dil), g, dtype, has_bias)
    spatial = [conv_size(INT, xs[2 + i], ws[2 + i], stride[i], pad[i], pad[i], dil[i]) for i in range(2)]
    out = (xs[0], ws[0], *spatial)
    activation = CONV_ACTIVATIONS[attrs["activation"]] if "activation" in attrs else "none"
    return ConvProblem("forward", xs, ws, out, tuple(pad), tuple(stride), tuple(dil), g, dtype, has_bias,
                       residual, activation)


# ABI pointer index of each tensor role but the one the ABI's result binds to (the residual is
# fused_conv2d's fourth operand)
_CONV_SOURCES = {"w": 1, "b": 2, "r": 3}


def _conv_plan(p: DnnProvider, op, dtype, shapes, attrs, ptrs) -> Plan:
    """A convolution through the vendor's plan API (`conv_builder`), the legacy calls where the
    provider has none or the plan API has no engine for the problem. What the plan leaves out of
    fused_conv2d's epilogue (the bias, the residual add, the activation) runs after it as legacy
    calls on the result."""
    prob = _conv_problem(op, dtype, shapes, attrs, ptrs[2] is not None, len(ptrs) > 3 and ptrs[3] is not None)
    out_rank = len(shapes[0])
    out_shape = getattr(prob, prob.out)
    out_shape = out_shape if out_rank == 4 else (out_shape[0], out_shape[1], out_shape[3])
    builder = getattr(p, "conv_builder", None)
    if builder is None:
        return _legacy_conv_plan(p, prob, ptrs, out_shape)
    # The search runs on the real inputs and a scratch result.
    scratch = p._malloc(_size(getattr(prob, prob.out)) * itemsize(dtype))
    keep: list = []
    try:
        bound = {prob.out: scratch, ("x" if prob.out == "y" else "y"): ptrs[0],
                 **{r: ptrs[i] for r, i in _CONV_SOURCES.items() if i < len(ptrs)}}
        top = builder(p, prob, bound, keep)
    finally:
        p.rt.call("free", ptr=scratch)
    if top is None:   # no engine of the plan API takes this problem
        _release(p, keep)
        plan = _legacy_conv_plan(p, prob, ptrs, out_shape)
        plan.info["api"] = "legacy (the plan API had no engine)"
        return plan
    # ABI pointer (input 0, weights, bias, residual, or the result) of each role, in the op's order
    source = {**_CONV_SOURCES, prob.out: -1, ("x" if prob.out == "y" else "y"): 0}
    slots = tuple(source[r] for r in top.roles)
    execute, need, workspace = top.run, top.workspace, p.workspace
    bias = _bias_add(p, prob, keep) if prob.bias and not top.fused_bias else None
    epilogue = _epilogue(p, prob, keep) if prob.epilogue and not top.fused_epilogue else None
    out_slot = top.roles.index(prob.out)

    def launch(key):
        """key: the roles' pointers, the bias and the residual (or None), the workspace (or None)."""
        *args, b, r, ws = key
        execute(tuple(args), ws)
        if bias is not None:
            bias(b, args[out_slot])
        if epilogue is not None:
            epilogue(r, args[out_slot])
    replays = Replays(p, launch) if p.table.graph_launch else None
    if replays is not None:
        keep.append(replays)
    start = replays or launch

    def run(ptrs, y):
        start(tuple(y if i < 0 else ptrs[i] for i in slots)
              + ((ptrs[2] if bias is not None else None), (ptrs[3] if epilogue is not None else None),
                 workspace(need) if need else None))
    info = {"api": p.table.conv_api, **top.info, "bias": ("fused" if top.fused_bias else "add") if prob.bias else None,
            "epilogue": _epilogue_form(prob, top.fused_epilogue), "graph_launch": replays is not None}
    return Plan(out_shape, run, keep, info)


def _epilogue_form(prob: ConvProblem, fused: bool):
    """plan.info's record of where fused_conv2d's residual add and activation ran."""
    return ("fused" if fused else "separate") if prob.epilogue else None


def _replayed(p: DnnProvider, plan: Plan):
    """A legacy plan's `run(ptrs, y)` replayed from a graph per set of pointers."""
    launch = plan.run
    replays = Replays(p, lambda key: launch(key[:-1], key[-1]))
    plan.keep.append(replays)

    def run(ptrs, y):
        replays((*ptrs, y))
    return run


def _bias_add(p: DnnProvider, prob: ConvProblem, keep):
    """y += b over channels, the legacy call (cudnnAddTensor / miopenConvolutionForwardBias)."""
    out = getattr(prob, prob.out)
    yD = p.tensor(out, prob.dtype, keep)
    bD = p.tensor((1, out[1], 1, 1), prob.dtype, keep)
    scale = ctypes.c_float(1.0)
    keep.append(scale)
    one = ctypes.byref(scale)

    def add(b, y):
        p.api.call("add_tensor", h=p.handle, alpha=one, bD=bD, b=b, beta=one, yD=yD, y=y)
    return add


def _epilogue(p: DnnProvider, prob: ConvProblem, keep):
    """y = activation(y + r) in place, by legacy calls: the residual add is miopenOpTensor where the
    table has it (MIOpen's bias call only broadcasts a (1, C, 1, 1) bias), cudnnAddTensor
    (C = alpha*A + beta*C, here of equal dims) otherwise; the relu is the activation call with x = y."""
    t, api = p.table, p.api
    yD = p.tensor(getattr(prob, prob.out), prob.dtype, keep)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    keep += [one, zero]
    steps = []
    if prob.residual and api.has("op_tensor"):
        steps.append(lambda r, y: api.call("op_tensor", h=p.handle, tensor_op=t.enums["tensor_op_add"],
                                           alpha1=ctypes.byref(one), aD=yD, a=y, alpha2=ctypes.byref(one), bD=yD,
                                           b=r, beta=ctypes.byref(zero), cD=yD, c=y))
    elif prob.residual:
        steps.append(lambda r, y: api.call("add_tensor", h=p.handle, alpha=ctypes.byref(one), bD=yD, b=r,
                                           beta=ctypes.byref(one), yD=yD, y=y))
    if prob.activation != "none":
        mode, _ = t.activations[prob.activation]
        act = p._out(P, "create_act")
        keep.append(("destroy_act", act))
        api.call("set_act", desc=act, mode=mode, nan=t.enums.get("propagate_nan", 0), coef=0.0, act_alpha=1.0,
                 act_beta=1.0, act_gamma=0.0)
        steps.append(lambda r, y: api.call("act_fwd", h=p.handle, desc=act, alpha=ctypes.byref(one), xD=yD, x=y,
                                           beta=ctypes.byref(zero), yD=yD, y=y))

    def run(r, y):
        for step in steps:
            step(r, y)
    return run


def _release(p: DnnProvider, keep):
    """Free what a plan holds: ("free", device pointer), (destroy role, descriptor), or an object
    with a `release()` (a cache of descriptors); anything else is only kept alive."""
    for item in reversed(keep):
        if isinstance(item, tuple):
            role, d = item
            if role == "free":
                p.rt.call("free", ptr=d)
            else:
                p.api.call(role, desc=d)
        elif hasattr(item, "release"):
            item.release()
    keep.clear()


def _legacy_conv_plan(p: DnnProvider, prob: ConvProblem, ptrs, out_shape) -> Plan:
    """The legacy calls: descriptors, the algorithm search, cudnnConvolutionForward & co."""
    t, api, keep = p.table, p.api, []
    transpose = prob.direction == "backward_data"
    # The library's x and y descriptors are the problem's x and y in both directions: backward data
    # computes dx (the transposed conv's output) from dy (its input).
    xD, yD = p.tensor(prob.x, prob.dtype, keep), p.tensor(prob.y, prob.dtype, keep)
    wD = p.tensor(prob.w, prob.dtype, keep, filter=True)
    conv = p._out(P, "create_conv")
    keep.append(("destroy_conv", conv))
    api.call("set_conv", desc=conv, n=2, pads=_ints(prob.pad), stride_a=_ints(prob.stride),
             dil_a=_ints(prob.dilation), mode=t.enums["cross_correlation"], ctype=t.dtypes["f32"])
    api.call("set_conv_groups", desc=conv, groups=prob.groups)
    if api.has("set_conv_math"):
        api.call("set_conv_math", desc=conv, math=t.enums["fma_math" if prob.dtype == "f32" else "tensor_op_math"])
    kind = "conv_bwd_data" if transpose else "conv_fwd"
    descs = {"dyD": yD, "wD": wD, "dxD": xD, "conv": conv} if transpose else {"xD": xD, "wD": wD, "yD": yD, "conv": conv}
    search_bytes = t.search_workspace
    if search_bytes is None:
        size = ctypes.c_size_t()
        api.call(f"{kind}_ws", h=p.handle, size_out=ctypes.byref(size), **descs)
        search_bytes = size.value
    y_scratch = p._malloc(_size(getattr(prob, prob.out)) * itemsize(prob.dtype))
    try:
        algo, need = _search(p, kind, descs, ptrs, y_scratch, search_bytes, transpose)
    finally:
        p.rt.call("free", ptr=y_scratch)
        p.release_workspace()   # the search's scratch is larger than any one algorithm needs
    bias = _bias_add(p, prob, keep) if prob.bias else None
    epilogue = _epilogue(p, prob, keep) if prob.epilogue else None
    alpha, beta = ctypes.byref(p.one), ctypes.byref(p.zero)
    names = ("dy", "dx") if transpose else ("x", "y")

    def run(ptrs, y):
        ws = p.workspace(need) if need else None
        api.call(kind, h=p.handle, alpha=alpha, beta=beta, algo=algo, ws=ws, ws_size=need,
                 **descs, **{names[0]: ptrs[0], "w": ptrs[1], names[1]: y})
        if bias is not None:
            bias(ptrs[2], y)
        if epilogue is not None:
            epilogue(ptrs[3], y)
    return Plan(out_shape, run, keep, {"api": "legacy", "algo": algo, "workspace": need,
                                       "epilogue": _epilogue_form(prob, False)})


def _search(p: DnnProvider, kind, descs, ptrs, y_scratch, search_bytes, transpose):
    """The library's algorithm search on scratch output; returns (algo, workspace bytes)."""
    t = p.table
    perf = (ctypes.c_byte * (t.perf.size * 8))()
    count = ctypes.c_int()
    names = ("dy", "dx") if transpose else ("x", "y")
    p.api.call(f"{kind}_find", h=p.handle, req=8, n_out=ctypes.byref(count), perf=perf,
               ws=p.workspace(search_bytes) if search_bytes else None, ws_size=search_bytes, exhaustive=False,
               **descs, **{names[0]: ptrs[0], "w": ptrs[1], names[1]: y_scratch})
    base = ctypes.addressof(perf)
    for i in range(count.value):
        rec = base + i * t.perf.size
        if t.perf.status is not None and ctypes.c_int.from_address(rec + t.perf.status).value != 0:
            continue
        return (ctypes.c_int.from_address(rec + t.perf.algo).value,
                ctypes.c_size_t.from_address(rec + t.perf.memory).value)
    raise DeviceError(f"{t.name}: no {kind.replace('_', ' ')} algorithm for this problem")


def _pool_plan(p: DnnProvider, op, dtype, shapes, attrs, ptrs) -> Plan:
    t, api, keep = p.table, p.api, []
    xs = shapes[0]
    kh, kw, sh, sw, ph, pw = (attrs[k] for k in ("kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w"))
    ys = (xs[0], xs[1], conv_size(INT, xs[2], kh, sh, ph, ph, 1), conv_size(INT, xs[3], kw, sw, pw, pw, 1))
    mode = t.enums["pool_max"] if op == "max_pool2d" else \
        t.enums["pool_avg_include" if attrs["count_include_pad"] else "pool_avg_exclude"]
    pool = p._out(P, "create_pool")
    keep.append(("destroy_pool", pool))
    api.call("set_pool", desc=pool, mode=mode, nan=t.enums.get("propagate_nan", 0), wh=kh, ww=kw, ph=ph, pw=pw,
             sh=sh, sw=sw)
    xD, yD = p.tensor(xs, dtype, keep), p.tensor(ys, dtype, keep)
    alpha, beta = ctypes.byref(p.one), ctypes.byref(p.zero)

    def run(ptrs, y):
        api.call("pool_fwd", h=p.handle, desc=pool, alpha=alpha, xD=xD, x=ptrs[0], beta=beta, yD=yD, y=y,
                 do_backward=False, ws=None, ws_size=0)
    return Plan(ys, run, keep)


def _softmax_plan(p: DnnProvider, op, dtype, shapes, attrs, ptrs) -> Plan:
    """x arrives as (outer, axis, inner): the library's channel mode over a (outer, axis, inner, 1) tensor."""
    t, keep = p.table, []
    xs = shapes[0]
    xD = p.tensor((*xs, 1), dtype, keep)
    algo = t.enums["softmax_log" if op == "log_softmax" else "softmax_accurate"]
    alpha, beta = ctypes.byref(p.one), ctypes.byref(p.zero)

    def run(ptrs, y):
        p.api.call("softmax_fwd", h=p.handle, alpha=alpha, xD=xD, x=ptrs[0], beta=beta, yD=xD, y=y,
                   sm_algo=algo, sm_mode=t.enums["softmax_channel"])
    return Plan(xs, run, keep)


def _activation_plan(p: DnnProvider, op, dtype, shapes, attrs, ptrs) -> Plan:
    """x arrives flat; it runs as an (n, 1, 1, 1) tensor. A leaky relu the library lacks is
    y = slope*x, then y += (1 - slope) * relu(x)."""
    t, api, keep = p.table, p.api, []
    n = shapes[0][0]
    xD = p.tensor((n, 1, 1, 1), dtype, keep)
    leaky_by_parts = op == "leaky_relu" and op not in t.activations
    mode, param = t.activations["relu" if leaky_by_parts else op]
    value = attrs[param] if param else 1.0
    act = p._out(P, "create_act")
    keep.append(("destroy_act", act))
    api.call("set_act", desc=act, mode=mode, nan=t.enums.get("propagate_nan", 0), coef=value if param else 0.0,
             act_alpha=value, act_beta=1.0, act_gamma=0.0)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    if leaky_by_parts:
        slope = attrs["negative_slope"]
        scale, rest = ctypes.c_float(slope), ctypes.c_float(1.0 - slope)
        keep += [scale, rest]

        def run(ptrs, y):
            api.call("add_tensor", h=p.handle, alpha=ctypes.byref(scale), bD=xD, b=ptrs[0],
                     beta=ctypes.byref(zero), yD=xD, y=y)
            api.call("act_fwd", h=p.handle, desc=act, alpha=ctypes.byref(rest), xD=xD, x=ptrs[0],
                     beta=ctypes.byref(one), yD=xD, y=y)
    else:
        def run(ptrs, y):
            api.call("act_fwd", h=p.handle, desc=act, alpha=ctypes.byref(one), xD=xD, x=ptrs[0],
                     beta=ctypes.byref(zero), yD=xD, y=y)
    keep += [one, zero]
    return Plan(tuple(shapes[0]), run, keep)


def _batch_norm_plan(p: DnnProvider, op, dtype, shapes, attrs, ptrs) -> Plan:
    """x arrives as (N, C, spatial); statistics in f32. Absent weight/bias become ones/zeros."""
    t, api, keep = p.table, p.api, []
    xs = shapes[0]
    c = xs[1]
    xD = p.tensor((*xs, 1), dtype, keep)
    bnD = p._out(P, "create_tensor")
    keep.append(("destroy_tensor", bnD))
    api.call("derive_bn", bnD=bnD, xD=xD, mode=t.enums["bn_spatial"])
    defaults = []
    for i, fill in ((3, 1.0), (4, 0.0)):
        if ptrs[i] is None:
            buf = p._malloc(4 * c)
            host = (ctypes.c_float * c)(*([fill] * c))
            api_rt = p.rt
            api_rt.call("memcpy", dst=buf, src=ctypes.addressof(host), count=4 * c, kind=1)
            defaults.append((i, buf))
            keep.append(("free", buf))
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    keep += [one, zero]
    eps = attrs["eps"]

    def run(ptrs, y):
        ptrs = list(ptrs)
        for i, buf in defaults:
            ptrs[i] = buf
        api.call("bn_infer", h=p.handle, mode=t.enums["bn_spatial"], alpha=ctypes.byref(one),
                 beta=ctypes.byref(zero), xD=xD, x=ptrs[0], yD=xD, y=y, bnD=bnD, scale=ptrs[3], bias=ptrs[4],
                 mean=ptrs[1], var=ptrs[2], eps=eps)
    return Plan(tuple(xs), run, keep)


def _lrn_plan(p: DnnProvider, op, dtype, shapes, attrs, ptrs) -> Plan:
    t, api, keep = p.table, p.api, []
    xs = shapes[0]
    xD = p.tensor((*xs, 1), dtype, keep)
    lrn = p._out(P, "create_lrn")
    keep.append(("destroy_lrn", lrn))
    api.call("set_lrn", desc=lrn, lrn_mode=t.enums["lrn_cross_channel"], lrn_n=attrs["size"],
             lrn_alpha=attrs["alpha"], lrn_beta=attrs["beta"], lrn_k=attrs["k"])
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    keep += [one, zero]

    def run(ptrs, y):
        api.call("lrn_fwd", h=p.handle, desc=lrn, lrn_mode=t.enums["lrn_cross_channel"], alpha=ctypes.byref(one),
                 xD=xD, x=ptrs[0], beta=ctypes.byref(zero), yD=xD, y=y, do_backward=False, ws=None)
    return Plan(tuple(xs), run, keep)


# Ops whose legacy launch depends on nothing but the pointers it is given (no workspace, no host
# synchronization), so a graph captured once per set of pointers replays it exactly.
REPLAYABLE = {"max_pool2d", "avg_pool2d", "softmax", "log_softmax", "relu", "sigmoid", "tanh", "elu",
              "leaky_relu", "clipped_relu", "batch_norm", "lrn"}

PLANNERS = {
    **{op: _conv_plan for op in ("conv1d", "conv2d", "fused_conv2d", "conv_transpose1d", "conv_transpose2d")},
    "max_pool2d": _pool_plan, "avg_pool2d": _pool_plan,
    "softmax": _softmax_plan, "log_softmax": _softmax_plan,
    **{op: _activation_plan for op in ("relu", "sigmoid", "tanh", "elu", "leaky_relu", "clipped_relu")},
    "batch_norm": _batch_norm_plan,
    "lrn": _lrn_plan,
}
