"""LSTM/GRU inference through the libraries' RNN APIs, one planner for both vendors: MIOpen's
(ROCm >= 6.0: miopenSetRNNDescriptor_V2, sequence-data descriptors, miopenRNNForward) and cuDNN's v8
API (cudnnSetRNNDescriptor_v8, cudnnSetRNNDataDescriptor, cudnnRNNForward).

What differs beyond names and argument order (which the vendor tables hold):
- fwdMode: MIOpen Training=0 / Inference=1, cuDNN Inference=0 / Training=1 (table enums);
- buffer sizes come after their pointers in MIOpen's forward call, before them in cuDNN's;
- cuDNN's forward takes the sequence lengths in device memory as well (`dev_seq_lens`);
- gate order: torch packs LSTM i, f, g, o and GRU r, z, n; cuDNN's linear-layer ids follow that
  order, MIOpen's parameter ids are LSTM i, f, o, g and GRU z, r, n: every weight and bias block is
  copied to the slot of its gate (`abi.gate_blocks` with the table's `gate_order`);
- how blocks enter the weight space (`rnn_weights`): MIOpen copies each one itself
  (miopenSetRNNLayerParam / Bias, after a miopenGetRNNLayerParam / Bias query with a NULL buffer
  that fills the block's descriptor); cuDNN returns each block's address inside the weight space
  (cudnnGetRNNWeightParams) and the copy is ours, device to device on the library's stream.
Weights are operands, not constants, so they are copied in on every call. The result is the ABI's
packed (seq + states, batch, hidden) tensor: the library writes y, then h_n (and c_n) behind it.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from ...externs import RNN_STATES, gate_blocks
from .capi import P, declared
from .dnn import DnnProvider
from .plans import Plan, itemsize

MEMCPY_DEVICE_TO_DEVICE = 3  # hipMemcpyDeviceToDevice == cudaMemcpyDeviceToDevice
MEMCPY_HOST_TO_DEVICE = 1


@dataclass(frozen=True)
class Slot:
    """One gate block: the library's id, the ABI operand it comes from, its byte offset there."""

    lib_id: int
    operand: int
    offset: int
    nbytes: int
    bias: bool


def slots(op: str, order: str, inp: int, hidden: int, itemsize: int, with_bias: bool) -> list:
    """Every weight (and bias) block in the library's id order: the input GEMM's gates (ids 0..g-1)
    from w_ih / b_ih, then the recurrent GEMM's (g..2g-1) from w_hh / b_hh."""
    g, out = len(order), []
    for j, block in enumerate(gate_blocks(op, order)):
        for half, (w_operand, cols) in enumerate(((1, inp), (2, hidden))):
            lib_id = half * g + j
            out.append(Slot(lib_id, w_operand, block * hidden * cols * itemsize, hidden * cols * itemsize, False))
            if with_bias:
                out.append(Slot(lib_id, 3 + half, block * hidden * itemsize, hidden * itemsize, True))
    return out


def _zeros(p: DnnProvider, nbytes: int, keep: list) -> int:
    buf = p._malloc(nbytes)
    keep.append(("free", buf))
    p.rt.call("memset_async", ptr=buf, value=0, count=nbytes, stream=p.stream)
    return buf


def _source(ptrs, slot: Slot, zeros: int) -> int:
    """Device address of a block; an absent bias operand reads zeros."""
    base = ptrs[slot.operand]
    return (base if base is not None else zeros) + slot.offset


def _library_copies(p: DnnProvider, ctx: dict, blocks: list, keep: list):
    """MIOpen: the library copies each block into its slot of the weight space."""
    api, h = p.api, p.handle
    common = dict(h=h, desc=ctx["rnn"], layer=0, xD=ctx["xD"], w=ctx["wspace"])
    wD = p._out(P, "create_tensor")
    keep.append(("destroy_tensor", wD))
    api.call("rnn_params_desc", h=h, desc=ctx["rnn"], xD=ctx["xD"], wD=wD, dtype=ctx["dtype"])
    descs = []
    for s in blocks:
        d = p._out(P, "create_tensor")
        keep.append(("destroy_tensor", d))
        api.call("rnn_get_bias" if s.bias else "rnn_get_param", wD=wD, lin_id=s.lib_id, mD=d, src=None, **common)
        descs.append(d)
    zeros = ctx["zeros"]

    def write(ptrs):
        for s, d in zip(blocks, descs):
            api.call(
                "rnn_set_bias" if s.bias else "rnn_set_param",
                wD=wD,
                lin_id=s.lib_id,
                mD=d,
                src=_source(ptrs, s, zeros),
                **common,
            )

    return write


def _address_copies(p: DnnProvider, ctx: dict, blocks: list, keep: list):
    """cuDNN: the library tells where each block lives in the weight space; we copy it there."""
    api = p.api
    dests = []
    for s in blocks:
        mD, bD = p._out(P, "create_tensor"), p._out(P, "create_tensor")
        keep += [("destroy_tensor", mD), ("destroy_tensor", bD)]
        m_addr, b_addr = P(), P()
        api.call(
            "rnn_weight_params",
            h=p.handle,
            desc=ctx["rnn"],
            layer=0,
            w_size=ctx["w_size"],
            w=ctx["wspace"],
            lin_id=s.lib_id,
            mD=mD,
            m_addr=ctypes.byref(m_addr),
            bD=bD,
            b_addr=ctypes.byref(b_addr),
        )
        dests.append((b_addr if s.bias else m_addr).value)
    zeros = ctx["zeros"]

    def write(ptrs):
        for s, dst in zip(blocks, dests):
            p.rt.call(
                "memcpy_async",
                dst=dst,
                src=_source(ptrs, s, zeros),
                count=s.nbytes,
                kind=MEMCPY_DEVICE_TO_DEVICE,
                stream=p.stream,
            )

    return write


WEIGHT_WRITERS = {"library_copies": _library_copies, "address_copies": _address_copies}


def _dropout(p: DnnProvider, keep: list) -> int:
    """A no-dropout descriptor (probability 0, no RNG state): the RNN setters require one."""
    d = p._out(P, "create_dropout")
    keep.append(("destroy_dropout", d))
    p.api.call(
        "set_dropout",
        desc=d,
        h=p.handle,
        drop_p=0.0,
        states=None,
        state_size=0,
        seed=0,
        use_mask=False,
        state_evo=False,
        rng_mode=0,
    )
    return d


def rnn_plan(p: DnnProvider, op, dtype, shapes, attrs, ptrs) -> Plan:
    t, api, keep, e = p.table, p.api, [], p.table.enums
    seq, batch, inp = shapes[0]
    hidden = shapes[2][1]
    item = itemsize(dtype)
    with_bias = ptrs[3] is not None or ptrs[4] is not None
    rnn = p._out(P, "create_rnn")
    keep.append(("destroy_rnn", rnn))
    api.call(
        "set_rnn",
        desc=rnn,
        hsize=hidden,
        nlayers=1,
        dropout=_dropout(p, keep),
        in_mode=e["rnn_linear_input"],
        direction=e["rnn_unidirectional"],
        rnn_mode=e[f"rnn_{op}"],
        bias_mode=e["rnn_bias" if with_bias else "rnn_no_bias"],
        rnn_algo=e["rnn_algo_standard"],
        dtype=t.dtypes[dtype],
        math_prec=t.dtypes["f32"],
        math=e.get("fma_math" if dtype == "f32" else "tensor_op_math", 0),
        input_size=inp,
        proj_size=hidden,
        aux_flags=0,
    )
    # Every sequence has the full length, so the packed sequence-major layout is the dense
    # (seq, batch, vec) tensor the ABI passes.
    lens = (ctypes.c_int * batch)(*([seq] * batch))
    dev_lens = p._malloc(4 * batch)
    keep += [lens, ("free", dev_lens)]
    p.rt.call("memcpy", dst=dev_lens, src=ctypes.addressof(lens), count=4 * batch, kind=MEMCPY_HOST_TO_DEVICE)

    def seq_data(vec):
        d = p._out(P, "create_rnn_data")
        keep.append(("destroy_rnn_data", d))
        api.call(
            "set_rnn_data",
            desc=d,
            dtype=t.dtypes[dtype],
            layout=e["rnn_seq_major_packed"],
            max_seq=seq,
            batch=batch,
            vec=vec,
            seq_lens=lens,
            pad_fill=None,
        )
        return d

    xS, yS = seq_data(inp), seq_data(hidden)
    hD = p.tensor((1, batch, hidden), dtype, keep)
    # One step's input (batch, input): only MIOpen's weight queries take it (cuDNN's legacy tensor
    # descriptors want 3 dims or more).
    xD = (
        p.tensor((batch, inp), dtype, keep)
        if "xD" in [n for n, _ in declared(t.functions["rnn_weight_size"][1])]
        else None
    )
    w_size, ws_size, rs_size = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
    api.call("rnn_weight_size", h=p.handle, desc=rnn, xD=xD, size_out=ctypes.byref(w_size), dtype=t.dtypes[dtype])
    api.call(
        "rnn_temp_sizes",
        h=p.handle,
        desc=rnn,
        xS=xS,
        fwd_mode=e["rnn_inference"],
        size_out=ctypes.byref(ws_size),
        size_out2=ctypes.byref(rs_size),
    )
    wspace = p._malloc(w_size.value)
    keep.append(("free", wspace))
    reserve = p._malloc(rs_size.value) if rs_size.value else None
    if reserve:
        keep.append(("free", reserve))
    blocks = slots(op, t.gate_order[op], inp, hidden, item, with_bias)
    missing_bias = with_bias and (ptrs[3] is None or ptrs[4] is None)
    ctx = {
        "rnn": rnn,
        "xD": xD,
        "wspace": wspace,
        "w_size": w_size.value,
        "dtype": t.dtypes[dtype],
        "zeros": _zeros(p, len(t.gate_order[op]) * hidden * item, keep) if missing_bias else 0,
    }
    write = WEIGHT_WRITERS[t.rnn_weights](p, ctx, blocks, keep)
    state_bytes = batch * hidden * item

    def run(ptrs, y):
        write(ptrs)
        hy = y + seq * state_bytes
        ws = p.workspace(ws_size.value) if ws_size.value else None
        api.call(
            "rnn_fwd",
            h=p.handle,
            desc=rnn,
            fwd_mode=e["rnn_inference"],
            dev_seq_lens=dev_lens,
            xS=xS,
            x=ptrs[0],
            yS=yS,
            y=y,
            hD=hD,
            hx=ptrs[5],
            hy=hy,
            cD=hD,
            cx=ptrs[6] if op == "lstm" else None,
            cy=hy + state_bytes if op == "lstm" else None,
            w_size=w_size.value,
            w=wspace,
            ws_size=ws_size.value,
            ws=ws,
            rs_size=rs_size.value,
            rs=reserve,
        )

    return Plan(
        (seq + RNN_STATES[op], batch, hidden), run, keep, {"weight_bytes": w_size.value, "workspace": ws_size.value}
    )


PLANNERS = {"lstm": rnn_plan, "gru": rnn_plan}
