"""The ctypes binding the DNN and BLAS providers share: a vendor's C functions, declared once in a table.

MIOpen's C API was modelled on cuDNN's legacy API: the same descriptors, the same operations, with
different function names, enum integers and argument orders. A vendor table (miopen.py, cudnn.py)
lists, for each role the shared code needs, the C function and the names of its arguments in C
order, each with its C type (`declared`); `Api.call(role, **named)` puts the named values in that
order and checks the returned status. What differs beyond order (workspace queries, perf-result
layouts, an activation cuDNN lacks) is data in the table too. The library is looked up on the
loader's path and in installed wheels (`load_library`); the device pointers handed to it are read
from IREE buffer views' DLPack capsules (`capsule_address`).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from dataclasses import dataclass, field

from ...errors import DeviceError

P = ctypes.c_void_p
# The C types a table's function declarations name: `"h alpha xD x algo:int ws ws_size:size_t"`
# declares each argument in C order, a pointer unless it says otherwise.
C_TYPES = {
    "ptr": P,
    "int": ctypes.c_int,
    "uint": ctypes.c_uint,
    "bool": ctypes.c_bool,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "i64": ctypes.c_int64,
    "u64": ctypes.c_uint64,
    "size_t": ctypes.c_size_t,
}


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
    status: int | None = None  # offset of a per-record status (cuDNN), None when absent (MIOpen)


@dataclass(frozen=True)
class VendorTable:
    name: str  # "MIOpen", "cuDNN"
    libraries: tuple  # file names tried, in order
    install: str  # how to get the library, for the error message
    functions: dict  # role -> (C function name, "arg names in C order")
    dtypes: dict  # rocmc dtype -> the library's data type enum
    enums: dict  # named enum values the shared code uses
    activations: dict  # op -> (mode, attribute passed as the mode's parameter or None)
    perf: Perf
    search_workspace: int | None  # bytes offered to the search when no query gives a size
    runtime: "RuntimeTable"
    dlpack_device: int  # DLPack device type of the library's device (kDLCUDA 2, kDLROCM 10)
    gate_order: dict = field(default_factory=dict)  # op -> the library's packed gate order ("ifog")
    rnn_weights: str = ""  # how weights enter the library's weight space (see recurrent.py)
    conv_ids: dict = field(default_factory=dict)  # conv tensor role (x, w, y, b) -> the plan API's id
    conv_api: str = ""  # the plan API convolutions run through (for reports)
    last_error: str = ""  # C function describing the last failure: void f(char *msg, size_t size)
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
    raise DeviceError(
        f"{what} not found: looked for {', '.join(names)} on the loader path and in installed wheels; {install}"
    )


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
                raise DeviceError(
                    f"{name}: the library has no {cname} (needed for {role}); install a newer version"
                ) from None
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
        raise DeviceError(
            f"{self.name} {self.functions[role][0]} failed with status {status} {msg}"
            f"{f' ({detail})' if detail else ''}".strip()
        )

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
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


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
