"""MIOpen's table for the shared DNN binding, and the HIP runtime's.

Written against MIOpen's C API (include/miopen/miopen.h): function names, argument order and enum
integers. Where MIOpen differs from cuDNN beyond names: filters are plain tensor descriptors,
mode 0 (miopenConvolution) is cross-correlation, the workspace query takes w before x and no
algorithm and must precede the (mandatory) search, which takes an `exhaustive` flag; workspace
arguments come last in the convolution calls; the average pooling modes are swapped; softmax,
pooling and LRN take their extra arguments in other positions. tests/test_miopen_table.py checks
this table against those facts.
"""
from __future__ import annotations

from .dnn import DnnProvider, Perf, RuntimeTable, VendorTable

HIP = RuntimeTable(
    name="HIP", libraries=("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"),
    install="install ROCm (the HIP runtime, e.g. `apt install hip-runtime-amd`)",
    functions={
        "set_device": ("hipSetDevice", "device"),
        "stream_create": ("hipStreamCreate", "out"),
        "stream_sync": ("hipStreamSynchronize", "stream"),
        "stream_destroy": ("hipStreamDestroy", "stream"),
        "malloc": ("hipMalloc", "out size"),
        "free": ("hipFree", "ptr"),
        "memcpy": ("hipMemcpy", "dst src count kind"),
        "error_string": ("hipGetErrorString", "status"),
    })

FUNCTIONS = {
    "create_handle": ("miopenCreate", "out"),
    "destroy_handle": ("miopenDestroy", "h"),
    "set_stream": ("miopenSetStream", "h stream"),
    "error_string": ("miopenGetErrorString", "status"),
    "create_tensor": ("miopenCreateTensorDescriptor", "out"),
    "set_tensor": ("miopenSetTensorDescriptor", "desc dtype n dims strides"),
    "destroy_tensor": ("miopenDestroyTensorDescriptor", "desc"),
    "create_filter": ("miopenCreateTensorDescriptor", "out"),
    "set_filter": ("miopenSetTensorDescriptor", "desc dtype n dims strides"),
    "destroy_filter": ("miopenDestroyTensorDescriptor", "desc"),
    "create_conv": ("miopenCreateConvolutionDescriptor", "out"),
    "set_conv": ("miopenInitConvolutionNdDescriptor", "desc n pads stride_a dil_a mode"),
    "set_conv_groups": ("miopenSetConvolutionGroupCount", "desc groups"),
    "destroy_conv": ("miopenDestroyConvolutionDescriptor", "desc"),
    "conv_fwd_ws": ("miopenConvolutionForwardGetWorkSpaceSize", "h wD xD conv yD size_out"),
    "conv_fwd_find": ("miopenFindConvolutionForwardAlgorithm",
                      "h xD x wD w conv yD y req n_out perf ws ws_size exhaustive"),
    "conv_fwd": ("miopenConvolutionForward", "h alpha xD x wD w conv algo beta yD y ws ws_size"),
    "conv_bwd_data_ws": ("miopenConvolutionBackwardDataGetWorkSpaceSize", "h dyD wD conv dxD size_out"),
    "conv_bwd_data_find": ("miopenFindConvolutionBackwardDataAlgorithm",
                           "h dyD dy wD w conv dxD dx req n_out perf ws ws_size exhaustive"),
    "conv_bwd_data": ("miopenConvolutionBackwardData", "h alpha dyD dy wD w conv algo beta dxD dx ws ws_size"),
    "add_tensor": ("miopenConvolutionForwardBias", "h alpha bD b beta yD y"),
    "create_pool": ("miopenCreatePoolingDescriptor", "out"),
    "set_pool": ("miopenSet2dPoolingDescriptor", "desc mode wh ww ph pw sh sw"),
    "destroy_pool": ("miopenDestroyPoolingDescriptor", "desc"),
    "pool_fwd": ("miopenPoolingForward", "h desc alpha xD x beta yD y do_backward ws ws_size"),
    "softmax_fwd": ("miopenSoftmaxForward_V2", "h alpha xD x beta yD y sm_algo sm_mode"),
    "create_act": ("miopenCreateActivationDescriptor", "out"),
    "set_act": ("miopenSetActivationDescriptor", "desc mode act_alpha act_beta act_gamma"),
    "destroy_act": ("miopenDestroyActivationDescriptor", "desc"),
    "act_fwd": ("miopenActivationForward", "h desc alpha xD x beta yD y"),
    "derive_bn": ("miopenDeriveBNTensorDescriptor", "bnD xD mode"),
    "bn_infer": ("miopenBatchNormalizationForwardInference",
                 "h mode alpha beta xD x yD y bnD scale bias mean var eps"),
    "create_lrn": ("miopenCreateLRNDescriptor", "out"),
    "set_lrn": ("miopenSetLRNDescriptor", "desc lrn_mode lrn_n lrn_alpha lrn_beta lrn_k"),
    "destroy_lrn": ("miopenDestroyLRNDescriptor", "desc"),
    "lrn_fwd": ("miopenLRNForward", "h desc alpha xD x beta yD y do_backward ws"),
}

MIOPEN = VendorTable(
    name="MIOpen", libraries=("libMIOpen.so.1", "libMIOpen.so"),
    install="install MIOpen (ROCm's `miopen-hip` package, usually /opt/rocm/lib)",
    functions=FUNCTIONS,
    dtypes={"f32": 1, "f16": 0, "bf16": 5},
    enums={"cross_correlation": 0,
           "pool_max": 0, "pool_avg_exclude": 1, "pool_avg_include": 2,
           "softmax_accurate": 1, "softmax_log": 2, "softmax_channel": 1,
           "bn_spatial": 1, "lrn_cross_channel": 1},
    # op -> (miopenActivationMode_t, attribute given as activAlpha). TANH computes beta*tanh(alpha*x),
    # so it gets alpha = beta = 1 like every mode without a parameter.
    activations={"sigmoid": (1, None), "tanh": (2, None), "relu": (3, None), "clipped_relu": (7, "ceiling"),
                 "leaky_relu": (8, "negative_slope"), "elu": (9, "alpha")},
    perf=Perf(size=16, algo=0, time=4, memory=8),
    search_workspace=None,
    runtime=HIP,
    dlpack_device=10,
)


class MiopenProvider(DnnProvider):
    table = MIOPEN
    exportable_hint = "call iree.runtime.flags.parse_flags('--hip_async_allocations=false') before the first hip device is opened"
