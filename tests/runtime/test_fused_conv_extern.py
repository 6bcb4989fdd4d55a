"""fused_conv2d (activation(conv2d(x, w, b) + residual)) as the library call `dnn.fused_conv2d`: ResNet
blocks rewritten into it and run through the numpy reference provider, the GPU modules' imports, and the
library plans against a recording fake: cuDNN's one backend graph (convolution, residual add, bias add,
relu) and its fallbacks, MIOpen's fusion plan and the separate form a residual takes."""

import re
from collections import defaultdict

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.errors import DeviceError
from rocmc.externs import DNN as ABI
from rocmc.runtime.providers.capi import declared
from rocmc.runtime.providers.conv_plan import _conv_plan

from helpers import TOL, rand, resnet_block
from test_extern import _dump_imports
from test_rnn_extern import _CONV_ATTRS, _FakeLibrary, _backend_sets

N, H, W = 3, 9, 11  # run-time batch of the symbolic dim "n"; odd spatial sizes


@pytest.mark.parametrize("cin, cout, groups, dtype", [(9, 15, 3, "f32"), (5, 7, 1, "f16")])
def test_resnet_block_runs_fused_calls_through_the_reference_provider(cin, cout, groups, dtype, rng):
    g = resnet_block(rng, cin, cout, groups, dtype)
    art = rocmc.compile(g, "cpu", libraries=["dnn"])
    calls = [
        (c["op"], c["import"], c["attrs"]["activation"] if c["op"] == "fused_conv2d" else None)
        for c in art.metadata["externs"]
    ]
    sfx = "" if dtype == "f32" else f".{dtype}"
    assert sorted(calls, key=str) == sorted(
        [("fused_conv2d", f"dnn.fused_conv2d{sfx}", "relu")] * 2
        + [("fused_conv2d", f"dnn.fused_conv2d{sfx}", "none"), ("conv2d", f"dnn.conv2d{sfx}", None)],
        key=str,
    )
    xs, rs = rand(rng, (N, cin, H, W), dtype, -1, 1), rand(rng, (N, cout, H, W), dtype, -1, 1)
    got = rocmc.load(art)(xs, rs)
    rtol, atol = TOL[dtype]
    for a, want in zip(got, rocmc.evaluate(g, xs, rs)):
        np.testing.assert_allclose(np.asarray(a, np.float64), want, rtol=2 * rtol, atol=2 * atol)


@pytest.mark.parametrize("target", ["gfx942", "cuda:sm_80"])
def test_gpu_modules_import_the_fused_call(target, tmp_path, rng):
    """gfx942 calls MIOpen for convolutions by default, fused ones too; cuda modules when asked."""
    g = resnet_block(rng, 6, 10, 2)
    art = rocmc.compile(g, target, **({} if target == "gfx942" else {"libraries": ["dnn"]}))
    imports = dict(re.findall(r"vm\.import @(dnn\.[\w.]+) cconv \"(\w+)\"", _dump_imports(art.vmfb, tmp_path)))
    assert imports == {
        "dnn.fused_conv2d": ABI.signatures["fused_conv2d"].cconv,
        "dnn.conv2d": ABI.signatures["conv2d"].cconv,
    }
    assert imports["dnn.fused_conv2d"] == "0rrrrIIIIIIII_r"
    assert [c["name"] for c in art.dispatches() if c["kind"] == "extern call"].count("dnn.fused_conv2d") == 3


def test_asymmetric_padding_stays_generated():
    from rocmc.lowering import registry
    from rocmc.lowering.target import Target

    g = rocmc.Graph("t")
    x = g.input("x", (1, 4, 9, 9), "f32")
    node = ops.fused_conv2d(x, np.ones((4, 4, 2, 2), np.float32), padding="same", activation="relu").producer
    choice = registry.choose(node, Target.parse("gfx942"))
    assert choice.impl.name == "generated" and "asymmetric padding" in choice.skipped[0][1]


# ---- the library plans against a recording fake ------------------------------------------------

SHAPES = [(2, 4, 9, 8), (6, 2, 3, 3), (6,), (2, 6, 9, 3)]  # x, w (groups 2), b, residual -> y (2, 6, 9, 3)
PTRS = [0x1000, 0x2000, 0x3000, 0x4000]
Y = 0x9000
RELU = {**_CONV_ATTRS, "activation": 1}


class _Fake(_FakeLibrary):
    """The recording fake with the provider's counters (`stats`) that plans update."""

    def __init__(self, table, **kw):
        super().__init__(table, **kw)
        self.stats = defaultdict(int)


class _Heuristics(_Fake):
    """cuDNN's heuristics answer each graph's queries (mode A, then the fallback list) with the next
    of `answers` engine configs (none once they run out), so the fused graph can find no engine."""

    def __init__(self, table, answers):
        super().__init__(table, configs=0, notes=((),) * 8)
        self.answers = list(answers)

    def _backend_get(self, named):
        if named["attr"] == 202 and not named["n_elems"]:  # a count query starts a heuristics answer
            self.configs = self.answers.pop(0) if self.answers else 0
        super()._backend_get(named)


def _created(p, kind) -> list:
    """Handles of the backend descriptors of `kind` (cudnnBackendDescriptorType_t), in creation order."""
    return [a["out"]._obj.value for r, a in p.calls if r == "be_create" and a["desc_type"] == kind]


def _set(p, attr) -> dict:
    """{descriptor: values} of one backend attribute."""
    return {a["desc"]: a["values"] for r, a in p.calls if r == "be_set" and a["attr"] == attr}


def _cudnn(answers=None):
    from rocmc.runtime.providers.cudnn import CUDNN, graph_conv

    p = _Fake(CUDNN, configs=2, notes=((0,), ())) if answers is None else _Heuristics(CUDNN, answers)
    p.conv_builder = graph_conv
    return p


def test_cudnn_fused_conv_is_one_graph_conv_residual_bias_relu():
    """f16 storage: x, w, y, b and the residual in half by their uids, the conv result and the two sums
    virtual f32; the op graph is convolution -> + r -> + b -> relu -> y (the order cuDNN's engines
    fuse); a call is one execution plan
    with x, w, y, b, r in its variant pack, replayed from a captured graph."""
    from rocmc.runtime.providers.cudnn import DESCRIPTORS, POINTWISE_ADD, POINTWISE_RELU_FWD

    p = _cudnn()
    plan = _conv_plan(p, "fused_conv2d", "f16", SHAPES, RELU, PTRS)
    assert plan.out_shape == (2, 6, 9, 3) and plan.info["epilogue"] == "fused" and plan.info["bias"] == "fused"
    uid = {d: v[0] for d, v in _set(p, 906).items()}
    assert list(uid.values()) == [1, 2, 3, 5, 6, 7, 4, 8]
    virtual = {uid[d] for d in _set(p, 907)}
    assert virtual == {5, 7, 8}
    types = {uid[d]: v[0] for d, v in _set(p, 901).items()}
    assert types == {1: 2, 2: 2, 3: 2, 4: 2, 6: 2, 5: 0, 7: 0, 8: 0}  # CUDNN_DATA_HALF / FLOAT
    dims = {uid[d]: v for d, v in _set(p, 902).items()}
    assert dims[4] == [1, 6, 1, 1] and dims[6] == dims[5] == dims[7] == dims[8] == dims[3] == [2, 6, 9, 3]
    (graph_ops,) = [v for d, v in _set(p, 801).items()]
    kinds = {h: k for k in (DESCRIPTORS["op_conv_forward"], DESCRIPTORS["op_pointwise"]) for h in _created(p, k)}
    assert [kinds[h] for h in graph_ops] == [10, 13, 13, 13]
    modes, pw = _set(p, 0), _set(p, 750)
    assert [modes[pw[h][0]] for h in graph_ops[1:]] == [[POINTWISE_ADD], [POINTWISE_ADD], [POINTWISE_RELU_FWD]]
    assert POINTWISE_RELU_FWD == 100
    conv_y = _set(p, 705)[graph_ops[0]][0]
    wiring = [
        (uid[_set(p, 751)[h][0]], uid[_set(p, 752)[h][0]] if h in _set(p, 752) else None, uid[_set(p, 753)[h][0]])
        for h in graph_ops[1:]
    ]
    assert uid[conv_y] == 5 and wiring == [(5, 6, 7), (7, 4, 8), (8, None, 3)]
    p.calls.clear()
    for _ in range(3):  # launched directly, then captured (on its second sighting) and replayed
        plan.run(PTRS, Y)
    roles = [r for r, _ in p.calls]
    assert roles.count("be_execute") == 2 and roles.count("capture_begin") == 1 and roles.count("graph_launch") == 2
    assert not {"add_tensor", "act_fwd"} & set(roles)
    assert _backend_sets(p, 1000) == [[1, 2, 3, 4, 6]]
    assert _backend_sets(p, 1001) == [[0x1000, 0x2000, Y, 0x3000, 0x4000]]


def test_cudnn_without_an_engine_for_the_chain_runs_the_epilogue_separately():
    """No engine for the fused graph: the conv + bias graph runs, then cudnnAddTensor adds the residual
    (C = 1*r + 1*C) and cudnnActivationForward applies relu in place, all in one captured launch."""
    p = _cudnn(answers=[0, 0, 1])
    plan = _conv_plan(p, "fused_conv2d", "f32", SHAPES, RELU, PTRS)
    assert plan.info["epilogue"] == "separate" and plan.info["bias"] == "fused" and plan.info["graph_launch"]
    assert _backend_sets(p, 906)[-5:] == [[1], [2], [3], [5], [4]]  # the second graph: conv + bias
    (act,) = p.roles("set_act")
    assert act["mode"] == 1  # CUDNN_ACTIVATION_RELU
    p.calls.clear()
    plan.run(PTRS, Y)
    plan.run(PTRS, Y)  # the second sighting of these pointers is captured
    launched = [r for r, _ in p.calls if r in ("capture_begin", "be_execute", "add_tensor", "act_fwd", "capture_end")]
    assert launched == [
        "be_execute",
        "add_tensor",
        "act_fwd",
        "capture_begin",
        "be_execute",
        "add_tensor",
        "act_fwd",
        "capture_end",
    ]
    add, relu = p.roles("add_tensor")[0], p.roles("act_fwd")[0]
    assert (add["b"], add["y"], add["alpha"]._obj.value, add["beta"]._obj.value) == (0x4000, Y, 1.0, 1.0)
    assert (relu["x"], relu["y"], relu["beta"]._obj.value) == (Y, Y, 0.0)
    assert _backend_sets(p, 1000) == [[1, 2, 3, 4]]
    # the replay depends on the residual's pointer: another residual is another capture (when it recurs)
    p.calls.clear()
    plan.run(PTRS[:3] + [0x5000], Y)
    plan.run(PTRS[:3] + [0x5000], Y)
    assert [r for r, _ in p.calls].count("capture_begin") == 1
    assert {a["b"] for a in p.roles("add_tensor")} == {0x5000}


def test_cudnn_with_no_engine_at_all_uses_the_legacy_calls_and_the_epilogue():
    p = _cudnn(answers=[])
    plan = _conv_plan(p, "fused_conv2d", "f32", SHAPES, RELU, PTRS)
    assert plan.info["api"].startswith("legacy") and plan.info["epilogue"] == "separate"
    p.calls.clear()
    plan.run(PTRS, Y)
    assert [r for r, _ in p.calls] == ["conv_fwd", "add_tensor", "add_tensor", "act_fwd"]
    assert [a["b"] for a in p.roles("add_tensor")] == [0x3000, 0x4000]  # the bias, then the residual


def test_cudnn_fused_conv_without_bias_or_residual_fuses_relu_alone():
    p = _cudnn()
    plan = _conv_plan(
        p, "fused_conv2d", "f32", [SHAPES[0], SHAPES[1], (0,), (0, 0, 0, 0)], RELU, [0x1000, 0x2000, None, None]
    )
    assert plan.info["epilogue"] == "fused" and plan.info["bias"] is None
    assert _backend_sets(p, 906) == [[1], [2], [3], [5]] and _backend_sets(p, 0) == [[100]]
    p.calls.clear()
    plan.run([0x1000, 0x2000, None, None], Y)
    assert _backend_sets(p, 1000) == [[1, 2, 3]]


# ---- MIOpen: the fusion plan (never run on hardware here) ----------------------------------------

FUSION_ROLES = (
    "create_fusion_plan",
    "create_fusion_conv",
    "create_fusion_bias",
    "create_fusion_act",
    "compile_fusion_plan",
    "create_op_args",
    "set_op_args_conv",
    "set_op_args_bias",
    "set_op_args_act",
    "execute_fusion_plan",
)


def _miopen(fake=_Fake):
    from rocmc.runtime.providers.miopen import MIOPEN, miopen_conv

    p = fake(MIOPEN)
    p.conv_builder = miopen_conv
    return p


def test_miopen_fuses_conv_bias_relu_in_a_fusion_plan():
    p = _miopen()
    plan = _conv_plan(p, "fused_conv2d", "f32", SHAPES[:3] + [(0, 0, 0, 0)], RELU, PTRS[:3] + [None])
    assert plan.info["epilogue"] == "fused" and plan.info["fusion_plan"]
    assert [r for r, _ in p.calls if r in FUSION_ROLES] == [
        "create_fusion_plan",
        "create_fusion_conv",
        "create_fusion_bias",
        "create_fusion_act",
        "compile_fusion_plan",
        "create_op_args",
        "set_op_args_act",
    ]
    assert not p.roles("find_solutions")
    (fp,) = p.roles("create_fusion_plan")
    assert fp["fusion_direction"] == 0  # miopenVerticalFusion
    assert p.roles("create_fusion_act")[0]["mode"] == 3  # miopenActivationRELU
    act = p.roles("set_op_args_act")[0]
    assert (act["act_alpha"], act["act_beta"], act["act_gamma"]) == (1.0, 1.0, 0.0)
    p.calls.clear()
    plan.run(PTRS[:3] + [None], Y)
    assert [r for r, _ in p.calls] == ["set_op_args_conv", "set_op_args_bias", "execute_fusion_plan"]
    conv, bias, run = (a for _, a in p.calls)
    assert (conv["w"], bias["b"], run["x"], run["y"]) == (0x2000, 0x3000, 0x1000, Y)
    assert run["args"] == conv["args"] == bias["args"] and run["xD"] == fp["xD"]


def test_miopen_residual_takes_the_separate_form():
    """No residual add in MIOpen's fusion plans: Find 2.0, then the bias, miopenOpTensor (y + r, in
    place) and the relu."""
    p = _miopen()
    plan = _conv_plan(p, "fused_conv2d", "f32", SHAPES, RELU, PTRS)
    assert plan.info["epilogue"] == "separate" and not p.roles("create_fusion_plan")
    p.calls.clear()
    plan.run(PTRS, Y)
    assert [r for r, _ in p.calls] == ["run_solution", "add_tensor", "op_tensor", "act_fwd"]
    add = p.roles("op_tensor")[0]
    assert (add["tensor_op"], add["a"], add["b"], add["c"]) == (0, Y, 0x4000, Y)
    assert (add["alpha1"]._obj.value, add["alpha2"]._obj.value, add["beta"]._obj.value) == (1.0, 1.0, 0.0)


class _RefusesFusion(_Fake):
    def call(self, role, **named):
        super().call(role, **named)
        if role == "compile_fusion_plan":
            raise DeviceError("MIOpen miopenCompileFusionPlan failed with status 8")


def test_miopen_plan_it_wont_compile_is_destroyed_and_runs_separately():
    p = _miopen(_RefusesFusion)
    plan = _conv_plan(p, "fused_conv2d", "f32", SHAPES[:3] + [(0, 0, 0, 0)], RELU, PTRS[:3] + [None])
    assert plan.info["epilogue"] == "separate" and p.roles("find_solutions")
    fusion = p.roles("create_fusion_plan")[0]["out"]._obj.value
    assert ("destroy_fusion_plan", {"desc": fusion}) in p.calls
    p.calls.clear()
    plan.run(PTRS[:3] + [None], Y)
    assert [r for r, _ in p.calls] == ["run_solution", "add_tensor", "act_fwd"]


# miopen.h (MIOpen 3.3.0) prototypes in the header's argument names -> the table's, position by position.
MIOPEN_FUSION_API = {
    "miopenCreateFusionPlan": ("fusePlanDesc fuseDirection inputDesc", "out fusion_direction xD"),
    "miopenCreateOpConvForward": ("fusePlanDesc convOp convDesc wDesc", "plan out conv wD"),
    "miopenCreateOpBiasForward": ("fusePlanDesc biasOp bDesc", "plan out bD"),
    "miopenCreateOpActivationForward": ("fusePlanDesc activFwdOp mode", "plan out mode"),
    "miopenCompileFusionPlan": ("handle fusePlanDesc", "h plan"),
    "miopenCreateOperatorArgs": ("args", "out"),
    "miopenSetOpArgsConvForward": ("args convOp alpha beta w", "args op alpha beta w"),
    "miopenSetOpArgsBiasForward": ("args biasOp alpha beta bias", "args op alpha beta b"),
    "miopenSetOpArgsActivForward": (
        "args activFwdOp alpha beta activAlpha activBeta activGamma",
        "args op alpha beta act_alpha act_beta act_gamma",
    ),
    "miopenExecuteFusionPlan": ("handle fusePlanDesc inputDesc input outputDesc output args", "h plan xD x yD y args"),
    "miopenDestroyFusionPlan": ("fusePlanDesc", "desc"),
    "miopenDestroyOperatorArgs": ("args", "desc"),
    "miopenOpTensor": (
        "handle tensorOp alpha1 aDesc A alpha2 bDesc B beta cDesc C",
        "h tensor_op alpha1 aD a alpha2 bD b beta cD c",
    ),
}


def test_miopen_fusion_table_matches_the_header():
    import ctypes
    from rocmc.runtime.providers.miopen import MIOPEN

    by_name = {}
    for cname, args in MIOPEN.functions.values():
        by_name.setdefault(cname, []).append(declared(args))
    for fn, (header, names) in MIOPEN_FUSION_API.items():
        assert len(by_name.get(fn, [])) == 1, f"{fn} declared {len(by_name.get(fn, []))} times"
        decl = by_name[fn][0]
        assert len(decl) == len(header.split()) and [n for n, _ in decl] == names.split(), fn
    types = {n: t for cname, args in MIOPEN.functions.values() if cname in MIOPEN_FUSION_API for n, t in declared(args)}
    assert types["act_alpha"] is ctypes.c_double and types["mode"] is ctypes.c_int
    assert types["tensor_op"] is ctypes.c_int and types["fusion_direction"] is ctypes.c_int
    assert MIOPEN.enums["tensor_op_add"] == 0 and MIOPEN.enums["vertical_fusion"] == 0
