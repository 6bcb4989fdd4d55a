"""Core behaviour: graph IR, targets, compile cache, artifacts and stages, runtime validation, errors."""

import threading

import numpy as np
import pytest

import rocmc
from rocmc import ops

from helpers import rand


def small_graph(name="g", dtype="f32"):
    g = rocmc.Graph(name)
    x = g.input("x", (2, "seq", 8), dtype)
    w = g.constant("w", np.linspace(-1, 1, 8).astype(rocmc.dtype(dtype).np))
    g.output(ops.silu(x * w + 1.0))
    return g


# ---- graph IR -----------------------------------------------------------------------------------


def test_printed_graph_is_typed_and_readable():
    g = rocmc.Graph("block")
    x = g.input("x", (2, "seq", 512), "f16")
    y = ops.leaky_relu(x, negative_slope=0.25)
    g.output(y)
    text = str(g)
    assert "graph block(%0:f16[2,seq,512] x)" in text
    assert "%1:f16[2,seq,512] = leaky_relu(%0) {negative_slope=0.25}" in text
    assert text.strip().endswith("return %1\n}".strip())


def test_graph_hash_is_stable_and_content_addressed():
    a, b = small_graph(), small_graph()
    assert a.hash() == b.hash()
    c = rocmc.Graph("g")
    x = c.input("x", (2, "seq", 8), "f32")
    c.output(ops.silu(x * c.constant("w", np.linspace(-1, 1, 8).astype(np.float32) + 1e-3) + 1.0))
    assert c.hash() != a.hash()


def test_constants_are_copied():
    g = rocmc.Graph("g")
    arr = np.ones(4, np.float32)
    c = g.constant("c", arr)
    arr[:] = 5
    assert np.all(g.constants["c"] == 1)
    assert c.type.shape == (4,)


@pytest.mark.parametrize("shape", [(2, -1), (2, "not a symbol"), (1.5,)])
def test_bad_input_shape(shape):
    with pytest.raises(rocmc.GraphError, match="input 'x'"):
        rocmc.Graph("g").input("x", shape)


def test_bad_dtype_and_duplicate_names():
    g = rocmc.Graph("g")
    with pytest.raises(rocmc.GraphError, match="unsupported dtype 'f8'"):
        g.input("x", (2,), "f8")
    g.input("x", (2,))
    with pytest.raises(rocmc.GraphError, match="already used"):
        g.input("x", (3,))


def test_float64_constant_needs_a_dtype():
    with pytest.raises(rocmc.GraphError, match="float64"):
        rocmc.Graph("g").constant("c", np.ones(3))


def test_values_of_other_graphs_are_rejected():
    a, b = rocmc.Graph("a"), rocmc.Graph("b")
    x, y = a.input("x", (2,)), b.input("y", (2,))
    with pytest.raises(rocmc.GraphError, match="another graph|not a value"):
        ops.add(x, y)


def test_graph_without_outputs():
    g = rocmc.Graph("g")
    g.input("x", (2,))
    with pytest.raises(rocmc.GraphError, match="no outputs"):
        rocmc.compile(g, "cpu")


# ---- targets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,want",
    [
        ("cpu", "cpu"),
        ("gfx942", "rocm:gfx942"),
        ("rocm:gfx90a", "rocm:gfx90a"),
        ("gfx1100", "rocm:gfx1100"),
        ("cuda:sm_80", "cuda:sm_80"),
    ],
)
def test_target_parse(spec, want):
    assert str(rocmc.Target.parse(spec)) == want


def test_unknown_target_lists_known_ones():
    with pytest.raises(rocmc.TargetError, match="unknown target 'gfx1234'.*rocm:gfx942.*cuda:sm_80"):
        rocmc.compile(small_graph(), "gfx1234")


# ---- compile, artifact, stages --------------------------------------------------------------------


def test_artifact_metadata_and_roundtrip(tmp_path, rng):
    g = small_graph()
    art = rocmc.compile(g, "cpu")
    p = art.save(tmp_path / "m.vmfb")
    loaded = rocmc.Artifact.load(p)
    m = loaded.metadata
    assert m["graph_hash"] == g.hash() and m["target"] == "cpu"
    assert m["rocmc"] == rocmc.__version__ and m["iree"].startswith("3.13")
    assert m["signature"]["inputs"] == [{"name": "x", "dtype": "f32", "shape": [2, "seq", 8]}]
    assert {c["op"]: c["impl"] for c in m["implementations"]} == {
        "mul": "generated",
        "add": "generated",
        "silu": "generated",
    }
    x = rand(rng, (2, 3, 8))
    np.testing.assert_allclose(rocmc.load(p)(x), rocmc.load(art)(x))


def test_stages_and_dispatches(tmp_path):
    art = rocmc.compile(small_graph(), "gfx942")
    assert "func.func @main" in art.ir("input")
    assert "graph g(" in art.ir("graph")
    for stage in ("flow", "stream", "hal"):
        assert "module" in art.ir(stage)
    d = art.dispatches()
    assert d and all(x["impl"] == "generated" for x in d)
    assert {"%2", "%5"} <= set(sum((x["nodes"] for x in d), []))  # mul and silu nodes map to a dispatch
    art.dump_ir(tmp_path / "dump")
    names = {p.name for p in (tmp_path / "dump").iterdir()}
    assert {"00.graph.txt", "01.input.mlir", "06.flow.mlir", "11.hal.mlir", "metadata.json", "dispatches"} <= names
    with pytest.raises(rocmc.ArtifactError, match="unknown stage"):
        art.ir("llvm")


def test_stage_dumps_elide_weights():
    """A weight is printed in IREE's phases as its name, not its bytes (the module still computes with them)."""
    rng = np.random.default_rng(3)
    w = rand(rng, (256, 64))
    g = rocmc.Graph("wide")
    x = g.input("x", (2, 256), "f32")
    g.output(ops.matmul(x, g.constant("w", w)))
    art = rocmc.compile(g, "cpu")
    for stage in ("global-optimization", "flow", "hal"):
        assert len(art.ir(stage)) < w.nbytes, stage  # 64 KiB of f32 is 128 KiB of hex when printed
    v = rand(rng, (2, 256))
    np.testing.assert_allclose(rocmc.load(art)(v), v.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)


def test_stages_of_a_loaded_file_need_the_graph(tmp_path):
    art = rocmc.compile(small_graph(), "cpu")
    loaded = rocmc.Artifact.load(art.save(tmp_path / "m.vmfb"))
    assert "graph g(" in loaded.ir("graph")
    with pytest.raises(rocmc.ArtifactError, match="recompile"):
        loaded.ir("flow")


def test_compile_error_carries_diagnostics():
    with pytest.raises(rocmc.CompileError, match=r"(?s)\[iree-compile\].*no-such-flag"):
        rocmc.compile(small_graph(), "cpu", flags=["--no-such-flag"], cache=False)


# ---- cache ----------------------------------------------------------------------------------------


def test_cache_hit_miss_and_corrupt_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCMC_CACHE_DIR", str(tmp_path / "cache"))
    g = small_graph("cached")
    a = rocmc.compile(g, "cpu")
    assert not a.cached
    b = rocmc.compile(small_graph("cached"), "cpu")
    assert b.cached and b.vmfb == a.vmfb
    assert not rocmc.compile(g, "gfx942").cached  # another target is another entry
    entries = list((tmp_path / "cache").glob("*/*/module.vmfb"))
    for e in entries:  # corrupt every entry: truncated module
        e.write_bytes(e.read_bytes()[:100])
    with pytest.warns(rocmc.CacheWarning, match="module.vmfb does not match its digest"):
        c = rocmc.compile(g, "cpu")
    assert not c.cached and c.vmfb == a.vmfb  # detected and rebuilt
    assert rocmc.compile(g, "cpu").cached


def test_cache_hit_maps_the_module_and_detects_a_damaged_header(tmp_path, monkeypatch, rng):
    from rocmc.lowering.cache import Cache

    monkeypatch.setenv("ROCMC_CACHE_DIR", str(tmp_path / "cache"))
    a = rocmc.compile(small_graph("mapped"), "cpu")
    b = rocmc.compile(small_graph("mapped"), "cpu")
    assert b.cached and b._vmfb is None and b.size == len(a.vmfb)  # nothing read on a hit
    x = rand(rng, (2, 5, 8))
    np.testing.assert_array_equal(rocmc.load(b)(x), rocmc.load(a)(x))  # the runtime maps the cached file
    assert b._vmfb is None
    (entry,) = (tmp_path / "cache").glob("*/*/module.vmfb")
    assert Cache(tmp_path / "cache").verify(entry.parent.name)
    data = bytearray(entry.read_bytes())
    data[5] ^= 0xFF  # same size, damaged header
    entry.write_bytes(bytes(data))
    assert not Cache(tmp_path / "cache").verify(entry.parent.name)
    with pytest.warns(rocmc.CacheWarning, match="module.vmfb does not match its digest"):
        c = rocmc.compile(small_graph("mapped"), "cpu")
    assert not c.cached and c.vmfb == a.vmfb


def test_constants_are_owned_read_only_copies_hashed_once():
    w = np.linspace(-1, 1, 8).astype(np.float32)
    g = rocmc.Graph("owned")
    x = g.input("x", (8,), "f32")
    g.output(x * g.constant("w", w))
    h = g.hash()
    w[0] = 7.0  # the caller's array is not the graph's
    assert g.constants["w"][0] == -1.0 and g.hash() == h
    with pytest.raises(ValueError):
        g.constants["w"][0] = 7.0
    other = rocmc.Graph("owned")
    other.output(other.input("x", (8,), "f32") * other.constant("w", w))
    assert other.hash() != h  # content, not identity, makes the hash


def test_large_constant_digest_is_chunked_and_content_addressed():
    from rocmc.frontend.graph import ContentDigest

    def content_digest(a):
        return ContentDigest(a).result()

    big = np.random.default_rng(0).standard_normal(9 << 20).astype(np.float32)  # 36 MiB: three chunks
    d = content_digest(big)
    assert content_digest(big.copy()) == d
    big[-1] += 1.0
    assert content_digest(big) != d


def test_cache_can_be_disabled(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCMC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ROCMC_CACHE", "0")
    rocmc.compile(small_graph(), "cpu")
    assert not (tmp_path / "cache").exists()


# ---- runtime --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def module():
    g = rocmc.Graph("two")
    a = g.input("a", ("n", 4), "f32")
    b = g.input("b", ("n", 4), "f32")
    g.output(a + b, ops.greater(a, b))
    return rocmc.load(rocmc.compile(g, "cpu"))


def test_call_with_keywords_and_several_outputs(module, rng):
    a, b = rand(rng, (5, 4)), rand(rng, (5, 4))
    s, gt = module(b=b, a=a)
    np.testing.assert_allclose(s, a + b, rtol=1e-6)
    assert gt.dtype == np.bool_ and np.array_equal(gt, a > b)


@pytest.mark.parametrize(
    "args,match",
    [
        ((np.ones((2, 4), np.float32),), "missing input"),
        ((np.ones((2, 4), np.float32),) * 3, "expected 2 input"),
        ((np.ones((2, 4), np.float64), np.ones((2, 4), np.float32)), "input 'a': dtype float64.*f32"),
        ((np.ones((2, 5), np.float32), np.ones((2, 5), np.float32)), "input 'a': dim 1 is 5, expected 4"),
        ((np.ones((2, 4, 1), np.float32), np.ones((2, 4), np.float32)), "input 'a': rank 3"),
        ((np.ones((2, 4), np.float32), np.ones((3, 4), np.float32)), "input 'b': dim 0 \\(n\\) is 3, but n=2"),
        (([1.0, 2.0, 3.0, 4.0], np.ones((1, 4), np.float32)), "input 'a': expected a numpy array"),
    ],
)
def test_inputs_are_validated(module, args, match):
    with pytest.raises(rocmc.InputError, match=match):
        module(*args)


def test_device_outputs_stay_on_device(module):
    a = np.ones((3, 4), np.float32)
    s, _ = module(a, a, output="device")
    assert not isinstance(s, np.ndarray)
    np.testing.assert_array_equal(s.to_host(), 2 * a)
    s2, _ = module(s, a)  # a device array is a valid input
    np.testing.assert_array_equal(s2, 3 * a)


def test_calls_from_several_threads(module, rng):
    errors = []

    def work():
        for _ in range(20):
            a, b = rand(rng, (7, 4)), rand(rng, (7, 4))
            s, _ = module(a, b)
            if not np.allclose(s, a + b, rtol=1e-6):
                errors.append("mismatch")

    threads = [threading.Thread(target=work) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors


def test_corrupt_and_truncated_vmfb(tmp_path):
    p = rocmc.compile(small_graph(), "cpu").save(tmp_path / "m.vmfb")
    data = p.read_bytes()
    (tmp_path / "t.vmfb").write_bytes(data[: len(data) // 2])
    with pytest.raises(rocmc.ArtifactError, match="t.vmfb"):
        rocmc.load(tmp_path / "t.vmfb")
    (tmp_path / "junk.vmfb").write_bytes(b"not a module at all" * 10)
    with pytest.raises(rocmc.ArtifactError, match="not an IREE .vmfb"):
        rocmc.load(tmp_path / "junk.vmfb")
    with pytest.raises(rocmc.ArtifactError, match="does not exist"):
        rocmc.load(tmp_path / "missing.vmfb")


def test_artifact_for_another_target():
    art = rocmc.compile(small_graph(), "gfx942")
    with pytest.raises(rocmc.DeviceError, match="compiled for rocm:gfx942.*local-task"):
        rocmc.load(art, device="local-task")


@pytest.mark.parametrize("target,lib,short", [("gfx942", "libamdhip64", "amdhip64"), ("cuda:sm_80", "libcuda", "cuda")])
def test_missing_gpu_driver_is_a_device_error(target, lib, short):
    art = rocmc.compile(small_graph(), target)
    import ctypes.util

    if ctypes.util.find_library(short):
        pytest.skip(f"{lib} is installed here")
    with pytest.raises(rocmc.DeviceError, match=lib):
        rocmc.load(art)


def test_unknown_device():
    with pytest.raises(rocmc.DeviceError, match="unknown device 'tpu'"):
        rocmc.load(rocmc.compile(small_graph(), "cpu"), device="tpu")


def test_local_sync_device(rng):
    g = small_graph()
    x = rand(rng, (2, 5, 8))
    y = rocmc.load(rocmc.compile(g, "cpu"), device="local-sync")(x)
    np.testing.assert_allclose(y, rocmc.evaluate(g, x), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "i32", "i64", "bool"])
def test_boundary_dtypes_roundtrip(dtype, rng):
    g = rocmc.Graph("id")
    x = g.input("x", (3, "n"), dtype)
    g.output(ops.where(ops.equal(x, x), x, x))
    v = rand(rng, (3, 5), dtype)
    y = rocmc.load(rocmc.compile(g, "cpu"))(v)
    assert y.dtype == v.dtype and np.array_equal(y, v)


# ---- command line -----------------------------------------------------------------------------------

MODEL = """
import numpy as np, rocmc
from rocmc import ops
def build_graph(width=8):
    g = rocmc.Graph("cli")
    x = g.input("x", ("n", width), "f32")
    g.output(ops.tanh(x) * 2.0)
    return g
"""


def test_cli_compile_run_inspect(tmp_path, capsys, rng):
    from rocmc.cli import main

    src = tmp_path / "model.py"
    src.write_text(MODEL)
    out = tmp_path / "m.vmfb"
    assert (
        main(["compile", str(src), "-t", "cpu", "-o", str(out), "--set", "width=6", "--dump-ir", str(tmp_path / "ir")])
        == 0
    )
    assert (tmp_path / "ir" / "06.flow.mlir").exists()
    x = rng.standard_normal((3, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(out), "--input", f"x=@{tmp_path / 'x.npy'}", "--save", str(tmp_path / "y.npz")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "y.npz")["out0"], np.tanh(x) * 2, rtol=1e-5, atol=1e-6)
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "target     cpu" in text and "main(x: f32[n,6])" in text and "embedded-elf" in text


def test_cli_errors(tmp_path, capsys):
    from rocmc.cli import main

    src = tmp_path / "model.py"
    src.write_text(MODEL)
    out = tmp_path / "m.vmfb"
    main(["compile", str(src), "-o", str(out)])
    assert main(["run", str(out), "--input", f"x=@{tmp_path / 'nope.npy'}"]) == 2
    err = capsys.readouterr().err
    assert "nope.npy" in err and "does not exist" in err
    assert main(["compile", str(tmp_path / "absent.py")]) == 2
    assert main(["compile", str(src), "-t", "gfx1"]) == 2
    assert "unknown target" in capsys.readouterr().err


def test_cpu_tuning_options_and_their_fallback(monkeypatch, rng):
    """CPU modules get data tiling + im2col; a module IREE can't compile with them is compiled without."""
    g = rocmc.Graph("tuned")
    x = g.input("x", ("n", 64), "f32")
    g.output(ops.matmul(x, g.constant("w", rng.standard_normal((64, 32)).astype(np.float32))))
    art = rocmc.compile(g, "cpu", cache=False)
    assert "--iree-opt-data-tiling" in art.metadata["compile_flags"] and "compile_note" not in art.metadata

    # The decomposed attention feeding a projection, which IREE 3.13 failed to compile with data tiling
    # before symbolic sizes were padded, now compiles with it.
    g = rocmc.Graph("attention_projection")
    q, k = g.input("q", (1, 8, "s", 64), "f32"), g.input("k", (1, 2, "s", 64), "f32")
    a = ops.reshape(ops.permute(ops.sdpa(q, k, k, is_causal=True), (0, 2, 1, 3)), (1, "s", 512))
    g.output(ops.matmul(a, g.constant("w", rng.standard_normal((512, 16)).astype(np.float32))))
    art = rocmc.compile(g, "cpu", cache=False)
    assert "--iree-opt-data-tiling" in art.metadata["compile_flags"] and "compile_note" not in art.metadata
    qv, kv = rand(rng, (1, 8, 5, 64)), rand(rng, (1, 2, 5, 64))
    np.testing.assert_allclose(rocmc.load(art)(qv, kv), rocmc.evaluate(g, qv, kv), rtol=1e-4, atol=1e-4)

    # When IREE fails with the tuning options, the module is compiled without them and the reason kept.
    from rocmc.lowering.target import Target

    monkeypatch.setattr(Target, "tuning_flags", lambda self: ["--iree-opt-data-tiling", "--no-such-iree-flag"])
    art = rocmc.compile(g, "cpu", cache=False)
    assert art.metadata["compile_flags"] == [] and "IREE failed" in art.metadata["compile_note"]
    np.testing.assert_allclose(rocmc.load(art)(qv, kv), rocmc.evaluate(g, qv, kv), rtol=1e-4, atol=1e-4)
