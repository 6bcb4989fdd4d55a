"""rocmc.ops: every op builder, one namespace (keyword names follow torch.nn.functional, axes numpy's).

The namespace is built from the op families' list (rocmc.frontend.ops.FAMILIES): each family's `__all__`.
"""

from .frontend.ops import family_modules as _family_modules


def _builders() -> dict:
    names = {}
    for module in _family_modules():
        for name in module.__all__:
            if name in names:
                raise ImportError(
                    f"rocmc.ops: {name!r} is exported by both {names[name].__name__} and {module.__name__}"
                )
            names[name] = module
    return {name: getattr(module, name) for name, module in names.items()}


_BUILDERS = _builders()
globals().update(_BUILDERS)
__all__ = sorted(_BUILDERS)
