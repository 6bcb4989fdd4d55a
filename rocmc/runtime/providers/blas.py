"""The providers of the `blas` role: `blas.matmul` served by hipBLASLt on hip devices and by its twin
cuBLASLt on cuda devices, through one binding driven by a per-vendor table.

hipBLASLt's C API is cuBLASLt's with a `hipblasLt` prefix: the same descriptors (a matmul
descriptor, four matrix layouts, a preference), the same heuristic query and the same
`Matmul(handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, size,
stream)`. What differs is numbers: operation enums (0/1 vs 111/112), compute types (68 vs 2),
attribute ids, the size of the heuristic result record. Each table's values were checked against
the vendor's headers (cuBLAS 12.6.4's cublasLt.h; hipBLASLt's hipblaslt.h of ROCm 6.2 with
hipblas-common.h), see tests/test_blas_table.py.

Both libraries are column-major; rocmc's row-major D = op(A) @ op(B) is computed as the
column-major D^T = op(B)^T @ op(A)^T, so the library's A is the ABI's b and its B the ABI's a, each
read as stored (a transposed operand is a transpose flag, never a copy), and the bias (one value
per row of the library's D) is one per column of rocmc's result, as a linear layer's bias is.

Per (shapes, dtype, flags, alignment) the provider keeps a plan: the descriptors, and the
algorithm it runs. The heuristic's candidates are timed on the real inputs the first time a GEMM
of that kind is seen, and the fastest is kept; GEMMs whose row count falls in the same bucket
(ROW_BUCKET rows, for a symbolic sequence length) reuse the winner without timing again, when the
heuristic offers it for their exact shape. Accumulation is f32 for every storage type, and f32
GEMMs run in full f32 (no TF32), as IREE's own code does. Launches are captured into stream graphs
per set of pointers and replayed (Replays), where the table enables it.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from time import perf_counter

from ...errors import DeviceError
from ...externs import EPILOGUES
from .cudnn import CUDART
from .capi import P
from .dnn import DnnProvider
from .plans import Plan, Replays, _release, itemsize
from .miopen import HIP

HEURISTIC_RESULTS = 8  # candidates asked of the heuristic
MAX_WORKSPACE = 32 << 20  # bytes of workspace an algorithm may use (the provider owns it)
ROW_BUCKET = 64  # rows rounded up to this for reusing a timed winner
TIMING_RUNS = 3


@dataclass(frozen=True)
class Result:
    """Layout of one heuristic result record: the algorithm's bytes at 0, then its workspace size
    (size_t) and its state (0: usable)."""

    size: int
    algo: int
    workspace: int
    state: int


@dataclass(frozen=True)
class BlasTable:
    name: str
    libraries: tuple
    install: str
    functions: dict  # role -> (C function, typed argument declaration), see capi.declared
    runtime: object  # the device runtime's table (CUDA / HIP)
    dlpack_device: int
    dtypes: dict  # rocmc dtype -> the library's data type enum (cudaDataType / hipDataType)
    compute_f32: int  # compute type: f32 accumulation, no reduced-precision shortcuts
    scale_f32: int  # data type of alpha and beta
    op: dict  # "n" / "t" -> operation enum
    desc: dict  # matmul descriptor attribute -> (id, ctypes type of its value)
    layout: dict  # matrix layout attribute -> (id, ctypes type)
    preference: dict  # preference attribute -> (id, ctypes type)
    epilogues: dict  # epilogue (with "bias" prefixed when a bias is fused) -> enum
    result: Result
    last_error: str = ""
    graph_launch: bool = False


def _functions(prefix: str, error_string: str | None) -> dict:
    """The API's functions: the same names after the vendor prefix, the same argument order."""
    f = {
        "create_handle": (f"{prefix}Create", "out"),
        "destroy_handle": (f"{prefix}Destroy", "h"),
        "desc_create": (f"{prefix}MatmulDescCreate", "out compute:int scale:int"),
        "desc_destroy": (f"{prefix}MatmulDescDestroy", "desc"),
        "desc_set": (f"{prefix}MatmulDescSetAttribute", "desc attr:int buf size:size_t"),
        "layout_create": (f"{prefix}MatrixLayoutCreate", "out dtype:int rows:u64 cols:u64 ld:i64"),
        "layout_destroy": (f"{prefix}MatrixLayoutDestroy", "desc"),
        "layout_set": (f"{prefix}MatrixLayoutSetAttribute", "desc attr:int buf size:size_t"),
        "pref_create": (f"{prefix}MatmulPreferenceCreate", "out"),
        "pref_destroy": (f"{prefix}MatmulPreferenceDestroy", "desc"),
        "pref_set": (f"{prefix}MatmulPreferenceSetAttribute", "desc attr:int buf size:size_t"),
        "heuristic": (f"{prefix}MatmulAlgoGetHeuristic", "h desc aD bD cD dD pref requested:int results n_out"),
        "matmul": (f"{prefix}Matmul", "h desc alpha a aD b bD beta c cD d dD algo ws ws_size:size_t stream"),
    }
    if error_string:
        f["error_string"] = (error_string, "status:int")
    return f


_I32, _U32, _I64, _U64 = ctypes.c_int32, ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64
_EPILOGUES = {"none": 1, "relu": 2, "bias": 4, "bias+relu": 6, "gelu_tanh": 32, "bias+gelu_tanh": 36}

CUBLASLT = BlasTable(
    name="cuBLASLt",
    libraries=("libcublasLt.so.12", "libcublasLt.so.13", "libcublasLt.so"),
    install="install cuBLAS (`pip install nvidia-cublas-cu12`, or a PyTorch wheel that ships it)",
    functions=_functions("cublasLt", "cublasLtGetStatusString"),
    runtime=CUDART,
    dlpack_device=2,
    dtypes={"f32": 0, "f16": 2, "bf16": 14},  # cudaDataType_t
    compute_f32=68,
    scale_f32=0,  # CUBLAS_COMPUTE_32F, CUDA_R_32F
    op={"n": 0, "t": 1},  # cublasOperation_t
    desc={"transa": (3, _I32), "transb": (4, _I32), "epilogue": (7, _U32), "bias_pointer": (8, P)},
    layout={"batch_count": (5, _I32), "batch_offset": (6, _I64)},
    preference={
        "max_workspace": (1, _U64),
        "align_a": (5, _U32),
        "align_b": (6, _U32),
        "align_c": (7, _U32),
        "align_d": (8, _U32),
    },
    epilogues=_EPILOGUES,
    result=Result(size=96, algo=0, workspace=64, state=72),
    graph_launch=True,
)

# libhipblaslt exports no status-to-string function (hipblasStatusToString is libhipblas's).
HIPBLASLT = BlasTable(
    name="hipBLASLt",
    libraries=("libhipblaslt.so.0", "libhipblaslt.so"),
    install="install hipBLASLt (ROCm's `hipblaslt` package, usually /opt/rocm/lib)",
    functions=_functions("hipblasLt", None),
    runtime=HIP,
    dlpack_device=10,
    dtypes={"f32": 0, "f16": 2, "bf16": 14},  # hipDataType
    compute_f32=2,
    scale_f32=0,  # HIPBLAS_COMPUTE_32F, HIP_R_32F
    op={"n": 111, "t": 112},  # hipblasOperation_t
    desc={"transa": (0, _I32), "transb": (1, _I32), "epilogue": (2, _U32), "bias_pointer": (3, P)},
    layout={"batch_count": (0, _I32), "batch_offset": (1, _I64)},
    preference={"max_workspace": (1, _U64)},
    epilogues=_EPILOGUES,
    result=Result(size=56, algo=0, workspace=24, state=32),
)


@dataclass(frozen=True)
class Gemm:
    """One call in the library's column-major terms (module docstring): D (n x m) = op(A) @ op(B),
    A the ABI's b, B the ABI's a, over `batch` matrices."""

    m: int
    n: int
    k: int
    batch: int
    trans_a: bool  # the ABI's transpose_a
    trans_b: bool
    a_batched: bool  # the ABI's a has the batch (else one matrix broadcast)
    b_batched: bool
    bias: bool
    epilogue: str
    dtype: str
    alpha: float = 1.0

    @staticmethod
    def of(dtype: str, shapes, attrs) -> "Gemm":
        (ba, ra, ca), (bb, rb, cb), (nbias,) = shapes
        ta, tb = bool(attrs["transpose_a"]), bool(attrs["transpose_b"])
        m, k = (ca, ra) if ta else (ra, ca)
        kb, n = (cb, rb) if tb else (rb, cb)
        batch = max(ba, bb)
        if k != kb or {ba, bb} - {1, batch} or nbias not in (0, n) or not 0 <= attrs["epilogue"] < len(EPILOGUES):
            raise DeviceError(
                f"matmul: operands {shapes} (transpose_a={ta}, transpose_b={tb}, epilogue "
                f"{attrs['epilogue']}) do not form a GEMM; the module was not built by this rocmc"
            )
        return Gemm(
            m,
            n,
            k,
            batch,
            ta,
            tb,
            ba == batch,
            bb == batch,
            nbias > 0,
            EPILOGUES[attrs["epilogue"]],
            dtype,
            attrs["alpha"],
        )

    @property
    def out_shape(self) -> tuple:
        return (self.batch, self.m, self.n)

    def bucket(self, align: int) -> tuple:
        """The key a timed winner is reused under: the rows rounded up to ROW_BUCKET."""
        rows = -(-self.m // ROW_BUCKET) * ROW_BUCKET
        return (
            self.dtype,
            self.batch,
            rows,
            self.n,
            self.k,
            self.trans_a,
            self.trans_b,
            self.a_batched,
            self.b_batched,
            self.bias,
            self.epilogue,
            self.alpha,
            align,
        )


class _Descriptors:
    """The matmul descriptor, the four layouts and the preference of one Gemm, destroyed with the plan."""

    def __init__(self, p: "BlasProvider", g: Gemm, align: int, keep: list):
        t, self.p = p.table, p
        self.desc = self._make("desc_create", "desc_destroy", keep, compute=t.compute_f32, scale=t.scale_f32)
        self._set("desc_set", self.desc, t.desc, "transa", t.op["t" if g.trans_b else "n"])
        self._set("desc_set", self.desc, t.desc, "transb", t.op["t" if g.trans_a else "n"])
        epilogue = g.epilogue
        if g.bias:
            epilogue = "bias" if epilogue == "none" else f"bias+{epilogue}"
        self._set("desc_set", self.desc, t.desc, "epilogue", t.epilogues[epilogue])
        elt = t.dtypes[g.dtype]
        # Library A = the ABI's b as stored: (k x n, ld k) when transposed, else (n x k, ld n).
        self.a = self._layout(keep, elt, *((g.k, g.n) if g.trans_b else (g.n, g.k)), g.batch, g.n * g.k * g.b_batched)
        # Library B = the ABI's a: (m x k, ld m) when transposed, else (k x m, ld k).
        self.b = self._layout(keep, elt, *((g.m, g.k) if g.trans_a else (g.k, g.m)), g.batch, g.m * g.k * g.a_batched)
        self.d = self._layout(keep, elt, g.n, g.m, g.batch, g.m * g.n)
        self.pref = self._make("pref_create", "pref_destroy", keep)
        self._set("pref_set", self.pref, t.preference, "max_workspace", MAX_WORKSPACE)
        for role in ("align_a", "align_b", "align_c", "align_d"):
            if role in t.preference:  # where the library assumes more alignment than the buffers have
                self._set("pref_set", self.pref, t.preference, role, align)

    def _make(self, create, destroy, keep, **kw):
        d = self.p._out(P, create, **kw)
        keep.append((destroy, d))
        return d

    def _set(self, role, obj, attrs, name, value):
        attr, ctype = attrs[name]
        v = ctype(value)
        self.p.api.call(role, desc=obj, attr=attr, buf=ctypes.byref(v), size=ctypes.sizeof(v))

    def set_bias(self, ptr):
        self._set("desc_set", self.desc, self.p.table.desc, "bias_pointer", ptr)

    def _layout(self, keep, elt, rows, cols, batch, stride):
        d = self._make("layout_create", "layout_destroy", keep, dtype=elt, rows=rows, cols=cols, ld=rows)
        if batch > 1:
            self._set("layout_set", d, self.p.table.layout, "batch_count", batch)
            self._set("layout_set", d, self.p.table.layout, "batch_offset", stride)
        return d


def _candidates(p: "BlasProvider", ds: _Descriptors) -> list:
    """The heuristic's usable algorithms as (algorithm record, workspace bytes)."""
    r = p.table.result
    records = (ctypes.c_byte * (r.size * HEURISTIC_RESULTS))()
    count = ctypes.c_int()
    p.api.call(
        "heuristic",
        h=p.handle,
        desc=ds.desc,
        aD=ds.a,
        bD=ds.b,
        cD=ds.d,
        dD=ds.d,
        pref=ds.pref,
        requested=HEURISTIC_RESULTS,
        results=records,
        n_out=ctypes.byref(count),
    )
    out = []
    for i in range(count.value):
        base = ctypes.addressof(records) + i * r.size
        if ctypes.c_int.from_address(base + r.state).value == 0:
            algo = (ctypes.c_byte * r.size)()
            ctypes.memmove(algo, base, r.size)
            out.append((algo, ctypes.c_size_t.from_address(base + r.workspace).value))
    return out


def _alignment(g: Gemm, ptrs, cap: int) -> int:
    """The byte alignment the library may assume of every matrix it reads or writes: of the base
    pointers, and of each row (the leading dimensions) and each batch matrix (the batch strides) from
    there. With an odd length, such as an attention's 513 keys, rows and batch matrices start at 2-byte
    offsets; an alignment hint of 16 then lets the library pick vector loads that fault."""
    item = itemsize(g.dtype)
    lds = [g.k if g.trans_b else g.n, g.m if g.trans_a else g.k, g.n]
    strides = [g.n * g.k * g.b_batched, g.m * g.k * g.a_batched, g.m * g.n] if g.batch > 1 else []
    sizes = [q for q in ptrs if q] + [x * item for x in lds + strides if x]
    return min([cap] + [x & -x for x in sizes])


def _gemm_plan(p: "BlasProvider", op, dtype, shapes, attrs, ptrs) -> Plan:
    g = Gemm.of(dtype, shapes, attrs)
    keep: list = []
    if g.m * g.n * g.batch == 0:
        return Plan(g.out_shape, lambda ptrs, y: None, keep, {"algo": "empty result"})
    if g.k == 0:
        raise DeviceError(f"{p.table.name}: matmul with K=0 ({shapes}); compile it with impl={{'matmul': 'generated'}}")
    align = _alignment(g, ptrs, p.alignment_cap)
    try:
        ds = _Descriptors(p, g, align, keep)
        if g.bias:
            ds.set_bias(ptrs[2])  # the heuristic reads the bias pointer's alignment
        found = _candidates(p, ds)
        if not found:
            raise DeviceError(
                f"{p.table.name} has no algorithm for a {dtype} GEMM of {g.batch} x ({g.m} x {g.k}) @ "
                f"({g.k} x {g.n}) on this device; compile it with impl={{'matmul': 'generated'}}"
            )
        algo, need, timed = _choose(p, g, ds, found, ptrs, align)
    except Exception:
        _release(p, keep)
        raise
    keep.append(algo)
    launch = _launcher(p, g, ds, algo, need)
    replays = Replays(p, launch) if p.table.graph_launch else None
    if replays is not None:
        keep.append(replays)
    start = replays or launch

    def run(ptrs, y):
        start((ptrs[0], ptrs[1], ptrs[2] if g.bias else None, y, p.workspace(need) if need else None))

    info = {
        "api": f"{p.table.name} matmul",
        "candidates": len(found),
        "workspace": need,
        "timed": timed,
        "graph_launch": replays is not None,
    }
    return Plan(g.out_shape, run, keep, info)


def _launcher(p: "BlasProvider", g: Gemm, ds: _Descriptors, algo, need: int):
    matmul, handle, stream = p.api.bound("matmul"), p.handle, p.stream
    scale = ctypes.c_float(g.alpha)
    alpha, beta = ctypes.byref(scale), ctypes.byref(p.zero)
    desc, a_d, b_d, d_d = ds.desc, ds.a, ds.b, ds.d
    size = need

    def launch(key):
        """key: the ABI's a, b, bias (or None), the result, the workspace (or None)."""
        a, b, bias, y, ws = key
        if bias is not None:
            ds.set_bias(bias)
        # library A = the ABI's b, library B = the ABI's a; C = D (beta 0)
        matmul(handle, desc, alpha, b, a_d, a, b_d, beta, y, d_d, y, d_d, algo, ws, size if ws else 0, stream)

    return launch


def _choose(p: "BlasProvider", g: Gemm, ds: _Descriptors, found: list, ptrs, align: int):
    """The algorithm to keep: the bucket's timed winner where the heuristic offers it, else the
    fastest of the candidates on the real inputs (timed once per bucket)."""
    key = g.bucket(align)
    winner = p.winners.get(key)
    if winner is not None:
        for algo, need in found:
            if bytes(algo) == winner:
                return algo, need, False
    if len(found) == 1:
        return found[0][0], found[0][1], False
    scratch = p._malloc(g.batch * g.m * g.n * itemsize(g.dtype))
    try:
        times = []
        for algo, need in found:
            launch = _launcher(p, g, ds, algo, need)
            key_ptrs = (ptrs[0], ptrs[1], ptrs[2] if g.bias else None, scratch, p.workspace(need) if need else None)
            try:
                launch(key_ptrs)  # warm-up (and a check that the algorithm runs at all)
                p._sync(p.stream)
            except DeviceError:
                continue
            t0 = perf_counter()
            for _ in range(TIMING_RUNS):
                launch(key_ptrs)
            p._sync(p.stream)
            times.append((perf_counter() - t0, len(times), algo, need))
    finally:
        p.rt.call("free", ptr=scratch)
    if not times:
        raise DeviceError(f"{p.table.name}: none of the heuristic's {len(found)} algorithms ran for this GEMM")
    best, _, algo, need = min(times, key=lambda t: (t[0], t[1]))
    p.timings[key] = [round(t[0] / TIMING_RUNS * 1e6, 1) for t in times]
    if len(p.winners) >= 1024:
        p.winners.pop(next(iter(p.winners)))
    p.winners[key] = bytes(algo)
    return algo, need, True


class BlasProvider(DnnProvider):
    table: BlasTable
    planners = {"matmul": _gemm_plan}

    def __init__(self, hal_device, device_name: str):
        self.winners: dict = {}  # bucket -> bytes of the timed winner's algorithm record
        self.timings: dict = {}  # bucket -> microseconds per launch of each candidate timed
        super().__init__(hal_device, device_name)


class CublasLtProvider(BlasProvider):
    table = CUBLASLT
    exportable_hint = (
        "open the device with rocmc.runtime.providers.cudnn.prepare_cuda() before loading, "
        "or call iree.runtime.flags.parse_flags('--cuda_async_allocations=false') before the "
        "first cuda device is opened"
    )


class HipblasLtProvider(BlasProvider):
    table = HIPBLASLT
    exportable_hint = (
        "call iree.runtime.flags.parse_flags('--hip_async_allocations=false') before the first hip device is opened"
    )
