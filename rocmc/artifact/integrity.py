"""The integrity trailer (the seal) of a saved module, and the header check that comes before it.

A sealed module is the .vmfb followed by a trailer: a magic, the sha256 of the module bytes, their
length, the magic again. IREE reads a module from its start and ignores bytes past it
(VmModule.mmap, copy_buffer and iree-dump-module all accept a sealed file). The trailer detects
damage, not tampering: anyone who can write the file can recompute it.
"""

from __future__ import annotations

import hashlib
import struct

from ..errors import ArtifactError

_VMFB_MAGIC = b"IREE"
_SEAL = struct.Struct("<8s32sQ8s")  # magic, sha256 of the module bytes, their length, magic
_SEAL_MAGIC = b"rocmc\x00s1"


def seal(vmfb: bytes) -> bytes:
    """The module followed by its integrity trailer."""
    return vmfb + _SEAL.pack(_SEAL_MAGIC, hashlib.sha256(vmfb).digest(), len(vmfb), _SEAL_MAGIC)


def check_seal(data: bytes, what: str = "artifact") -> None:
    """ArtifactError unless `data` is a module followed by the trailer `seal` gave it."""
    n = len(data) - _SEAL.size
    head, digest, length, tail = _SEAL.unpack_from(data, n) if n > 0 else (b"",) * 4
    if head != _SEAL_MAGIC or tail != _SEAL_MAGIC:
        raise ArtifactError(
            f"{what}: no rocmc integrity trailer at the end of the file: it is truncated or "
            f"damaged, was made by an older rocmc, or is not a rocmc artifact; recompile it, "
            f"or load it with verify=False if you trust the file"
        )
    if length != n:
        raise ArtifactError(
            f"{what}: damaged: its trailer records a module of {length} bytes, the file holds {n}; recompile it"
        )
    if hashlib.sha256(memoryview(data)[:n]).digest() != digest:
        raise ArtifactError(f"{what}: damaged: the module's sha256 differs from the one in its trailer; recompile it")


def check_header(data: bytes, what: str) -> None:
    """ArtifactError unless `data` starts like an IREE .vmfb module."""
    if len(data) < 16 or _VMFB_MAGIC not in data[:256]:
        raise ArtifactError(f"{what}: not an IREE .vmfb module (bad header, {len(data)} bytes)")
