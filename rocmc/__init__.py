"""rocmc: ML graphs -> IREE -> .vmfb for AMD GPUs (ROCm), NVIDIA GPUs (CUDA) and the host CPU."""

from ._version import __version__
from .artifact import Artifact
from .errors import (
    ArtifactError,
    CacheWarning,
    CompileError,
    DeviceError,
    DistributedError,
    GraphError,
    InputError,
    LoweringError,
    ModelImportError,
    RocmcError,
    TargetError,
)
from .frontend import Graph, TensorType, Value, dtype
from .dtypes import bf16, bool_, f16, f32, f64, i4, i8, i16, i32, i64, u4, u8, u16, u32, u64
from . import ops
from .lowering import compile
from .lowering.target import Target, known_targets
from .runtime import load
from .frontend.reference import evaluate
from .parameters import Parameters, save_parameters
from . import llm


def import_onnx(model, **kwargs):
    """Import an ONNX model (path, bytes or onnx.ModelProto) as a Graph; see rocmc.frontend.onnx."""
    from .frontend.onnx import import_onnx as _imp

    return _imp(model, **kwargs)


def import_torch(model, args=(), **kwargs):
    """Import a torch nn.Module (through torch.export) or an ExportedProgram as a Graph; see
    rocmc.frontend.torch. torch is imported here, on first use, never by `import rocmc`."""
    from .frontend.torch import import_torch as _imp

    return _imp(model, args, **kwargs)


__all__ = [
    "Artifact",
    "ArtifactError",
    "CacheWarning",
    "CompileError",
    "DeviceError",
    "DistributedError",
    "Graph",
    "GraphError",
    "InputError",
    "LoweringError",
    "ModelImportError",
    "RocmcError",
    "Target",
    "TargetError",
    "TensorType",
    "Value",
    "__version__",
    "compile",
    "dtype",
    "evaluate",
    "import_onnx",
    "import_torch",
    "known_targets",
    "llm",
    "load",
    "ops",
    "Parameters",
    "save_parameters",
    "f32",
    "f16",
    "bf16",
    "f64",
    "i4",
    "u4",
    "i8",
    "i16",
    "i32",
    "i64",
    "u8",
    "u16",
    "u32",
    "u64",
    "bool_",
]
