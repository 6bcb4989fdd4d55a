"""The extern-call ABI shared by the compiled module and every provider (reference, MIOpen, cuDNN).

A library-backed node becomes a call `miopen.<op>(tensors..., scalars...) -> tensor`. Tensors come
first and every scalar is an i64 (a float attribute travels as the bit pattern of its f64): IREE's
Python module binding misreads an i32/f32 argument that precedes a ref, and rejects f64. An absent
optional tensor (a bias, a batch-norm scale) is passed as an empty tensor. Each op has a fixed rank
per tensor, so one declaration serves every shape: softmax, batch norm and LRN see their input
reshaped to (outer, axis, inner) / (N, C, spatial), activations see it flattened. The result's
shape is computed by the provider from the operands and attributes.

Every import returns one tensor. The recurrent ops, which have several results, return them packed
along the time dim: (seq + states, batch, hidden) holding y's seq rows, then h_n, then c_n (LSTM);
the module slices them apart. Recurrent weights arrive in torch's layout and gate order (LSTM i, f,
g, o; GRU r, z, n): each provider repacks them into its library's order (`gate_blocks`).

This module is plain data so that both the lowering and the runtime can read it.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

NAMESPACE = "miopen"
DTYPES = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class Signature:
    op: str
    tensors: tuple           # (name, rank) of each tensor operand, in call order
    scalars: tuple = ()      # names of the i64 scalars, in call order
    floats: tuple = ()       # which scalars carry f64 bit patterns

    @property
    def cconv(self) -> str:
        """IREE VM calling convention string of the import, e.g. '0rrrIIIIIII_r'."""
        return "0" + "r" * len(self.tensors) + "I" * len(self.scalars) + "_r"

    def decode(self, values) -> dict:
        """i64 scalars as received by a provider -> {name: int | float}."""
        return {n: (from_bits(v) if n in self.floats else int(v)) for n, v in zip(self.scalars, values)}


def _conv(n, transpose=False):
    axes = ("h", "w") if n == 2 else ("",)
    names = lambda p: tuple(f"{p}_{a}" if a else p for a in axes)   # noqa: E731
    scal = names("stride") + names("pad") + (names("output_padding") if transpose else ()) + names("dilation")
    return (("x", n + 2), ("w", n + 2), ("b", 1)), scal + ("groups",)


# x (seq, batch, input), w_ih (G*hidden, input), w_hh (G*hidden, hidden), b_ih, b_hh (G*hidden,),
# h0 (1, batch, hidden); absent biases and states are empty tensors (zeros).
_RNN = (("x", 3), ("w_ih", 2), ("w_hh", 2), ("b_ih", 1), ("b_hh", 1), ("h0", 3))
_POOL = ("kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w")

SIGNATURES = {s.op: s for s in [
    Signature("conv1d", *_conv(1)),
    Signature("conv2d", *_conv(2)),
    Signature("conv_transpose1d", *_conv(1, True)),
    Signature("conv_transpose2d", *_conv(2, True)),
    Signature("max_pool2d", (("x", 4),), _POOL),
    Signature("avg_pool2d", (("x", 4),), _POOL + ("count_include_pad",)),
    Signature("softmax", (("x", 3),)),              # x as (outer, axis, inner)
    Signature("log_softmax", (("x", 3),)),
    Signature("relu", (("x", 1),)),
    Signature("sigmoid", (("x", 1),)),
    Signature("tanh", (("x", 1),)),
    Signature("elu", (("x", 1),), ("alpha",), ("alpha",)),
    Signature("leaky_relu", (("x", 1),), ("negative_slope",), ("negative_slope",)),
    Signature("clipped_relu", (("x", 1),), ("ceiling",), ("ceiling",)),
    Signature("batch_norm", (("x", 3), ("mean", 1), ("var", 1), ("weight", 1), ("bias", 1)), ("eps",), ("eps",)),
    Signature("lrn", (("x", 3),), ("size", "alpha", "beta", "k"), ("alpha", "beta", "k")),
    Signature("lstm", _RNN + (("c0", 3),)),
    Signature("gru", _RNN),
    Signature("sdpa", (("q", 4), ("k", 4), ("v", 4)), ("scale",), ("scale",)),
]}

# Packed gate order of torch's recurrent weights (rows of w_ih / w_hh, entries of the biases).
TORCH_GATES = {"lstm": "ifgo", "gru": "rzn"}
# Result rows after y: the final states.
RNN_STATES = {"lstm": 2, "gru": 1}
# Ops MIOpen serves that cuDNN's legacy API can't: compiled for cuda they stay generated, and a
# module that imports them anyway is refused at load on cuda devices.
NO_CUDNN_CALL = {"sdpa": "cuDNN has no legacy multi-head attention (its fused attention is in the graph API only)"}


def import_name(op: str, dtype: str) -> str:
    """Function name inside the namespace: `conv2d` for f32, `conv2d.f16` for other storage types
    (one declaration per element type, since a declaration has one tensor type)."""
    return op if dtype == "f32" else f"{op}.{dtype}"


def to_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def from_bits(v: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(v)))[0]


def out_dim(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def transposed_dim(size: int, kernel: int, stride: int, pad: int, output_padding: int, dilation: int) -> int:
    return (size - 1) * stride - 2 * pad + dilation * (kernel - 1) + output_padding + 1


def gate_blocks(op: str, order: str) -> list:
    """For each gate of a library's packed `order` (e.g. MIOpen's LSTM 'ifog'), the index of that
    gate's block in torch's packing: weights repack as `blocks[gate_blocks(op, order)[j]]`."""
    torch = TORCH_GATES[op]
    if sorted(order) != sorted(torch):
        raise ValueError(f"{op}: gate order {order!r} is not a permutation of {torch!r}")
    return [torch.index(g) for g in order]
