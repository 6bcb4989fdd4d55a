"""What every provider shares: decoding the ABI's arguments and building the VM module."""

from __future__ import annotations

from ...errors import DeviceError
from ...externs import Library
from ... import dtypes


def dtype_of(element_type) -> dtypes.DType:
    """The float storage type (f32, f16, bf16, f64) a HAL element type tags; the extern ABI's tensors
    are floats, so the signless integer types sharing one HAL type never arise."""
    for d in (dtypes.f32, dtypes.f16, dtypes.bf16, dtypes.f64):
        if int(d.hal_element_type()) == int(element_type):
            return d
    raise DeviceError(f"HAL element type {element_type!r} is no float storage type of the extern ABI")


class Provider:
    """Serves one library role's imports (`<library>.<op>`, rocmc.externs) on one device. Subclasses
    implement `run(op, tensors, attrs)`: tensors are iree HalBufferViews in ABI order (an empty one
    for an absent optional operand), attrs the decoded scalars; it returns the result as a
    HalBufferView."""

    library = "?"
    abi: Library  # the library whose calls it serves (set by provider_for)

    def __init__(self, hal_device, device_name: str):
        self.device = hal_device
        self.device_name = device_name

    def unsupported(self, op: str, dtype: str, attrs: dict) -> str | None:
        """Why this provider can't run `op` on `dtype` with `attrs` (None: it can)."""
        return None

    def run(self, op: str, tensors: list, attrs: dict):
        raise NotImplementedError

    def vm_module(self, imports, namespace: str | None = None):
        """A PyModuleInterface module named `namespace` (default: the library's role), exporting each
        import's function (`conv2d`, `conv2d.f16` for `dnn.conv2d`, `dnn.conv2d.f16`)."""
        from iree import runtime as rt

        provider = self

        class Instance:
            def __init__(self, iface):
                pass

        iface = rt.PyModuleInterface(namespace or self.abi.name, Instance)
        for full in imports:
            name = full.split(".", 1)[1]
            op = name.split(".")[0]
            sig = self.abi.signatures[op]
            iface.export(name, sig.cconv, _entry(provider, op, sig, rt.HalBufferView))
        return iface.create()


class Attrs(dict):
    """Decoded scalars of a call, with `key`: a hashable form a provider may cache plans by."""

    key: tuple = ()


def _entry(provider: Provider, op: str, sig, view_type):
    n = len(sig.tensors)
    decoded: dict = {}  # the raw i64 scalars -> Attrs: a module calls with few distinct ones

    def call(_instance, *args):
        tensors = [a.deref(view_type) for a in args[:n]]
        raw = args[n:]
        attrs = decoded.get(raw)
        if attrs is None:
            attrs = Attrs(sig.decode(raw))
            attrs.key = tuple(sorted(attrs.items()))
            if len(decoded) < 256:
                decoded[raw] = attrs
        return provider.run(op, tensors, attrs).ref

    call.__name__ = op
    return call
