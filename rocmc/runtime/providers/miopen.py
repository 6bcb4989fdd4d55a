"""MIOpen's table for the shared DNN binding, and the HIP runtime's.

Written against MIOpen's C API (include/miopen/miopen.h): function names, argument order and enum
integers. Where MIOpen differs from cuDNN beyond names: filters are plain tensor descriptors,
mode 0 (miopenConvolution) is cross-correlation, the workspace query takes w before x and no
algorithm and must precede the (mandatory) search, which takes an `exhaustive` flag; workspace
arguments come last in the convolution calls; the average pooling modes are swapped; softmax,
pooling and LRN take their extra arguments in other positions; the RNN API packs gates in another
order (recurrent.py); multi-head attention exists only here, as a Find 2.0 problem. Convolutions run
through Find 2.0 as well (a convolution problem, `miopenFindSolutions` on the real inputs, then
per call only `miopenRunSolution` with the tensor arguments x, w, y), the twin of cuDNN's execution
plans in the shared planner (conv_plan.py); the bias add stays the legacy call. Every value below is stated once,
from miopen.h of MIOpen 3.3.0; tests/runtime/test_dnn_tables.py checks what holds without a second copy
(declarations parse, the shared code's roles and argument names are declared, enums that must
differ do, the perf record's offsets are the header struct's).

fused_conv2d (activation(conv + bias + residual)) runs as a fusion plan (miopenCreateFusionPlan:
convolution, bias, activation, compiled once, executed per call) when it has no residual: MIOpen's
fusion plans have no residual add. A residual, or a plan MIOpen won't compile (it refuses
configurations its fused kernels lack), takes the separate form: the Find 2.0 convolution, then the
bias, residual add (miopenOpTensor) and activation as legacy calls. Written against miopen.h of
MIOpen 3.3.0; neither form has run on an AMD GPU yet: both are checked against a recording fake
only (tests/runtime/test_fused_conv_extern.py).
"""

from __future__ import annotations

import ctypes

from ...errors import DeviceError
from .capi import P, Perf, RuntimeTable, VendorTable, _ints, packed_strides
from .conv_plan import TensorOp, conv_descriptor
from .dnn import PLANNERS, DnnProvider
from .plans import Plan, _release
from .recurrent import PLANNERS as RNN_PLANNERS

HIP = RuntimeTable(
    name="HIP",
    libraries=("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"),
    install="install ROCm (the HIP runtime, e.g. `apt install hip-runtime-amd`)",
    functions={
        "set_device": ("hipSetDevice", "device:int"),
        "stream_create": ("hipStreamCreate", "out"),
        "stream_sync": ("hipStreamSynchronize", "stream"),
        "stream_destroy": ("hipStreamDestroy", "stream"),
        "malloc": ("hipMalloc", "out size:size_t"),
        "free": ("hipFree", "ptr"),
        "memcpy": ("hipMemcpy", "dst src count:size_t kind:int"),
        "memcpy_async": ("hipMemcpyAsync", "dst src count:size_t kind:int stream"),
        "memset_async": ("hipMemsetAsync", "ptr value:int count:size_t stream"),
        "error_string": ("hipGetErrorString", "status:int"),
    },
)

# role -> (C function, argument names in C order), from miopen.h of MIOpen 3.3.0
FUNCTIONS = {
    "create_handle": ("miopenCreate", "out"),
    "destroy_handle": ("miopenDestroy", "h"),
    "set_stream": ("miopenSetStream", "h stream"),
    "error_string": ("miopenGetErrorString", "status:int"),
    "create_tensor": ("miopenCreateTensorDescriptor", "out"),
    "set_tensor": ("miopenSetTensorDescriptor", "desc dtype:int n:int dims strides"),
    "destroy_tensor": ("miopenDestroyTensorDescriptor", "desc"),
    "create_filter": ("miopenCreateTensorDescriptor", "out"),
    "set_filter": ("miopenSetTensorDescriptor", "desc dtype:int n:int dims strides"),
    "destroy_filter": ("miopenDestroyTensorDescriptor", "desc"),
    "create_conv": ("miopenCreateConvolutionDescriptor", "out"),
    "set_conv": ("miopenInitConvolutionNdDescriptor", "desc n:int pads stride_a dil_a mode:int"),
    "set_conv_groups": ("miopenSetConvolutionGroupCount", "desc groups:int"),
    "destroy_conv": ("miopenDestroyConvolutionDescriptor", "desc"),
    "conv_fwd_ws": ("miopenConvolutionForwardGetWorkSpaceSize", "h wD xD conv yD size_out"),
    "conv_fwd_find": (
        "miopenFindConvolutionForwardAlgorithm",
        "h xD x wD w conv yD y req:int n_out perf ws ws_size:size_t exhaustive:bool",
    ),
    "conv_fwd": ("miopenConvolutionForward", "h alpha xD x wD w conv algo:int beta yD y ws ws_size:size_t"),
    "conv_bwd_data_ws": ("miopenConvolutionBackwardDataGetWorkSpaceSize", "h dyD wD conv dxD size_out"),
    "conv_bwd_data_find": (
        "miopenFindConvolutionBackwardDataAlgorithm",
        "h dyD dy wD w conv dxD dx req:int n_out perf ws ws_size:size_t exhaustive:bool",
    ),
    "conv_bwd_data": (
        "miopenConvolutionBackwardData",
        "h alpha dyD dy wD w conv algo:int beta dxD dx ws ws_size:size_t",
    ),
    "add_tensor": ("miopenConvolutionForwardBias", "h alpha bD b beta yD y"),
    "create_pool": ("miopenCreatePoolingDescriptor", "out"),
    "set_pool": ("miopenSet2dPoolingDescriptor", "desc mode:int wh:int ww:int ph:int pw:int sh:int sw:int"),
    "destroy_pool": ("miopenDestroyPoolingDescriptor", "desc"),
    "pool_fwd": ("miopenPoolingForward", "h desc alpha xD x beta yD y do_backward:bool ws ws_size:size_t"),
    "softmax_fwd": ("miopenSoftmaxForward_V2", "h alpha xD x beta yD y sm_algo:int sm_mode:int"),
    "create_act": ("miopenCreateActivationDescriptor", "out"),
    "set_act": ("miopenSetActivationDescriptor", "desc mode:int act_alpha:double act_beta:double act_gamma:double"),
    "destroy_act": ("miopenDestroyActivationDescriptor", "desc"),
    "act_fwd": ("miopenActivationForward", "h desc alpha xD x beta yD y"),
    "derive_bn": ("miopenDeriveBNTensorDescriptor", "bnD xD mode:int"),
    "bn_infer": (
        "miopenBatchNormalizationForwardInference",
        "h mode:int alpha beta xD x yD y bnD scale bias mean var eps:double",
    ),
    "create_lrn": ("miopenCreateLRNDescriptor", "out"),
    "set_lrn": ("miopenSetLRNDescriptor", "desc lrn_mode:int lrn_n:uint lrn_alpha:double lrn_beta:double lrn_k:double"),
    "destroy_lrn": ("miopenDestroyLRNDescriptor", "desc"),
    "lrn_fwd": ("miopenLRNForward", "h desc alpha xD x beta yD y do_backward:bool ws"),
    # RNN (ROCm >= 6.0): sequence-data descriptors and miopenRNNForward, sizes after their buffers
    "create_dropout": ("miopenCreateDropoutDescriptor", "out"),
    "set_dropout": (
        "miopenSetDropoutDescriptor",
        "desc h drop_p:float states state_size:size_t seed:u64 use_mask:bool state_evo:bool rng_mode:int",
    ),
    "destroy_dropout": ("miopenDestroyDropoutDescriptor", "desc"),
    "create_rnn": ("miopenCreateRNNDescriptor", "out"),
    "set_rnn": (
        "miopenSetRNNDescriptor_V2",
        "desc hsize:int nlayers:int dropout in_mode:int direction:int rnn_mode:int bias_mode:int "
        "rnn_algo:int dtype:int",
    ),
    "destroy_rnn": ("miopenDestroyRNNDescriptor", "desc"),
    "create_rnn_data": ("miopenCreateSeqTensorDescriptor", "out"),
    "set_rnn_data": (
        "miopenSetRNNDataSeqTensorDescriptor",
        "desc dtype:int layout:int max_seq:int batch:int vec:int seq_lens pad_fill",
    ),
    "destroy_rnn_data": ("miopenDestroySeqTensorDescriptor", "desc"),
    "rnn_weight_size": ("miopenGetRNNParamsSize", "h desc xD size_out dtype:int"),
    "rnn_params_desc": ("miopenGetRNNParamsDescriptor", "h desc xD wD dtype:int"),
    "rnn_get_param": ("miopenGetRNNLayerParam", "h desc layer:int xD wD w lin_id:int mD src"),
    "rnn_get_bias": ("miopenGetRNNLayerBias", "h desc layer:int xD wD w lin_id:int mD src"),
    "rnn_set_param": ("miopenSetRNNLayerParam", "h desc layer:int xD wD w lin_id:int mD src"),
    "rnn_set_bias": ("miopenSetRNNLayerBias", "h desc layer:int xD wD w lin_id:int mD src"),
    "rnn_temp_sizes": ("miopenGetRNNTempSpaceSizes", "h desc xS fwd_mode:int size_out size_out2"),
    "rnn_fwd": (
        "miopenRNNForward",
        "h desc fwd_mode:int xS x hD hx hy cD cx cy yS y w w_size:size_t ws ws_size:size_t rs rs_size:size_t",
    ),
    # multi-head attention (ROCm >= 6.2), through the Find 2.0 problem/solution API
    "create_mha": ("miopenCreateMhaDescriptor", "out"),
    "set_mha": ("miopenSetMhaDescriptor", "desc mha_scale:float"),
    "create_mha_problem": ("miopenCreateMhaProblem", "out desc direction:int"),
    "set_problem_tensor": ("miopenSetProblemTensorDescriptor", "problem tensor_id:int desc"),
    "find_solutions": ("miopenFindSolutions", "h problem options solutions n_out max_solutions:size_t"),
    "solution_ws": ("miopenGetSolutionWorkspaceSize", "solution size_out"),
    "run_solution": ("miopenRunSolution", "h solution n_args:size_t args ws ws_size:size_t"),
    "destroy_problem": ("miopenDestroyProblem", "desc"),
    "destroy_solution": ("miopenDestroySolution", "desc"),
    # convolutions through Find 2.0 (ROCm >= 5.5)
    "create_conv_problem": ("miopenCreateConvProblem", "out desc direction:int"),
    "create_find_options": ("miopenCreateFindOptions", "out"),
    "set_find_tensor": ("miopenSetFindOptionPreallocatedTensor", "options tensor_id:int ptr"),
    "destroy_find_options": ("miopenDestroyFindOptions", "desc"),
    # C = op(alpha1 * A, alpha2 * B) + beta * C: fused_conv2d's residual add when it runs separately
    "op_tensor": ("miopenOpTensor", "h tensor_op:int alpha1 aD a alpha2 bD b beta cD c"),
    # fusion plans (conv + bias + activation, fused_conv2d without a residual); op descriptors belong
    # to their plan, destroyed with it
    "create_fusion_plan": ("miopenCreateFusionPlan", "out fusion_direction:int xD"),
    "create_fusion_conv": ("miopenCreateOpConvForward", "plan out conv wD"),
    "create_fusion_bias": ("miopenCreateOpBiasForward", "plan out bD"),
    "create_fusion_act": ("miopenCreateOpActivationForward", "plan out mode:int"),
    "compile_fusion_plan": ("miopenCompileFusionPlan", "h plan"),
    "create_op_args": ("miopenCreateOperatorArgs", "out"),
    "set_op_args_conv": ("miopenSetOpArgsConvForward", "args op alpha beta w"),
    "set_op_args_bias": ("miopenSetOpArgsBiasForward", "args op alpha beta b"),
    "set_op_args_act": (
        "miopenSetOpArgsActivForward",
        "args op alpha beta act_alpha:double act_beta:double act_gamma:double",
    ),
    "execute_fusion_plan": ("miopenExecuteFusionPlan", "h plan xD x yD y args"),
    "destroy_fusion_plan": ("miopenDestroyFusionPlan", "desc"),
    "destroy_op_args": ("miopenDestroyOperatorArgs", "desc"),
}

# Enum integers from miopen.h of MIOpen 3.3.0 (miopenDataType_t, miopenConvolutionMode_t, miopenPoolingMode_t,
# miopenSoftmaxAlgorithm_t / Mode_t, miopenBatchNormMode_t, miopenLRNMode_t, the RNN enums below)
MIOPEN = VendorTable(
    name="MIOpen",
    libraries=("libMIOpen.so.1", "libMIOpen.so"),
    install="install MIOpen (ROCm's `miopen-hip` package, usually /opt/rocm/lib)",
    functions=FUNCTIONS,
    dtypes={"f32": 1, "f16": 0, "bf16": 5},
    enums={
        "cross_correlation": 0,
        "pool_max": 0,
        "pool_avg_exclude": 1,
        "pool_avg_include": 2,
        "softmax_accurate": 1,
        "softmax_log": 2,
        "softmax_channel": 1,
        "bn_spatial": 1,
        "lrn_cross_channel": 1,
        # miopenRNNMode_t, miopenRNNInputMode_t, miopenRNNDirectionMode_t, miopenRNNBiasMode_t,
        # miopenRNNAlgo_t, miopenRNNFWDMode_t (Training=0, Inference=1), miopenRNNBaseLayout_t
        "rnn_lstm": 2,
        "rnn_gru": 3,
        "rnn_linear_input": 0,
        "rnn_unidirectional": 0,
        "rnn_no_bias": 0,
        "rnn_bias": 1,
        "rnn_algo_standard": 0,
        "rnn_training": 0,
        "rnn_inference": 1,
        "rnn_seq_major_packed": 1,
        # miopenProblemDirection_t (a transposed convolution is the backward-data problem)
        "problem_forward": 0,
        "problem_backward_data": 1,
        "int64": 9,
        # miopenTensorOp_t, miopenFusionDirection_t
        "tensor_op_add": 0,
        "vertical_fusion": 0,
    },
    # op -> (miopenActivationMode_t, attribute given as activAlpha). TANH computes beta*tanh(alpha*x),
    # so it gets alpha = beta = 1 like every mode without a parameter.
    activations={
        "sigmoid": (1, None),
        "tanh": (2, None),
        "relu": (3, None),
        "clipped_relu": (7, "ceiling"),
        "leaky_relu": (8, "negative_slope"),
        "elu": (9, "alpha"),
    },
    # miopenConvAlgoPerf_t: {union {fwd_algo, bwd_weights_algo, bwd_data_algo} (enums), float time, size_t memory}
    perf=Perf(size=16, algo=0, time=4, memory=8),
    search_workspace=None,
    runtime=HIP,
    dlpack_device=10,
    # paramID / biasID order of miopenSetRNNLayerParam / Bias: input, forget, output, new memory
    # (LSTM); update, reset, new memory (GRU). Ids 0..g-1 act on x, g..2g-1 on h.
    gate_order={"lstm": "ifog", "gru": "zrn"},
    rnn_weights="library_copies",
    # miopenTensorArgumentId_t: miopenTensorConvolutionX / W / Y
    conv_ids={"x": 1, "w": 2, "y": 3},
    conv_api="Find 2.0 (miopenRunSolution)",
)

# miopenTensorArgumentId_t of the MHA forward problem's tensors (miopen.h of MIOpen 3.3.0).
MHA_TENSORS = {
    "k": 4,
    "q": 5,
    "v": 6,
    "descale_k": 7,
    "descale_q": 8,
    "descale_v": 9,
    "descale_s": 10,
    "scale_s": 11,
    "scale_o": 12,
    "dropout_probability": 13,
    "dropout_seed": 14,
    "dropout_offset": 15,
    "o": 16,
    "amax_o": 17,
    "amax_s": 18,
    "m": 19,
    "z_inv": 20,
}


class TensorArgument(ctypes.Structure):
    """miopenTensorArgument_t: 24 bytes, {id@0, miopenTensorDescriptor_t* descriptor@8, buffer@16};
    a NULL descriptor means the one the problem was given."""

    _fields_ = [("id", ctypes.c_int), ("descriptor", ctypes.c_void_p), ("buffer", ctypes.c_void_p)]


def _device_values(p: DnnProvider, ctype, values, keep) -> int:
    host = (ctype * len(values))(*values)
    buf = p._malloc(ctypes.sizeof(host))
    keep.append(("free", buf))
    p.rt.call("memcpy", dst=buf, src=ctypes.addressof(host), count=ctypes.sizeof(host), kind=1)
    return buf


def _raw_tensor(p: DnnProvider, dims, dtype_enum: int, keep) -> int:
    d = p._out(P, "create_tensor")
    keep.append(("destroy_tensor", d))
    p.api.call(
        "set_tensor", desc=d, dtype=dtype_enum, n=len(dims), dims=_ints(dims), strides=_ints(packed_strides(dims))
    )
    return d


def mha_plan(p: DnnProvider, op, dtype, shapes, attrs, ptrs) -> Plan:
    """softmax(q k^T * scale) v as MIOpen's MHA forward problem. The fp8 scaling tensors are ones,
    dropout is off; the row statistics (m, z_inv) and the amax outputs go to scratch buffers."""
    t, api, keep = p.table, p.api, []
    (b, h, s, _), (_, _, s_kv, _), (_, _, _, dv) = shapes[:3]
    out = (b, h, s, dv)
    mha = p._out(P, "create_mha")
    keep.append(mha)  # kept for the plan's lifetime, like the problem built on it
    api.call("set_mha", desc=mha, mha_scale=attrs["scale"])
    problem = p._out(P, "create_mha_problem", desc=mha, direction=t.enums["problem_forward"])
    keep.append(("destroy_problem", problem))
    f32, main, unit = t.dtypes["f32"], t.dtypes[dtype], (1, 1, 1, 1)
    dims = {
        "q": (shapes[0], main),
        "k": (shapes[1], main),
        "v": (shapes[2], main),
        "o": (out, main),
        "m": ((b, h, s, 1), f32),
        "z_inv": ((b, h, s, 1), f32),
        "dropout_seed": (unit, t.enums["int64"]),
        "dropout_offset": (unit, t.enums["int64"]),
    }
    for name, tid in MHA_TENSORS.items():
        shape, dt = dims.get(name, (unit, f32))
        api.call("set_problem_tensor", problem=problem, tensor_id=tid, desc=_raw_tensor(p, shape, dt, keep))
    found = (P * 4)()
    count = ctypes.c_size_t()
    api.call(
        "find_solutions",
        h=p.handle,
        problem=problem,
        options=None,
        solutions=found,
        n_out=ctypes.byref(count),
        max_solutions=4,
    )
    if count.value == 0:
        raise DeviceError(f"MIOpen: no MHA forward solution for q {shapes[0]}, k {shapes[1]}, {dtype}")
    keep += [("destroy_solution", found[i]) for i in range(count.value)]
    solution = found[0]
    ws_size = ctypes.c_size_t()
    api.call("solution_ws", solution=solution, size_out=ctypes.byref(ws_size))
    ones, zero = _device_values(p, ctypes.c_float, [1.0], keep), _device_values(p, ctypes.c_float, [0.0], keep)
    zero64 = _device_values(p, ctypes.c_int64, [0, 0], keep)
    stats = p._malloc(2 * b * h * s * 4 + 8)
    keep.append(("free", stats))
    fixed = {
        "descale_k": ones,
        "descale_q": ones,
        "descale_v": ones,
        "descale_s": ones,
        "scale_s": ones,
        "scale_o": ones,
        "dropout_probability": zero,
        "dropout_seed": zero64,
        "dropout_offset": zero64 + 8,
        "amax_o": stats,
        "amax_s": stats + 4,
        "m": stats + 8,
        "z_inv": stats + 8 + b * h * s * 4,
    }
    args = (TensorArgument * len(MHA_TENSORS))(
        *[TensorArgument(tid, None, fixed.get(n)) for n, tid in MHA_TENSORS.items()]
    )
    slot = {n: i for i, n in enumerate(MHA_TENSORS)}
    keep.append(args)

    def run(ptrs, y):
        for name, ptr in zip(("q", "k", "v", "o"), (ptrs[0], ptrs[1], ptrs[2], y)):
            args[slot[name]].buffer = ptr
        api.call(
            "run_solution",
            h=p.handle,
            solution=solution,
            n_args=len(MHA_TENSORS),
            args=args,
            ws=p.workspace(ws_size.value) if ws_size.value else None,
            ws_size=ws_size.value,
        )

    return Plan(out, run, keep, {"solutions": count.value, "workspace": ws_size.value, "kv_length": s_kv})


def find2_conv(p: DnnProvider, prob, bound: dict, keep: list):
    """The convolution as a Find 2.0 problem; the search (`miopenFindSolutions`, fastest first)
    runs on the real inputs and a scratch result handed over as preallocated tensors. None when
    MIOpen finds no solution."""
    t, api = p.table, p.api
    ids = t.conv_ids
    descs = {
        "x": p.tensor(prob.x, prob.dtype, keep),
        "w": p.tensor(prob.w, prob.dtype, keep, filter=True),
        "y": p.tensor(prob.y, prob.dtype, keep),
    }
    conv = conv_descriptor(p, prob, keep)
    problem = p._out(P, "create_conv_problem", desc=conv, direction=t.enums[f"problem_{prob.direction}"])
    keep.append(("destroy_problem", problem))
    options = p._out(P, "create_find_options")
    keep.append(("destroy_find_options", options))
    for role in ("x", "w", "y"):
        api.call("set_problem_tensor", problem=problem, tensor_id=ids[role], desc=descs[role])
        api.call("set_find_tensor", options=options, tensor_id=ids[role], ptr=bound[role])
    found, count = (P * 4)(), ctypes.c_size_t()
    api.call(
        "find_solutions",
        h=p.handle,
        problem=problem,
        options=options,
        solutions=found,
        n_out=ctypes.byref(count),
        max_solutions=4,
    )
    if count.value == 0:
        return None
    keep += [("destroy_solution", found[i]) for i in range(count.value)]
    solution = found[0]
    size = ctypes.c_size_t()
    api.call("solution_ws", solution=solution, size_out=ctypes.byref(size))
    need = size.value
    roles = ("x", "w", "y")
    args = (TensorArgument * 3)(*[TensorArgument(ids[r], None, None) for r in roles])
    keep.append(args)
    run_solution, handle = api.bound("run_solution"), p.handle

    def run(ptrs, ws):
        for arg, ptr in zip(args, ptrs):
            arg.buffer = ptr
        run_solution(handle, solution, 3, args, ws, need)

    return TensorOp(roles, run, workspace=need, info={"solutions": count.value, "workspace": need})


def fusion_conv(p: DnnProvider, prob, bound: dict, keep: list):
    """fused_conv2d without a residual as a fusion plan: convolution, bias (if any), activation,
    compiled once; a call sets the weight and bias pointers in the operator arguments and executes
    the plan on x and y. None when MIOpen won't compile the plan for this problem (what it fuses
    depends on the shapes, the dtype and the kernels it has). Not yet run on an AMD GPU."""
    t, api, local = p.table, p.api, []
    xD, yD = p.tensor(prob.x, prob.dtype, local), p.tensor(prob.y, prob.dtype, local)
    wD = p.tensor(prob.w, prob.dtype, local, filter=True)
    conv = conv_descriptor(p, prob, local)
    plan = p._out(P, "create_fusion_plan", fusion_direction=t.enums["vertical_fusion"], xD=xD)
    local.append(("destroy_fusion_plan", plan))
    conv_op = p._out(P, "create_fusion_conv", plan=plan, conv=conv, wD=wD)
    bias_op = (
        p._out(P, "create_fusion_bias", plan=plan, bD=p.tensor((1, prob.y[1], 1, 1), prob.dtype, local))
        if prob.bias
        else None
    )
    act_op = p._out(P, "create_fusion_act", plan=plan, mode=t.activations[prob.activation][0])
    try:
        api.call("compile_fusion_plan", h=p.handle, plan=plan)
    except DeviceError:
        _release(p, local)
        return None
    keep += local
    args = p._out(P, "create_op_args")
    keep.append(("destroy_op_args", args))
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    keep += [one, zero]
    alpha, beta = ctypes.byref(one), ctypes.byref(zero)
    api.call(
        "set_op_args_act", args=args, op=act_op, alpha=alpha, beta=beta, act_alpha=1.0, act_beta=1.0, act_gamma=0.0
    )
    set_conv, set_bias = api.bound("set_op_args_conv"), api.bound("set_op_args_bias")
    execute, handle = api.bound("execute_fusion_plan"), p.handle
    roles = ("x", "w", "b", "y") if prob.bias else ("x", "w", "y")

    def run(ptrs, ws):
        x, w, *b, y = ptrs
        set_conv(args, conv_op, alpha, beta, w)
        if b:
            set_bias(args, bias_op, alpha, beta, b[0])
        execute(handle, plan, xD, x, yD, y, args)

    return TensorOp(roles, run, fused_bias=prob.bias, fused_epilogue=True, info={"fusion_plan": True})


def miopen_conv(p: DnnProvider, prob, bound: dict, keep: list):
    """fused_conv2d as a fusion plan where MIOpen can fuse it (no residual, an activation to fuse),
    every other convolution, and a fused one MIOpen won't compile, through Find 2.0."""
    if prob.activation != "none" and not prob.residual:
        fused = fusion_conv(p, prob, bound, keep)
        if fused is not None:
            return fused
    return find2_conv(p, prob, bound, keep)


class MiopenProvider(DnnProvider):
    table = MIOPEN
    planners = {**PLANNERS, **RNN_PLANNERS, "sdpa": mha_plan}
    conv_builder = staticmethod(miopen_conv)
    exportable_hint = (
        "call iree.runtime.flags.parse_flags('--hip_async_allocations=false') before the first hip device is opened"
    )
