"""The process-group hook: how a collective op's float64 reference finds the ranks it runs with.

The group itself is the runtime's (rocmc.runtime.distributed: a tensor-parallel run's process group, or
the ranks of `simulate`); importing it installs its `current` here. The frontend asks `current()` and
never imports the runtime: a process that never imported it has no group.
"""

from __future__ import annotations

from typing import Callable

from .errors import DistributedError

OUTSIDE = (
    "a collective op ran outside a tensor-parallel group: load the module with tensor_parallel=N under "
    "`rocmc launch`, or evaluate the ranks with rocmc.runtime.distributed.simulate"
)

_current: Callable | None = None


def install(current: Callable) -> None:
    """Make `current` (no arguments, returns the group of the calling thread) the answer of `current()`."""
    global _current
    _current = current


def current():
    """The group collectives of this thread use (with `rank`, `world_size`, `all_reduce`, `all_gather`);
    DistributedError outside one."""
    if _current is None:
        raise DistributedError(OUTSIDE)
    return _current()
