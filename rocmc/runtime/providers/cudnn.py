"""cuDNN's table for the shared DNN binding (cuDNN 9, legacy API), and the CUDA runtime's.

cuDNN is the twin that proves the binding on NVIDIA hardware: same roles as miopen.py, its own
names, argument orders and enum integers (cudnn_ops.h, cudnn_cnn.h, cudnn_graph.h of cuDNN 9).
"""
from __future__ import annotations

from .dnn import DnnProvider, Perf, RuntimeTable, VendorTable

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
}

CUDNN = VendorTable(
    name="cuDNN", libraries=("libcudnn.so.9", "libcudnn.so"),
    install="install cuDNN 9 (`pip install nvidia-cudnn-cu12`, or a PyTorch wheel that ships it)",
    functions=FUNCTIONS,
    dtypes={"f32": 0, "f16": 2, "bf16": 9},
    enums={"cross_correlation": 1, "nchw": 0, "fma_math": 3, "tensor_op_math": 1, "propagate_nan": 1,
           "pool_max": 0, "pool_avg_include": 1, "pool_avg_exclude": 2,
           "softmax_accurate": 1, "softmax_log": 2, "softmax_channel": 1,
           "bn_spatial": 1, "lrn_cross_channel": 0},
    # op -> (cudnnActivationMode_t, attribute given as `coef`); no leaky relu: built from parts
    activations={"sigmoid": (0, None), "relu": (1, None), "tanh": (2, None), "clipped_relu": (3, "ceiling"),
                 "elu": (4, "alpha")},
    perf=Perf(size=48, algo=0, status=4, time=8, memory=16),
    search_workspace=256 << 20,
    runtime=CUDART,
    dlpack_device=2,
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

    def table_limits(self, op, attrs):
        if op == "lrn" and not (1 <= attrs["size"] <= 16 and attrs["k"] >= 1e-5 and attrs["beta"] >= 0.01):
            return (f"LRN with size={attrs['size']}, k={attrs['k']}, beta={attrs['beta']} "
                    f"(cuDNN needs size in [1, 16], k >= 1e-5, beta >= 0.01)")
        return None
