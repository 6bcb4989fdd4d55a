"""Typed errors. Every message names the op or argument at fault and what was expected."""


class RocmcError(Exception):
    """Base of every error rocmc raises on purpose."""


class GraphError(RocmcError, ValueError):
    """A graph was built wrongly: shape, dtype, attribute or argument mismatch."""


class TargetError(RocmcError, ValueError):
    """Unknown or malformed compile target."""


class LoweringError(RocmcError):
    """No implementation can lower a node for the chosen target."""


class CompileError(RocmcError):
    """iree-compile (or a kernel build) failed; carries the stage and the diagnostics."""

    def __init__(self, message, *, stage="iree-compile", diagnostics=""):
        self.stage = stage
        self.diagnostics = diagnostics
        text = f"[{stage}] {message}"
        if diagnostics:
            text += "\n" + diagnostics.strip()
        super().__init__(text)


class ArtifactError(RocmcError):
    """A .vmfb or its metadata is missing, truncated, corrupt or for another target."""


class DeviceError(RocmcError):
    """A runtime device or driver is unavailable or does not fit the artifact."""


class InputError(RocmcError, ValueError):
    """Inputs given at call time do not match the compiled signature."""


class DistributedError(RocmcError):
    """The processes of a tensor-parallel run can't form or keep their group: a missing or dead rank,
    a bad launcher environment, ranks that loaded different things, an absent collective library."""


class ModelImportError(RocmcError):
    """A model file (ONNX) could not be imported; lists every unsupported node."""


class CacheWarning(RuntimeWarning):
    """A compile-cache directory or entry can't be used or trusted; rocmc compiles without it."""
