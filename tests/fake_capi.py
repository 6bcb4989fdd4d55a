"""A recording stand-in for a provider's library and runtime, to drive the ctypes bindings'
planners (rocmc/runtime/providers) without the library or a GPU.

`FakeCapi` is the provider surface the planners use: its `api` and `rt` are itself, so a planner's
`p.api.call(role, ...)` and `p.rt.call(role, ...)` both reach `call`, which each fake defines (what
it records, what it answers). `bound` and `raw` pass positional arguments under the names the
vendor table declares for the role, in C order; `_out` and `_malloc` are the provider's
out-parameter helpers. Handles, streams and the constants 1 and 0 are the provider's fields.
"""

import collections
import ctypes

from rocmc.runtime.providers.capi import declared


class FakeCapi:
    def __init__(self, table):
        self.table, self.calls = table, []
        self.api = self.rt = self
        self.handle, self.stream, self._next = 7, 8, 100
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.stats = collections.Counter()
        functions = {**table.functions, **table.runtime.functions}
        self._names = {role: [n for n, _ in declared(args)] for role, (_, args) in functions.items()}

    def call(self, role, **named):
        raise NotImplementedError

    def bound(self, role):
        names = self._names[role]
        return lambda *args: self.call(role, **dict(zip(names, args)))

    def raw(self, role):
        names = self._names[role]
        return lambda *args: self.call(role, **dict(zip(names, args))) or 0

    def has(self, role):
        return role in self._names

    def _out(self, ctype, role, rt=False, **kw):
        v = ctype()
        self.call(role, out=ctypes.byref(v), **kw)
        return v.value

    def _malloc(self, nbytes):
        return self._out(ctypes.c_void_p, "malloc", rt=True, size=nbytes)

    def roles(self, role):
        """The arguments of each recorded call of `role`, in order."""
        return [a for r, a in self.calls if r == role]
