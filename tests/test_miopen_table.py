"""The MIOpen ctypes table against MIOpen's C API facts (shared/docs/vendor-dnn.md, from miopen.h),
and the cuDNN twin against the differences the same document lists."""
import ctypes

import pytest

from rocmc.runtime.providers.cudnn import CUDNN
from rocmc.runtime.providers.dnn import declared
from rocmc.runtime.providers.miopen import HIP, MIOPEN

# Signatures as the header declares them, in the document's argument names.
MIOPEN_API = {
    "miopenSetTensorDescriptor": "d dtype n dims strides",
    "miopenInitConvolutionNdDescriptor": "c n pads strides dils mode",
    "miopenSetConvolutionGroupCount": "c groups",
    "miopenConvolutionForwardGetWorkSpaceSize": "h wD xD c yD &sz",
    "miopenFindConvolutionForwardAlgorithm": "h xD x wD w c yD y req &n perf ws wsSz exhaustive",
    "miopenConvolutionForward": "h a xD x wD w c algo b yD y ws wsSz",
    "miopenConvolutionBackwardDataGetWorkSpaceSize": "h dyD wD c dxD &sz",
    "miopenFindConvolutionBackwardDataAlgorithm": "h dyD dy wD w c dxD dx req &n perf ws wsSz exhaustive",
    "miopenConvolutionBackwardData": "h a dyD dy wD w c algo b dxD dx ws wsSz",
    "miopenSet2dPoolingDescriptor": "p mode wH wW padH padW sH sW",
    "miopenPoolingForward": "h p a xD x b yD y do_backward ws wsSz",
    "miopenSoftmaxForward_V2": "h a xD x b yD y algo mode",
    "miopenSetActivationDescriptor": "a mode alpha beta gamma",
    "miopenActivationForward": "h a al xD x be yD y",
    "miopenDeriveBNTensorDescriptor": "bnD xD mode",
    "miopenBatchNormalizationForwardInference": "h mode a b xD x yD y bnD scale bias mean var eps",
    "miopenSetLRNDescriptor": "l mode n alpha beta k",
    "miopenLRNForward": "h l a xD x b yD y do_backward ws",
    "miopenSetStream": "h stream",
}
# The document's names -> the table's (positions must agree one to one).
DOC_NAMES = {
    "d": "desc", "c": "conv", "p": "desc", "l": "desc", "dims": "dims", "strides": "strides", "pads": "pads",
    "&sz": "size_out", "&n": "n_out", "wsSz": "ws_size", "wH": "wh", "wW": "ww", "padH": "ph", "padW": "pw",
    "sH": "sh", "sW": "sw",
}
# Per function, the document's names that mean something else there.
LOCAL_NAMES = {
    "miopenInitConvolutionNdDescriptor": {"c": "desc", "strides": "stride_a", "dils": "dil_a"},
    "miopenSetConvolutionGroupCount": {"c": "desc"},
    "miopenSoftmaxForward_V2": {"a": "alpha", "b": "beta", "algo": "sm_algo", "mode": "sm_mode"},
    "miopenSetActivationDescriptor": {"a": "desc", "alpha": "act_alpha", "beta": "act_beta", "gamma": "act_gamma"},
    "miopenActivationForward": {"a": "desc", "al": "alpha", "be": "beta"},
    "miopenSetLRNDescriptor": {"mode": "lrn_mode", "n": "lrn_n", "alpha": "lrn_alpha", "beta": "lrn_beta",
                               "k": "lrn_k"},
}
SCALING = {"a": "alpha", "b": "beta"}


def _expected(fn: str, doc: str) -> list:
    local = LOCAL_NAMES.get(fn, {})
    return [local.get(a) or DOC_NAMES.get(a) or SCALING.get(a) or a for a in doc.split()]


def _by_name(table):
    return {name: [n for n, _ in declared(args)] for name, args in table.functions.values()}


def _names(args):
    return [n for n, _ in declared(args)]


def _types(table):
    """{argument name: ctypes type} over a table's declarations (one name has one type in each table)."""
    out = {}
    for name, args in {**table.functions, **table.runtime.functions}.values():
        for a, t in declared(args):
            assert out.setdefault(a, t) is t, f"{name}: {a!r} declared with two types"
    return out


@pytest.mark.parametrize("fn", sorted(MIOPEN_API))
def test_miopen_function_names_and_argument_order(fn):
    table = _by_name(MIOPEN)
    assert fn in table, f"{fn} missing from the MIOpen table"
    want = _expected(fn, MIOPEN_API[fn])
    assert len(table[fn]) == len(want), f"{fn}: {len(table[fn])} arguments, the header has {len(want)}"
    assert table[fn] == want


def test_miopen_enums():
    assert MIOPEN.dtypes == {"f16": 0, "f32": 1, "bf16": 5}
    e = MIOPEN.enums
    assert e["cross_correlation"] == 0                  # miopenConvolution
    assert (e["pool_max"], e["pool_avg_exclude"], e["pool_avg_include"]) == (0, 1, 2)
    assert (e["softmax_accurate"], e["softmax_log"], e["softmax_channel"]) == (1, 2, 1)
    assert e["bn_spatial"] == 1 and e["lrn_cross_channel"] == 1
    modes = {op: m for op, (m, _) in MIOPEN.activations.items()}
    assert modes == {"sigmoid": 1, "tanh": 2, "relu": 3, "clipped_relu": 7, "leaky_relu": 8, "elu": 9}


def test_miopen_perf_record_and_search():
    assert (MIOPEN.perf.size, MIOPEN.perf.algo, MIOPEN.perf.time, MIOPEN.perf.memory) == (16, 0, 4, 8)
    assert MIOPEN.perf.status is None
    # The search is mandatory and needs a workspace: its size comes from the query (no algorithm).
    assert MIOPEN.search_workspace is None
    assert {"conv_fwd_ws", "conv_bwd_data_ws"} <= set(MIOPEN.functions)
    assert MIOPEN.libraries[0] == "libMIOpen.so.1" and HIP.libraries[0] == "libamdhip64.so"
    assert MIOPEN.dlpack_device == 10                    # kDLROCM


def test_miopen_filters_are_tensor_descriptors():
    assert MIOPEN.functions["set_filter"] == MIOPEN.functions["set_tensor"]


def test_cudnn_twin_differences():
    """Same roles, the differences vendor-dnn.md lists: cross-correlation is 1, average modes swapped,
    workspace arguments before beta, w before dy in backward data, no leaky relu mode."""
    # MIOpen-only roles: workspace queries, RNN weights set by the library (cuDNN hands out addresses
    # instead: rnn_weight_params) and the MHA problem (cuDNN's legacy API has no attention).
    miopen_only = {"conv_fwd_ws", "conv_bwd_data_ws", "rnn_params_desc", "rnn_get_param", "rnn_get_bias",
                   "rnn_set_param", "rnn_set_bias", "create_mha", "set_mha", "create_mha_problem",
                   "set_problem_tensor", "find_solutions", "solution_ws", "run_solution", "destroy_problem",
                   "destroy_solution", "create_conv_problem", "create_find_options", "set_find_tensor",
                   "destroy_find_options", "op_tensor", "create_fusion_plan", "create_fusion_conv",
                   "create_fusion_bias", "create_fusion_act", "compile_fusion_plan", "create_op_args",
                   "set_op_args_conv", "set_op_args_bias", "set_op_args_act", "execute_fusion_plan",
                   "destroy_fusion_plan", "destroy_op_args"}
    assert set(MIOPEN.functions) - miopen_only <= set(CUDNN.functions)
    assert CUDNN.enums["cross_correlation"] == 1
    assert (CUDNN.enums["pool_avg_include"], CUDNN.enums["pool_avg_exclude"]) == (1, 2)
    assert CUDNN.dtypes == {"f32": 0, "f16": 2, "bf16": 9}
    assert _names(CUDNN.functions["conv_fwd"][1])[-5:] == ["ws", "ws_size", "beta", "yD", "y"]
    assert _names(CUDNN.functions["conv_bwd_data"][1])[2:6] == ["wD", "w", "dyD", "dy"]
    assert _names(CUDNN.functions["softmax_fwd"][1])[:3] == ["h", "sm_algo", "sm_mode"]
    assert "leaky_relu" not in CUDNN.activations
    assert {op: m for op, (m, _) in CUDNN.activations.items()} == \
        {"sigmoid": 0, "relu": 1, "tanh": 2, "clipped_relu": 3, "elu": 4}
    assert (CUDNN.perf.size, CUDNN.perf.algo, CUDNN.perf.status, CUDNN.perf.time, CUDNN.perf.memory) == \
        (48, 0, 4, 8, 16)
    assert CUDNN.enums["fma_math"] == 3   # f32 parity: no TF32
    assert CUDNN.enums["lrn_cross_channel"] == 0


@pytest.mark.parametrize("table", [MIOPEN, CUDNN], ids=["miopen", "cudnn"])
def test_every_argument_has_a_c_type(table):
    types = _types(table)
    # Doubles where the header has doubles (activation and LRN parameters, batch-norm epsilon).
    for a in ("act_alpha", "lrn_alpha", "lrn_beta", "lrn_k", "eps", "coef"):
        assert types.get(a, ctypes.c_double) is ctypes.c_double
    assert types["lrn_n"] is ctypes.c_uint and types["ws_size"] is ctypes.c_size_t


# ---- RNN and multi-head attention ---------------------------------------------------------------

# miopen.h's RNN and MHA calls in the header's argument names -> the table's names, position by position.
MIOPEN_SEQ_API = {
    "miopenSetRNNDescriptor_V2": ("rnnDesc hsize nlayers dropoutDesc inMode direction rnnMode biasMode algo dataType",
                                  "desc hsize nlayers dropout in_mode direction rnn_mode bias_mode rnn_algo dtype"),
    "miopenSetRNNDataSeqTensorDescriptor": (
        "seqTensorDesc dataType layout maxSequenceLen batchSize vectorSize sequenceLenArray paddingMarker",
        "desc dtype layout max_seq batch vec seq_lens pad_fill"),
    "miopenGetRNNTempSpaceSizes": ("handle rnnDesc xDesc fwdMode workSpaceSize reserveSpaceSize",
                                   "h desc xS fwd_mode size_out size_out2"),
    # vendor-dnn.md: (h, r, fwdMode, xS, x, hD, hx, hy, cD, cx, cy, yS, y, w, wSz, ws, wsSz, rs, rsSz)
    "miopenRNNForward": ("h r fwdMode xS x hD hx hy cD cx cy yS y w wSz ws wsSz rs rsSz",
                         "h desc fwd_mode xS x hD hx hy cD cx cy yS y w w_size ws ws_size rs rs_size"),
    "miopenSetRNNLayerParam": ("handle rnnDesc layer xDesc wDesc w paramID paramDesc layerParam",
                               "h desc layer xD wD w lin_id mD src"),
    "miopenSetRNNLayerBias": ("handle rnnDesc layer xDesc wDesc w biasID biasDesc layerBias",
                              "h desc layer xD wD w lin_id mD src"),
    "miopenGetRNNLayerParam": ("handle rnnDesc layer xDesc wDesc w paramID paramDesc layerParam",
                               "h desc layer xD wD w lin_id mD src"),
    "miopenGetRNNParamsSize": ("handle rnnDesc xDesc numBytes dtype", "h desc xD size_out dtype"),
    "miopenSetDropoutDescriptor": (
        "dropoutDesc handle dropout states stateSizeInBytes seed use_mask state_evo rng_mode",
        "desc h drop_p states state_size seed use_mask state_evo rng_mode"),
    "miopenCreateMhaDescriptor": ("&m", "out"),
    "miopenSetMhaDescriptor": ("m scale", "desc mha_scale"),
    "miopenCreateMhaProblem": ("&p m direction", "out desc direction"),
    "miopenSetProblemTensorDescriptor": ("p id descriptor", "problem tensor_id desc"),
    "miopenFindSolutions": ("handle problem options solutions &numSolutions maxSolutions",
                            "h problem options solutions n_out max_solutions"),
    "miopenRunSolution": ("handle solution nInputs tensors workspace workspaceSize",
                          "h solution n_args args ws ws_size"),
    # convolutions through Find 2.0
    "miopenCreateConvProblem": ("&problem operatorDesc direction", "out desc direction"),
    "miopenCreateFindOptions": ("&options", "out"),
    "miopenSetFindOptionPreallocatedTensor": ("options id buffer", "options tensor_id ptr"),
    "miopenDestroyFindOptions": ("options", "desc"),
    "miopenGetSolutionWorkspaceSize": ("solution &workspaceSize", "solution size_out"),
    "miopenDestroyProblem": ("problem", "desc"),
    "miopenDestroySolution": ("solution", "desc"),
}


@pytest.mark.parametrize("fn", sorted(MIOPEN_SEQ_API))
def test_miopen_rnn_and_mha_calls(fn):
    header, table_names = MIOPEN_SEQ_API[fn]
    table = _by_name(MIOPEN)
    assert fn in table, f"{fn} missing from the MIOpen table"
    n = len(header.split())
    assert len(table[fn]) == n, f"{fn}: {len(table[fn])} arguments, the header has {n}"
    assert table[fn] == table_names.split()


def test_rnn_sizes_follow_buffers_in_miopen_and_precede_them_in_cudnn():
    miopen = _names(MIOPEN.functions["rnn_fwd"][1])
    cudnn = _names(CUDNN.functions["rnn_fwd"][1])
    for buf, size in (("w", "w_size"), ("ws", "ws_size"), ("rs", "rs_size")):
        assert miopen.index(size) == miopen.index(buf) + 1
        assert cudnn.index(size) == cudnn.index(buf) - 1
    assert "dev_seq_lens" in cudnn and "dev_seq_lens" not in miopen   # cuDNN wants device lengths
    assert CUDNN.functions["rnn_fwd"][0] == "cudnnRNNForward" and len(cudnn) == 20
    assert MIOPEN.functions["rnn_fwd"][0] == "miopenRNNForward" and len(miopen) == 19


def test_rnn_enums_and_gate_orders():
    m, c = MIOPEN.enums, CUDNN.enums
    assert (m["rnn_training"], m["rnn_inference"]) == (0, 1)     # miopenRNNFWDMode_t
    assert (c["rnn_inference"], c["rnn_training"]) == (0, 1)     # cudnnForwardMode_t: swapped
    assert (m["rnn_lstm"], m["rnn_gru"]) == (c["rnn_lstm"], c["rnn_gru"]) == (2, 3)
    assert (m["rnn_no_bias"], m["rnn_bias"]) == (0, 1)           # miopenRNNwithBias
    assert (c["rnn_no_bias"], c["rnn_bias"]) == (0, 2)           # CUDNN_RNN_DOUBLE_BIAS
    assert MIOPEN.gate_order == {"lstm": "ifog", "gru": "zrn"}
    assert CUDNN.gate_order == {"lstm": "ifgo", "gru": "rzn"}
    assert (MIOPEN.rnn_weights, CUDNN.rnn_weights) == ("library_copies", "address_copies")


def test_cudnn_v8_rnn_calls():
    f = CUDNN.functions
    assert f["set_rnn"][0] == "cudnnSetRNNDescriptor_v8" and len(_names(f["set_rnn"][1])) == 15
    assert f["set_rnn_data"][0] == "cudnnSetRNNDataDescriptor" and len(_names(f["set_rnn_data"][1])) == 8
    assert f["rnn_temp_sizes"] == ("cudnnGetRNNTempSpaceSizes", "h desc fwd_mode:int xS size_out size_out2")
    assert f["rnn_weight_params"] == ("cudnnGetRNNWeightParams",
                                      "h desc layer:int w_size:size_t w lin_id:int mD m_addr bD b_addr")
    assert "create_mha" not in f    # no legacy attention: sdpa is refused on cuda devices


def test_rnn_weight_slots_repack_gates():
    """MIOpen's LSTM param ids are i, f, o, g: id 2 (output gate) reads torch's block 3 of w_ih and id
    4 + 3 (new memory, recurrent) torch's block 2 of w_hh; cuDNN's ids are torch's order."""
    from rocmc.runtime.providers.recurrent import slots
    inp, hidden, item = 5, 7, 4
    mi = {(s.lib_id, s.operand): s for s in slots("lstm", "ifog", inp, hidden, item, True)}
    assert mi[(2, 1)].offset == 3 * hidden * inp * item and mi[(2, 1)].nbytes == hidden * inp * item
    assert mi[(7, 2)].offset == 2 * hidden * hidden * item
    assert mi[(7, 4)].offset == 2 * hidden * item and mi[(7, 4)].bias
    gru = {(s.lib_id, s.operand): s for s in slots("gru", "zrn", inp, hidden, item, False)}
    assert gru[(0, 1)].offset == 1 * hidden * inp * item and len(gru) == 6   # z is torch's block 1
    cu = slots("lstm", "ifgo", inp, hidden, item, False)
    assert [s.offset for s in cu if s.operand == 1] == [k * hidden * inp * item for k in range(4)]


def test_mha_tensor_argument_layout_and_ids():
    from rocmc.runtime.providers.miopen import MHA_TENSORS, TensorArgument
    assert ctypes.sizeof(TensorArgument) == 24
    assert (TensorArgument.id.offset, TensorArgument.descriptor.offset, TensorArgument.buffer.offset) == (0, 8, 16)
    assert (MHA_TENSORS["k"], MHA_TENSORS["q"], MHA_TENSORS["v"], MHA_TENSORS["o"]) == (4, 5, 6, 16)
    assert sorted(MHA_TENSORS.values()) == list(range(4, 21))
    assert MIOPEN.enums["problem_forward"] == 0 and MIOPEN.enums["int64"] == 9


def test_miopen_find2_convolution_facts():
    """miopenProblemDirection_t, miopenTensorArgumentId_t of a convolution problem."""
    assert (MIOPEN.enums["problem_forward"], MIOPEN.enums["problem_backward_data"]) == (0, 1)
    assert MIOPEN.conv_ids == {"x": 1, "w": 2, "y": 3}     # miopenTensorConvolutionX / W / Y
    assert "Find 2.0" in MIOPEN.conv_api


# ---- cuDNN's backend (graph) API, cudnn_graph.h of cuDNN 9 -----------------------------------------

CUDNN_BACKEND_API = {
    "cudnnBackendCreateDescriptor": ("descriptorType &descriptor", "desc_type out"),
    "cudnnBackendDestroyDescriptor": ("descriptor", "desc"),
    "cudnnBackendSetAttribute": ("descriptor attributeName attributeType elementCount arrayOfElements",
                                 "desc attr atype n_elems values"),
    "cudnnBackendGetAttribute": ("descriptor attributeName attributeType requestedElementCount &elementCount "
                                 "arrayOfElements", "desc attr atype n_elems n_out values"),
    "cudnnBackendFinalize": ("descriptor", "desc"),
    "cudnnBackendExecute": ("handle executionPlan variantPack", "h plan vpack"),
}


@pytest.mark.parametrize("fn", sorted(CUDNN_BACKEND_API))
def test_cudnn_backend_calls(fn):
    header, names = CUDNN_BACKEND_API[fn]
    table = _by_name(CUDNN)
    assert len(table[fn]) == len(header.split()) and table[fn] == names.split()
    assert _types(CUDNN)["n_elems"] is ctypes.c_int64     # int64_t elementCount


def test_cudnn_backend_enums():
    from rocmc.runtime.providers.cudnn import (ATTR_TYPES, ATTRS, DESCRIPTORS, FORBIDDEN_NOTES, HEUR_MODES,
                                               NUMERICAL_NOTES, POINTWISE_ADD)
    # cudnnBackendDescriptorType_t
    assert (DESCRIPTORS["pointwise"], DESCRIPTORS["convolution"], DESCRIPTORS["engine"], DESCRIPTORS["engine_config"],
            DESCRIPTORS["engine_heuristics"], DESCRIPTORS["execution_plan"]) == (0, 1, 2, 3, 4, 5)
    assert (DESCRIPTORS["op_conv_forward"], DESCRIPTORS["op_conv_backward_data"], DESCRIPTORS["op_pointwise"]) == \
        (10, 12, 13)
    assert (DESCRIPTORS["operation_graph"], DESCRIPTORS["variant_pack"], DESCRIPTORS["tensor"]) == (15, 16, 17)
    # cudnnBackendAttributeType_t, and element sizes: enums are C ints, booleans one byte
    codes = {name: code for name, (code, _) in ATTR_TYPES.items()}
    assert codes == {"handle": 0, "data_type": 1, "boolean": 2, "int64": 3, "float": 4, "double": 5, "void_ptr": 6,
                     "convolution_mode": 7, "heur_mode": 8, "numerical_note": 11, "pointwise_mode": 14,
                     "backend_descriptor": 15}
    assert ctypes.sizeof(ATTR_TYPES["boolean"][1]) == 1 and ctypes.sizeof(ATTR_TYPES["heur_mode"][1]) == 4
    # cudnnBackendAttributeName_t
    enum = {name: e for name, (e, _) in ATTRS.items()}
    assert [enum[f"conv_{k}"] for k in ("comp_type", "mode", "dilations", "filter_strides", "post_paddings",
                                        "pre_paddings", "spatial_dims")] == list(range(100, 107))
    assert [enum[f"fwd_{k}"] for k in ("alpha", "beta", "conv", "w", "x", "y")] == list(range(700, 706))
    assert [enum[f"bwd_data_{k}"] for k in ("alpha", "beta", "conv", "w", "dx", "dy")] == list(range(706, 712))
    assert [enum[f"pw_{k}"] for k in ("descriptor", "x", "b", "y")] == list(range(750, 754))
    assert (enum["heur_mode"], enum["heur_operation_graph"], enum["heur_results"]) == (200, 201, 202)
    assert (enum["engine_config_engine"], enum["plan_handle"], enum["plan_engine_config"],
            enum["plan_workspace_size"]) == (300, 400, 401, 402)
    assert (enum["graph_handle"], enum["graph_ops"]) == (800, 801)
    assert [enum[f"tensor_{k}"] for k in ("alignment", "data_type", "dims", "strides")] == [900, 901, 902, 903]
    assert (enum["tensor_uid"], enum["tensor_virtual"]) == (906, 907)
    assert (enum["pack_uids"], enum["pack_pointers"], enum["pack_workspace"]) == (1000, 1001, 1003)
    assert (enum["engine_global_index"], enum["engine_numerical_note"]) == (1301, 1303)
    assert (enum["pointwise_mode"], enum["pointwise_math_prec"], POINTWISE_ADD) == (0, 1, 0)
    assert (HEUR_MODES["instant"], HEUR_MODES["fallback"], HEUR_MODES["a"]) == (0, 2, 3)
    assert (NUMERICAL_NOTES["tensor_core"], NUMERICAL_NOTES["down_convert_inputs"],
            NUMERICAL_NOTES["reduced_precision_reduction"]) == (0, 1, 2)
    # f32 parity: no TF32 tensor-core engines; halves accumulate in f32
    assert FORBIDDEN_NOTES["f32"] == {0, 1} and FORBIDDEN_NOTES["f16"] == FORBIDDEN_NOTES["bf16"] == {2}
    assert CUDNN.conv_ids == {"x": 1, "w": 2, "y": 3, "b": 4, "r": 6}


def test_cuda_graph_replay_calls():
    """cuda_runtime_api.h: cudaStreamBeginCapture(stream, mode), cudaStreamEndCapture(stream,
    &graph), cudaGraphInstantiateWithFlags(&exec, graph, unsigned long long flags),
    cudaGraphLaunch(exec, stream); thread-local capture mode is 1."""
    from rocmc.runtime.providers.dnn import CAPTURE_THREAD_LOCAL
    f = CUDNN.runtime.functions
    assert f["capture_begin"] == ("cudaStreamBeginCapture", "stream capture_mode:int")
    assert f["capture_end"] == ("cudaStreamEndCapture", "stream out")
    assert f["graph_instantiate"] == ("cudaGraphInstantiateWithFlags", "out graph flags:u64")
    assert f["graph_launch"] == ("cudaGraphLaunch", "exec stream")
    assert CAPTURE_THREAD_LOCAL == 1
    assert CUDNN.graph_launch and not MIOPEN.graph_launch    # not enabled where it never ran
