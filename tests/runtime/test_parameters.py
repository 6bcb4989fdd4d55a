"""External parameters: tensors named in a module's `#flow.parameter.named` globals come from .irpa,
.safetensors (single, sharded, HF directory) or arrays; file headers are untrusted and checked before
any byte is read; the provider serves them to IREE, converting float dtypes once when asked."""

import gc
import json
import os
import struct

import ml_dtypes
import numpy as np
import pytest
from iree import compiler as ic
from iree import runtime as rt
from safetensors.numpy import save_file

from rocmc.errors import ArtifactError, InputError
from rocmc.parameters import Parameters, Spec, save_parameters

CPU_FLAGS = [
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
]

# y = x @ W + b, with W and b external parameters under HF-style dotted names.
PROGRAM = """
util.global private @w = #flow.parameter.named<"model"::"a.b.weight"> : tensor<3x4xf32>
util.global private @b = #flow.parameter.named<"model"::"a.b.bias"> : tensor<4xf32>
func.func @main(%x: tensor<2x3xf32>) -> tensor<2x4xf32> {
  %w = util.global.load @w : tensor<3x4xf32>
  %b = util.global.load @b : tensor<4xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x4xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<2x4xf32>) -> tensor<2x4xf32>
  %m = linalg.matmul ins(%x, %w : tensor<2x3xf32>, tensor<3x4xf32>) outs(%f : tensor<2x4xf32>) -> tensor<2x4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>,
                                        affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%m, %b : tensor<2x4xf32>, tensor<4xf32>) outs(%e : tensor<2x4xf32>) {
  ^bb0(%p: f32, %q: f32, %o: f32):
    %s = arith.addf %p, %q : f32
    linalg.yield %s : f32
  } -> tensor<2x4xf32>
  return %r : tensor<2x4xf32>
}
"""
SPECS = [Spec("a.b.weight", (3, 4), "f32"), Spec("a.b.bias", (4,), "f32")]


@pytest.fixture(scope="module")
def program() -> bytes:
    return ic.compile_str(PROGRAM, input_type="auto", extra_args=CPU_FLAGS)


def run_program(vmfb: bytes, params: Parameters, x: np.ndarray, specs=SPECS) -> np.ndarray:
    instance, device = rt.VmInstance(), rt.get_device("local-sync")
    parameters = params.provider(instance, specs=specs)
    program = rt.VmModule.copy_buffer(instance, vmfb)
    context = rt.VmContext(instance, modules=[rt.create_hal_module(instance, device), parameters, program])
    return np.asarray(rt.FunctionInvoker(context, device, program.lookup_function("main"))(x).to_host())


def write_safetensors(path, tensors: dict, *, header: dict | None = None, pad: bool = False, tail=b""):
    """A safetensors file written by hand: `tensors` name -> (dtype tag, array), packed in order;
    `header` replaces the generated header (for malformed files)."""
    hdr, blobs, offset = {"__metadata__": {"format": "np"}}, [], 0
    for name, (tag, a) in tensors.items():
        data = a.tobytes()
        hdr[name] = {"dtype": tag, "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header if header is not None else hdr).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs) + tail)
    return path


def weights(rng):
    return {
        "a.b.weight": rng.standard_normal((3, 4)).astype(np.float32),
        "a.b.bias": rng.standard_normal(4).astype(np.float32),
    }


def reference(x, w):
    return x.astype(np.float64) @ w["a.b.weight"].astype(np.float64) + w["a.b.bias"].astype(np.float64)


def sharded(tmp_path, w) -> os.PathLike:
    """A two-shard checkpoint in the Hugging Face layout; returns its directory."""
    save_file({"a.b.weight": w["a.b.weight"]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"a.b.bias": w["a.b.bias"]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {"a.b.weight": "model-00001-of-00002.safetensors", "a.b.bias": "model-00002-of-00002.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tmp_path


# ---- reading sources -------------------------------------------------------------------------------


def test_safetensors_from_the_library_keeps_names_shapes_and_values(tmp_path, rng):
    w = weights(rng)
    save_file(w, str(tmp_path / "m.safetensors"))
    p = Parameters.open(tmp_path / "m.safetensors")
    assert sorted(p.names()) == sorted(w) and len(p) == 2 and "a.b.weight" in p and "a.b" not in p
    assert p.info("a.b.weight") == ((3, 4), "f32")
    for name, a in w.items():
        np.testing.assert_array_equal(p.array(name), a)


def test_handwritten_safetensors_every_dtype_unaligned(tmp_path, rng):
    tensors = {
        "flag": ("BOOL", rng.random(3) < 0.5),
        "bytes": ("U8", rng.integers(0, 255, 5).astype(np.uint8)),
        "bf": ("BF16", rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16)),
        "half": ("F16", rng.standard_normal(3).astype(np.float16)),
        "double": ("F64", rng.standard_normal((2, 2))),
        "long": ("I64", rng.integers(-9, 9, 4)),
        "int": ("I32", rng.integers(-9, 9, 4).astype(np.int32)),
        "short": ("I16", rng.integers(-9, 9, 4).astype(np.int16)),
        "tiny": ("I8", rng.integers(-9, 9, 4).astype(np.int8)),
        "scalar": ("F32", np.array(rng.standard_normal(), np.float32)),
        "empty": ("F32", np.zeros((0, 5), np.float32)),
    }
    p = Parameters.open(write_safetensors(tmp_path / "h.safetensors", tensors))
    names = {
        "BOOL": "bool",
        "U8": "u8",
        "BF16": "bf16",
        "F16": "f16",
        "F64": "f64",
        "I64": "i64",
        "I32": "i32",
        "I16": "i16",
        "I8": "i8",
        "F32": "f32",
    }
    for name, (tag, a) in tensors.items():
        assert p.info(name) == (a.shape, names[tag])
        got = p.array(name)
        assert got.dtype == a.dtype and got.shape == a.shape
        np.testing.assert_array_equal(got, a)


def test_sharded_checkpoint_by_index_file_and_by_directory(tmp_path, rng):
    w = weights(rng)
    root = sharded(tmp_path, w)
    for source in (root / "model.safetensors.index.json", root, str(root)):
        p = Parameters.open(source)
        assert sorted(p.names()) == sorted(w)
        np.testing.assert_array_equal(p.array("a.b.bias"), w["a.b.bias"])


def test_hugging_face_cache_layout_of_linked_files(tmp_path, program, rng):
    """A hub cache snapshot links every file to a blob of another directory: shards are looked up next
    to the index's link, not next to its target."""
    w = weights(rng)
    checkpoint, blobs, snapshot = tmp_path / "checkpoint", tmp_path / "blobs", tmp_path / "snapshot"
    for d in (checkpoint, blobs, snapshot):
        d.mkdir()
    for i, f in enumerate(sorted(sharded(checkpoint, w).iterdir())):
        f.rename(blobs / f"blob{i}")  # blobs carry no file names
        (snapshot / f.name).symlink_to(blobs / f"blob{i}")
    x = rng.standard_normal((2, 3)).astype(np.float32)
    got = run_program(program, Parameters.open(snapshot), x)
    np.testing.assert_allclose(got, reference(x, w), rtol=1e-5, atol=1e-5)


def test_directory_with_a_single_model_safetensors(tmp_path, rng):
    w = weights(rng)
    save_file(w, str(tmp_path / "model.safetensors"))
    np.testing.assert_array_equal(Parameters.open(tmp_path).array("a.b.weight"), w["a.b.weight"])


def test_irpa_round_trip_keeps_shapes_dtypes_and_values(tmp_path, rng):
    arrays = {
        "w.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "w.bf16": rng.standard_normal((4, 2)).astype(ml_dtypes.bfloat16),
        "w.f16": rng.standard_normal(7).astype(np.float16),
        "ids": rng.integers(-100, 100, (2, 3)),
        "mask": rng.random(6) < 0.5,
        "scale": np.array(rng.standard_normal(), np.float32),
        "strided": rng.standard_normal((6, 4)).astype(np.float32)[::2, ::-1],
    }
    out = save_parameters(tmp_path / "w.irpa", arrays)
    assert out == tmp_path / "w.irpa" and os.listdir(tmp_path) == ["w.irpa"]  # no temporary left behind
    p = Parameters.open(out)
    assert sorted(p.names()) == sorted(arrays)
    for name, a in arrays.items():
        assert p.info(name)[0] == a.shape
        got = p.array(name)
        assert got.dtype == a.dtype
        np.testing.assert_array_equal(got, a)


def test_save_parameters_from_a_checkpoint_and_overwrites_whole(tmp_path, rng):
    w = weights(rng)
    (tmp_path / "ckpt").mkdir()
    root = sharded(tmp_path / "ckpt", w)
    target = tmp_path / "w.irpa"
    target.write_bytes(b"an older file")
    save_parameters(target, root)
    p = Parameters.open(target)
    for name, a in w.items():
        assert p.info(name) == (a.shape, "f32")
        np.testing.assert_array_equal(p.array(name), a)
    with pytest.raises(InputError, match=r"\.irpa"):
        save_parameters(tmp_path / "w.bin", w)


def test_irpa_without_tensor_metadata_is_checked_by_size(tmp_path, rng):
    w = weights(rng)
    index = rt.ParameterIndex()
    for name, a in w.items():
        index.add_buffer(name, a.copy())
    index.create_archive_file(str(tmp_path / "raw.irpa"))
    p = Parameters.open(tmp_path / "raw.irpa")
    assert p.info("a.b.weight") == (None, None)
    assert p.check(SPECS) == []
    np.testing.assert_array_equal(p.array("a.b.bias").view(np.float32), w["a.b.bias"])
    with pytest.raises(InputError, match=r"'a\.b\.weight'.*expected 96 bytes \(f32\[3,8\]\), found 48"):
        p.check([Spec("a.b.weight", (3, 8), "f32")])


def test_irpa_splat_entry(tmp_path, program, rng):
    w = weights(rng)
    value = np.float32(rng.standard_normal())
    index = rt.ParameterIndex()
    index.add_buffer("a.b.weight", w["a.b.weight"].copy())
    index.add_splat("a.b.bias", value.tobytes(), 16)
    index.create_archive_file(str(tmp_path / "splat.irpa"))
    p = Parameters.open(tmp_path / "splat.irpa")
    np.testing.assert_array_equal(p.array("a.b.bias"), np.full(4, value).view(np.uint8))
    w["a.b.bias"] = np.full(4, value)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(run_program(program, p, x), reference(x, w), rtol=1e-5, atol=1e-5)


def test_sources_combine_and_may_not_redefine_a_name(tmp_path, rng):
    w = weights(rng)
    save_file({"a.b.weight": w["a.b.weight"]}, str(tmp_path / "w.safetensors"))
    p = Parameters.open([tmp_path / "w.safetensors", {"a.b.bias": w["a.b.bias"]}])
    assert sorted(p.names()) == sorted(w) and Parameters.open(p) is p
    assert sorted(Parameters.open((p, {"extra": np.ones(2, np.float32)})).names()) == sorted([*w, "extra"])
    with pytest.raises(InputError, match=r"'a\.b\.weight' is defined twice.*w\.safetensors.*given arrays"):
        Parameters.open([tmp_path / "w.safetensors", {"a.b.weight": w["a.b.weight"]}])


# ---- checking against a module's specs ------------------------------------------------------------


def test_check_names_the_missing_tensor_and_counts_the_others(rng):
    p = Parameters.open({"a.b.weight": weights(rng)["a.b.weight"]})
    with pytest.raises(InputError, match=r"'a\.b\.bias' not found"):
        p.check(SPECS)
    with pytest.raises(InputError, match=r"'a\.b\.bias' not found.*2 other"):
        p.check([*SPECS, Spec("x", (1,), "f32"), Spec("y", (1,), "f32")])


def test_check_names_tensor_expected_and_found_shape(rng):
    p = Parameters.open(
        {
            "a.b.weight": rng.standard_normal((4, 3)).astype(np.float32),
            "a.b.bias": rng.standard_normal(4).astype(np.float32),
        }
    )
    with pytest.raises(InputError, match=r"'a\.b\.weight'.*expected shape \[3,4\], found \[4,3\]"):
        p.check(SPECS)


def test_check_converts_float_dtypes_only_when_allowed(rng):
    p = Parameters.open(
        {
            "a.b.weight": rng.standard_normal((3, 4)).astype(ml_dtypes.bfloat16),
            "a.b.bias": rng.standard_normal(4).astype(np.float32),
        }
    )
    assert p.check(SPECS) == ["a.b.weight: converted bf16 -> f32"]
    with pytest.raises(InputError, match=r"'a\.b\.weight'.*expected dtype f32, found bf16"):
        p.check(SPECS, convert=False)
    ints = Parameters.open({"a.b.weight": rng.integers(0, 9, (3, 4)).astype(np.int32)})
    with pytest.raises(InputError, match=r"'a\.b\.weight'.*expected dtype f32, found i32"):
        ints.check(SPECS[:1])


def test_checks_happen_before_any_tensor_byte_is_read(tmp_path, rng, monkeypatch):
    w = weights(rng)
    w["a.b.weight"] = w["a.b.weight"].T.copy()
    save_file(w, str(tmp_path / "m.safetensors"))

    def no_read(self, name):
        raise AssertionError(f"read {name} before checking")

    monkeypatch.setattr(Parameters, "array", no_read)
    p = Parameters.open(tmp_path / "m.safetensors")
    with pytest.raises(InputError, match="expected shape"):
        p.provider(rt.VmInstance(), specs=SPECS)


def test_spec_rejects_bad_dtype_and_shape():
    for bad in ("f8", "float128", np.complex64):
        with pytest.raises(InputError, match="'w'.*unsupported dtype"):
            Spec("w", (2,), bad)
    with pytest.raises(InputError, match="'w'.*non-negative"):
        Spec("w", (2, -1), "f32")
    assert Spec("w", [2, 3], np.float16) == Spec("w", (2, 3), "float16") == Spec("w", (2, 3), "f16")


# ---- untrusted files ----------------------------------------------------------------------------


def good_tensors(rng):
    return {
        "a.b.weight": ("F32", rng.standard_normal((3, 4)).astype(np.float32)),
        "a.b.bias": ("F32", rng.standard_normal(4).astype(np.float32)),
    }


def test_truncated_safetensors_names_file_and_tensor(tmp_path, rng):
    path = write_safetensors(tmp_path / "t.safetensors", good_tensors(rng))
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ArtifactError, match=r"t\.safetensors: tensor 'a\.b\.bias'.*outside the data section"):
        Parameters.open(path)


def test_header_length_past_the_end_or_too_large(tmp_path, rng):
    for n in (10**6, 2**63, 0xFFFFFFFFFFFFFFFF):
        path = tmp_path / "h.safetensors"
        path.write_bytes(struct.pack("<Q", n) + b"{}")
        with pytest.raises(ArtifactError, match=rf"h\.safetensors: safetensors header of {n} bytes does not fit"):
            Parameters.open(path)
    (tmp_path / "short.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(ArtifactError, match=r"short\.safetensors.*shorter"):
        Parameters.open(tmp_path / "short.safetensors")


def test_overlapping_tensors(tmp_path):
    header = {
        "big": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "one": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
        "two": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
    }
    path = write_safetensors(tmp_path / "o.safetensors", {}, header=header, tail=b"\0" * 16)
    with pytest.raises(ArtifactError, match=r"o\.safetensors: tensors 'big' and 'one' overlap"):
        Parameters.open(path)


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"dtype": "F8_E5M2", "shape": [2], "data_offsets": [0, 2]}, "unknown dtype 'F8_E5M2'"),
        ({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}, r"span 8 bytes.*f32\[3\] needs 12"),
        ({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}, "non-negative ints"),
        ({"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}, "non-negative ints"),
        ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, "outside the data section"),
        ({"dtype": "F32", "shape": [2]}, "dtype, shape and data_offsets"),
        ([1, 2], "dtype, shape and data_offsets"),
    ],
)
def test_malformed_header_entry_names_file_and_tensor(tmp_path, entry, message):
    path = write_safetensors(tmp_path / "m.safetensors", {}, header={"w.x": entry}, tail=b"\0" * 8)
    with pytest.raises(ArtifactError, match=rf"m\.safetensors: tensor 'w\.x'.*{message}"):
        Parameters.open(path)


@pytest.mark.parametrize(
    "text, message",
    [
        (b"[1, 2]", "must be a JSON object"),
        (b"{not json", "not valid JSON"),
        (
            b'{"w": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}, '
            b'"w": {"dtype": "F32", "shape": [], "data_offsets": [4, 8]}}',
            "key 'w' appears twice",
        ),
    ],
)
def test_malformed_header_json(tmp_path, text, message):
    path = tmp_path / "j.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 8)
    with pytest.raises(ArtifactError, match=rf"j\.safetensors.*{message}"):
        Parameters.open(path)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "sub/inner.safetensors", "..", ""])
def test_shard_path_traversal(tmp_path, rng, shard):
    (tmp_path / "ckpt").mkdir()
    save_file({"w": rng.standard_normal(2).astype(np.float32)}, str(tmp_path / "outside.safetensors"))
    (tmp_path / "ckpt" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(ArtifactError, match=r"index\.json: shard .* is not a plain file name"):
        Parameters.open(tmp_path / "ckpt")


def test_shard_must_hold_exactly_its_listed_tensors(tmp_path, rng):
    root = sharded(tmp_path, weights(rng))
    index = root / "model.safetensors.index.json"
    good = json.loads(index.read_text())
    good["weight_map"]["a.b.extra"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps(good))
    with pytest.raises(ArtifactError, match=r"'a\.b\.extra' is listed in shard 'model-00001-of-00002"):
        Parameters.open(root)
    del good["weight_map"]["a.b.extra"]
    index.write_text(json.dumps(good))
    save_file(
        {"a.b.bias": rng.standard_normal(4).astype(np.float32), "a.b.other": np.ones(2, np.float32)},
        str(root / "model-00002-of-00002.safetensors"),
    )
    with pytest.raises(ArtifactError, match=r"shard 'model-00002-of-00002\.safetensors' holds tensor 'a\.b\.other'"):
        Parameters.open(root)
    index.write_text(json.dumps({"weight_map": {"a.b.weight": "missing.safetensors"}}))
    with pytest.raises(ArtifactError, match=r"shard 'missing\.safetensors' not found"):
        Parameters.open(root)
    index.write_text(json.dumps({"weights": {}}))
    with pytest.raises(ArtifactError, match="weight_map"):
        Parameters.open(root)


def test_nonexistent_unsupported_and_garbage_paths(tmp_path):
    with pytest.raises(InputError, match=r"nowhere\.safetensors does not exist"):
        Parameters.open(tmp_path / "nowhere.safetensors")
    (tmp_path / "w.bin").write_bytes(b"abc")
    with pytest.raises(InputError, match=r"w\.bin: unsupported file kind '\.bin'"):
        Parameters.open(tmp_path / "w.bin")
    (tmp_path / "g.irpa").write_bytes(b"garbage" * 20)
    with pytest.raises(ArtifactError, match=r"g\.irpa: not a readable \.irpa archive"):
        Parameters.open(tmp_path / "g.irpa")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds neither model.safetensors"):
        Parameters.open(tmp_path / "empty")
    with pytest.raises(InputError, match="unsupported source int"):
        Parameters.open(3)


def test_truncated_irpa(tmp_path, rng):
    path = save_parameters(tmp_path / "w.irpa", {"big": rng.standard_normal(4096).astype(np.float32)})
    path.write_bytes(path.read_bytes()[:8192])  # half of the tensor's 16 KiB
    with pytest.raises(ArtifactError, match=r"w\.irpa: not a readable \.irpa archive"):
        Parameters.open(path)


# ---- end to end: a compiled module reads its weights from each kind of source ---------------------


def source_of(kind, tmp_path, w):
    """One source of the weights `w` for each kind; returns (source, weights the module will see)."""
    if kind == "dict":
        return w, w
    if kind == "irpa":
        return save_parameters(tmp_path / "w.irpa", w), w
    if kind == "safetensors":
        save_file(w, str(tmp_path / "m.safetensors"))
        return tmp_path / "m.safetensors", w
    if kind == "sharded":
        return sharded(tmp_path, w), w
    if kind == "mixed":
        save_file({"a.b.weight": w["a.b.weight"]}, str(tmp_path / "w.safetensors"))
        return [tmp_path / "w.safetensors", {"a.b.bias": w["a.b.bias"]}], w
    # converted: a bf16 weight beside an f32 bias in one file (the bias is served from the mapped file)
    seen = dict(w, **{"a.b.weight": w["a.b.weight"].astype(ml_dtypes.bfloat16)})
    tensors = {
        "pad": ("U8", np.arange(3, dtype=np.uint8)),
        "a.b.weight": ("BF16", seen["a.b.weight"]),
        "a.b.bias": ("F32", w["a.b.bias"]),
    }
    return write_safetensors(tmp_path / "c.safetensors", tensors), seen


@pytest.mark.parametrize("kind", ["irpa", "safetensors", "sharded", "dict", "mixed", "converted"])
def test_module_runs_with_parameters_from(kind, tmp_path, program, rng):
    source, seen = source_of(kind, tmp_path, weights(rng))
    x = rng.standard_normal((2, 3)).astype(np.float32)
    got = run_program(program, Parameters.open(source), x)
    np.testing.assert_allclose(got, reference(x, seen), rtol=1e-5, atol=1e-5)


def test_provider_without_specs_serves_everything(tmp_path, program, rng):
    w = weights(rng)
    p = Parameters.open([sharded(tmp_path, w), {"unused": rng.standard_normal(3).astype(np.float32)}])
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(run_program(program, p, x, specs=None), reference(x, w), rtol=1e-5, atol=1e-5)


def test_arrays_outlive_the_caller_references(program, rng):
    w = weights(rng)
    w_seen = {k: a.copy() for k, a in w.items()}
    p = Parameters.open({k: a.copy() for k, a in w.items()})
    instance, device = rt.VmInstance(), rt.get_device("local-sync")
    module = p.provider(instance, specs=SPECS)
    del p
    gc.collect()
    program_module = rt.VmModule.copy_buffer(instance, program)
    context = rt.VmContext(instance, modules=[rt.create_hal_module(instance, device), module, program_module])
    x = rng.standard_normal((2, 3)).astype(np.float32)
    got = np.asarray(rt.FunctionInvoker(context, device, program_module.lookup_function("main"))(x).to_host())
    np.testing.assert_allclose(got, reference(x, w_seen), rtol=1e-5, atol=1e-5)


def test_joined_tensors_and_a_rank_s_slices_of_them(tmp_path, rng):
    """shard() joins tensors along axis 0 (a fused q/k/v projection made at load), whole or each one's slice of a
    rank; the checkpoint file is not changed."""
    q, k, v = (rng.standard_normal((n, 4)).astype(np.float32) for n in (8, 4, 4))
    save_file({"q": q, "k": k, "v": v, "n": np.ones(4, np.float32)}, str(tmp_path / "model.safetensors"))
    before = (tmp_path / "model.safetensors").read_bytes()
    p = Parameters.open(tmp_path)
    whole = p.shard({"qkv": (("q", "k", "v"), 0), "n": ("n", None)}, 0, 1)
    np.testing.assert_array_equal(whole.array("qkv"), np.concatenate([q, k, v]))
    assert whole.info("qkv") == ((16, 4), "f32") and whole.info("n") == ((4,), "f32")
    rank1 = p.shard({"qkv": (("q", "k", "v"), 0)}, 1, 2)
    np.testing.assert_array_equal(rank1.array("qkv"), np.concatenate([q[4:], k[2:], v[2:]]))
    assert (tmp_path / "model.safetensors").read_bytes() == before


def test_tensors_that_do_not_concatenate_are_an_input_error(tmp_path, rng):
    save_file(
        {"a": rng.standard_normal((2, 4)).astype(np.float32), "b": rng.standard_normal((2, 3)).astype(np.float32)},
        str(tmp_path / "model.safetensors"),
    )
    with pytest.raises(InputError, match=r"parameter 'ab' joins 'a', 'b' along axis 0, but their shapes do not"):
        Parameters.open(tmp_path).shard({"ab": (("a", "b"), 0)}, 0, 1)
