"""Old names of the library roles and implementations, accepted as aliases of the current ones.

Until artifact format 3 the roles were named after their ROCm providers: the `dnn` role was `miopen`
(its calls imported as `miopen.<op>`), the `blas` role `hipblaslt` (`hipblaslt.matmul`), and the
hand-written kernel implementation `kernel` was `hip`. This one table maps each old name to its
current one wherever an old name can still arrive:
- compile's `libraries=["miopen"]`, `libraries=["hipblaslt"]`, `impl="hip"`, `impl={"rms_norm": "hip"}`
  (and `rocmc compile --library/--impl`) mean the current names;
- an artifact of format 2 or earlier imports `miopen.*` and `hipblaslt.*`: the runtime serves those
  namespaces with the `dnn` and `blas` providers, and its metadata's implementation names read as the
  current ones (summaries, `rocmc inspect`, the load-time checks).
"""

from __future__ import annotations

ALIASES = {"miopen": "dnn", "hipblaslt": "blas", "hip": "kernel"}

# First artifact format whose imports and implementation names are the current ones.
CURRENT_NAMES_FORMAT = 3


def current(name):
    """The current name of a library role or implementation (`name` itself when it is not an alias)."""
    return ALIASES.get(name, name) if isinstance(name, str) else name
