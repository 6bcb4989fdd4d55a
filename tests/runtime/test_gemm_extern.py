"""The `blas` GEMM implementation: the size rule, the lowering run end to end through the numpy
reference provider, the imports compiled for ROCm and CUDA, and the cuBLASLt / hipBLASLt binding
driven against a recording fake of the library that computes what the library would, column-major."""

import ctypes
import re

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.externs import BLAS, EPILOGUES
from rocmc.lowering import registry
from rocmc.lowering.blas import MIN_COLS, MIN_ROWS
from rocmc.lowering.target import Target
from rocmc.runtime.providers import blas
from rocmc.runtime.providers.capi import declared
from rocmc.runtime.providers.reference import OPS

from fake_capi import FakeCapi
from helpers import rand
from test_extern import _dump_imports

GEMM = {"matmul": "blas", "linear": "blas"}


def _ref_matmul(a, b, ta, tb):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.matmul(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b)


def _tol(dtype):
    return {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}[dtype]


def _close(got, want, dtype):
    got = np.asarray(got).astype(np.float64)
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
    assert err < _tol(dtype), err


def _externs(art):
    return [x for x in art.metadata["externs"] if x["library"] == "blas"]


# ---- the lowering, run through the reference provider on the CPU ----------------------------------


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_batched_matmul_with_transposes_and_symbolic_rows(rng, dtype, ta, tb):
    g = rocmc.Graph("mm")
    a = g.input("a", (3, 7, "m") if ta else (3, "m", 7), dtype)
    b = g.input("b", (9, 7) if tb else (7, 9), dtype)  # one matrix broadcast over the batch
    g.output(ops.matmul(a, b, transpose_a=ta, transpose_b=tb))
    art = rocmc.compile(g, "cpu", impl=GEMM)
    assert [x["import"] for x in _externs(art)] == ["blas.matmul" + ("" if dtype == "f32" else f".{dtype}")]
    mod = rocmc.load(art)
    for m in (1, 5, 13):
        av = rand(rng, (3, 7, m) if ta else (3, m, 7), dtype)
        bv = rand(rng, (9, 7) if tb else (7, 9), dtype)
        _close(mod(av, bv), _ref_matmul(av, bv, ta, tb), dtype)


def test_matmul_batches_on_both_sides_and_attention_shapes(rng):
    g = rocmc.Graph("scores")
    q = g.input("q", (2, 3, "s", 16), "f16")
    k = g.input("k", (2, 3, "s", 16), "f16")
    v = g.input("v", (2, 3, "s", 16), "f16")
    g.output(ops.matmul(ops.matmul(q, k, transpose_b=True), v))
    art = rocmc.compile(g, "cpu", impl=GEMM)
    assert len(_externs(art)) == 2
    qv, kv, vv = (rand(rng, (2, 3, 11, 16), "f16") for _ in range(3))
    want = _ref_matmul(_ref_matmul(qv, kv, False, True).astype(np.float16), vv, False, False)
    _close(rocmc.load(art)(qv, kv, vv), want, "f16")


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_linear_with_bias_over_symbolic_leading_dims(rng, dtype):
    g = rocmc.Graph("lin")
    x = g.input("x", ("batch", "seq", 24), dtype)
    w = rand(rng, (37, 24), dtype)
    bias = rand(rng, (37,), dtype)
    g.output(ops.linear(x, w, bias))
    art = rocmc.compile(g, "cpu", impl=GEMM)
    (call,) = _externs(art)
    assert call["op"] == "linear" and call["node"] in art.summary()
    mod = rocmc.load(art)
    for shape in ((2, 5, 24), (1, 1, 24), (3, 17, 24)):
        xv = rand(rng, shape, dtype)
        _close(mod(xv), xv.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64), dtype)


def test_linear_weights_as_inputs_are_passed_transposed_not_copied(rng):
    g = rocmc.Graph("lin")
    x = g.input("x", ("n", 16), "f32")
    w = g.input("w", (20, 16), "f32")
    g.output(ops.linear(x, w))
    art = rocmc.compile(g, "cpu", impl=GEMM)
    text = art.ir("input")
    assert "linalg.transpose" not in text and "blas.matmul" in text
    xv, wv = rand(rng, (70, 16), "f32"), rand(rng, (20, 16), "f32")
    _close(rocmc.load(art)(xv, wv), xv.astype(np.float64) @ wv.astype(np.float64).T, "f32")


# ---- when the library is called ---------------------------------------------------------------------


def _node(g, op):
    return next(n for n in g.nodes if n.op == op)


def _linear_graph(rows, n=128, k=128, dtype="f16"):
    g = rocmc.Graph("lin")
    x = g.input("x", (rows, k), dtype)
    g.output(ops.linear(x, np.ones((n, k), np.float32).astype(rocmc.dtype(dtype).np)))
    return g


@pytest.mark.parametrize("target", ["gfx942", "cuda:sm_80"])
def test_size_rule_keeps_small_gemms_generated_and_says_why(target):
    # f32: the few-row kernel (linear_rows: f16/bf16, 2-32 static rows, default on GPUs) does not take them
    small, big = _linear_graph(MIN_ROWS - 1, dtype="f32"), _linear_graph(MIN_ROWS, dtype="f32")
    symbolic = _linear_graph("seq")
    t = Target.parse(target)
    lib = ("blas",)
    # where it does, it comes before the library (a synchronous call per GEMM would cost a decode step more)
    assert registry.choose(_node(_linear_graph(MIN_ROWS), "linear"), t, libraries=lib).impl.name == "kernel"
    assert registry.choose(_node(big, "linear"), t).impl.name == "generated"  # opt-in
    assert registry.choose(_node(big, "linear"), t, libraries=lib).impl.name == "blas"
    assert registry.choose(_node(symbolic, "linear"), t, libraries=lib).impl.name == "blas"
    choice = registry.choose(_node(small, "linear"), t, libraries=lib)
    assert choice.impl.name == "generated"
    assert any(n == "blas" and f"M={MIN_ROWS - 1} rows" in r for n, r in choice.skipped)
    narrow = registry.choose(_node(_linear_graph(512, n=MIN_COLS - 1), "linear"), t, libraries=lib)
    # passed over by the library, the N-row GEMM is linear_mm's on NVIDIA (its default there), IREE's on ROCm
    assert narrow.impl.name == ("kernel" if t.kind == "cuda" else "generated")
    assert any(n == "blas" and "N=" in r for n, r in narrow.skipped)
    # asked for by name, the size rule does not apply; impl="generated" turns the library off
    assert registry.choose(_node(small, "linear"), t, impl={"linear": "blas"}).impl.name == "blas"
    assert registry.choose(_node(big, "linear"), t, impl="generated").impl.name == "generated"


def test_summary_lists_the_gemms_passed_over_with_the_reason():
    # f32: the decode projection kernels (ahead of the library, f16/bf16 only) take neither.
    g = rocmc.Graph("two")
    x = g.input("x", ("seq", 64), "f32")
    x1 = g.input("x1", (1, 64), "f32")
    w = np.ones((96, 64), np.float32)
    g.output(ops.linear(x, w))
    g.output(ops.linear(x1, w))
    summary = rocmc.compile(g, "gfx942", libraries=["blas"]).summary()
    assert re.search(r"blas\.matmul +extern call +blas", summary)
    passed = summary.split("passed over:")[1]
    assert "linear" in passed and f"M=1 rows, below the {MIN_ROWS}-row rule" in passed


def test_what_the_library_cannot_take_stays_generated():
    t = Target.parse("gfx942")
    g = rocmc.Graph("ints")
    a = g.input("a", (128, 128), "i32")
    g.output(ops.matmul(a, a))
    assert "dtype i32" in registry.choose(_node(g, "matmul"), t, impl=GEMM).skipped[0][1]
    g = rocmc.Graph("partial")
    a = g.input("a", (4, 1, 128, 64), "f16")
    b = g.input("b", (1, 3, 64, 128), "f16")
    g.output(ops.matmul(a, b))
    choice = registry.choose(_node(g, "matmul"), t, impl=GEMM)
    assert choice.impl.name == "generated" and "broadcasts part of the batch" in choice.skipped[0][1]


@pytest.mark.parametrize("target", ["gfx90a", "gfx942", "gfx1100", "cuda:sm_80"])
def test_gemm_imports_compile_for_gpu_targets(tmp_path, target):
    g = rocmc.Graph("blk")
    x = g.input("x", ("seq", 256), "f16")
    h = ops.linear(x, np.full((512, 256), 0.01, np.float16), np.zeros(512, np.float16))
    g.output(ops.matmul(h, np.full((512, 128), 0.01, np.float16)))
    art = rocmc.compile(g, target, libraries=["blas"])
    imports = dict(re.findall(r"vm\.import @(blas\.[\w.]+) cconv \"(\w+)\"", _dump_imports(art.vmfb, tmp_path)))
    assert imports == {"blas.matmul.f16": BLAS.signatures["matmul"].cconv} == {"blas.matmul.f16": "0rrrIIII_r"}
    assert {x["node"] for x in _externs(art)} == {
        f"%{n.outputs[0].id}" for n in g.nodes if n.op in ("linear", "matmul")
    }


def test_modules_without_the_format_key_still_load_as_dnn_calls(rng):
    """Modules saved before extern calls named their library (format 1, imports `miopen.<op>`) keep loading."""
    from rocmc.runtime.providers import library_of

    assert library_of({"import": "miopen.relu"}, 1) == "dnn"
    assert library_of({"import": "hipblaslt.matmul", "library": "hipblaslt"}, 2) == "blas"
    assert library_of({"import": "blas.matmul", "library": "blas"}, 3) == "blas"
    g = rocmc.Graph("r")
    x = g.input("x", (5,), "f32")
    g.output(ops.relu(x))
    art = rocmc.compile(g, "cpu", libraries=["dnn"])
    meta = dict(art.metadata)
    meta.pop("format")
    meta["externs"] = [
        {**{k: v for k, v in e.items() if k != "library"}, "import": "miopen.relu"} for e in meta["externs"]
    ]
    from rocmc.runtime.providers import modules_for

    mods = modules_for(meta["externs"], rocmc.runtime.get_device("local-task"), "local-task", None, 1)
    assert len(mods) == 1


def test_an_unknown_library_is_refused_at_load():
    from rocmc.runtime.providers import modules_for

    bad = [
        {
            "node": "%4",
            "op": "linear",
            "import": "rocblas.gemm",
            "impl": "rocblas",
            "library": "rocblas",
            "dtype": "f32",
        }
    ]
    with pytest.raises(rocmc.DeviceError, match=r"%4: unknown extern import 'rocblas.gemm'"):
        modules_for(bad, rocmc.runtime.get_device("local-task"), "local-task", None)


# ---- the binding, against a fake library -------------------------------------------------------------


class _FakeBlas(FakeCapi):
    """Stands in for a provider's library and runtime: records every call by role and argument name
    (as the table declares them) and computes a Matmul from host memory the way a column-major
    BLAS does, reading the descriptors' attributes by the table's ids and types."""

    def __init__(self, table):
        super().__init__(table)
        self.objects, self.buffers = {}, {}
        self.winners, self.timings, self.alignment_cap = {}, {}, 16
        self._sync = lambda stream: None
        self.capturing, self.graphs = None, {}

    def call(self, role, **named):
        assert set(named) <= set(self._names[role]), (role, named)
        self.calls.append((role, dict(named)))
        getattr(self, "_on_" + role, lambda **kw: None)(**named)

    def workspace(self, nbytes):
        return self._malloc(nbytes)

    # the library
    def _new(self, out, kind, **attrs):
        self._next += 1
        self.objects[self._next] = {"kind": kind, **attrs}
        out._obj.value = self._next

    def _on_desc_create(self, out, compute, scale):
        assert (compute, scale) == (self.table.compute_f32, self.table.scale_f32)
        self._new(out, "desc")

    def _on_layout_create(self, out, dtype, rows, cols, ld):
        self._new(out, "layout", dtype=dtype, rows=rows, cols=cols, ld=ld, batch_count=1, batch_offset=0)

    def _on_pref_create(self, out):
        self._new(out, "pref")

    def _set(self, attrs, desc, attr, buf, size):
        name = next(n for n, (i, _) in attrs.items() if i == attr)
        ctype = attrs[name][1]
        assert size == ctypes.sizeof(ctype)
        self.objects[desc][name] = ctype.from_address(ctypes.addressof(buf._obj)).value

    def _on_desc_set(self, desc, attr, buf, size):
        self._set(self.table.desc, desc, attr, buf, size)

    def _on_layout_set(self, desc, attr, buf, size):
        self._set(self.table.layout, desc, attr, buf, size)

    def _on_pref_set(self, desc, attr, buf, size):
        self._set(self.table.preference, desc, attr, buf, size)

    def _on_heuristic(self, h, desc, aD, bD, cD, dD, pref, requested, results, n_out):
        # the alignment the library may assume of every matrix (cuBLASLt's default is 256 bytes)
        self.promised = min(
            [
                self.objects[pref].get(k, 256)
                for k in ("align_a", "align_b", "align_c", "align_d")
                if k in self.table.preference
            ]
            or [1]
        )
        r = self.table.result
        base = ctypes.addressof(results)
        for i, ws in enumerate((0, 4096)):  # two algorithms, the second needing a workspace
            rec = base + i * r.size
            ctypes.c_byte.from_address(rec + r.algo).value = i + 1
            ctypes.c_size_t.from_address(rec + r.workspace).value = ws
            ctypes.c_int.from_address(rec + r.state).value = 0
        n_out._obj.value = 2

    def _on_malloc(self, out, size):
        buf = ctypes.create_string_buffer(size)
        self.buffers[ctypes.addressof(buf)] = buf
        out._obj.value = ctypes.addressof(buf)

    def _on_free(self, ptr):
        self.buffers.pop(ptr)

    def _aligned(self, layout, ptr, item):
        """Every column (row of the row-major matrix) of every batch matrix starts where promised."""
        lay = self.objects[layout]
        starts = [
            ptr + (i * lay["batch_offset"] + c * lay["ld"]) * item
            for i in range(lay["batch_count"])
            for c in range(lay["cols"])
        ]
        bad = [s for s in starts if s % self.promised]
        assert not bad, f"a matrix starts at {bad[0]:#x}, not {self.promised}-byte aligned as promised"

    def _read(self, layout, ptr, np_dtype):
        lay = self.objects[layout]
        rows, cols, ld, batch, stride = (lay[k] for k in ("rows", "cols", "ld", "batch_count", "batch_offset"))
        item = np.dtype(np_dtype).itemsize
        self._aligned(layout, ptr, item)
        n = ((batch - 1) * stride + (cols - 1) * ld + rows) * item
        flat = np.frombuffer((ctypes.c_byte * n).from_address(ptr), np_dtype)
        return np.stack(
            [flat[i * stride + np.arange(cols)[None, :] * ld + np.arange(rows)[:, None]] for i in range(batch)]
        ).astype(np.float64)

    # stream capture: launches are recorded into a graph and run when it is launched
    def _on_capture_begin(self, stream, capture_mode):
        self.capturing = []

    def _on_capture_end(self, stream, out):
        self._next += 1
        self.graphs[self._next], self.capturing = self.capturing, None
        out._obj.value = self._next

    def _on_graph_instantiate(self, out, graph, flags):
        self._next += 1
        self.graphs[self._next] = self.graphs[graph]
        out._obj.value = self._next

    def _on_graph_launch(self, exec, stream):
        for kw in self.graphs[exec]:
            self._run_matmul(**kw)

    def _on_matmul(self, **kw):
        if self.capturing is not None:
            self.capturing.append(kw)
        else:
            self._run_matmul(**kw)

    def _run_matmul(self, h, desc, alpha, a, aD, b, bD, beta, c, cD, d, dD, algo, ws, ws_size, stream):
        t, dsc = self.table, self.objects[desc]
        assert c == d and cD == dD and ctypes.c_float.from_address(ctypes.addressof(beta._obj)).value == 0.0
        np_dtype = {v: rocmc.dtype(k).np for k, v in t.dtypes.items()}[self.objects[dD]["dtype"]]
        op = {v: k for k, v in t.op.items()}
        A, B = self._read(aD, a, np_dtype), self._read(bD, b, np_dtype)
        A = np.swapaxes(A, 1, 2) if op[dsc.get("transa", t.op["n"])] == "t" else A
        B = np.swapaxes(B, 1, 2) if op[dsc.get("transb", t.op["n"])] == "t" else B
        D = ctypes.c_float.from_address(ctypes.addressof(alpha._obj)).value * (A @ B)
        epilogue = {v: k for k, v in t.epilogues.items()}[dsc.get("epilogue", t.epilogues["none"])]
        if epilogue.startswith("bias"):
            nb = D.shape[1]
            D = (
                D
                + np.frombuffer(
                    (ctypes.c_byte * (nb * np.dtype(np_dtype).itemsize)).from_address(dsc["bias_pointer"]), np_dtype
                ).astype(np.float64)[None, :, None]
            )
        act = epilogue.split("+")[-1]
        D = OPS["matmul"](
            [np.swapaxes(D, 1, 2), np.eye(D.shape[1]), np.zeros(0)],
            {
                "transpose_a": 0,
                "transpose_b": 0,
                "alpha": 1.0,
                "epilogue": EPILOGUES.index(act if act in EPILOGUES else "none"),
            },
        )
        D = np.swapaxes(D, 1, 2)
        lay = self.objects[dD]
        self._aligned(dD, d, np.dtype(np_dtype).itemsize)
        for i in range(lay["batch_count"]):
            out = np.frombuffer(
                (ctypes.c_byte * (lay["rows"] * lay["cols"] * np.dtype(np_dtype).itemsize)).from_address(
                    d + i * lay["batch_offset"] * np.dtype(np_dtype).itemsize
                ),
                np_dtype,
            )
            out[:] = D[i].T.reshape(-1).astype(np_dtype)  # column-major: columns one after another


@pytest.mark.parametrize("table", [blas.CUBLASLT, blas.HIPBLASLT], ids=["cublaslt", "hipblaslt"])
@pytest.mark.parametrize(
    "case",
    [
        # (batch_a, batch_b, m, n, k, transpose_a, transpose_b, bias, epilogue, dtype)
        (1, 1, 70, 33, 48, False, True, True, "none", "f32"),  # linear: x @ W^T + b
        (3, 1, 19, 24, 10, False, False, False, "none", "f16"),  # a batch over one matrix
        (1, 4, 9, 5, 12, True, False, False, "relu", "f32"),
        (2, 2, 6, 11, 7, True, True, True, "gelu_tanh", "f32"),
        (2, 2, 6, 11, 7, False, True, True, "relu", "bf16"),
        (3, 3, 13, 17, 513, False, True, False, "none", "f16"),  # attention-like: odd rows and batch strides
    ],
    ids=lambda c: "-".join(map(str, c)),
)
def test_binding_computes_the_row_major_gemm(rng, table, case):
    ba, bb, m, n, k, ta, tb, has_bias, epilogue, dtype = case
    f = _FakeBlas(table)
    a = rand(rng, (ba, k, m) if ta else (ba, m, k), dtype)
    b = rand(rng, (bb, n, k) if tb else (bb, k, n), dtype)
    bias = rand(rng, (n,), dtype) if has_bias else np.zeros(0, rocmc.dtype(dtype).np)
    attrs = {"transpose_a": int(ta), "transpose_b": int(tb), "epilogue": EPILOGUES.index(epilogue), "alpha": 0.75}
    ptrs = [a.ctypes.data, b.ctypes.data, bias.ctypes.data if has_bias else None]
    plan = blas._gemm_plan(f, "matmul", dtype, [a.shape, b.shape, bias.shape], attrs, ptrs)
    batch = max(ba, bb)
    assert plan.out_shape == (batch, m, n) and plan.info["timed"] and plan.info["candidates"] == 2
    y = np.full((batch, m, n), np.nan, rocmc.dtype(dtype).np)
    plan.run(ptrs, y.ctypes.data)
    want = OPS["matmul"]([a.astype(np.float64), b.astype(np.float64), bias.astype(np.float64)], attrs)
    _close(y, want, dtype)
    # the library's A is the ABI's b, with the ABI's transpose_b as its own transa
    desc = next(o for o in f.objects.values() if o["kind"] == "desc")
    assert desc["transa"] == table.op["t" if tb else "n"] and desc["transb"] == table.op["t" if ta else "n"]
    if "align_a" in table.preference:
        assert any(o.get("align_a") for o in f.objects.values() if o["kind"] == "pref")


def test_binding_reuses_a_timed_winner_within_a_row_bucket(rng):
    f = _FakeBlas(blas.CUBLASLT)
    attrs = {"transpose_a": 0, "transpose_b": 1, "epilogue": 0, "alpha": 1.0}

    def plan(m):
        a, b = rand(rng, (1, m, 32), "f16"), rand(rng, (1, 40, 32), "f16")
        return blas._gemm_plan(
            f, "matmul", "f16", [a.shape, b.shape, (0,)], attrs, [a.ctypes.data, b.ctypes.data, None]
        )

    assert plan(100).info["timed"]
    assert not plan(120).info["timed"]  # same 128-row bucket: the winner is reused
    assert plan(200).info["timed"]


def test_binding_refuses_what_is_not_a_gemm_and_an_empty_heuristic(rng):
    f = _FakeBlas(blas.CUBLASLT)
    attrs = {"transpose_a": 0, "transpose_b": 0, "epilogue": 0, "alpha": 1.0}
    with pytest.raises(rocmc.DeviceError, match="do not form a GEMM"):
        blas._gemm_plan(f, "matmul", "f32", [(1, 4, 5), (1, 6, 7), (0,)], attrs, [1 << 20, 1 << 20, None])
    f._on_heuristic = lambda **kw: None  # the library answers with no algorithm
    a = rand(rng, (1, 4, 5), "f32")
    with pytest.raises(rocmc.DeviceError, match=r"cuBLASLt has no algorithm .* impl=\{'matmul': 'generated'\}"):
        blas._gemm_plan(f, "matmul", "f32", [(1, 4, 5), (1, 5, 7), (0,)], attrs, [a.ctypes.data, a.ctypes.data, None])
    made = [o for o in f.objects if f.objects[o]["kind"] in ("desc", "layout", "pref")]
    destroyed = [kw["desc"] for r, kw in f.calls if r.endswith("_destroy")]
    assert sorted(destroyed) == sorted(made)  # what a failed plan made is released


def test_binding_tables_follow_the_headers():
    """Record sizes and offsets of the heuristic result as the headers' structs lay them out
    (cublasLt.h of cuBLAS 12.6.4; hipblaslt.h of ROCm 6.2), and the prefixes of the function names."""

    class CuAlgo(ctypes.Structure):
        _fields_ = [("data", ctypes.c_uint64 * 8)]

    class HipAlgo(ctypes.Structure):
        _fields_ = [("data", ctypes.c_uint8 * 16), ("max_workspace_bytes", ctypes.c_size_t)]

    def result(algo):
        class R(ctypes.Structure):
            _fields_ = [
                ("algo", algo),
                ("workspaceSize", ctypes.c_size_t),
                ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float),
                ("reserved", ctypes.c_int * 4),
            ]

        return blas.Result(ctypes.sizeof(R), R.algo.offset, R.workspaceSize.offset, R.state.offset)

    assert blas.CUBLASLT.result == result(CuAlgo)
    assert blas.HIPBLASLT.result == result(HipAlgo)
    for table, prefix in ((blas.CUBLASLT, "cublasLt"), (blas.HIPBLASLT, "hipblasLt")):
        assert all(c.startswith(prefix) for role, (c, _) in table.functions.items() if role != "error_string")
        # the same C argument order in both: one binding
        assert [declared(a) for _, a in table.functions.values() if _ != "error_string"]
    assert [n for n, _ in declared(blas.CUBLASLT.functions["matmul"][1])] == [
        n for n, _ in declared(blas.HIPBLASLT.functions["matmul"][1])
    ]


def test_library_results_are_allocated_for_export_out_of_iree_caching_pool():
    """A library call writes its result through a raw pointer, so the result is allocated with the export usage,
    which IREE's caching allocator never pools. Results from the pool faulted in the library's kernels on a GPU
    (an illegal memory access in 4 of 6 runs of bench/blas_fault_gpu.py, 0 of 17 with the export usage)."""
    from iree import runtime as rt

    from rocmc.runtime.providers.dnn import result_view

    drv = rt.get_driver("local-task")
    dev = drv.create_device(drv.query_available_devices()[0], allocators=["caching"])  # as rocmc opens GPUs
    et = rocmc.dtype("f16").hal_element_type()
    view = result_view(dev, 3 * 5 * 7 * 2, [3, 5, 7], et)
    assert list(view.shape) == [3, 5, 7] and int(view.element_type) == int(et)
    buf = view.get_buffer()
    assert buf.byte_length() >= 3 * 5 * 7 * 2
    usage = int(buf.allowed_usage())
    assert usage & int(rt.BufferUsage.SHARING_EXPORT), f"usage {usage:#x} lacks the export bit"
    assert usage & int(rt.BufferUsage.DEFAULT) == int(rt.BufferUsage.DEFAULT), "IREE's dispatches must still take it"
