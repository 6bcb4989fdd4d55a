"""A plan: what one call of an op needs at call time, kept per (op, dtype, shapes, attributes), and
how it is released; its launch replayed from captured stream graphs (`Replays`).

Where the vendor table enables it (`graph_launch`, cuDNN), a plan's launch is captured into a stream
graph once per set of device pointers and replayed with one runtime call: the library's host-side
launch path, tens of microseconds for a cuDNN execution plan, runs only at capture.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...errors import DeviceError
from ... import dtypes

if TYPE_CHECKING:
    from .dnn import DnnProvider


@dataclass
class Plan:
    """Everything one (op, dtype, shapes, attributes) needs at call time."""

    out_shape: tuple
    run: object  # fn(ptrs: list[int], y: int) -> None
    keep: list = field(default_factory=list)  # descriptors and arrays to keep alive
    info: dict = field(default_factory=dict)  # what the search chose (algorithm, workspace bytes)
    nbytes: int = 0  # bytes of the result, set by the provider


def itemsize(dtype: str) -> int:
    """Bytes per element of a storage type (f32, f16, bf16)."""
    return dtypes.ALL[dtype].np.itemsize


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n


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


CAPTURE_THREAD_LOCAL = 1  # cudaStreamCaptureModeThreadLocal == hipStreamCaptureModeThreadLocal
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
            rt.raw("get_last_error")()  # clear the error the failed capture left
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
