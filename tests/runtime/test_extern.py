"""The `dnn` implementation: library-backed nodes as extern calls, run on the CPU through the
reference provider, compiled for gfx942 / sm_80 with the expected imports."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.externs import DNN, from_bits, to_bits
from rocmc.lowering import registry
from rocmc.lowering.target import Target
from rocmc.runtime.providers import modules_for

from helpers import TOL, check, rand

SIGNATURES = DNN.signatures


def _w(rng, *shape, dtype="f32"):
    return rand(rng, shape, dtype, -1.0, 1.0)


def every_op_graph(rng, dtype="f32"):
    """One graph holding every extern op (odd sizes, a symbolic batch, groups, stride, dilation)."""
    g = rocmc.Graph("every_extern")
    x = g.input("x", ("n", 4, 9, 11), dtype)
    s = g.input("s", ("n", 6, 13), dtype)
    c = ops.conv2d(
        x,
        _w(rng, 6, 2, 3, 3, dtype=dtype),
        _w(rng, 6, dtype=dtype),
        stride=(2, 1),
        padding=1,
        dilation=(1, 2),
        groups=2,
    )
    c1 = ops.conv1d(s, _w(rng, 8, 3, 3, dtype=dtype), None, stride=2, padding=2, groups=2)
    t = ops.conv_transpose2d(
        c, _w(rng, 6, 2, 3, 2, dtype=dtype), _w(rng, 4, dtype=dtype), stride=2, padding=1, output_padding=1, groups=2
    )
    t1 = ops.conv_transpose1d(c1, _w(rng, 8, 3, 4, dtype=dtype), None, stride=3, padding=1, dilation=2)
    m = ops.max_pool2d(t, 3, stride=2, padding=1)
    a = ops.avg_pool2d(t, (2, 3), stride=(1, 2), padding=(1, 1), count_include_pad=False)
    a2 = ops.avg_pool2d(m, 2, count_include_pad=True)
    stats = np.float32 if dtype == "f32" else rocmc.dtype(dtype).np
    bn = ops.batch_norm(
        a, _w(rng, 4, dtype=dtype), rng.uniform(0.5, 2.0, 4).astype(stats), _w(rng, 4, dtype=dtype), None, eps=1e-3
    )
    ln = ops.lrn(bn, 3, alpha=0.1, beta=0.75, k=2.0)
    f = ops.fused_conv2d(
        c, _w(rng, 6, 3, 3, 3, dtype=dtype), _w(rng, 6, dtype=dtype), c, padding=1, groups=2, activation="relu"
    )
    g.output(
        ops.relu(ops.softmax(ln, axis=1)),
        ops.sigmoid(a2),
        ops.tanh(ops.log_softmax(t1, axis=2)),
        ops.elu(ln, 0.7),
        ops.leaky_relu(t1, 0.2),
        ops.clipped_relu(c, 0.5),
        f,
    )
    # recurrences over a symbolic sequence (LSTM with both biases and c0 only, GRU with b_hh and the
    # LSTM's h_n as h0) and attention with a kv length other than the query's
    r = g.input("r", ("t", 2, 5), dtype)
    y, h, cn = ops.lstm(
        r,
        _w(rng, 12, 5, dtype=dtype),
        _w(rng, 12, 3, dtype=dtype),
        _w(rng, 12, dtype=dtype),
        _w(rng, 12, dtype=dtype),
        c0=_w(rng, 1, 2, 3, dtype=dtype),
    )
    gy, gh = ops.gru(y, _w(rng, 9, 3, dtype=dtype), _w(rng, 9, 3, dtype=dtype), None, _w(rng, 9, dtype=dtype), h0=h)
    q = g.input("q", ("n", 2, 5, 4), dtype)
    k, v = g.input("k", ("n", 2, 7, 4), dtype), g.input("v", ("n", 2, 7, 3), dtype)
    g.output(gy, gh, cn, ops.sdpa(q, k, v, scale=0.3))
    return g, (
        _w(rng, 3, 4, 9, 11, dtype=dtype) * 2,
        _w(rng, 3, 6, 13, dtype=dtype) * 2,
        _w(rng, 4, 2, 5, dtype=dtype),
        _w(rng, 3, 2, 5, 4, dtype=dtype),
        _w(rng, 3, 2, 7, 4, dtype=dtype),
        _w(rng, 3, 2, 7, 3, dtype=dtype),
    )


def test_every_op_runs_through_the_reference_provider(rng):
    g, inputs = every_op_graph(rng)
    art = rocmc.compile(g, "cpu", libraries=["dnn"])
    assert {c["impl"] for c in art.implementations} == {"dnn"}
    assert {x["op"] for x in art.metadata["externs"]} == set(SIGNATURES)
    check(g, *inputs, libraries=["dnn"])


def test_every_op_matches_the_generated_implementation(rng):
    g, inputs = every_op_graph(rng)
    lib = rocmc.load(rocmc.compile(g, "cpu", libraries=["dnn"]))(*inputs)
    gen = rocmc.load(rocmc.compile(g, "cpu", impl="generated"))(*inputs)
    for a, b in zip(lib, gen):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_types(dtype, rng):
    g = rocmc.Graph("t")
    x = g.input("x", ("n", 4, 7, 9), dtype)
    y = ops.conv2d(x, _w(rng, 5, 4, 3, 3, dtype=dtype), _w(rng, 5, dtype=dtype), padding=1)
    y = ops.max_pool2d(ops.elu(y, 0.5), 2)
    g.output(ops.log_softmax(y, axis=1))
    art = rocmc.compile(g, "cpu", libraries=["dnn"])
    assert [x["import"] for x in art.metadata["externs"]] == [
        f"dnn.{op}.{dtype}" for op in ("conv2d", "elu", "max_pool2d", "log_softmax")
    ]
    rtol, atol = TOL[dtype]
    check(g, _w(rng, 2, 4, 7, 9, dtype=dtype), tol=(4 * rtol, 4 * atol), libraries=["dnn"])


def test_batch_norm_and_lrn_f16_with_absent_affine(rng):
    g = rocmc.Graph("t")
    x = g.input("x", (2, 6, 5), "f16")
    y = ops.batch_norm(x, _w(rng, 6, dtype="f16"), rng.uniform(0.5, 2.0, 6).astype(np.float16), eps=1e-5)
    g.output(ops.lrn(y, 5, alpha=0.2, beta=0.5, k=1.5))
    check(g, _w(rng, 2, 6, 5, dtype="f16"), tol=(1e-2, 1e-2), libraries=["dnn"])


@pytest.mark.parametrize("axis", [0, 1, 3])
def test_softmax_any_axis_and_activations_any_rank(axis, rng):
    g = rocmc.Graph("t")
    x = g.input("x", (3, "n", 5, 7), "f32")
    g.output(ops.softmax(x, axis=axis), ops.clipped_relu(ops.leaky_relu(x, 0.1), 1.2))
    check(g, rand(rng, (3, 4, 5, 7), "f32"), impl={"softmax": "dnn", "leaky_relu": "dnn", "clipped_relu": "dnn"})


def test_conv_defaults_to_dnn_on_rocm_only():
    g = rocmc.Graph("t")
    x = g.input("x", (1, 4, 8, 8), "f32")
    node = g.apply(
        "conv2d",
        [x, g.constant(None, np.ones((4, 4, 3, 3), np.float32)), None],
        {"stride": [1, 1], "padding": [[1, 1], [1, 1]], "dilation": [1, 1], "groups": 1},
    )[0].producer
    assert registry.choose(node, Target.parse("gfx942")).impl.name == "dnn"
    assert registry.choose(node, Target.parse("cpu")).impl.name == "generated"
    assert registry.choose(node, Target.parse("cuda:sm_80")).impl.name == "generated"
    soft = ops.softmax(x, axis=1).producer
    assert registry.choose(soft, Target.parse("gfx942")).impl.name != "dnn"
    assert registry.choose(soft, Target.parse("gfx942"), impl={"softmax": "dnn"}).impl.name == "dnn"


@pytest.mark.parametrize(
    "build, reason",
    [
        (lambda x: ops.conv2d(x, np.ones((4, 4, 2, 2), np.float32), padding="same"), "asymmetric padding"),
        (lambda x: ops.max_pool2d(x, 3, dilation=2), "dilation"),
        (lambda x: ops.max_pool2d(x, 3, stride=2, ceil_mode=True), "ceil_mode"),
        (lambda x: ops.lrn(x, 4), "even size"),
    ],
)
def test_what_miopen_cannot_do_falls_back_to_generated(build, reason):
    g = rocmc.Graph("t")
    x = g.input("x", (1, 4, 9, 9), "f32")
    node = build(x).producer
    choice = registry.choose(node, Target.parse("gfx942"), libraries=("dnn",))
    assert choice.impl.name == "generated"
    assert any(name == "dnn" and reason in why for name, why in choice.skipped)


def test_bf16_batch_norm_is_not_sent_to_miopen():
    g = rocmc.Graph("t")
    x = g.input("x", (2, 3, 4), "bf16")
    s = np.ones(3, np.float32)
    node = ops.batch_norm(x, s, s).producer
    choice = registry.choose(node, Target.parse("gfx942"), libraries=("dnn",))
    assert choice.impl.name == "generated" and "dtype bf16" in choice.skipped[0][1]


def _dump_imports(vmfb: bytes, tmp_path: Path) -> str:
    path = tmp_path / "m.vmfb"
    path.write_bytes(vmfb)
    tool = Path(sys.executable).with_name("iree-dump-module")
    return subprocess.run([str(tool), str(path)], check=True, capture_output=True, text=True).stdout


@pytest.mark.parametrize("target", ["gfx942", "cuda:sm_80"])
def test_gpu_modules_import_every_op_with_the_abi_signature(target, tmp_path, rng):
    g, _ = every_op_graph(rng)
    art = rocmc.compile(g, target, libraries=["dnn"])
    dump = _dump_imports(art.vmfb, tmp_path)
    imports = dict(re.findall(r"vm\.import @(dnn\.[\w.]+) cconv \"(\w+)\"", dump))
    # cuda modules are served by cuDNN, which lacks some calls: those ops stay generated there
    skip = DNN.unavailable["cuda"] if target.startswith("cuda") else {}
    assert imports == {f"dnn.{op}": sig.cconv for op, sig in SIGNATURES.items() if op not in skip}
    assert imports["dnn.conv2d"] == "0rrrIIIIIII_r"


def test_dispatches_list_the_extern_calls():
    g = rocmc.Graph("t")
    x = g.input("x", (1, 3, 6, 6), "f32")
    y = ops.conv2d(x, np.ones((2, 3, 3, 3), np.float32))
    g.output(ops.relu(y) + 1.0)
    art = rocmc.compile(g, "gfx942", rewrite=False)  # (rewritten, conv + relu is one dnn.fused_conv2d)
    calls = [d for d in art.dispatches() if d["kind"] == "extern call"]
    assert calls == [
        {"name": "dnn.conv2d", "nodes": [f"%{y.id}"], "ops": ["conv2d"], "impl": "dnn", "kind": "extern call"}
    ]


def test_float_attributes_travel_as_f64_bits():
    for v in (0.7, -1e-5, 6.0, 1e300):
        assert from_bits(to_bits(v)) == v
    assert SIGNATURES["elu"].decode([to_bits(0.25)]) == {"alpha": 0.25}


def test_unknown_import_is_a_device_error_before_any_call():
    bad = [{"node": "%3", "op": "conv2d", "import": "dnn.conv3d", "dtype": "f32", "attrs": {}}]
    with pytest.raises(rocmc.DeviceError, match=r"%3: unknown extern import 'dnn.conv3d'"):
        modules_for(bad, rocmc.runtime.get_device("local-task"), "local-task", None)


def test_library_limits_are_device_errors_at_load(monkeypatch):
    from rocmc.runtime.providers import reference

    monkeypatch.setattr(
        reference.ReferenceProvider,
        "unsupported",
        lambda self, op, dtype, attrs: "size 17 is over the library's limit of 16",
    )
    g = rocmc.Graph("t")
    x = g.input("x", (1, 4, 5), "f32")
    g.output(ops.lrn(x, 3))
    art = rocmc.compile(g, "cpu", libraries=["dnn"])
    with pytest.raises(rocmc.DeviceError, match=r"\(lrn, f32\).*size 17.*recompile with impl=\{'lrn': 'generated'\}"):
        rocmc.load(art)


def test_cudnn_lrn_limits():
    from rocmc.runtime.providers.cudnn import CudnnProvider

    assert "size in [1, 16]" in CudnnProvider.table_limits(None, "lrn", {"size": 17, "k": 1.0, "beta": 0.75})
    assert CudnnProvider.table_limits(None, "lrn", {"size": 5, "k": 1.0, "beta": 0.75}) is None


def test_missing_vendor_library_names_the_file_and_the_fix():
    from rocmc.runtime.providers.miopen import MiopenProvider

    try:
        MiopenProvider(None, "hip")
    except rocmc.DeviceError as e:
        assert re.search(r"(HIP runtime|MIOpen) not found: looked for (libamdhip64\.so|libMIOpen\.so\.1)", str(e))
        assert "install" in str(e)
    else:
        pytest.skip("ROCm and MIOpen are installed here")


def test_constant_operands_are_exported_once_not_copied_per_call():
    """Constant weights (and absent operands) reach the import as module globals exported by an
    initializer: the call site has no per-call allocation or copy, and the results are unchanged."""
    rng = np.random.default_rng(11)
    g = rocmc.Graph("const_conv")
    x = g.input("x", ("n", 6, 9, 11), "f32")
    w = g.constant("w", rand(rng, (4, 6, 3, 3)))
    b = g.constant("b", rand(rng, (4,)))
    y = ops.conv2d(x, w, b, padding=1)
    g.output(ops.conv2d(y, g.constant("w2", rand(rng, (5, 4, 1, 1)))))
    check(g, rand(rng, (2, 6, 9, 11)), impl={"conv2d": "dnn"})
    art = rocmc.compile(g, "cuda:sm_80", impl={"conv2d": "dnn"})
    ir = art.ir("input")
    assert ir.count("util.initializer") == 4  # w, b, w2, and the absent bias of the second conv
    hal = art.ir("hal")
    main = hal[hal.index("util.func public @main(") :]
    main = main[: main.index("util.return")]
    assert main.count("util.call @dnn.conv2d") == 2
    assert "queue.copy" not in main and "queue.fill" not in main
