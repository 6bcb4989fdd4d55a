"""The extern-call ABI: the library roles a compiled module may call, and each call's signature.

A library-backed node becomes a call `<library>.<op>(tensors..., scalars...) -> tensor`, e.g.
`dnn.conv2d.f16` or `blas.matmul`. A library is a role, not a vendor: its name is the registry key of
the lowering (`impl="blas"`), the import namespace in the module and the key of its provider at load
time; each role is served per device kind by a provider (`Library.serves`): `dnn` by MIOpen on hip
devices, cuDNN on cuda devices and the float64 reference on the CPU; `blas` by hipBLASLt, cuBLASLt
and the reference. (Modules of artifact format 2 and earlier import the old namespaces `miopen` and
`hipblaslt`: rocmc.aliases.)

Tensors come first and every scalar is an i64 (a float attribute travels as the bit pattern of its
f64): IREE's Python module binding misreads an i32/f32 argument that precedes a ref, and rejects
f64. An absent optional tensor (a bias, a batch-norm scale) is passed as an empty tensor. Each op
has a fixed rank per tensor, so one declaration serves every shape: softmax, batch norm and LRN see
their input reshaped to (outer, axis, inner) / (N, C, spatial), activations see it flattened, a GEMM
sees (batch, rows, cols) operands. The result's shape is computed by the provider.

Every import returns one tensor. The recurrent ops, which have several results, return them packed
along the time dim: (seq + states, batch, hidden) holding y's seq rows, then h_n, then c_n (LSTM);
the module slices them apart. Recurrent weights arrive in torch's layout and gate order (LSTM i, f,
g, o; GRU r, z, n): each provider repacks them into its library's order (`gate_blocks`).

This module is plain data read by the lowering (what to emit) and the runtime (what to serve).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Signature:
    op: str
    tensors: tuple  # (name, rank) of each tensor operand, in call order
    scalars: tuple = ()  # names of the i64 scalars, in call order
    floats: tuple = ()  # which scalars carry f64 bit patterns

    @property
    def cconv(self) -> str:
        """IREE VM calling convention string of the import, e.g. '0rrrIIIIIII_r'."""
        return "0" + "r" * len(self.tensors) + "I" * len(self.scalars) + "_r"

    def decode(self, values) -> dict:
        """i64 scalars as received by a provider -> {name: int | float}."""
        return {n: (from_bits(v) if n in self.floats else int(v)) for n, v in zip(self.scalars, values)}


@dataclass(frozen=True)
class Library:
    name: str  # the role: registry key, import namespace, provider key
    serves: dict  # target kind -> the provider that serves it there ("MIOpen", "cuDNN", ...)
    dtypes: tuple  # storage types every op takes (an op may take fewer: op_dtypes)
    signatures: dict  # op -> Signature
    op_dtypes: dict = field(default_factory=dict)
    unavailable: dict = field(default_factory=dict)  # target kind -> {op: why that kind's library lacks it}


def _conv(n, transpose=False):
    axes = ("h", "w") if n == 2 else ("",)
    names = lambda p: tuple(f"{p}_{a}" if a else p for a in axes)  # noqa: E731
    scal = names("stride") + names("pad") + (names("output_padding") if transpose else ()) + names("dilation")
    return (("x", n + 2), ("w", n + 2), ("b", 1)), scal + ("groups",)


# x (seq, batch, input), w_ih (G*hidden, input), w_hh (G*hidden, hidden), b_ih, b_hh (G*hidden,),
# h0 (1, batch, hidden); absent biases and states are empty tensors (zeros).
_RNN = (("x", 3), ("w_ih", 2), ("w_hh", 2), ("b_ih", 1), ("b_hh", 1), ("h0", 3))
_POOL = ("kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w")

DNN = Library(
    "dnn",
    {"rocm": "MIOpen", "cuda": "cuDNN", "cpu": "the float64 reference"},
    ("f32", "f16", "bf16"),
    {
        s.op: s
        for s in [
            Signature("conv1d", *_conv(1)),
            Signature("conv2d", *_conv(2)),
            # activation(conv2d(x, w, b) + residual): an absent residual is an empty tensor; activation
            # is an index into CONV_ACTIVATIONS
            Signature("fused_conv2d", _conv(2)[0] + (("residual", 4),), _conv(2)[1] + ("activation",)),
            Signature("conv_transpose1d", *_conv(1, True)),
            Signature("conv_transpose2d", *_conv(2, True)),
            Signature("max_pool2d", (("x", 4),), _POOL),
            Signature("avg_pool2d", (("x", 4),), _POOL + ("count_include_pad",)),
            Signature("softmax", (("x", 3),)),  # x as (outer, axis, inner)
            Signature("log_softmax", (("x", 3),)),
            Signature("relu", (("x", 1),)),
            Signature("sigmoid", (("x", 1),)),
            Signature("tanh", (("x", 1),)),
            Signature("elu", (("x", 1),), ("alpha",), ("alpha",)),
            Signature("leaky_relu", (("x", 1),), ("negative_slope",), ("negative_slope",)),
            Signature("clipped_relu", (("x", 1),), ("ceiling",), ("ceiling",)),
            Signature(
                "batch_norm", (("x", 3), ("mean", 1), ("var", 1), ("weight", 1), ("bias", 1)), ("eps",), ("eps",)
            ),
            Signature("lrn", (("x", 3),), ("size", "alpha", "beta", "k"), ("alpha", "beta", "k")),
            Signature("lstm", _RNN + (("c0", 3),)),
            Signature("gru", _RNN),
            Signature("sdpa", (("q", 4), ("k", 4), ("v", 4)), ("scale",), ("scale",)),
        ]
    },
    # MIOpen's batch-norm, LRN and RNN kernels have no bf16 variant.
    op_dtypes={"batch_norm": ("f32", "f16"), "lrn": ("f32", "f16"), "lstm": ("f32", "f16"), "gru": ("f32", "f16")},
    # Ops MIOpen serves that cuDNN's legacy API can't: compiled for cuda they stay generated, and a
    # module that imports them anyway is refused at load on cuda devices.
    unavailable={
        "cuda": {"sdpa": "cuDNN has no legacy multi-head attention (its fused attention is in the graph API only)"}
    },
)

# Activations a fused convolution applies after its bias and residual.
CONV_ACTIVATIONS = ("none", "relu")

# GEMM epilogues a call may ask for (the `epilogue` scalar), applied after the bias.
EPILOGUES = ("none", "relu", "gelu_tanh")

# D = alpha * op(A) @ op(B) (+ bias over D's columns, then the epilogue): A (batch_a, M, K), or (batch_a, K, M)
# with transpose_a; B (batch_b, K, N), or (batch_b, N, K) with transpose_b; batch_a and batch_b are
# the result's batch or 1 (broadcast); D is (batch, M, N), accumulated in f32.
BLAS = Library(
    "blas",
    {"rocm": "hipBLASLt", "cuda": "cuBLASLt", "cpu": "the float64 reference"},
    ("f32", "f16", "bf16"),
    {
        "matmul": Signature(
            "matmul", (("a", 3), ("b", 3), ("bias", 1)), ("transpose_a", "transpose_b", "epilogue", "alpha"), ("alpha",)
        )
    },
)

# Collectives of a tensor-parallel module on the CPU, which has no collective library: the runtime's
# process group serves them on the host. x is the rank's tensor flattened; all_reduce returns the sum
# over ranks, all_gather the ranks' x concatenated in rank order. On GPUs the collectives are IREE's own
# (flow.collective on NCCL/RCCL, lowering/collective.py), not extern calls.
COLLECTIVES = Library(
    "collectives",
    {"cpu": "rocmc's process group"},
    ("f32", "f16", "bf16"),
    {"all_reduce": Signature("all_reduce", (("x", 1),)), "all_gather": Signature("all_gather", (("x", 1),))},
)

LIBRARIES = {lib.name: lib for lib in (DNN, BLAS, COLLECTIVES)}

# Packed gate order of torch's recurrent weights (rows of w_ih / w_hh, entries of the biases).
TORCH_GATES = {"lstm": "ifgo", "gru": "rzn"}
# Result rows after y: the final states.
RNN_STATES = {"lstm": 2, "gru": 1}


def import_name(op: str, dtype: str) -> str:
    """Function name inside the namespace: `conv2d` for f32, `conv2d.f16` for other storage types
    (one declaration per element type, since a declaration has one tensor type)."""
    return op if dtype == "f32" else f"{op}.{dtype}"


def parse_import(full: str, namespaces: dict | None = None) -> tuple[Library, Signature, str] | None:
    """`dnn.conv2d.f16` -> (its library, the op's signature, "f16"); None for a name no library has.
    `namespaces`: other import namespaces accepted, each -> the library it names (an old artifact's
    `miopen` -> `dnn`)."""
    parts = full.split(".")
    lib = LIBRARIES.get((namespaces or {}).get(parts[0], parts[0]))
    if len(parts) not in (2, 3) or lib is None:
        return None
    sig = lib.signatures.get(parts[1])
    dtype = parts[2] if len(parts) == 3 else "f32"
    if sig is None or dtype not in lib.dtypes or import_name(parts[1], dtype) != ".".join(parts[1:]):
        return None
    return lib, sig, dtype


def to_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def from_bits(v: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(v)))[0]


def gate_blocks(op: str, order: str) -> list:
    """For each gate of a library's packed `order` (e.g. MIOpen's LSTM 'ifog'), the index of that
    gate's block in torch's packing: weights repack as `blocks[gate_blocks(op, order)[j]]`."""
    torch = TORCH_GATES[op]
    if sorted(order) != sorted(torch):
        raise ValueError(f"{op}: gate order {order!r} is not a permutation of {torch!r}")
    return [torch.index(g) for g in order]
