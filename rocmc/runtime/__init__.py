"""Runtime: load artifacts on devices and call them. Depends on nothing in rocmc.lowering."""

from .devices import DEVICES, get_device
from .module import Module, Submission, load

__all__ = ["DEVICES", "Module", "Submission", "get_device", "load"]
