"""cuDNN's table for the shared DNN binding (cuDNN 9), and the CUDA runtime's.

cuDNN is the twin that proves the binding on NVIDIA hardware: same roles as miopen.py, its own
names, argument orders and enum integers (cudnn_ops.h, cudnn_cnn.h, cudnn_adv.h, cudnn_graph.h of
cuDNN 9). RNNs use the v8 API (the v6/v7 inference calls were removed in cuDNN 9); multi-head
attention has no legacy call at all.

Convolutions use the backend (graph) API, what cuDNN's frontend and PyTorch use: the legacy
algorithm enum can't reach cuDNN's newer engines, and `cudnnConvolutionForward` spends tens to
hundreds of microseconds of host time per call. Per (op, shapes, dtype) the provider builds an
operation graph (convolution, plus the bias as a pointwise add when an engine fuses it), asks
the heuristics for engine configs, drops those whose numerics break f32 parity (TF32 tensor cores)
or accumulate halves below f32, finalizes execution plans for the first few and keeps the fastest
on the real inputs. A call is then one `cudnnBackendExecute` with a variant pack, kept per set of
device pointers (IREE's caching allocator hands the same buffers back call after call).

fused_conv2d (activation(conv + bias + residual)) is one graph as well: the convolution, then a chain
of pointwise ops on virtual f32 intermediates (+ residual, + bias, relu) ending in y: the order of
cudnnConvolutionBiasActivationForward's act(conv + z + bias). Measured with cuDNN 9 on an H100, that
chain gets engines (f32 without TF32 too, grouped or not) where + bias, then + residual, gets none;
conv -> relu without a bias gets none either. Where no engine takes the chain, the convolution (and
bias) graph runs and the epilogue follows as legacy calls (conv_plan._epilogue); plan.info["epilogue"] says
which form ran.
"""

from __future__ import annotations

import ctypes
import math
from time import perf_counter

from ...errors import DeviceError
from ...externs import DNN as _DNN_ABI
from .capi import P, Perf, RuntimeTable, VendorTable, packed_strides
from .conv_plan import TensorOp
from .dnn import PLANNERS, DnnProvider
from .recurrent import PLANNERS as RNN_PLANNERS

CUDART = RuntimeTable(
    name="CUDA",
    libraries=("libcudart.so", "libcudart.so.13", "libcudart.so.12"),
    install="install the CUDA toolkit or `pip install nvidia-cuda-runtime-cu12`",
    functions={
        "set_device": ("cudaSetDevice", "device:int"),
        "stream_create": ("cudaStreamCreate", "out"),
        "stream_sync": ("cudaStreamSynchronize", "stream"),
        "stream_destroy": ("cudaStreamDestroy", "stream"),
        "malloc": ("cudaMalloc", "out size:size_t"),
        "free": ("cudaFree", "ptr"),
        "memcpy": ("cudaMemcpy", "dst src count:size_t kind:int"),
        "memcpy_async": ("cudaMemcpyAsync", "dst src count:size_t kind:int stream"),
        "memset_async": ("cudaMemsetAsync", "ptr value:int count:size_t stream"),
        "error_string": ("cudaGetErrorString", "status:int"),
        "get_last_error": ("cudaGetLastError", ""),
        "capture_begin": ("cudaStreamBeginCapture", "stream capture_mode:int"),
        "capture_end": ("cudaStreamEndCapture", "stream out"),
        "graph_instantiate": ("cudaGraphInstantiateWithFlags", "out graph flags:u64"),
        "graph_launch": ("cudaGraphLaunch", "exec stream"),
        "graph_exec_destroy": ("cudaGraphExecDestroy", "exec"),
        "graph_destroy": ("cudaGraphDestroy", "graph"),
    },
)

# role -> (C function, argument names in C order), from the cuDNN 9 headers
FUNCTIONS = {
    "create_handle": ("cudnnCreate", "out"),
    "destroy_handle": ("cudnnDestroy", "h"),
    "set_stream": ("cudnnSetStream", "h stream"),
    "error_string": ("cudnnGetErrorString", "status:int"),
    "create_tensor": ("cudnnCreateTensorDescriptor", "out"),
    "set_tensor": ("cudnnSetTensorNdDescriptor", "desc dtype:int n:int dims strides"),
    "destroy_tensor": ("cudnnDestroyTensorDescriptor", "desc"),
    "create_filter": ("cudnnCreateFilterDescriptor", "out"),
    "set_filter": ("cudnnSetFilterNdDescriptor", "desc dtype:int format:int n:int dims"),
    "destroy_filter": ("cudnnDestroyFilterDescriptor", "desc"),
    "create_conv": ("cudnnCreateConvolutionDescriptor", "out"),
    "set_conv": ("cudnnSetConvolutionNdDescriptor", "desc n:int pads stride_a dil_a mode:int ctype:int"),
    "set_conv_groups": ("cudnnSetConvolutionGroupCount", "desc groups:int"),
    "set_conv_math": ("cudnnSetConvolutionMathType", "desc math:int"),
    "destroy_conv": ("cudnnDestroyConvolutionDescriptor", "desc"),
    "conv_fwd_find": (
        "cudnnFindConvolutionForwardAlgorithmEx",
        "h xD x wD w conv yD y req:int n_out perf ws ws_size:size_t",
    ),
    "conv_fwd": ("cudnnConvolutionForward", "h alpha xD x wD w conv algo:int ws ws_size:size_t beta yD y"),
    "conv_bwd_data_find": (
        "cudnnFindConvolutionBackwardDataAlgorithmEx",
        "h wD w dyD dy conv dxD dx req:int n_out perf ws ws_size:size_t",
    ),
    "conv_bwd_data": (
        "cudnnConvolutionBackwardData",
        "h alpha wD w dyD dy conv algo:int ws ws_size:size_t beta dxD dx",
    ),
    "add_tensor": ("cudnnAddTensor", "h alpha bD b beta yD y"),
    "create_pool": ("cudnnCreatePoolingDescriptor", "out"),
    "set_pool": ("cudnnSetPooling2dDescriptor", "desc mode:int nan:int wh:int ww:int ph:int pw:int sh:int sw:int"),
    "destroy_pool": ("cudnnDestroyPoolingDescriptor", "desc"),
    "pool_fwd": ("cudnnPoolingForward", "h desc alpha xD x beta yD y"),
    "softmax_fwd": ("cudnnSoftmaxForward", "h sm_algo:int sm_mode:int alpha xD x beta yD y"),
    "create_act": ("cudnnCreateActivationDescriptor", "out"),
    "set_act": ("cudnnSetActivationDescriptor", "desc mode:int nan:int coef:double"),
    "destroy_act": ("cudnnDestroyActivationDescriptor", "desc"),
    "act_fwd": ("cudnnActivationForward", "h desc alpha xD x beta yD y"),
    "derive_bn": ("cudnnDeriveBNTensorDescriptor", "bnD xD mode:int"),
    "bn_infer": (
        "cudnnBatchNormalizationForwardInference",
        "h mode:int alpha beta xD x yD y bnD scale bias mean var eps:double",
    ),
    "create_lrn": ("cudnnCreateLRNDescriptor", "out"),
    "set_lrn": ("cudnnSetLRNDescriptor", "desc lrn_n:uint lrn_alpha:double lrn_beta:double lrn_k:double"),
    "destroy_lrn": ("cudnnDestroyLRNDescriptor", "desc"),
    "lrn_fwd": ("cudnnLRNCrossChannelForward", "h desc lrn_mode:int alpha xD x beta yD y"),
    # RNN, the v8 API (cudnn_adv.h): sizes before their buffers, device sequence lengths
    "create_dropout": ("cudnnCreateDropoutDescriptor", "out"),
    "set_dropout": ("cudnnSetDropoutDescriptor", "desc h drop_p:float states state_size:size_t seed:u64"),
    "destroy_dropout": ("cudnnDestroyDropoutDescriptor", "desc"),
    "create_rnn": ("cudnnCreateRNNDescriptor", "out"),
    "set_rnn": (
        "cudnnSetRNNDescriptor_v8",
        "desc rnn_algo:int rnn_mode:int bias_mode:int direction:int in_mode:int dtype:int math_prec:int "
        "math:int input_size:int hsize:int proj_size:int nlayers:int dropout aux_flags:int",
    ),
    "destroy_rnn": ("cudnnDestroyRNNDescriptor", "desc"),
    "create_rnn_data": ("cudnnCreateRNNDataDescriptor", "out"),
    "set_rnn_data": (
        "cudnnSetRNNDataDescriptor",
        "desc dtype:int layout:int max_seq:int batch:int vec:int seq_lens pad_fill",
    ),
    "destroy_rnn_data": ("cudnnDestroyRNNDataDescriptor", "desc"),
    "rnn_weight_size": ("cudnnGetRNNWeightSpaceSize", "h desc size_out"),
    "rnn_weight_params": ("cudnnGetRNNWeightParams", "h desc layer:int w_size:size_t w lin_id:int mD m_addr bD b_addr"),
    "rnn_temp_sizes": ("cudnnGetRNNTempSpaceSizes", "h desc fwd_mode:int xS size_out size_out2"),
    "rnn_fwd": (
        "cudnnRNNForward",
        "h desc fwd_mode:int dev_seq_lens xS x yS y hD hx hy cD cx cy w_size:size_t w ws_size:size_t ws "
        "rs_size:size_t rs",
    ),
    # the backend (graph) API, cudnn_graph.h
    "be_create": ("cudnnBackendCreateDescriptor", "desc_type:int out"),
    "be_destroy": ("cudnnBackendDestroyDescriptor", "desc"),
    "be_set": ("cudnnBackendSetAttribute", "desc attr:int atype:int n_elems:i64 values"),
    "be_get": ("cudnnBackendGetAttribute", "desc attr:int atype:int n_elems:i64 n_out values"),
    "be_finalize": ("cudnnBackendFinalize", "desc"),
    "be_execute": ("cudnnBackendExecute", "h plan vpack"),
}

# The backend API's enums, from cudnn_graph.h of cuDNN 9. cudnnBackendDescriptorType_t:
DESCRIPTORS = {
    "pointwise": 0,
    "convolution": 1,
    "engine": 2,
    "engine_config": 3,
    "engine_heuristics": 4,
    "execution_plan": 5,
    "op_conv_forward": 10,
    "op_conv_backward_data": 12,
    "op_pointwise": 13,
    "operation_graph": 15,
    "variant_pack": 16,
    "tensor": 17,
}
# cudnnBackendAttributeType_t, and the C type of one element
ATTR_TYPES = {
    "handle": (0, P),
    "data_type": (1, ctypes.c_int),
    "boolean": (2, ctypes.c_bool),
    "int64": (3, ctypes.c_int64),
    "float": (4, ctypes.c_float),
    "double": (5, ctypes.c_double),
    "void_ptr": (6, P),
    "convolution_mode": (7, ctypes.c_int),
    "heur_mode": (8, ctypes.c_int),
    "numerical_note": (11, ctypes.c_int),
    "pointwise_mode": (14, ctypes.c_int),
    "backend_descriptor": (15, P),
}
# cudnnBackendAttributeName_t: our name -> (enum, attribute type)
ATTRS = {
    "pointwise_mode": (0, "pointwise_mode"),
    "pointwise_math_prec": (1, "data_type"),
    "conv_comp_type": (100, "data_type"),
    "conv_mode": (101, "convolution_mode"),
    "conv_dilations": (102, "int64"),
    "conv_filter_strides": (103, "int64"),
    "conv_post_paddings": (104, "int64"),
    "conv_pre_paddings": (105, "int64"),
    "conv_spatial_dims": (106, "int64"),
    "heur_mode": (200, "heur_mode"),
    "heur_operation_graph": (201, "backend_descriptor"),
    "heur_results": (202, "backend_descriptor"),
    "engine_config_engine": (300, "backend_descriptor"),
    "plan_handle": (400, "handle"),
    "plan_engine_config": (401, "backend_descriptor"),
    "plan_workspace_size": (402, "int64"),
    "fwd_alpha": (700, "float"),
    "fwd_beta": (701, "float"),
    "fwd_conv": (702, "backend_descriptor"),
    "fwd_w": (703, "backend_descriptor"),
    "fwd_x": (704, "backend_descriptor"),
    "fwd_y": (705, "backend_descriptor"),
    "bwd_data_alpha": (706, "float"),
    "bwd_data_beta": (707, "float"),
    "bwd_data_conv": (708, "backend_descriptor"),
    "bwd_data_w": (709, "backend_descriptor"),
    "bwd_data_dx": (710, "backend_descriptor"),
    "bwd_data_dy": (711, "backend_descriptor"),
    "pw_descriptor": (750, "backend_descriptor"),
    "pw_x": (751, "backend_descriptor"),
    "pw_b": (752, "backend_descriptor"),
    "pw_y": (753, "backend_descriptor"),
    "graph_handle": (800, "handle"),
    "graph_ops": (801, "backend_descriptor"),
    "tensor_alignment": (900, "int64"),
    "tensor_data_type": (901, "data_type"),
    "tensor_dims": (902, "int64"),
    "tensor_strides": (903, "int64"),
    "tensor_uid": (906, "int64"),
    "tensor_virtual": (907, "boolean"),
    "pack_uids": (1000, "int64"),
    "pack_pointers": (1001, "void_ptr"),
    "pack_workspace": (1003, "void_ptr"),
    "engine_global_index": (1301, "int64"),
    "engine_numerical_note": (1303, "numerical_note"),
}
HEUR_MODES = {"instant": 0, "b": 1, "fallback": 2, "a": 3}  # cudnnBackendHeurMode_t
NUMERICAL_NOTES = {"tensor_core": 0, "down_convert_inputs": 1, "reduced_precision_reduction": 2}
# cudnnPointwiseMode_t (cudnn_graph.h of cuDNN 9.6.0): CUDNN_POINTWISE_ADD, CUDNN_POINTWISE_RELU_FWD
POINTWISE_ADD = 0
POINTWISE_RELU_FWD = 100
# Engines whose numerics break rocmc's rules: f32 must not run on TF32 tensor cores (parity with
# float64 at 1e-4), f16/bf16 must accumulate in f32.
FORBIDDEN_NOTES = {
    "f32": {NUMERICAL_NOTES["tensor_core"], NUMERICAL_NOTES["down_convert_inputs"]},
    "f16": {NUMERICAL_NOTES["reduced_precision_reduction"]},
    "bf16": {NUMERICAL_NOTES["reduced_precision_reduction"]},
}
CANDIDATES = 6  # execution plans timed on the first call
MAX_CONFIGS = 64  # engine configs looked at per heuristics mode
MAX_WORKSPACE = 256 << 20  # engine configs needing more are skipped (what the legacy search offered)
PACKS_PER_PLAN = 32  # variant packs kept per plan (one per set of device pointers)


# Enum integers from cudnn_ops.h, cudnn_cnn.h, cudnn_adv.h, cudnn_graph.h of cuDNN 9
CUDNN = VendorTable(
    name="cuDNN",
    libraries=("libcudnn.so.9", "libcudnn.so"),
    install="install cuDNN 9 (`pip install nvidia-cudnn-cu12`, or a PyTorch wheel that ships it)",
    functions=FUNCTIONS,
    dtypes={"f32": 0, "f16": 2, "bf16": 9},
    enums={
        "cross_correlation": 1,
        "nchw": 0,
        "fma_math": 3,
        "tensor_op_math": 1,
        "propagate_nan": 1,
        "pool_max": 0,
        "pool_avg_include": 1,
        "pool_avg_exclude": 2,
        "softmax_accurate": 1,
        "softmax_log": 2,
        "softmax_channel": 1,
        "bn_spatial": 1,
        "lrn_cross_channel": 0,
        # cudnnRNNMode_t, cudnnRNNInputMode_t, cudnnDirectionMode_t, cudnnRNNBiasMode_t (DOUBLE_BIAS:
        # separate input and recurrent biases, as torch has), cudnnRNNAlgo_t, cudnnForwardMode_t
        # (Inference=0, Training=1), cudnnRNNDataLayout_t
        "rnn_lstm": 2,
        "rnn_gru": 3,
        "rnn_linear_input": 0,
        "rnn_unidirectional": 0,
        "rnn_no_bias": 0,
        "rnn_bias": 2,
        "rnn_algo_standard": 0,
        "rnn_inference": 0,
        "rnn_training": 1,
        "rnn_seq_major_packed": 1,
    },
    # op -> (cudnnActivationMode_t, attribute given as `coef`); no leaky relu: built from parts
    activations={
        "sigmoid": (0, None),
        "relu": (1, None),
        "tanh": (2, None),
        "clipped_relu": (3, "ceiling"),
        "elu": (4, "alpha"),
    },
    # cudnnConvolutionFwdAlgoPerf_t: {algo, status (enums), float time, size_t memory, determinism, mathType
    # (enums), int reserved[3]}
    perf=Perf(size=48, algo=0, status=4, time=8, memory=16),
    search_workspace=256 << 20,
    runtime=CUDART,
    dlpack_device=2,
    # linLayerID order of cudnnGetRNNWeightParams: torch's (i, f, g, o; r, z, n), x then h
    gate_order={"lstm": "ifgo", "gru": "rzn"},
    rnn_weights="address_copies",
    # tensor unique ids of the convolution graph: x, w, y, the bias, fused_conv2d's residual (the
    # virtual intermediates are VIRTUAL_UIDS)
    conv_ids={"x": 1, "w": 2, "y": 3, "b": 4, "r": 6},
    conv_api="backend graph (cudnnBackendExecute)",
    last_error="cudnnGetLastErrorString",
    graph_launch=True,
)
# uids of the virtual f32 intermediates of a fused graph, in chain order: the conv result and the
# sums after it
VIRTUAL_UIDS = (5, 7, 8)


class Graph:
    """Descriptors of the backend API from attribute tables. Every descriptor made is destroyed
    with the plan that holds `keep`."""

    def __init__(self, p: DnnProvider, keep: list):
        self.p, self.api, self.keep = p, p.api, keep

    def new(self, kind: str, owned: bool = True) -> int:
        """A fresh descriptor; `owned=False`: the caller destroys it."""
        d = ctypes.c_void_p()
        self.api.call("be_create", desc_type=DESCRIPTORS[kind], out=ctypes.byref(d))
        if owned:
            self.keep.append(("be_destroy", d.value))
        return d.value

    def set(self, d: int, name: str, values):
        enum, atype = ATTRS[name]
        code, ctype = ATTR_TYPES[atype]
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        self.api.call(
            "be_set", desc=d, attr=enum, atype=code, n_elems=len(values), values=(ctype * len(values))(*values)
        )

    def make(self, kind: str, **attrs) -> int:
        """A finalized descriptor with the given attributes."""
        d = self.new(kind)
        for name, values in attrs.items():
            self.set(d, name, values)
        self.api.call("be_finalize", desc=d)
        return d

    def get(self, d: int, name: str, most: int) -> list:
        enum, atype = ATTRS[name]
        code, ctype = ATTR_TYPES[atype]
        out, n = (ctype * most)(), ctypes.c_int64()
        self.api.call("be_get", desc=d, attr=enum, atype=code, n_elems=most, n_out=ctypes.byref(n), values=out)
        return list(out[: n.value])

    def count(self, d: int, name: str) -> int:
        enum, atype = ATTRS[name]
        n = ctypes.c_int64()
        self.api.call(
            "be_get", desc=d, attr=enum, atype=ATTR_TYPES[atype][0], n_elems=0, n_out=ctypes.byref(n), values=None
        )
        return n.value

    def get_descriptors(self, d: int, name: str, kind: str, most: int) -> list:
        """Descriptor-valued attributes: the library fills descriptors made beforehand."""
        made = [self.new(kind) for _ in range(most)]
        enum, _ = ATTRS[name]
        n = ctypes.c_int64()
        self.api.call(
            "be_get",
            desc=d,
            attr=enum,
            atype=ATTR_TYPES["backend_descriptor"][0],
            n_elems=most,
            n_out=ctypes.byref(n),
            values=(P * most)(*made),
        )
        return made[: n.value]


def _alignment(ptr) -> int:
    """Byte alignment recorded in a tensor descriptor: 16, or less for a pointer inside a buffer."""
    return 16 if not ptr or ptr % 16 == 0 else ptr & -ptr


def _pointwise_chain(prob, fuse_bias: bool, fuse_epilogue: bool) -> list:
    """The pointwise ops after the convolution, in order: (mode, the role of their second operand
    or None). The residual comes before the bias: the order cuDNN's engines fuse (module doc)."""
    chain = [(POINTWISE_ADD, "r")] if fuse_epilogue and prob.residual else []
    if fuse_bias:
        chain.append((POINTWISE_ADD, "b"))
    if fuse_epilogue and prob.activation == "relu":
        chain.append((POINTWISE_RELU_FWD, None))
    return chain


def _conv_graph(g: Graph, prob, bound: dict, fuse_bias: bool, fuse_epilogue: bool = False) -> int:
    """The operation graph: x, w -> convolution -> y, or -> (virtual) -> + r -> (virtual) -> + b ->
    (virtual) -> relu -> y, as far as the fused ops go; intermediates are virtual f32 tensors."""
    p, ids, f32 = g.p, CUDNN.conv_ids, CUDNN.dtypes["f32"]
    dt = CUDNN.dtypes[prob.dtype]

    def tensor(uid, dims, ptr=None, virtual=False, dtype=dt):
        return g.make(
            "tensor",
            tensor_data_type=dtype,
            tensor_dims=dims,
            tensor_strides=packed_strides(dims),
            tensor_uid=uid,
            tensor_alignment=_alignment(ptr),
            **({"tensor_virtual": True} if virtual else {}),
        )

    x, w, y = (tensor(ids[r], getattr(prob, r), bound[r]) for r in ("x", "w", "y"))
    out = prob.out
    result, dims = {"x": x, "y": y}[out], getattr(prob, out)
    chain = _pointwise_chain(prob, fuse_bias, fuse_epilogue)
    virtual = iter(VIRTUAL_UIDS)
    conv_out = tensor(next(virtual), dims, virtual=True, dtype=f32) if chain else result
    conv = g.make(
        "convolution",
        conv_comp_type=f32,
        conv_mode=CUDNN.enums["cross_correlation"],
        conv_spatial_dims=2,
        conv_dilations=prob.dilation,
        conv_filter_strides=prob.stride,
        conv_pre_paddings=prob.pad,
        conv_post_paddings=prob.pad,
    )
    if prob.direction == "forward":
        op = g.make("op_conv_forward", fwd_alpha=1.0, fwd_beta=0.0, fwd_conv=conv, fwd_w=w, fwd_x=x, fwd_y=conv_out)
    else:
        op = g.make(
            "op_conv_backward_data",
            bwd_data_alpha=1.0,
            bwd_data_beta=0.0,
            bwd_data_conv=conv,
            bwd_data_w=w,
            bwd_data_dx=conv_out,
            bwd_data_dy=y,
        )
    ops, last = [op], conv_out
    operand_dims = {"b": (1, dims[1], 1, 1), "r": dims}
    for i, (mode, role) in enumerate(chain):
        second = {"pw_b": tensor(ids[role], operand_dims[role], bound[role])} if role else {}
        step_out = result if i == len(chain) - 1 else tensor(next(virtual), dims, virtual=True, dtype=f32)
        desc = g.make("pointwise", pointwise_mode=mode, pointwise_math_prec=f32)
        ops.append(g.make("op_pointwise", pw_descriptor=desc, pw_x=last, **second, pw_y=step_out))
        last = step_out
    return g.make("operation_graph", graph_ops=ops, graph_handle=p.handle)


def _engine_configs(g: Graph, graph: int):
    """Engine configs of the heuristics (mode A, then the fallback list), in their order."""
    for mode in ("a", "fallback"):
        try:
            heur = g.make("engine_heuristics", heur_operation_graph=graph, heur_mode=HEUR_MODES[mode])
            n = min(g.count(heur, "heur_results"), MAX_CONFIGS)
        except DeviceError:
            continue
        yield from g.get_descriptors(heur, "heur_results", "engine_config", n) if n else ()


class _Packs:
    """Variant packs by device pointers: a finalized pack can't be changed, and the same buffers
    come back call after call, so each set of pointers gets one pack, built on first use."""

    def __init__(self, p: DnnProvider, uids):
        self.p, self.uids, self.cache = p, (ctypes.c_int64 * len(uids))(*uids), {}
        self.g = Graph(p, [])

    def get(self, ptrs: tuple) -> int:
        vp = self.cache.get(ptrs)
        if vp is None:
            if len(self.cache) >= PACKS_PER_PLAN:
                self._destroy(self.cache.pop(next(iter(self.cache))))
            *data, ws = ptrs
            vp = self.g.new("variant_pack", owned=False)
            self.g.set(vp, "pack_uids", list(self.uids))
            self.g.set(vp, "pack_pointers", data)
            self.g.set(vp, "pack_workspace", [ws])
            self.p.api.call("be_finalize", desc=vp)
            self.cache[ptrs] = vp
        return vp

    def _destroy(self, vp):
        self.p.api.call("be_destroy", desc=vp)

    def release(self):
        for vp in self.cache.values():
            self._destroy(vp)
        self.cache.clear()


def _fastest(p: DnnProvider, g: Graph, graph: int, prob, bound: dict, roles: tuple):
    """Execution plans of the first CANDIDATES usable engine configs, each timed on the search
    bindings (best of 3 after a warm-up); returns (plan, workspace bytes, info) of the fastest."""
    execute, sync = p.api.bound("be_execute"), p._sync
    forbidden = FORBIDDEN_NOTES[prob.dtype]
    uids = [CUDNN.conv_ids[r] for r in roles]
    timed, seen = [], 0
    for cfg in _engine_configs(g, graph):
        seen += 1
        try:
            engine = g.get_descriptors(cfg, "engine_config_engine", "engine", 1)[0]
            if forbidden & set(g.get(engine, "engine_numerical_note", 16)):
                continue
            plan = g.make("execution_plan", plan_handle=p.handle, plan_engine_config=cfg)
            need = g.get(plan, "plan_workspace_size", 1)[0]
            if need > MAX_WORKSPACE:
                continue
            packs = _Packs(p, uids)
            ws = p.workspace(need) if need else None
            vp = packs.get(tuple(bound[r] for r in roles) + (ws,))
            best = math.inf
            for rep in range(4):
                t0 = perf_counter()
                execute(p.handle, plan, vp)
                sync(p.stream)
                if rep:
                    best = min(best, perf_counter() - t0)
            packs.release()
            index = g.get(engine, "engine_global_index", 1)[0]
        except DeviceError:  # a config the library can't finalize or run for this problem
            continue
        timed.append((best, index, plan, need))
        if len(timed) == CANDIDATES:
            break
    if not timed:
        return None
    best, engine, plan, need = min(timed)
    return (
        plan,
        need,
        {
            "engine": engine,
            "workspace": need,
            "configs_seen": seen,
            "candidates_ms": sorted(round(t[0] * 1e3, 4) for t in timed),
        },
    )


def _fusions(prob) -> list:
    """(fuse the bias, fuse the epilogue) to try, most fused first: the whole fused_conv2d, the
    convolution and its bias, the convolution alone."""
    out = []
    for form in ((prob.bias, prob.epilogue), (prob.bias, False), (False, False)):
        if form not in out:
            out.append(form)
    return out


def graph_conv(p: DnnProvider, prob, bound: dict, keep: list):
    """The convolution, with as much of its bias and epilogue as an engine fuses, as an execution
    plan; None when no engine takes the problem."""
    g = Graph(p, keep)
    for fuse_bias, fuse_epilogue in _fusions(prob):
        roles = ("x", "w", "y") + (("b",) if fuse_bias else ()) + (("r",) if fuse_epilogue and prob.residual else ())
        try:
            graph = _conv_graph(g, prob, bound, fuse_bias, fuse_epilogue)
        except DeviceError:
            continue
        found = _fastest(p, g, graph, prob, bound, roles)
        p.release_workspace()
        if found is not None:
            break
    else:
        return None
    plan, need, info = found
    packs = _Packs(p, [CUDNN.conv_ids[r] for r in roles])
    keep.append(packs)
    execute, handle = p.api.bound("be_execute"), p.handle

    def run(ptrs, ws):
        execute(handle, plan, packs.get(ptrs + (ws,)))

    return TensorOp(roles, run, workspace=need, fused_bias=fuse_bias, fused_epilogue=fuse_epilogue, info=info)


def prepare_cuda(device: str = "cuda"):
    """Open `device` (rocmc opens CUDA devices with exportable, caching allocations; see devices.py)."""
    from .. import devices

    return devices.get_device(device)


class CudnnProvider(DnnProvider):
    table = CUDNN
    exportable_hint = (
        "open the device with rocmc.runtime.providers.cudnn.prepare_cuda() before loading, "
        "or call iree.runtime.flags.parse_flags('--cuda_async_allocations=false') before the "
        "first cuda device is opened"
    )

    planners = {**PLANNERS, **RNN_PLANNERS}
    conv_builder = staticmethod(graph_conv)

    def table_limits(self, op, attrs):
        if op in _DNN_ABI.unavailable["cuda"]:
            return _DNN_ABI.unavailable["cuda"][op]
        if op == "lrn" and not (1 <= attrs["size"] <= 16 and attrs["k"] >= 1e-5 and attrs["beta"] >= 0.01):
            return (
                f"LRN with size={attrs['size']}, k={attrs['k']}, beta={attrs['beta']} "
                f"(cuDNN needs size in [1, 16], k >= 1e-5, beta >= 0.01)"
            )
        return None
