"""cuDNN's table for the shared DNN binding (cuDNN 9, legacy API), and the CUDA runtime's.

cuDNN is the twin that proves the binding on NVIDIA hardware: same roles as miopen.py, its own
names, argument orders and enum integers (cudnn_ops.h, cudnn_cnn.h, cudnn_adv.h, cudnn_graph.h of
cuDNN 9). RNNs use the v8 API (the v6/v7 inference calls were removed in cuDNN 9); multi-head
attention has no legacy call at all.
"""
from __future__ import annotations

from .abi import NO_CUDNN_CALL
from .dnn import PLANNERS, DnnProvider, Perf, RuntimeTable, VendorTable
from .recurrent import PLANNERS as RNN_PLANNERS

CUDART = RuntimeTable(
    name="CUDA", libraries=("libcudart.so", "libcudart.so.13", "libcudart.so.12"),
    install="install the CUDA toolkit or `pip install nvidia-cuda-runtime-cu12`",
    functions={
        "set_device": ("cudaSetDevice", "device"),
        "stream_create": ("cudaStreamCreate", "out"),
        "stream_sync": ("cudaStreamSynchronize", "stream"),
        "stream_destroy": ("cudaStreamDestroy", "stream"),
        "malloc": ("cudaMalloc", "out size"),
        "free": ("cudaFree", "ptr"),
        "memcpy": ("cudaMemcpy", "dst src count kind"),
        "memcpy_async": ("cudaMemcpyAsync", "dst src count kind stream"),
        "memset_async": ("cudaMemsetAsync", "ptr value count stream"),
        "error_string": ("cudaGetErrorString", "status"),
    })

FUNCTIONS = {
    "create_handle": ("cudnnCreate", "out"),
    "destroy_handle": ("cudnnDestroy", "h"),
    "set_stream": ("cudnnSetStream", "h stream"),
    "error_string": ("cudnnGetErrorString", "status"),
    "create_tensor": ("cudnnCreateTensorDescriptor", "out"),
    "set_tensor": ("cudnnSetTensorNdDescriptor", "desc dtype n dims strides"),
    "destroy_tensor": ("cudnnDestroyTensorDescriptor", "desc"),
    "create_filter": ("cudnnCreateFilterDescriptor", "out"),
    "set_filter": ("cudnnSetFilterNdDescriptor", "desc dtype format n dims"),
    "destroy_filter": ("cudnnDestroyFilterDescriptor", "desc"),
    "create_conv": ("cudnnCreateConvolutionDescriptor", "out"),
    "set_conv": ("cudnnSetConvolutionNdDescriptor", "desc n pads stride_a dil_a mode ctype"),
    "set_conv_groups": ("cudnnSetConvolutionGroupCount", "desc groups"),
    "set_conv_math": ("cudnnSetConvolutionMathType", "desc math"),
    "destroy_conv": ("cudnnDestroyConvolutionDescriptor", "desc"),
    "conv_fwd_find": ("cudnnFindConvolutionForwardAlgorithmEx",
                      "h xD x wD w conv yD y req n_out perf ws ws_size"),
    "conv_fwd": ("cudnnConvolutionForward", "h alpha xD x wD w conv algo ws ws_size beta yD y"),
    "conv_bwd_data_find": ("cudnnFindConvolutionBackwardDataAlgorithmEx",
                           "h wD w dyD dy conv dxD dx req n_out perf ws ws_size"),
    "conv_bwd_data": ("cudnnConvolutionBackwardData", "h alpha wD w dyD dy conv algo ws ws_size beta dxD dx"),
    "add_tensor": ("cudnnAddTensor", "h alpha bD b beta yD y"),
    "create_pool": ("cudnnCreatePoolingDescriptor", "out"),
    "set_pool": ("cudnnSetPooling2dDescriptor", "desc mode nan wh ww ph pw sh sw"),
    "destroy_pool": ("cudnnDestroyPoolingDescriptor", "desc"),
    "pool_fwd": ("cudnnPoolingForward", "h desc alpha xD x beta yD y"),
    "softmax_fwd": ("cudnnSoftmaxForward", "h sm_algo sm_mode alpha xD x beta yD y"),
    "create_act": ("cudnnCreateActivationDescriptor", "out"),
    "set_act": ("cudnnSetActivationDescriptor", "desc mode nan coef"),
    "destroy_act": ("cudnnDestroyActivationDescriptor", "desc"),
    "act_fwd": ("cudnnActivationForward", "h desc alpha xD x beta yD y"),
    "derive_bn": ("cudnnDeriveBNTensorDescriptor", "bnD xD mode"),
    "bn_infer": ("cudnnBatchNormalizationForwardInference",
                 "h mode alpha beta xD x yD y bnD scale bias mean var eps"),
    "create_lrn": ("cudnnCreateLRNDescriptor", "out"),
    "set_lrn": ("cudnnSetLRNDescriptor", "desc lrn_n lrn_alpha lrn_beta lrn_k"),
    "destroy_lrn": ("cudnnDestroyLRNDescriptor", "desc"),
    "lrn_fwd": ("cudnnLRNCrossChannelForward", "h desc lrn_mode alpha xD x beta yD y"),
    # RNN, the v8 API (cudnn_adv.h): sizes before their buffers, device sequence lengths
    "create_dropout": ("cudnnCreateDropoutDescriptor", "out"),
    "set_dropout": ("cudnnSetDropoutDescriptor", "desc h drop_p states state_size seed"),
    "destroy_dropout": ("cudnnDestroyDropoutDescriptor", "desc"),
    "create_rnn": ("cudnnCreateRNNDescriptor", "out"),
    "set_rnn": ("cudnnSetRNNDescriptor_v8",
                "desc rnn_algo rnn_mode bias_mode direction in_mode dtype math_prec math input_size hsize "
                "proj_size nlayers dropout aux_flags"),
    "destroy_rnn": ("cudnnDestroyRNNDescriptor", "desc"),
    "create_rnn_data": ("cudnnCreateRNNDataDescriptor", "out"),
    "set_rnn_data": ("cudnnSetRNNDataDescriptor", "desc dtype layout max_seq batch vec seq_lens pad_fill"),
    "destroy_rnn_data": ("cudnnDestroyRNNDataDescriptor", "desc"),
    "rnn_weight_size": ("cudnnGetRNNWeightSpaceSize", "h desc size_out"),
    "rnn_weight_params": ("cudnnGetRNNWeightParams", "h desc layer w_size w lin_id mD m_addr bD b_addr"),
    "rnn_temp_sizes": ("cudnnGetRNNTempSpaceSizes", "h desc fwd_mode xS size_out size_out2"),
    "rnn_fwd": ("cudnnRNNForward",
                "h desc fwd_mode dev_seq_lens xS x yS y hD hx hy cD cx cy w_size w ws_size ws rs_size rs"),
}

CUDNN = VendorTable(
    name="cuDNN", libraries=("libcudnn.so.9", "libcudnn.so"),
    install="install cuDNN 9 (`pip install nvidia-cudnn-cu12`, or a PyTorch wheel that ships it)",
    functions=FUNCTIONS,
    dtypes={"f32": 0, "f16": 2, "bf16": 9},
    enums={"cross_correlation": 1, "nchw": 0, "fma_math": 3, "tensor_op_math": 1, "propagate_nan": 1,
           "pool_max": 0, "pool_avg_include": 1, "pool_avg_exclude": 2,
           "softmax_accurate": 1, "softmax_log": 2, "softmax_channel": 1,
           "bn_spatial": 1, "lrn_cross_channel": 0,
           # cudnnRNNMode_t, cudnnRNNInputMode_t, cudnnDirectionMode_t, cudnnRNNBiasMode_t (DOUBLE_BIAS:
           # separate input and recurrent biases, as torch has), cudnnRNNAlgo_t, cudnnForwardMode_t
           # (Inference=0, Training=1), cudnnRNNDataLayout_t
           "rnn_lstm": 2, "rnn_gru": 3, "rnn_linear_input": 0, "rnn_unidirectional": 0,
           "rnn_no_bias": 0, "rnn_bias": 2, "rnn_algo_standard": 0, "rnn_inference": 0, "rnn_training": 1,
           "rnn_seq_major_packed": 1},
    # op -> (cudnnActivationMode_t, attribute given as `coef`); no leaky relu: built from parts
    activations={"sigmoid": (0, None), "relu": (1, None), "tanh": (2, None), "clipped_relu": (3, "ceiling"),
                 "elu": (4, "alpha")},
    perf=Perf(size=48, algo=0, status=4, time=8, memory=16),
    search_workspace=256 << 20,
    runtime=CUDART,
    dlpack_device=2,
    # linLayerID order of cudnnGetRNNWeightParams: torch's (i, f, g, o; r, z, n), x then h
    gate_order={"lstm": "ifgo", "gru": "rzn"},
    rnn_weights="address_copies",
)


def prepare_cuda(device: str = "cuda"):
    """Open `device` (rocmc opens CUDA devices with exportable, caching allocations; see devices.py)."""
    from .. import devices
    return devices.get_device(device)


class CudnnProvider(DnnProvider):
    table = CUDNN
    exportable_hint = ("open the device with rocmc.runtime.providers.cudnn.prepare_cuda() before loading, "
                       "or call iree.runtime.flags.parse_flags('--cuda_async_allocations=false') before the "
                       "first cuda device is opened")

    planners = {**PLANNERS, **RNN_PLANNERS}

    def table_limits(self, op, attrs):
        if op in NO_CUDNN_CALL:
            return NO_CUDNN_CALL[op]
        if op == "lrn" and not (1 <= attrs["size"] <= 16 and attrs["k"] >= 1e-5 and attrs["beta"] >= 0.01):
            return (f"LRN with size={attrs['size']}, k={attrs['k']}, beta={attrs['beta']} "
                    f"(cuDNN needs size in [1, 16], k >= 1e-5, beta >= 0.01)")
        return None
