"""What one call of a compiled function asks of the device and the host, read off IREE's HAL program.

A call's cost on a GPU is set as much by how its work is issued as by its kernels: each dispatch is a kernel
launch, each queue submission a trip through the driver, each `hal.fence.await` a host wait for the device
inside the call, and each queue allocation or free (on IREE 3.13's CUDA driver) a host wait too. These are
visible in the HAL stage without running anything, so they can be counted for any target, on any machine.

Counts are static: an op inside a branch or a loop counts once. Dispatches recorded into a memoized command
buffer (built once, replayed by `hal.device.queue.execute.indirect`) are counted for the function that
replays it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

# The HAL ops counted, by what they mean for a call.
_OPS = {
    "dispatches": ("hal.command_buffer.dispatch",),
    "fills": ("hal.command_buffer.fill_buffer",),
    "copies": ("hal.command_buffer.copy_buffer", "hal.device.queue.copy"),
    "submissions": ("hal.device.queue.execute", "hal.device.queue.execute.indirect"),
    "host_waits": ("hal.fence.await",),
    "allocations": ("hal.device.queue.alloca",),
    "frees": ("hal.device.queue.dealloca",),
}
_OP = re.compile(r"(hal\.[a-z_]+\.[a-z_.]+)")
_FUNC = re.compile(r"^  util\.func (?:public |private )?@([\w.$-]+)\(")
_MEMOIZED = re.compile(r"util\.global\.load (?:immutable )?@(__[\w.$-]+_memoize_result_\d+_[\w$-]+)")
_MEMOIZE_SET = re.compile(r"util\.global\.store %[\w#]+, @(__[\w.$-]+_memoize_result_\d+_[\w$-]+)")
_CALL = re.compile(r"util\.call @([\w.$-]+)\(")


@dataclass(frozen=True)
class CallStructure:
    """Per call of one function: kernel launches, buffer fills, copies, queue submissions, host waits inside
    the call, queue allocations and frees."""

    dispatches: int = 0
    fills: int = 0
    copies: int = 0
    submissions: int = 0
    host_waits: int = 0
    allocations: int = 0
    frees: int = 0

    def __sub__(self, other: "CallStructure") -> "CallStructure":
        return CallStructure(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def describe(self) -> str:
        return ", ".join(f"{getattr(self, f.name)} {f.name.replace('_', ' ')}" for f in fields(self))


def call_structure(hal: str) -> dict[str, CallStructure]:
    """{public function: CallStructure} of a module's HAL stage text (`Artifact.ir("hal")`)."""
    bodies, public = _functions(hal)
    builders = _memoized_builders(hal)
    out = {}
    for name in public:
        counts = dict.fromkeys(_OPS, 0)
        for line in _lines_of(name, bodies, builders):
            for op in _OP.findall(line):
                for what, spellings in _OPS.items():
                    if op in spellings:
                        counts[what] += 1
        out[name] = CallStructure(**counts)
    return out


def _functions(hal: str) -> tuple[dict[str, list[str]], list[str]]:
    """{function: its body's lines}, and the public functions in order."""
    bodies: dict[str, list[str]] = {}
    public: list[str] = []
    current = None
    for line in hal.split("\n"):
        m = _FUNC.match(line)
        if m:
            current = m.group(1)
            bodies[current] = []
            if line.startswith("  util.func public"):
                public.append(current)
            continue
        if current is not None and (line == "  }" or line.startswith("  } ")):
            current = None
        elif current is not None:
            bodies[current].append(line)
    return bodies, public


def _memoized_builders(hal: str) -> dict[str, str]:
    """{memoized command buffer global: the function that records it}, from the initializers that store the
    result of a `util.call` of the builder into the global."""
    out: dict[str, str] = {}
    for block in hal.split("util.initializer")[1:]:
        called = _CALL.search(block)
        stored = _MEMOIZE_SET.search(block)
        if called and stored:
            out[stored.group(1)] = called.group(1)
    return out


def _lines_of(name: str, bodies: dict, builders: dict, seen: frozenset = frozenset()) -> list[str]:
    """The lines of a function, with those of the functions it calls and of the command buffers it replays."""
    if name in seen or name not in bodies:
        return []
    lines = list(bodies[name])
    for line in bodies[name]:
        for callee in _CALL.findall(line):
            lines += _lines_of(callee, bodies, builders, seen | {name})
        for buffer in _MEMOIZED.findall(line):
            if buffer in builders:
                lines += _lines_of(builders[buffer], bodies, builders, seen | {name})
    return lines
