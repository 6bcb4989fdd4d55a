"""Artifact: the compiled .vmfb plus rocmc's metadata, and access to every lowering stage.

The .vmfb is self-describing: rocmc's metadata (graph hash, target, versions, per-node implementation,
signature with symbolic dims) lives in the entry function's `iree.reflection` dictionary, so an
artifact loaded from a file knows what it is.

A file read from disk is untrusted until checked: its integrity trailer (`integrity.py`) is verified
before any byte reaches IREE, and its metadata is checked against a schema and against the module's
own function signatures (`schema.py`). The trailer detects damage, not tampering (anyone who can
write the file can recompute it): loading a .vmfb runs its native code, so an artifact is trusted
like a shared library.

- `core.py`: the `Artifact` class (files, stages, parameters).
- `summary.py`: `Artifact.summary()` in words.
- `dispatches.py`: which graph nodes each dispatch computes.
- `integrity.py`: the seal (integrity trailer) and the header check.
- `schema.py`: the metadata's format, schema and checks against the module.
"""

from .core import PARAMETER_SCOPE, STAGES, STATE_BUFFERS, Artifact
from .integrity import _SEAL, check_seal, seal
from .schema import FORMAT, check_metadata, functions
from .summary import rewrite_lines

__all__ = [
    "Artifact",
    "PARAMETER_SCOPE",
    "STATE_BUFFERS",
    "STAGES",
    "FORMAT",
    "functions",
    "check_metadata",
    "rewrite_lines",
    "seal",
    "check_seal",
    "_SEAL",
]
