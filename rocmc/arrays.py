"""Arrays from other libraries as the numpy arrays rocmc takes.

Wherever rocmc takes an array (a call's inputs, `rocmc.evaluate`, graph constants, parameters given as
arrays) a torch tensor is taken too, through `as_numpy`: a CPU tensor of a dtype rocmc has becomes a
numpy array sharing its memory (bf16, which numpy lacks, through a view of its bits as
ml_dtypes.bfloat16), detached first when it requires grad. Anything else a tensor can be (on a GPU or
the meta device, complex, quantized, sparse) is an InputError naming the argument. torch is optional:
this module never imports it, and a value is a tensor only if torch is already imported.
"""

from __future__ import annotations

import sys

from .errors import InputError

# torch dtype names (str(dtype) without "torch.") of the types rocmc has that tensor.numpy() reads as
# the numpy type of the same name; bfloat16 and the float8 types go through their bits (_BITS)
_NUMPY_READABLE = (
    "float32",
    "float16",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
)
_BITS = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1}
_SUPPORTED = ", ".join((*_BITS, *_NUMPY_READABLE))


def is_tensor(x) -> bool:
    """Whether x is a torch.Tensor (False without importing torch when torch was never imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, getattr(torch, "Tensor", ()))


def as_numpy(x, what: str):
    """x itself unless it is a torch tensor; a tensor as a numpy array of the same values, sharing its
    memory. `what` names the argument in errors ("input 'ids'", "constant 'w'")."""
    if not is_tensor(x):
        return x
    import torch

    if x.layout != torch.strided:
        raise InputError(
            f"{what}: a torch tensor of layout {x.layout}; expected a dense (strided) CPU tensor (call .to_dense())"
        )
    if x.is_quantized:
        raise InputError(
            f"{what}: a quantized torch tensor ({x.dtype}); expected a CPU tensor of one of "
            f"{_SUPPORTED} (call .dequantize())"
        )
    if x.device.type != "cpu":
        raise InputError(
            f"{what}: a torch tensor on device {x.device}; expected a CPU tensor (call .cpu(), "
            f"or give the module's own device arrays)"
        )
    name = str(x.dtype).removeprefix("torch.")
    if name not in _BITS and name not in _NUMPY_READABLE:
        raise InputError(f"{what}: torch dtype {x.dtype}, which rocmc lacks; expected one of {_SUPPORTED}")
    t = x.detach()
    try:
        if name in _BITS:  # numpy's view of the same bits as ml_dtypes' type of that name
            import ml_dtypes

            return t.view({1: torch.uint8, 2: torch.int16}[_BITS[name]]).numpy().view(getattr(ml_dtypes, name))
        return t.numpy()
    except (RuntimeError, TypeError) as e:  # a tensor without CPU storage of its own (a fake tensor)
        raise InputError(f"{what}: a torch tensor numpy can't read ({e}); expected a plain CPU tensor") from None
