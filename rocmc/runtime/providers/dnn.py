"""The DNN provider MIOpen and cuDNN share, over their vendor tables (capi.py), and its planners.

Per device the provider keeps one library handle on one stream, a workspace that only grows, and
a plan cache keyed by (op, dtype, shapes, attributes): descriptors, the algorithm the library's
search picked and its workspace size (plans.py). Search runs real kernels on scratch buffers once
per key; every later call only launches. Convolutions are planned in conv_plan.py, LSTM/GRU in
recurrent.py; the other ops' planners (pooling, softmax, activations, batch norm, LRN) are here.

Where the vendor table enables it (`graph_launch`, cuDNN), a plan's launch is captured into a stream
graph once per set of device pointers and replayed with one runtime call (`plans.Replays`).

The compiled module calls imports with IREE's synchronous model: IREE has waited for the inputs
before the call, and takes the result as ready when the call returns, so each call ends with a
stream synchronize.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from time import perf_counter as _now

from ...errors import DeviceError
from ... import dtypes
from ...symbolic import INT, conv_size
from .base import Provider, dtype_of
from .capi import P, Api, VendorTable, _ints, capsule_address, load_library, packed_strides
from .conv_plan import PLANNERS as CONV_PLANNERS
from .plans import Plan, Replays, _release, _size, itemsize


def result_view(device, nbytes: int, shape, element_type):
    """A fresh device buffer of `nbytes` for a library call's result, viewed as `shape`.

    It is allocated for export (the library writes it through a raw pointer), which keeps it out of IREE's
    caching pool (IREE 3.13's caching allocator pools no buffer with the export usage). Pooled results
    faulted: an intermittent illegal memory access in the library's kernels, 4 of 6 runs of
    bench/blas_fault_gpu.py with the device drained before each call, 0 of 17 with export usage (BENCHMARKS.md,
    "The GEMM library path's fault")."""
    from iree import runtime as hal

    usage = hal.BufferUsage.DEFAULT | hal.BufferUsage.SHARING_EXPORT
    buf = device.allocator.allocate_buffer(hal.MemoryType.DEVICE_LOCAL, usage, nbytes)
    return hal.HalBufferView(buf, shape, element_type)


ACTIVE: "weakref.WeakSet" = weakref.WeakSet()  # live providers (benchmarks read their stats)


class DnnProvider(Provider):
    table: VendorTable

    def __init__(self, hal_device, device_name: str):
        super().__init__(hal_device, device_name)
        t = self.table
        self.library = f"{t.name} ({t.libraries[0]})"
        self.device_index = int(device_name.split(":")[1]) if ":" in device_name else 0
        rt_lib = load_library(t.runtime.libraries, f"{t.runtime.name} runtime", t.runtime.install)
        self.rt = Api(rt_lib, t.runtime.name, t.runtime.functions, "error_string")
        self.api = Api(load_library(t.libraries, t.name, t.install), t.name, t.functions, "error_string", t.last_error)
        self.rt.call("set_device", device=self.device_index)
        self._check_exportable()
        self.stream = self._out(P, "stream_create", rt=True)
        self.handle = self._out(P, "create_handle")
        if self.api.has("set_stream"):  # a library that takes the stream per call has none
            self.api.call("set_stream", h=self.handle, stream=self.stream)
        self._plans: dict = {}
        self._ws = (None, 0)
        self._lock = threading.Lock()
        # Cumulative seconds per phase of a call (pointers of the inputs, the output buffer, the
        # library launch, the stream synchronize): where the per-call overhead goes.
        self.stats = dict.fromkeys(("calls", "inputs_s", "output_s", "launch_s", "sync_s", "captures"), 0)
        ACTIVE.add(self)
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._sync = self.rt.bound("stream_sync")

    exportable_hint = ""

    def _check_exportable(self):
        """A typed error now, not a failure inside the first call, when the device's buffers can't
        be handed to the library (IREE's pooled asynchronous allocations can't be exported)."""
        from iree import runtime as rt

        buf = self.device.allocator.allocate_buffer(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, allocation_size=64
        )
        view = rt.HalBufferView(buf, [16], dtypes.f32.hal_element_type())
        try:
            self.device.create_dlpack_capsule(view, self.table.dlpack_device, self.device_index)
        except Exception as e:  # noqa: BLE001
            raise DeviceError(
                f"{self.device_name!r}: the device's buffers can't be handed to {self.table.name} "
                f"({e}); {self.exportable_hint}"
            ) from None

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
        self.api.call(
            f"set_{kind}",
            desc=d,
            dtype=self.table.dtypes[dtype],
            n=len(dims),
            dims=_ints(dims),
            strides=_ints(packed_strides(dims)),
            format=self.table.enums.get("nchw", 0),
        )
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
                if len(self._plans) >= MAX_PLANS:  # a symbolic dim can make one per call: keep the newest
                    _release(self, self._plans.pop(next(iter(self._plans))).keep)
                dtype = dtype_of(x.element_type).name
                plan = self._plans[key] = self.plan(op, dtype, [tuple(s) for s in shapes], attrs, ptrs)
                plan.nbytes = max(_size(plan.out_shape) * itemsize(dtype), 1)
            t1 = _now()
            out = result_view(self.device, plan.nbytes, plan.out_shape, x.element_type)
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

    planners: dict = {}  # op -> planner, set by each vendor (PLANNERS plus what it adds)
    alignment_cap = 16  # plans are keyed by their inputs' pointer alignment, up to this many bytes
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


def _replayed(p: DnnProvider, plan: Plan):
    """A legacy plan's `run(ptrs, y)` replayed from a graph per set of pointers."""
    launch = plan.run
    replays = Replays(p, lambda key: launch(key[:-1], key[-1]))
    plan.keep.append(replays)

    def run(ptrs, y):
        replays((*ptrs, y))

    return run


# ---- planners: one per op family (convolutions: conv_plan.py; LSTM, GRU: recurrent.py) ------------


def _pool_plan(p: DnnProvider, op, dtype, shapes, attrs, ptrs) -> Plan:
    t, api, keep = p.table, p.api, []
    xs = shapes[0]
    kh, kw, sh, sw, ph, pw = (attrs[k] for k in ("kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w"))
    ys = (xs[0], xs[1], conv_size(INT, xs[2], kh, sh, ph, ph, 1), conv_size(INT, xs[3], kw, sw, pw, pw, 1))
    mode = (
        t.enums["pool_max"]
        if op == "max_pool2d"
        else t.enums["pool_avg_include" if attrs["count_include_pad"] else "pool_avg_exclude"]
    )
    pool = p._out(P, "create_pool")
    keep.append(("destroy_pool", pool))
    api.call(
        "set_pool", desc=pool, mode=mode, nan=t.enums.get("propagate_nan", 0), wh=kh, ww=kw, ph=ph, pw=pw, sh=sh, sw=sw
    )
    xD, yD = p.tensor(xs, dtype, keep), p.tensor(ys, dtype, keep)
    alpha, beta = ctypes.byref(p.one), ctypes.byref(p.zero)

    def run(ptrs, y):
        api.call(
            "pool_fwd",
            h=p.handle,
            desc=pool,
            alpha=alpha,
            xD=xD,
            x=ptrs[0],
            beta=beta,
            yD=yD,
            y=y,
            do_backward=False,
            ws=None,
            ws_size=0,
        )

    return Plan(ys, run, keep)


def _softmax_plan(p: DnnProvider, op, dtype, shapes, attrs, ptrs) -> Plan:
    """x arrives as (outer, axis, inner): the library's channel mode over a (outer, axis, inner, 1) tensor."""
    t, keep = p.table, []
    xs = shapes[0]
    xD = p.tensor((*xs, 1), dtype, keep)
    algo = t.enums["softmax_log" if op == "log_softmax" else "softmax_accurate"]
    alpha, beta = ctypes.byref(p.one), ctypes.byref(p.zero)

    def run(ptrs, y):
        p.api.call(
            "softmax_fwd",
            h=p.handle,
            alpha=alpha,
            xD=xD,
            x=ptrs[0],
            beta=beta,
            yD=xD,
            y=y,
            sm_algo=algo,
            sm_mode=t.enums["softmax_channel"],
        )

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
    api.call(
        "set_act",
        desc=act,
        mode=mode,
        nan=t.enums.get("propagate_nan", 0),
        coef=value if param else 0.0,
        act_alpha=value,
        act_beta=1.0,
        act_gamma=0.0,
    )
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    if leaky_by_parts:
        slope = attrs["negative_slope"]
        scale, rest = ctypes.c_float(slope), ctypes.c_float(1.0 - slope)
        keep += [scale, rest]

        def run(ptrs, y):
            api.call(
                "add_tensor",
                h=p.handle,
                alpha=ctypes.byref(scale),
                bD=xD,
                b=ptrs[0],
                beta=ctypes.byref(zero),
                yD=xD,
                y=y,
            )
            api.call(
                "act_fwd",
                h=p.handle,
                desc=act,
                alpha=ctypes.byref(rest),
                xD=xD,
                x=ptrs[0],
                beta=ctypes.byref(one),
                yD=xD,
                y=y,
            )
    else:

        def run(ptrs, y):
            api.call(
                "act_fwd",
                h=p.handle,
                desc=act,
                alpha=ctypes.byref(one),
                xD=xD,
                x=ptrs[0],
                beta=ctypes.byref(zero),
                yD=xD,
                y=y,
            )

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
        api.call(
            "bn_infer",
            h=p.handle,
            mode=t.enums["bn_spatial"],
            alpha=ctypes.byref(one),
            beta=ctypes.byref(zero),
            xD=xD,
            x=ptrs[0],
            yD=xD,
            y=y,
            bnD=bnD,
            scale=ptrs[3],
            bias=ptrs[4],
            mean=ptrs[1],
            var=ptrs[2],
            eps=eps,
        )

    return Plan(tuple(xs), run, keep)


def _lrn_plan(p: DnnProvider, op, dtype, shapes, attrs, ptrs) -> Plan:
    t, api, keep = p.table, p.api, []
    xs = shapes[0]
    xD = p.tensor((*xs, 1), dtype, keep)
    lrn = p._out(P, "create_lrn")
    keep.append(("destroy_lrn", lrn))
    api.call(
        "set_lrn",
        desc=lrn,
        lrn_mode=t.enums["lrn_cross_channel"],
        lrn_n=attrs["size"],
        lrn_alpha=attrs["alpha"],
        lrn_beta=attrs["beta"],
        lrn_k=attrs["k"],
    )
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    keep += [one, zero]

    def run(ptrs, y):
        api.call(
            "lrn_fwd",
            h=p.handle,
            desc=lrn,
            lrn_mode=t.enums["lrn_cross_channel"],
            alpha=ctypes.byref(one),
            xD=xD,
            x=ptrs[0],
            beta=ctypes.byref(zero),
            yD=xD,
            y=y,
            do_backward=False,
            ws=None,
        )

    return Plan(tuple(xs), run, keep)


# Ops whose legacy launch depends on nothing but the pointers it is given (no workspace, no host
# synchronization), so a graph captured once per set of pointers replays it exactly.
REPLAYABLE = {
    "max_pool2d",
    "avg_pool2d",
    "softmax",
    "log_softmax",
    "relu",
    "sigmoid",
    "tanh",
    "elu",
    "leaky_relu",
    "clipped_relu",
    "batch_norm",
    "lrn",
}

PLANNERS = {
    **CONV_PLANNERS,
    "max_pool2d": _pool_plan,
    "avg_pool2d": _pool_plan,
    "softmax": _softmax_plan,
    "log_softmax": _softmax_plan,
    **{op: _activation_plan for op in ("relu", "sigmoid", "tanh", "elu", "leaky_relu", "clipped_relu")},
    "batch_norm": _batch_norm_plan,
    "lrn": _lrn_plan,
}
