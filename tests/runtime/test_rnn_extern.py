"""LSTM, GRU and attention as extern calls (the `dnn` implementation): the packed ABI result,
the reference provider (which computes in MIOpen's gate order), what falls back to generated."""

import ctypes
import re

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.externs import DNN
from rocmc.lowering import registry
from rocmc.lowering.target import Target

from fake_capi import FakeCapi
from helpers import TOL, check, rand
from test_extern import _dump_imports
from helpers import rnn_graph as _graph

SIGNATURES = DNN.signatures


@pytest.mark.parametrize("op, dtype", [("lstm", "f32"), ("gru", "f32"), ("lstm", "f16"), ("gru", "f16")])
def test_rnn_through_the_reference_provider(op, dtype, rng):
    g, feeds = _graph(op, rng, dtype=dtype, batch="b", inp=6, hidden=5)
    art = rocmc.compile(g, "cpu", libraries=["dnn"])
    assert [x["import"] for x in art.metadata["externs"]] == [f"dnn.{op}" + ("" if dtype == "f32" else ".f16")]
    rtol, atol = TOL[dtype]
    lib = check(g, *feeds, tol=(2 * rtol, 2 * atol), libraries=["dnn"])
    gen = rocmc.load(rocmc.compile(g, "cpu", impl="generated"))(*feeds)
    for a, b in zip(lib, gen):
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=2 * rtol, atol=2 * atol)


@pytest.mark.parametrize("op", ["lstm", "gru"])
def test_rnn_without_biases_or_states_and_one_bias(op, rng):
    g, feeds = _graph(op, rng, biases=False, states=False)
    check(g, *feeds, libraries=["dnn"])
    g = rocmc.Graph("t")
    x = g.input("x", ("s", 2, 4), "f32")
    gates = {"lstm": 4, "gru": 3}[op] * 3
    g.output(*getattr(ops, op)(x, rand(rng, (gates, 4)), rand(rng, (gates, 3)), b_hh=rand(rng, (gates,))))
    check(g, rand(rng, (5, 2, 4)), libraries=["dnn"])


def test_sdpa_through_the_reference_provider_f16(rng):
    g = rocmc.Graph("t")
    q, k, v = (g.input(n, ("b", 3, s, 8), "f16") for n, s in (("q", 5), ("k", 9), ("v", 9)))
    g.output(ops.sdpa(q, k, v))
    art = rocmc.compile(g, "cpu", libraries=["dnn"])
    assert [x["import"] for x in art.metadata["externs"]] == ["dnn.sdpa.f16"]
    check(g, *(rand(rng, (2, 3, s, 8), "f16", -1, 1) for s in (5, 9, 9)), tol=(1e-2, 1e-2), libraries=["dnn"])


def test_gfx942_module_imports_half_rnn_and_attention(tmp_path, rng):
    g = rocmc.Graph("t")
    x = g.input("x", ("s", "b", 6), "f16")
    y, h = ops.gru(x, rand(rng, (12, 6), "f16"), rand(rng, (12, 4), "f16"))
    q = g.input("q", (2, 2, 5, 8), "f16")
    g.output(y, h, ops.sdpa(q, q, q))
    art = rocmc.compile(g, "gfx942", libraries=["dnn"])
    imports = dict(re.findall(r"vm\.import @(dnn\.[\w.]+) cconv \"(\w+)\"", _dump_imports(art.vmfb, tmp_path)))
    assert imports == {"dnn.gru.f16": SIGNATURES["gru"].cconv, "dnn.sdpa.f16": SIGNATURES["sdpa"].cconv}
    assert SIGNATURES["gru"].cconv == "0rrrrrr_r" and SIGNATURES["sdpa"].cconv == "0rrrI_r"
    assert [c["name"] for c in art.dispatches() if c["kind"] == "extern call"] == ["dnn.gru.f16", "dnn.sdpa.f16"]


def _choice(build, target="gfx942"):
    g = rocmc.Graph("t")
    node = build(g).producer
    return registry.choose(node, Target.parse(target), libraries=("dnn",))


@pytest.mark.parametrize(
    "build, reason",
    [
        (lambda g: ops.sdpa(*(g.input(n, (1, 2, 4, 8), "f32") for n in "qkv"), is_causal=True), "causal"),
        (lambda g: ops.sdpa(*(g.input(n, (1, 2, 4, 8), "f32") for n in "qkv"), mask=np.ones((4, 4), bool)), "mask"),
        (
            lambda g: ops.sdpa(
                g.input("q", (1, 4, 4, 8), "f32"), g.input("k", (1, 2, 4, 8), "f32"), g.input("v", (1, 2, 4, 8), "f32")
            ),
            "grouped kv heads",
        ),
        (
            lambda g: ops.lstm(
                g.input("x", (3, 1, 2), "bf16"),
                np.ones((8, 2), np.float32).astype(rocmc.dtype("bf16").np),
                np.ones((8, 2), np.float32).astype(rocmc.dtype("bf16").np),
            )[0],
            "dtype bf16",
        ),
    ],
)
def test_what_miopen_cannot_do_stays_generated(build, reason):
    choice = _choice(build)
    assert choice.impl.name == "generated"
    assert any(name == "dnn" and reason in why for name, why in choice.skipped), choice.skipped


def test_attention_stays_generated_on_cuda_and_cudnn_refuses_it():
    from rocmc.runtime.providers.cudnn import CudnnProvider

    choice = _choice(lambda g: ops.sdpa(*(g.input(n, (1, 2, 4, 8), "f32") for n in "qkv")), "cuda:sm_80")
    assert choice.impl.name == "generated"
    assert any(n == "dnn" and "no legacy multi-head attention" in r for n, r in choice.skipped), choice.skipped
    assert "graph API" in CudnnProvider.table_limits(None, "sdpa", {"scale": 0.5})
    assert (
        _choice(
            lambda g: ops.gru(g.input("x", (3, 1, 2), "f32"), np.ones((6, 2), np.float32), np.ones((6, 2), np.float32))[
                0
            ],
            "cuda:sm_80",
        ).impl.name
        == "dnn"
    )


class _FakeLibrary(FakeCapi):
    """Records every library and runtime call of a planner; hands out increasing handles and, for
    cuDNN's weight-params query, addresses inside the weight space (base + 1000 * id). For cuDNN's
    backend API it answers the first heuristics query (mode A) with `configs` engine configs, the
    engine of config i carrying the numerical notes `notes[i]` and the global index 40 + i, and
    every later query (the fallback list) with none."""

    def __init__(self, table, configs=2, notes=((0,), ())):
        super().__init__(table)
        self.configs, self.notes, self._engines = configs, notes, []
        self._sync = lambda stream: self.calls.append(("stream_sync", {"stream": stream}))

    def release_workspace(self):
        pass

    def _backend_get(self, named):
        attr, most, values = named["attr"], named["n_elems"], named["values"]
        if attr == 202:  # heuristics results
            n = min(most, self.configs) if most else self.configs
            self.configs = self.configs if not most else 0
        elif attr == 300:  # the engine of a config
            self._engines.append(values[0])
            n = 1
        elif attr == 1303:  # the engine's numerical notes
            notes = self.notes[self._engines.index(named["desc"])]
            for i, v in enumerate(notes):
                values[i] = v
            n = len(notes)
        else:  # workspace size 0, global index
            values[0] = 0 if attr == 402 else 40 + self._engines.index(named["desc"])
            n = 1
        named["n_out"]._obj.value = n

    def call(self, role, **named):
        record = {a: named.get(a) for a in self._names[role]}
        if role == "be_set":
            record["values"] = list(named["values"])
        self.calls.append((role, record))
        if role == "be_get":
            self._backend_get(named)
        if role.endswith("_find"):  # the legacy search: one record, algorithm 0
            named["n_out"]._obj.value = 1
        if role == "rnn_weight_params":
            base = named["w"] + 1000 * named["lin_id"]
            named["m_addr"]._obj.value, named["b_addr"]._obj.value = base, base + 500
        if role == "find_solutions":
            named["n_out"]._obj.value, named["solutions"][0] = 1, 0x77
        for out in ("size_out", "size_out2"):
            if out in named and named[out] is not None:
                named[out]._obj.value = 4096
        if "out" in named:
            self._next += 1
            named["out"]._obj.value = self._next

    def tensor(self, dims, dtype, keep, filter=False):
        return self._out(ctypes.c_void_p, "create_tensor")

    def workspace(self, nbytes):
        return 0xAB000


@pytest.mark.parametrize("vendor", ["miopen", "cudnn"])
def test_rnn_planner_drives_the_library_in_its_gate_order(vendor):
    """LSTM (seq 5, batch 2, input 3, hidden 4) with both biases and h0, no c0: the forward call gets
    the inference mode of the vendor, y then h_n, c_n behind it, and each gate block lands in the
    library slot of its gate."""
    from rocmc.runtime.providers.cudnn import CUDNN
    from rocmc.runtime.providers.miopen import MIOPEN
    from rocmc.runtime.providers.recurrent import rnn_plan

    table = {"miopen": MIOPEN, "cudnn": CUDNN}[vendor]
    p = _FakeLibrary(table)
    shapes = [(5, 2, 3), (16, 3), (16, 4), (16,), (16,), (1, 2, 4), (0,)]
    ptrs = [0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, None]
    plan = rnn_plan(p, "lstm", "f32", shapes, {}, ptrs)
    assert plan.out_shape == (7, 2, 4)
    (rnn,) = p.roles("set_rnn")
    assert (rnn["rnn_mode"], rnn["bias_mode"], rnn["hsize"]) == (2, table.enums["rnn_bias"], 4)
    p.calls.clear()
    plan.run(ptrs, 0x9000)
    (fwd,) = p.roles("rnn_fwd")
    assert fwd["fwd_mode"] == {"miopen": 1, "cudnn": 0}[vendor]
    assert (fwd["x"], fwd["hx"], fwd["cx"], fwd["y"]) == (0x1000, 0x6000, None, 0x9000)
    assert (fwd["hy"], fwd["cy"]) == (0x9000 + 5 * 2 * 4 * 4, 0x9000 + 6 * 2 * 4 * 4)
    # the output gate (torch block 3) of w_ih, and the new-memory gate (torch block 2) of b_hh
    order = table.gate_order["lstm"]
    o, g = order.index("o"), 4 + order.index("g")
    if vendor == "miopen":
        params = {
            (a["lin_id"], "bias" if r == "rnn_set_bias" else "w"): a["src"]
            for r, a in p.calls
            if r in ("rnn_set_param", "rnn_set_bias")
        }
        assert params[(o, "w")] == 0x2000 + 3 * 4 * 3 * 4 and o == 2
        assert params[(g, "bias")] == 0x5000 + 2 * 4 * 4 and g == 7
    else:
        copies = {a["dst"]: a["src"] for a in p.roles("memcpy_async")}
        wspace = next(a["w"] for r, a in p.calls if r == "rnn_fwd")
        assert copies[wspace + 1000 * o] == 0x2000 + 3 * 4 * 3 * 4 and o == 3
        assert copies[wspace + 1000 * g + 500] == 0x5000 + 2 * 4 * 4 and g == 6
        assert len(copies) == 16


def test_mha_planner_passes_q_k_v_and_the_output_by_tensor_id():
    from rocmc.runtime.providers.miopen import MHA_TENSORS, MIOPEN, mha_plan

    p = _FakeLibrary(MIOPEN)
    shapes = [(2, 3, 5, 8), (2, 3, 9, 8), (2, 3, 9, 6)]
    plan = mha_plan(p, "sdpa", "f16", shapes, {"scale": 0.25}, [0x1000, 0x2000, 0x3000])
    assert plan.out_shape == (2, 3, 5, 6)
    assert p.roles("set_mha")[0]["mha_scale"] == 0.25
    assert sorted(a["tensor_id"] for a in p.roles("set_problem_tensor")) == list(range(4, 21))
    p.calls.clear()
    plan.run([0x1000, 0x2000, 0x3000], 0x9000)
    (run,) = p.roles("run_solution")
    assert run["solution"] == 0x77 and run["n_args"] == 17 and run["ws_size"] == 4096
    by_id = {a.id: a.buffer for a in run["args"]}
    assert [by_id[MHA_TENSORS[n]] for n in ("q", "k", "v", "o")] == [0x1000, 0x2000, 0x3000, 0x9000]
    assert all(by_id[i] for i in range(4, 21))  # every scale, statistic and dropout tensor has a buffer


# ---- convolutions through the plan APIs (MIOpen's Find 2.0, cuDNN's backend graph) -----------------

_CONV_ATTRS = {"stride_h": 1, "stride_w": 2, "pad_h": 1, "pad_w": 0, "dilation_h": 1, "dilation_w": 1, "groups": 2}
_CONV_T_ATTRS = {**_CONV_ATTRS, "output_padding_h": 0, "output_padding_w": 1}


@pytest.mark.parametrize("op", ["conv2d", "conv_transpose2d"])
def test_miopen_conv_runs_a_find2_solution(op):
    """The convolution problem gets the direction and the x/w/y descriptors by tensor id, the search
    the real input and a scratch result; a call is one miopenRunSolution with x, w, y bound to
    the ABI's pointers (a transposed convolution's input is the problem's y), then the bias."""
    from rocmc.runtime.providers.conv_plan import _conv_plan
    from rocmc.runtime.providers.miopen import MIOPEN, find2_conv

    p = _FakeLibrary(MIOPEN)
    p.conv_builder = find2_conv
    shapes = [(2, 4, 9, 8), (6, 2, 3, 3) if op == "conv2d" else (4, 3, 3, 3), (6,)]
    ptrs = [0x1000, 0x2000, 0x3000]
    plan = _conv_plan(p, op, "f32", shapes, _CONV_ATTRS if op == "conv2d" else _CONV_T_ATTRS, ptrs)
    assert plan.out_shape == ((2, 6, 9, 3) if op == "conv2d" else (2, 6, 9, 18))
    (problem,) = p.roles("create_conv_problem")
    assert problem["direction"] == {"conv2d": 0, "conv_transpose2d": 1}[op]
    assert sorted(a["tensor_id"] for a in p.roles("set_problem_tensor")) == [1, 2, 3]
    found = {a["tensor_id"]: a["ptr"] for a in p.roles("set_find_tensor")}
    scratch = next(a["out"] for r, a in p.calls if r == "malloc")
    input_id, output_id = (1, 3) if op == "conv2d" else (3, 1)
    assert found[input_id] == 0x1000 and found[2] == 0x2000
    assert found[output_id] != 0x1000 and ("free", {"ptr": found[output_id]}) in p.calls
    assert scratch is not None
    (conv,) = p.roles("set_conv")
    assert list(conv["pads"]) == [1, 0] and list(conv["stride_a"]) == [1, 2] and conv["mode"] == 0
    p.calls.clear()
    plan.run(ptrs, 0x9000)
    assert [r for r, _ in p.calls] == ["run_solution", "add_tensor"]
    run = p.calls[0][1]
    by_id = {a.id: a.buffer for a in run["args"]}
    assert by_id == {input_id: 0x1000, 2: 0x2000, output_id: 0x9000}
    assert run["n_args"] == 3 and run["ws_size"] == 4096
    assert (p.calls[1][1]["b"], p.calls[1][1]["y"]) == (0x3000, 0x9000)


def _backend_sets(p, attr):
    return [a["values"] for r, a in p.calls if r == "be_set" and a["attr"] == attr]


def test_cudnn_conv_builds_a_fused_graph_and_skips_tf32_engines():
    """conv2d + bias in f32: tensors x, w, y, b by unique id and the conv result virtual, one
    pointwise add; the heuristics' first engine (tensor-core note) is never finalized, the second
    is; the first call with a set of pointers executes the plan with a variant pack of them, the
    second under stream capture, and from there on the captured graph is replayed."""
    from rocmc.runtime.providers.cudnn import CUDNN
    from rocmc.runtime.providers.conv_plan import _conv_plan

    p = _FakeLibrary(CUDNN)
    p.conv_builder = CudnnProvider_graph_conv()
    shapes = [(2, 4, 9, 8), (6, 2, 3, 3), (6,)]
    plan = _conv_plan(p, "conv2d", "f32", shapes, _CONV_ATTRS, [0x1000, 0x2000, 0x3000])
    assert _backend_sets(p, 906) == [[1], [2], [3], [5], [4]]  # tensor unique ids
    assert _backend_sets(p, 907) == [[True]]  # the conv result is virtual
    assert _backend_sets(p, 902)[:3] == [[2, 4, 9, 8], [6, 2, 3, 3], [2, 6, 9, 3]]
    assert _backend_sets(p, 105) == [[1, 0]] and _backend_sets(p, 103) == [[1, 2]]
    assert _backend_sets(p, 101) == [[1]]  # cross-correlation
    assert _backend_sets(p, 100) == [[0]] and _backend_sets(p, 1) == [[0]]  # f32 compute, f32 add
    assert _backend_sets(p, 750) and _backend_sets(p, 0) == [[0]]  # pointwise ADD
    assert len(_backend_sets(p, 401)) == 1  # one plan finalized
    assert plan.info["engine"] == 41 and plan.info["api"].startswith("backend graph")
    p.calls.clear()
    for _ in range(3):  # first sighting of these pointers: launched directly; then captured, replayed
        plan.run([0x1000, 0x2000, 0x3000], 0x9000)
    roles = [r for r, _ in p.calls]
    assert roles.count("be_execute") == 2 and roles.count("graph_launch") == 2
    assert (
        roles.index("capture_begin")
        < roles.index("be_execute", roles.index("capture_begin"))
        < roles.index("capture_end")
    )
    assert roles.index("capture_end") < roles.index("graph_instantiate") < roles.index("graph_launch")
    assert _backend_sets(p, 1001) == [[0x1000, 0x2000, 0x9000, 0x3000]]  # one pack
    assert _backend_sets(p, 1000) == [[1, 2, 3, 4]]
    assert "add_tensor" not in [r for r, _ in p.calls]


def test_cudnn_conv_without_a_usable_engine_falls_back_to_the_legacy_calls():
    from rocmc.runtime.providers.cudnn import CUDNN
    from rocmc.runtime.providers.conv_plan import _conv_plan

    p = _FakeLibrary(CUDNN, configs=1, notes=((0,),))  # only a TF32 engine: unusable for f32
    p.conv_builder = CudnnProvider_graph_conv()
    plan = _conv_plan(
        p, "conv2d", "f32", [(1, 2, 5, 5), (3, 2, 3, 3), (0,)], {**_CONV_ATTRS, "groups": 1}, [0x1000, 0x2000, None]
    )
    assert plan.info["api"].startswith("legacy")
    assert p.roles("conv_fwd_find")


def CudnnProvider_graph_conv():
    from rocmc.runtime.providers.cudnn import graph_conv

    return graph_conv
