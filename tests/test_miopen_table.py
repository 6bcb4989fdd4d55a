"""The MIOpen ctypes table against MIOpen's C API facts (shared/docs/vendor-dnn.md, from miopen.h),
and the cuDNN twin against the differences the same document lists."""
import ctypes

import pytest

from rocmc.runtime.providers.cudnn import CUDNN
from rocmc.runtime.providers.dnn import ARG_TYPES
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
    return {name: args.split() for name, args in table.functions.values()}


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
    assert set(MIOPEN.functions) - {"conv_fwd_ws", "conv_bwd_data_ws"} <= set(CUDNN.functions)
    assert CUDNN.enums["cross_correlation"] == 1
    assert (CUDNN.enums["pool_avg_include"], CUDNN.enums["pool_avg_exclude"]) == (1, 2)
    assert CUDNN.dtypes == {"f32": 0, "f16": 2, "bf16": 9}
    assert CUDNN.functions["conv_fwd"][1].split()[-5:] == ["ws", "ws_size", "beta", "yD", "y"]
    assert CUDNN.functions["conv_bwd_data"][1].split()[2:6] == ["wD", "w", "dyD", "dy"]
    assert CUDNN.functions["softmax_fwd"][1].split()[:3] == ["h", "sm_algo", "sm_mode"]
    assert "leaky_relu" not in CUDNN.activations
    assert {op: m for op, (m, _) in CUDNN.activations.items()} == \
        {"sigmoid": 0, "relu": 1, "tanh": 2, "clipped_relu": 3, "elu": 4}
    assert (CUDNN.perf.size, CUDNN.perf.algo, CUDNN.perf.status, CUDNN.perf.time, CUDNN.perf.memory) == \
        (48, 0, 4, 8, 16)
    assert CUDNN.enums["fma_math"] == 3   # f32 parity: no TF32
    assert CUDNN.enums["lrn_cross_channel"] == 0


@pytest.mark.parametrize("table", [MIOPEN, CUDNN], ids=["miopen", "cudnn"])
def test_every_argument_has_a_c_type(table):
    for role, (name, args) in {**table.functions, **table.runtime.functions}.items():
        for a in args.split():
            assert a in ARG_TYPES, f"{name}: argument {a!r} has no ctypes type"
    # Doubles where the header has doubles (activation and LRN parameters, batch-norm epsilon).
    for a in ("act_alpha", "lrn_alpha", "lrn_beta", "lrn_k", "eps", "coef"):
        assert ARG_TYPES[a] is ctypes.c_double
    assert ARG_TYPES["lrn_n"] is ctypes.c_uint and ARG_TYPES["ws_size"] is ctypes.c_size_t
