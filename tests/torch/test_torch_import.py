"""rocmc.import_torch: torch.export programs become rocmc graphs that compute what the eager module does.

Every family of tests/export_models.py is imported with its dynamic axes as torch.export.Dims, compiled
for the CPU and compared with the eager module at two (batch, sequence) sizes at 1e-4 relative (f32, on
the rows the attention mask keeps); a static import of each is checked with rocmc's float64 reference.
Small modules pin the semantics of single ATen ops, the Dims' ranges and divisibility, external
parameters, error reporting and the gfx942 build of an LLM (hand-written rms_norm/rope kernels).
"""

import subprocess
import sys

import numpy as np
import pytest

import rocmc

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import export_models as zoo  # noqa: E402
from helpers import TOL  # noqa: E402

SIZES = ((2, 7), (3, 12))
Dim = torch.export.Dim


def _rel(got, ref, keep=None) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if keep is not None:
        got, ref = got[keep], ref[keep]
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _torch_args(arrays):
    return tuple(torch.from_numpy(a) for a in arrays)


# Compiled for the CPU here: all but three CNNs, whose CPU builds take most of a minute each on two cores
# (they run through rocmc's float64 reference, which checks the import alone); bench/torch_exports.py
# compiles every family, static and dynamic (docs/torch-exports.md).
CPU_COMPILED = set(zoo.FAMILIES) - {"mobilenet_v2", "resnet", "convnext"}


@pytest.mark.parametrize("family", list(zoo.FAMILIES))
def test_family_matches_torch(family, rng):
    model = zoo.build(family, seed=int(rng.integers(1 << 31)))
    f = zoo.FAMILIES[family]
    example = f.inputs(rng, *SIZES[0])
    graph = rocmc.import_torch(model, _torch_args(example), dynamic_shapes=zoo.torch_dynamic_shapes(family, model))
    assert "batch" in graph.symbols()
    run = (
        rocmc.load(rocmc.compile(graph, "cpu")) if family in CPU_COMPILED else (lambda *xs: rocmc.evaluate(graph, *xs))
    )
    for batch, seq in SIZES:
        inputs = f.inputs(rng, batch, seq)
        got, ref = run(*inputs), zoo.run_torch(model, inputs)
        assert got.shape == ref.shape
        err = _rel(got, ref, zoo.valid_rows(family, inputs))
        assert err < 1e-4, f"{family} at batch {batch}, seq {seq}: relative error {err:.2e}"
    static = rocmc.import_torch(model, _torch_args(example))
    assert not static.symbols()
    err = _rel(rocmc.evaluate(static, *example), zoo.run_torch(model, example), zoo.valid_rows(family, example))
    assert err < 1e-4, f"{family} static: relative error {err:.2e}"


@pytest.mark.parametrize("family, dtype", [("bert", "f16"), ("llama", "bf16")])
def test_half_precision_family(family, dtype, rng):
    """Half-precision models compiled for the CPU, against the f32 model."""
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    model = zoo.build(family, seed=int(rng.integers(1 << 31)))
    inputs = zoo.FAMILIES[family].inputs(rng, 2, 8)
    ref32 = zoo.run_torch(model, inputs)
    model = model.to(tdt)
    graph = rocmc.import_torch(model, _torch_args(inputs))
    assert graph.outputs[0].dtype.name == dtype
    got = rocmc.load(rocmc.compile(graph, "cpu"))(*inputs)
    with torch.no_grad():
        ref = model(*_torch_args(inputs)).float().numpy()
    keep = zoo.valid_rows(family, inputs)
    # rocmc and torch round at different points: each is about as far from the f32 model as the other
    assert _rel(got, ref32, keep) < max({"bf16": 5e-2, "f16": 5e-3}[dtype], 3 * _rel(ref, ref32, keep))


def test_llm_gfx942_gets_hand_written_kernels(rng):
    model = zoo.build("llama", seed=int(rng.integers(1 << 31)))
    example = zoo.FAMILIES["llama"].inputs(rng, 2, 8)
    graph = rocmc.import_torch(model, _torch_args(example), dynamic_shapes=zoo.torch_dynamic_shapes("llama", model))
    art = rocmc.compile(graph, "gfx942")
    found = [r["op"] for r in art.metadata["rewrites"]]
    assert found.count("rms_norm") == 5 and found.count("rope") == 4
    assert sum(n.op == "sdpa" for n in graph.nodes) == 2  # attention arrives whole
    kernels = {d["name"] for d in art.dispatches() if d["kind"] == "hand-written"}
    assert any(k.startswith("rms_norm_") for k in kernels) and any(k.startswith("rope_") for k in kernels)


# ---- single ops against eager torch ---------------------------------------------------------------------


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _check(fn, *arrays, dynamic_shapes=None, tol=1e-5):
    args = _torch_args(arrays)
    spec = None if dynamic_shapes is None else (dynamic_shapes,)  # _Fn takes *xs
    graph = rocmc.import_torch(_Fn(fn), args, dynamic_shapes=spec)
    with torch.no_grad():
        ref = fn(*args).numpy()
    got = rocmc.evaluate(graph, *arrays)
    assert graph.outputs[0].dtype.np == ref.dtype, f"dtype {graph.outputs[0].dtype} vs torch's {ref.dtype}"
    assert got.shape == ref.shape
    if ref.dtype == np.bool_ or ref.dtype.kind in "iu":
        np.testing.assert_array_equal(got, ref)
    else:
        np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol)
    return graph


OPS = {
    "int_plus_float_scalar": (lambda x: x + 1.5, "i64"),
    "int_true_div": (lambda x: x / 3, "i64"),
    "floor_div_int": (lambda x: torch.div(x, 3, rounding_mode="floor"), "i64"),
    "trunc_div_int": (lambda x: torch.div(x, 3, rounding_mode="trunc"), "i64"),
    "trunc_div_float": (lambda x: torch.div(x, 0.7, rounding_mode="trunc"), "f32"),
    "remainder": (lambda x: torch.remainder(x, 3), "i64"),
    "sub_alpha": (lambda x: torch.sub(x, x * x, alpha=2), "f32"),
    "compare_int_float": (lambda x: x > 0.5, "i64"),
    "clamp": (lambda x: torch.clamp(x, -0.5, 0.25), "f32"),
    "relu6": (lambda x: torch.nn.functional.relu6(x), "f32"),
    "log_softmax": (lambda x: torch.log_softmax(x, 1), "f32"),
    "sum_int_to_i64": (lambda x: x.sum(1), "i32"),
    "mean_keepdim": (lambda x: x.mean((0, 2), keepdim=True), "f32"),
    "var": (lambda x: x.var(2), "f32"),
    "max_dim": (lambda x: x.max(1).values + x.argmax(1), "f32"),
    "any": (lambda x: (x > 1).any(2), "f32"),
    "cumsum": (lambda x: x.cumsum(2), "f32"),
    "split_cat": (lambda x: torch.cat(list(reversed(x.split([1, 3], 2))), 2), "f32"),
    "chunk_select": (lambda x: x.chunk(2, 2)[1][:, 0] * x[:, -1, 2:], "f32"),
    "flip": (lambda x: x.flip(2), "f32"),
    "pad": (lambda x: torch.nn.functional.pad(x, (1, 2, 0, 1), value=0.5), "f32"),
    "index_two": (lambda x: x[torch.tensor([0, 1, 1]), torch.tensor([2, 0, 1])], "f32"),
    "index_middle": (lambda x: x[:, torch.tensor([[0, 2], [1, 1]])], "f32"),
    "gather_smaller": (lambda x: torch.gather(x, 2, torch.tensor([[[0, 3], [1, 1]]])), "f32"),
    "scatter_add": (lambda x: torch.zeros(2, 3, 5).scatter_add(2, torch.tensor([[[0, 1, 1, 4]] * 3] * 2), x), "f32"),
    "index_put": (lambda x: x.index_put((torch.tensor([1, 0]),), torch.tensor(7.0)), "f32"),
    "where_scalar": (lambda x: torch.where(x > 0, x, 0.0), "f32"),
    "tril": (lambda x: torch.tril(x, -1), "f32"),
    "arange_float": (lambda x: x + torch.arange(0.5, 4.5, 1.0), "f32"),
    "gelu_tanh": (lambda x: torch.nn.functional.gelu(x, approximate="tanh"), "f32"),
    "hardswish": (lambda x: torch.nn.functional.hardswish(x), "f32"),
}


@pytest.mark.parametrize("name", list(OPS))
def test_op_matches_torch(name, rng):
    fn, dtype = OPS[name]
    x = rng.standard_normal((2, 3, 4)) * 3
    x = x.astype(np.float32) if dtype == "f32" else np.round(x).astype({"i64": np.int64, "i32": np.int32}[dtype])
    _check(fn, x)


def test_layers_match_torch(rng):
    from torch import nn

    torch.manual_seed(int(rng.integers(1 << 31)))
    layers = nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1, groups=2),
        nn.GroupNorm(2, 8),
        nn.AvgPool2d(2, 2),
        nn.ConvTranspose2d(8, 4, 2, stride=2),
        nn.BatchNorm2d(4),
        nn.AdaptiveAvgPool2d(2),
    ).eval()
    with torch.no_grad():
        layers[4].running_mean.uniform_(-1, 1)
        layers[4].running_var.uniform_(0.5, 2)
    _check(layers, rng.standard_normal((2, 4, 8, 8)).astype(np.float32), tol=1e-4)


@pytest.mark.parametrize("causal, q_len, gqa", [(True, 5, False), (True, 3, True), (False, 5, True)])
def test_sdpa_semantics(causal, q_len, gqa, rng):
    """torch's is_causal is top-left aligned (rocmc's bottom-right): equal only for square scores;
    a query whose keys are all masked gives 0 in torch."""

    def attend(q, k, v, m):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=None if causal else m, is_causal=causal, enable_gqa=gqa, scale=0.3
        )

    q = rng.standard_normal((2, 4, q_len, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2 if gqa else 4, 5, 8)).astype(np.float32) for _ in range(2))
    mask = rng.random((2, 1, q_len, 5)) > 0.4
    mask[0, 0, 0] = False  # one query attends to nothing
    _check(attend, q, k, v, mask)


# ---- symbolic dims ----------------------------------------------------------------------------------------


def test_dims_are_named_and_size_arithmetic_stays_symbolic(rng):
    def fn(x):
        b, s, d = x.shape
        y = x.reshape(b * s, d)[1:] * 2  # a slice from 1 to b*s
        return y.reshape(-1)[: s * d] + torch.arange(s * d)

    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    graph = _check(fn, x, dynamic_shapes=({0: Dim("batch", min=2, max=8), 1: Dim("seq", max=32)},))
    assert graph.symbols() == ["batch", "seq"]
    assert "f32[(seq*4)]" in str(graph)
    module = rocmc.load(rocmc.compile(graph, "cpu"))
    x2 = rng.standard_normal((4, 9, 4)).astype(np.float32)
    np.testing.assert_allclose(module(x2), fn(torch.from_numpy(x2)).numpy(), rtol=1e-6)


def test_dim_range_is_checked_at_call_time(rng):
    """A call outside a Dim's range names the input, the dim, its size and the whole allowed range."""
    x = rng.standard_normal((2, 6)).astype(np.float32)
    graph = rocmc.import_torch(
        _Fn(lambda x: x * 2), (torch.from_numpy(x),), dynamic_shapes=(({1: Dim("seq", min=4, max=16)},),)
    )
    module = rocmc.load(rocmc.compile(graph, "cpu"))
    np.testing.assert_allclose(module(x), x * 2)
    name = graph.inputs[0].name
    for bad in (3, 17):
        want = rf"^input '{name}' dim 1 \('seq'\) is {bad}; allowed range is \[4, 16\] \(torch.export range of seq\)$"
        with pytest.raises(rocmc.InputError, match=want):
            module(rng.standard_normal((2, bad)).astype(np.float32))
        with pytest.raises(rocmc.InputError, match=want):
            rocmc.evaluate(graph, rng.standard_normal((2, bad)).astype(np.float32))


@pytest.mark.parametrize("dim", ["named", "auto", "dynamic"])
def test_dims_without_max_have_no_upper_bound(dim, rng):
    """Dim("seq") (no max), Dim.AUTO and Dim.DYNAMIC: symbolic dims with torch's lower bound (none for a
    named Dim, 2 for the others: torch specializes 0 and 1) and no upper one, checked on every call."""
    spec = {"named": Dim("seq"), "auto": Dim.AUTO, "dynamic": Dim.DYNAMIC}[dim]

    def fn(x):
        return torch.tanh(x) * 3 + x.mean(1, keepdim=True)

    x = rng.standard_normal((2, 6)).astype(np.float32)
    graph = rocmc.import_torch(_Fn(fn), (torch.from_numpy(x),), dynamic_shapes=(({1: spec},),))
    (sym,) = graph.symbols()
    assert graph.inputs[0].shape == (2, sym)
    assert [c.describe() for c in graph.assumptions] == (
        [] if dim == "named" else [f"torch.export range of {sym}: {sym} >= 2"]
    )
    module = rocmc.load(rocmc.compile(graph, "cpu"))
    for seq in (3, 301, 4099):
        xs = rng.standard_normal((2, seq)).astype(np.float32)
        want = fn(torch.from_numpy(xs.astype(np.float64))).numpy()
        np.testing.assert_allclose(module(xs), want, rtol=TOL["f32"][0], atol=TOL["f32"][1])
        # float64 both: equal to rounding (where the terms cancel, an output near zero keeps an absolute error)
        np.testing.assert_allclose(rocmc.evaluate(graph, xs), want, rtol=1e-12, atol=1e-14)
    x1 = rng.standard_normal((2, 1)).astype(np.float32)
    if dim == "named":
        np.testing.assert_allclose(module(x1), fn(torch.from_numpy(x1)).numpy(), rtol=1e-5)
    else:
        want = rf"^input '{graph.inputs[0].name}' dim 1 \('{sym}'\) is 1; allowed range is \[2, inf\)"
        with pytest.raises(rocmc.InputError, match=want):
            module(x1)


def test_derived_dim_divisibility_is_a_constraint(rng):
    k = Dim("k", min=1, max=8)

    def fn(x):
        return x.reshape(x.shape[0], x.shape[1] // 8, 32).sum(2)

    x = rng.standard_normal((2, 16, 4)).astype(np.float32)
    graph = _check(fn, x, dynamic_shapes=({1: 8 * k},))
    assert any(c.kind == "divisible" for c in graph.assumptions)
    module = rocmc.load(rocmc.compile(graph, "cpu"))
    x3 = rng.standard_normal((2, 24, 4)).astype(np.float32)
    # against the float64 sum, at the suite's f32 tolerance (a sum of 32 values near 0 is off by a few ulps
    # of its terms in any f32 summation order: torch's f32 result is no reference for a relative 1e-5)
    rtol, atol = TOL["f32"]
    np.testing.assert_allclose(module(x3), fn(torch.from_numpy(x3.astype(np.float64))).numpy(), rtol=rtol, atol=atol)
    with pytest.raises(rocmc.InputError, match="divisible by 8"):
        module(rng.standard_normal((2, 20, 4)).astype(np.float32))


# ---- transformers models as loaded, constant keyword arguments, outputs that are not tensors -------------


def _hf_causal_lm(config_name: str, seed: int, tmp_path=None):
    """A tiny random transformers causal LM, straight from from_config, or saved and read back with
    from_pretrained when tmp_path is given: the model as a user has it (ModelOutput with a DynamicCache)."""
    import transformers

    cfg = getattr(transformers, config_name)(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    if tmp_path is not None:
        model.save_pretrained(tmp_path)
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    return model


@pytest.mark.parametrize("config_name, loaded", [("LlamaConfig", "from_config"), ("Qwen2Config", "from_pretrained")])
def test_hf_causal_lm_as_loaded(config_name, loaded, tmp_path, rng):
    """The model itself, not a wrapper: its ModelOutput's cache is dropped and the graph returns the
    logits, over an unbounded Dim("seq"); compared with the float64 eager model at odd lengths."""
    import copy

    model = _hf_causal_lm(config_name, int(rng.integers(1 << 31)), tmp_path if loaded == "from_pretrained" else None)
    ids = torch.from_numpy(rng.integers(0, 128, (1, 9)))
    graph = rocmc.import_torch(model, (ids,), dynamic_shapes=({1: Dim("seq")},))
    assert [v.name for v in graph.inputs] == ["input_ids"] and len(graph.outputs) == 1
    assert graph.outputs[0].shape == (1, "seq", 128) and graph.outputs[0].dtype.name == "f32"
    # use_cache=False is a constant of the export, not an input; dynamic_shapes by name needs no entry for it
    no_cache = rocmc.import_torch(
        model,
        (ids,),
        kwargs={"use_cache": False, "output_attentions": False},
        dynamic_shapes={"input_ids": {1: Dim("seq")}},
    )
    assert [v.name for v in no_cache.inputs] == ["input_ids"] and len(no_cache.outputs) == 1
    module = rocmc.load(rocmc.compile(graph, "cpu"))
    ref64 = copy.deepcopy(model).double()
    for seq in (5, 13):
        x = rng.integers(0, 128, (1, seq)).astype(np.int64)
        with torch.no_grad():
            want = ref64(torch.from_numpy(x)).logits.numpy()
        # the model computes its rotary tables in f32 even in float64: the float64 reference is that close
        assert _rel(rocmc.evaluate(graph, x), want) < 1e-6
        assert _rel(rocmc.evaluate(no_cache, x), want) < 1e-6
        assert _rel(module(torch.from_numpy(x)), want) < TOL["f32"][0]
    names = set(rocmc.import_torch(model, (ids,), parameters="external").parameters)
    assert names == set(dict(model.named_parameters()))  # the state-dict names, as in the checkpoint


class _Structured(torch.nn.Module):
    """Returns a dict with None, a number and a string among the tensors; takes non-tensor keywords."""

    def forward(self, x, mask=None, *, scale: float = 1.0, flag: bool = False, mode: str = "sum", bias=None):
        y = x * scale + (0 if bias is None else bias)
        if flag:
            y = -y
        s = y.sum(1) if mode == "sum" else y.amax(1)
        if mask is not None:
            s = s * mask
        return {"none": None, "y": y, "count": 3, "stats": (s, "note", torch.tanh(s)), "mode": mode}


def test_constant_kwargs_and_non_tensor_outputs(rng):
    x = rng.standard_normal((2, 5)).astype(np.float32)
    mask = (rng.random(2) > 0.5).astype(np.float32)
    kwargs = {"scale": 2.5, "flag": True, "mode": "max", "bias": None, "mask": torch.from_numpy(mask)}
    graph = rocmc.import_torch(
        _Structured(),
        (torch.from_numpy(x),),
        kwargs=kwargs,
        dynamic_shapes={"x": {1: Dim("n")}, "mask": None, "scale": None},
    )
    assert [v.name for v in graph.inputs] == ["x", "mask"] and len(graph.outputs) == 3
    x7 = rng.standard_normal((2, 7)).astype(np.float32)
    got = rocmc.evaluate(graph, x7, mask)
    want = _Structured()(
        torch.from_numpy(x7.astype(np.float64)),
        torch.from_numpy(mask.astype(np.float64)),
        scale=2.5,
        flag=True,
        mode="max",
    )
    for g, w in zip(got, (want["y"], *want["stats"][::2])):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(rocmc.ModelImportError, match=r"dynamic_shapes gives a shape for 'scale'"):
        rocmc.import_torch(
            _Structured(),
            (torch.from_numpy(x),),
            kwargs={"scale": 2.0},
            dynamic_shapes={"x": {1: Dim("n")}, "scale": {0: Dim("m")}},
        )


# ---- weights, errors, packaging -------------------------------------------------------------------------


def test_external_parameters_under_state_dict_names(rng):
    from torch import nn

    torch.manual_seed(int(rng.integers(1 << 31)))
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4)).eval()
    x = rng.standard_normal((3, 8)).astype(np.float32)
    graph = rocmc.import_torch(model, (torch.from_numpy(x),), parameters="external")
    assert set(graph.parameters) == set(model.state_dict()) and not graph.constants
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    got = rocmc.load(rocmc.compile(graph, "cpu"), parameters=weights)(x)
    np.testing.assert_allclose(got, zoo.run_torch(model, (x,)), rtol=1e-5, atol=1e-6)
    assert sum(n.op == "linear" for n in graph.nodes) == 2  # addmm(b, x, W^T) reads W as stored


def test_unsupported_nodes_are_all_reported(rng):
    def fn(x):
        return torch.sort(x, 1).values + torch.cummax(x, 1).values + x.exp()

    with pytest.raises(rocmc.ModelImportError) as e:
        rocmc.import_torch(_Fn(fn), (torch.randn(2, 5),))
    text = str(e.value)
    assert "2 unsupported node(s)" in text
    assert "aten.sort.default 'sort': op is not supported" in text and "aten.cummax.default" in text


def test_bad_arguments_are_import_errors():
    with pytest.raises(rocmc.ModelImportError, match="nn.Module or torch.export.ExportedProgram"):
        rocmc.import_torch("model.pt2")
    with pytest.raises(rocmc.ModelImportError, match="parameters='weights'"):
        rocmc.import_torch(_Fn(torch.exp), (torch.randn(2),), parameters="weights")


@pytest.mark.parametrize("dim", ["max_32", "named", "auto"])
def test_cli_compiles_a_saved_program(dim, tmp_path, rng):
    from rocmc.cli import main

    spec = {"max_32": Dim("seq", max=32), "named": Dim("seq"), "auto": Dim.AUTO}[dim]
    x = rng.standard_normal((2, 6)).astype(np.float32)
    ep = torch.export.export(_Fn(lambda x: torch.tanh(x) * 3), (torch.from_numpy(x),), dynamic_shapes=(({1: spec},),))
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    assert main(["compile", str(tmp_path / "m.pt2"), "-o", str(tmp_path / "m.vmfb")]) == 0
    module = rocmc.load(str(tmp_path / "m.vmfb"))
    x9 = rng.standard_normal((2, 9)).astype(np.float32)
    np.testing.assert_allclose(module(x9), np.tanh(x9) * 3, rtol=1e-5)
    x_long = rng.standard_normal((2, 77)).astype(np.float32)
    if dim == "max_32":
        with pytest.raises(rocmc.InputError, match=r"dim 1 \('\w+'\) is 77; allowed range is \[0, 32\]"):
            module(x_long)
    else:
        np.testing.assert_allclose(module(x_long), np.tanh(x_long) * 3, rtol=1e-5)


def test_import_rocmc_does_not_import_torch():
    code = "import sys, rocmc; rocmc.import_torch; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
