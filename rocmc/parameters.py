"""External parameters: named tensors that a compiled module reads at load time instead of embedding.

A module compiled with external weights holds globals like
`util.global private @w = #flow.parameter.named<"model"::"NAME"> : tensor<...>`; `Parameters` gathers
the tensors behind those names from .irpa archives, .safetensors files (one file, a sharded Hugging Face
checkpoint or its directory) and in-memory numpy arrays, and serves them to IREE as a parameter module.

Opening a source reads only headers: every entry's name, shape, dtype and place in its file is known
before any tensor byte is read, so `check` can reject a wrong checkpoint before anything runs. File
headers are untrusted input: a safetensors header is parsed here, bounded and checked entry by entry
(IREE's own parser accepts overlapping tensors and offsets that disagree with the shape), and every
problem is an ArtifactError naming the file and the tensor.

An .irpa written by `save_parameters` records each tensor's shape and dtype in the entry's metadata, in
IREE's own `TENSORv0:{json}` form (the one `iree.runtime.io` reads and writes). An .irpa from elsewhere
without that metadata still opens: its entries then have an unknown shape and dtype, and only their byte
sizes can be checked.

Serving: a file whose needed entries are all used as they are is handed to IREE whole, mapped and not
copied (`ParameterIndex.load`). An entry whose dtype must change (f32, f16 and bf16 convert into one
another) is converted once, in host memory, when the provider is made; the other entries of its file
are then served from a mapping of that file. IREE's index keeps every buffer it was given alive for as
long as the provider module lives.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import mmap
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .arrays import as_numpy
from .dtypes import ALL as DTYPES, DType
from .errors import ArtifactError, InputError
from .files import umask
from .progress import byte_progress, format_bytes, step

# Element types a parameter file may hold: rocmc's, by name (DTYPES), and by numpy type.
_BY_NUMPY = {d.np: name for name, d in DTYPES.items()}
_SAFETENSORS = {
    "F64": "f64",
    "F32": "f32",
    "F16": "f16",
    "BF16": "bf16",
    "I64": "i64",
    "I32": "i32",
    "I16": "i16",
    "I8": "i8",
    "U8": "u8",
    "BOOL": "bool",
    # float8 e4m3fn, read as its bytes: rocmc.llm.quant decodes fp8 checkpoints' weights from them in integer
    # arithmetic (quantized_linear's format "e4m3fn"), which IREE compiles for every target; the f8e4m3fn element
    # type it does not compile for CUDA.
    "F8_E4M3": "u8",
}
_IREE_NAMES = {
    "f64": "float64",
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "i64": "int64",
    "i32": "int32",
    "i16": "int16",
    "i8": "int8",
    "u8": "uint8",
    "bool": "bool",
}
_FROM_IREE = {v: k for k, v in _IREE_NAMES.items()}
_CONVERTIBLE = ("f32", "f16", "bf16")

_MAX_HEADER = 100_000_000  # the safetensors format's own bound on its JSON header
_TENSOR_METADATA = (b"TENSORv0:", b"PYTORCH:")  # IREE's metadata prefixes (the second: older writers)
_ARRAYS = "the given arrays"


@dataclass(frozen=True)
class Spec:
    """One parameter a module needs: its name in the "model" scope, shape and rocmc dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise InputError(f"parameter spec: name must be a non-empty string, got {self.name!r}")
        try:
            shape = tuple(int(d) for d in self.shape)
        except (TypeError, ValueError):
            shape = None
        if shape is None or any(d < 0 for d in shape):
            raise InputError(f"parameter spec {self.name!r}: shape must be non-negative ints, got {self.shape!r}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", _dtype_name(self.dtype, f"parameter spec {self.name!r}"))

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize


@dataclass(frozen=True)
class _Entry:
    """Where one tensor lives. shape/dtype None: an .irpa entry without tensor metadata (size only)."""

    shape: tuple[int, ...] | None
    dtype: str | None
    nbytes: int
    origin: str  # the file, or _ARRAYS, for messages
    path: Path | None = None  # file-backed: the file, its format and the tensor's byte offset
    format: str | None = None
    offset: int = 0
    array: np.ndarray | None = None  # in memory
    splat: bytes | None = None  # an .irpa splat: this pattern repeated to nbytes
    part: bool = False  # a range of a tensor of its file (a rank's slice): served mapped


class Parameters:
    """A set of named tensors from any mix of sources; see the module docstring."""

    def __init__(self, entries: dict[str, _Entry] | None = None):
        self._entries: dict[str, _Entry] = dict(entries or {})

    @classmethod
    def open(cls, source) -> "Parameters":
        """Parameters from a path (.irpa, .safetensors, a sharded checkpoint's index .json, or a directory
        holding model.safetensors[.index.json]), a dict name -> array (numpy, or a CPU torch tensor: its
        memory is shared, not copied), a Parameters, or a list/tuple of these. A name defined by two
        sources is an InputError."""
        if isinstance(source, Parameters):
            return source
        if isinstance(source, dict):
            return cls(_from_arrays(source))
        if isinstance(source, (list, tuple)):
            return cls(_merge([cls.open(s)._entries for s in source]))
        if isinstance(source, (str, os.PathLike)):
            with step(f"reading the checkpoint headers of {source}", logger=__name__):
                opened = cls(_open_path(Path(source)))
            logging.getLogger(__name__).info(
                "%s: %d tensors, %s", source, len(opened), format_bytes(sum(e.nbytes for e in opened._entries.values()))
            )
            return opened
        raise InputError(
            f"parameters: unsupported source {type(source).__name__}: expected a path, a dict "
            f"of arrays, a Parameters or a list of these"
        )

    def names(self) -> list[str]:
        return list(self._entries)

    def info(self, name: str) -> tuple[tuple[int, ...] | None, str | None]:
        """(shape, dtype) of one entry; (None, None) for an .irpa entry that records neither."""
        e = self._entry(name)
        return e.shape, e.dtype

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __repr__(self) -> str:
        origins = _origins(self._entries.values())
        return f"Parameters({len(self)} tensors from {origins})" if self._entries else "Parameters(empty)"

    def check(self, specs, *, convert: bool = True) -> list[str]:
        """Check that every spec is here with its shape and dtype, reading no tensor bytes. Returns one
        note per tensor whose dtype will be converted when served (only with `convert`)."""
        return [f"{name}: converted {src} -> {dst}" for name, (src, dst) in self._conversions(specs, convert).items()]

    def array(self, name: str) -> np.ndarray:
        """One tensor as a numpy array: a read-only view of its file's mapping when file-backed."""
        e = self._entry(name)
        if e.array is not None:
            return e.array
        dtype = DTYPES[e.dtype].np if e.dtype else np.dtype(np.uint8)
        shape = e.shape if e.shape is not None else (e.nbytes,)
        if e.splat is not None:
            return np.frombuffer(e.splat * (e.nbytes // len(e.splat)), dtype).reshape(shape)
        if e.nbytes == 0:
            return np.empty(shape, dtype)
        try:
            return np.memmap(e.path, dtype=dtype, mode="r", offset=e.offset, shape=shape).view(np.ndarray)
        except (OSError, ValueError) as err:
            raise ArtifactError(
                f"{e.path}: cannot read tensor {name!r} ({e.nbytes} bytes at offset {e.offset}): {err}"
            ) from None

    def shard(self, shards: dict, rank: int, parts: int) -> "Parameters":
        """Rank `rank`'s tensors: {name: (sources, axis)} -> a Parameters holding under each name the rank-th
        of `parts` equal slices along `axis` (None: whole) of its source, a tensor name; or, for a tuple of
        several names, each source's slice concatenated along axis 0 (a joined projection). A slice along
        axis 0 of one source is a range of its file, served mapped (no copy); a slice along another axis, or
        a join, is made once in host memory (parts == 1: the tensors renamed, and joined)."""
        if not (isinstance(parts, int) and isinstance(rank, int) and 0 <= rank < parts):
            raise InputError(f"parameters shard: rank {rank!r} of {parts!r}: expected 0 <= rank < parts")
        out, copies = {}, []
        for name, (sources, axis) in shards.items():
            sources = (sources,) if isinstance(sources, str) else tuple(sources)
            if len(sources) == 1:
                served = self._slice(sources[0], axis, rank, parts)
                if isinstance(served, _Entry):
                    out[name] = served
                else:
                    copies.append((name, [(sources[0], served[0])], served[1]))
                continue
            pieces = [(src, self._slice(src, axis, rank, parts, copy=True)) for src in sources]
            entries = [e for _, (_, e) in pieces]
            first = entries[0]
            if any(e.dtype != first.dtype or e.shape[1:] != first.shape[1:] for e in entries):
                raise InputError(
                    f"parameter {name!r} joins {', '.join(map(repr, sources))} along axis 0, but their "
                    f"{'slices' if parts > 1 else 'shapes'} do not concatenate: "
                    + ", ".join(_typed(e.shape, e.dtype) for e in entries)
                )
            shape = (sum(e.shape[0] for e in entries),) + first.shape[1:]
            joined = _Entry(shape, first.dtype, sum(e.nbytes for e in entries), _origins(entries))
            copies.append((name, [(src, index) for src, (index, _) in pieces], joined))
        # Slices along another axis and joins are read from the checkpoint into host memory, once.
        if not copies:
            return Parameters(out)
        what = f"rank {rank}'s slices of" if parts > 1 else "joining"
        with byte_progress(
            f"reading {what} {len(copies)} tensors", sum(c[2].nbytes for c in copies), logger=__name__
        ) as progress:
            for name, pieces, e in copies:
                arrays = [self.array(src)[index] for src, index in pieces]
                data = np.concatenate(arrays, axis=0) if len(arrays) > 1 else np.ascontiguousarray(arrays[0])
                out[name] = _Entry(e.shape, e.dtype, e.nbytes, e.origin, array=data)
                progress.update(e.nbytes)
        return Parameters(out)

    def _slice(self, source: str, axis, rank: int, parts: int, copy: bool = False):
        """Rank `rank`'s slice of one tensor: its _Entry, served as stored (whole, or a range of its file along
        axis 0), or, where it must be copied out (or `copy`), (numpy index, _Entry of the slice)."""
        e = self._entry(source)
        whole = axis is None or parts == 1
        if whole and not copy:
            return e
        if e.shape is None or e.dtype is None or not (whole or 0 <= axis < len(e.shape)):
            raise InputError(
                f"parameter {source!r}: can't {'join' if whole else f'split along axis {axis}'}: its shape is "
                f"{_dims(e.shape) if e.shape is not None else 'not recorded'} in {e.origin}"
            )
        if whole:
            return (Ellipsis,), e
        if e.shape[axis] % parts:
            raise InputError(
                f"parameter {source!r}: axis {axis} of {_dims(e.shape)} does not split into {parts} equal parts"
            )
        part = e.shape[axis] // parts
        shape = tuple(part if i == axis else d for i, d in enumerate(e.shape))
        nbytes = math.prod(shape) * DTYPES[e.dtype].itemsize
        if axis == 0 and e.path is not None and e.splat is None and not copy:
            return _Entry(shape, e.dtype, nbytes, e.origin, e.path, e.format, e.offset + rank * nbytes, part=True)
        index = tuple(slice(rank * part, (rank + 1) * part) if i == axis else slice(None) for i in range(len(e.shape)))
        return index, _Entry(shape, e.dtype, nbytes, e.origin)

    def fingerprint(self, config: bytes = b"") -> str:
        """A digest that ranks compare before each reads its own slices: `config` (the checkpoint's
        config.json), every tensor's name, shape, dtype and place, and each file's size and first and last
        MiB (reading no more: each rank holds a different part of the tensors; in-memory arrays in full)."""
        import hashlib

        h = hashlib.sha256(config)
        for name in sorted(self._entries):
            e = self._entries[name]
            h.update(f"{name}|{e.shape}|{e.dtype}|{e.offset}|{e.nbytes}|{e.path.name if e.path else ''}".encode())
            if e.path is None:
                h.update(_flat_bytes(self.array(name)).tobytes())
        for f in sorted({e.path for e in self._entries.values() if e.path is not None}):
            size = os.path.getsize(f)
            with open(f, "rb") as fh:
                h.update(str(size).encode() + fh.read(1 << 20))
                fh.seek(max(0, size - (1 << 20)))
                h.update(fh.read(1 << 20))
        return h.hexdigest()

    def provider(self, instance, scope: str = "model", specs=None):
        """An IREE VM module serving these tensors under `scope`; place it between the HAL module and
        the program in the VmContext. With `specs`, they are checked first (see `check`), only the
        tensors they name are served, and a tensor of another float dtype is converted to theirs."""
        from iree import runtime as rt

        if specs is None:
            needed, conversions = list(self._entries), {}
        else:
            specs = _specs(specs)
            conversions = self._conversions(specs, convert=True)
            needed = list(dict.fromkeys(s.name for s in specs))
        index = rt.ParameterIndex()
        files: dict[tuple[Path, str], list[str]] = {}
        converting = (
            byte_progress(
                f"reading and converting {len(conversions)} parameters",
                sum(self._entries[n].nbytes for n in conversions),
                logger=__name__,
            )
            if conversions
            else contextlib.nullcontext()
        )
        with converting as progress:
            for name in conversions:
                index.add_buffer(name, _flat_bytes(self.array(name).astype(DTYPES[conversions[name][1]].np)))
                progress.update(self._entries[name].nbytes)
        for name in needed:
            e = self._entries[name]
            if name in conversions:
                continue
            if e.path is None:
                _add_entry(index, name, e)
            else:
                files.setdefault((e.path, e.format), []).append(name)
        mapped_files = {self._entries[name].path for name in conversions} | {
            e.path for name, e in self._entries.items() if e.part and name in needed
        }
        for (path, fmt), names in files.items():
            if path in mapped_files:
                handle = _map_file(rt, path)
                for name in names:
                    _add_entry(index, name, self._entries[name], handle)
            else:
                _load_whole(index, path, fmt)
        return rt.create_io_parameters_module(instance, index.create_provider(scope=scope))

    # ---- internals ----

    def _entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise InputError(f"parameter {name!r} not found in {_origins(self._entries.values())}") from None

    def _conversions(self, specs, convert: bool) -> dict[str, tuple[str, str]]:
        """name -> (found dtype, wanted dtype) for each spec that needs a conversion; InputError on the
        first missing tensor (counting the others), shape or size mismatch, or dtype that can't convert."""
        specs = _specs(specs)
        missing = [s.name for s in specs if s.name not in self._entries]
        if missing:
            others = f" ({len(missing) - 1} other parameter(s) missing too)" if len(missing) > 1 else ""
            raise InputError(f"parameter {missing[0]!r} not found in {_origins(self._entries.values())}{others}")
        conversions = {}
        for s in specs:
            e = self._entries[s.name]
            if e.shape is None:
                if e.nbytes != s.nbytes:
                    raise InputError(
                        f"parameter {s.name!r}: expected {s.nbytes} bytes "
                        f"({_typed(s.shape, s.dtype)}), found {e.nbytes} in {e.origin}"
                    )
                continue
            if e.shape != s.shape:
                raise InputError(
                    f"parameter {s.name!r}: expected shape {_dims(s.shape)}, found {_dims(e.shape)} in {e.origin}"
                )
            if e.dtype == s.dtype:
                continue
            if not (convert and e.dtype in _CONVERTIBLE and s.dtype in _CONVERTIBLE):
                why = "" if convert else " (conversion is off)"
                raise InputError(
                    f"parameter {s.name!r}: expected dtype {s.dtype}, found {e.dtype} in "
                    f"{e.origin}{why}; only {', '.join(_CONVERTIBLE)} convert into one another"
                )
            conversions[s.name] = (e.dtype, s.dtype)
        return conversions


def save_parameters(path, source) -> Path:
    """Write the tensors of `source` (anything `Parameters.open` takes) to an .irpa archive, each with
    its shape and dtype in IREE's tensor metadata. The file appears whole or not at all."""
    from iree import runtime as rt

    path = Path(path)
    if path.suffix != ".irpa":
        raise InputError(f"save_parameters: {path}: the file name must end in .irpa")
    params = Parameters.open(source)
    index = rt.ParameterIndex()
    for name in params.names():
        e = params._entries[name]
        metadata = _tensor_metadata(e.shape, e.dtype) if e.dtype else None
        if e.splat is not None:
            index.add_splat(name, e.splat, e.nbytes, metadata=metadata)
        else:
            index.add_buffer(name, _flat_bytes(params.array(name)), metadata=metadata)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with step(
            f"writing {len(params)} parameters ({format_bytes(sum(e.nbytes for e in params._entries.values()))}) "
            f"to {path}",
            logger=__name__,
        ):
            index.create_archive_file(tmp)
        os.chmod(tmp, 0o644 & ~umask())  # a weights file is shared like a saved model
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


# ---- opening sources -----------------------------------------------------------------------------


def _open_path(path: Path) -> dict[str, _Entry]:
    if not path.exists():
        raise InputError(f"parameters: {path} does not exist")
    path = Path(os.path.abspath(path))  # not resolve(): a Hugging Face cache links each file to a blob
    if path.is_dir():
        for name in ("model.safetensors.index.json", "model.safetensors"):
            if (path / name).is_file():
                return _open_path(path / name)
        raise InputError(
            f"parameters: directory {path} holds neither model.safetensors.index.json nor model.safetensors"
        )
    readers = {".safetensors": _read_safetensors, ".json": _read_sharded, ".irpa": _read_irpa}
    if path.suffix not in readers:
        raise InputError(
            f"parameters: {path}: unsupported file kind {path.suffix!r}: expected .irpa, "
            f".safetensors or a sharded checkpoint's .json index"
        )
    return readers[path.suffix](path)


def _from_arrays(arrays: dict) -> dict[str, _Entry]:
    entries = {}
    for name, value in arrays.items():
        if not isinstance(name, str) or not name:
            raise InputError(f"parameters: array names must be non-empty strings, got {name!r}")
        try:
            a = np.asarray(as_numpy(value, f"parameter {name!r}"))
        except InputError:
            raise
        except Exception as err:  # noqa: BLE001
            raise InputError(f"parameter {name!r}: not an array: {err}") from None
        dtype = _dtype_name(a.dtype, f"parameter {name!r}")
        entries[name] = _Entry(tuple(a.shape), dtype, a.nbytes, _ARRAYS, array=a)
    return entries


def _merge(parts: list[dict[str, _Entry]]) -> dict[str, _Entry]:
    merged: dict[str, _Entry] = {}
    for part in parts:
        for name, e in part.items():
            if name in merged:
                raise InputError(f"parameter {name!r} is defined twice: in {merged[name].origin} and in {e.origin}")
            merged[name] = e
    return merged


def _read_safetensors(path: Path) -> dict[str, _Entry]:
    """The entries of a .safetensors file, from its header alone, checked as untrusted input."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise ArtifactError(f"{path}: not a safetensors file: {size} bytes, shorter than its header length")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise ArtifactError(
                    f"{path}: safetensors header of {n} bytes does not fit the file "
                    f"({size} bytes, at most {_MAX_HEADER} of header)"
                )
            raw = f.read(n)
    except OSError as err:
        raise ArtifactError(f"{path}: cannot read: {err}") from None
    header = _parse_json(raw, path, "safetensors header")
    data_start, data_size = 8 + n, size - 8 - n
    entries, spans = {}, []
    for name, desc in header.items():
        if name == "__metadata__":
            continue
        shape, dtype, begin, end = _safetensors_entry(desc, path, name, data_size)
        entries[name] = _Entry(shape, dtype, end - begin, str(path), path, "safetensors", data_start + begin)
        spans.append((begin, end, name))
    _check_disjoint(spans, path)
    return entries


def _check_disjoint(spans: list[tuple[int, int, str]], path: Path) -> None:
    """ArtifactError if two tensors share a byte (empty tensors share none)."""
    reach, reacher = 0, None  # the furthest end so far, and whose it is
    for begin, end, name in sorted(spans):
        if begin < end and begin < reach:
            raise ArtifactError(f"{path}: tensors {reacher!r} and {name!r} overlap in the data section")
        if end > reach:
            reach, reacher = end, name


def _safetensors_entry(desc, path: Path, name: str, data_size: int):
    """(shape, dtype, begin, end) of one header entry; ArtifactError naming it if malformed."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(desc, dict) or not {"dtype", "shape", "data_offsets"} <= desc.keys():
        raise ArtifactError(f"{where}: header entry must be an object with dtype, shape and data_offsets")
    dtype = _SAFETENSORS.get(desc["dtype"]) if isinstance(desc["dtype"], str) else None
    if dtype is None:
        raise ArtifactError(f"{where}: unknown dtype {desc['dtype']!r}: expected one of {', '.join(_SAFETENSORS)}")
    shape = desc["shape"]
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ArtifactError(f"{where}: shape must be a list of non-negative ints, got {shape!r}")
    offsets = desc["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise ArtifactError(f"{where}: data_offsets must be two ints, got {offsets!r}")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise ArtifactError(
            f"{where}: data_offsets [{begin}, {end}] fall outside the data section of "
            f"{data_size} bytes (truncated file?)"
        )
    expected = math.prod(shape) * DTYPES[dtype].itemsize
    if end - begin != expected:
        raise ArtifactError(
            f"{where}: data_offsets span {end - begin} bytes, its shape {_typed(shape, dtype)} needs {expected}"
        )
    return tuple(shape), dtype, begin, end


def _read_sharded(path: Path) -> dict[str, _Entry]:
    """The entries of a sharded checkpoint: its index's weight_map names a shard file for each tensor."""
    try:
        if path.stat().st_size > _MAX_HEADER:
            raise ArtifactError(f"{path}: checkpoint index larger than {_MAX_HEADER} bytes")
        raw = path.read_bytes()
    except OSError as err:
        raise ArtifactError(f"{path}: cannot read: {err}") from None
    weight_map = _parse_json(raw, path, "checkpoint index").get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ArtifactError(f'{path}: expected {{"weight_map": {{tensor: shard file name}}}}')
    shards: dict[str, dict[str, _Entry]] = {}
    for tensor, shard in weight_map.items():
        if shard not in shards:
            shards[shard] = _read_shard(path, shard)
        if tensor not in shards[shard]:
            raise ArtifactError(f"{path}: tensor {tensor!r} is listed in shard {shard!r}, which does not hold it")
    for shard, entries in shards.items():
        for tensor in entries:
            if weight_map.get(tensor) != shard:
                raise ArtifactError(
                    f"{path}: shard {shard!r} holds tensor {tensor!r}, which the index "
                    f"places in {weight_map.get(tensor, 'no shard')!r}"
                )
    return _merge(list(shards.values()))


def _read_shard(index: Path, shard: str) -> dict[str, _Entry]:
    # Shards are plain file names next to the index; anything else could reach outside the checkpoint.
    if not shard or shard in (".", "..") or "/" in shard or "\\" in shard or "\0" in shard:
        raise ArtifactError(f"{index}: shard {shard!r} is not a plain file name in the index's directory")
    path = index.parent / shard
    if not path.is_file():
        raise ArtifactError(f"{index}: shard {shard!r} not found next to the index")
    return _read_safetensors(path)


def _read_irpa(path: Path) -> dict[str, _Entry]:
    """The entries of an .irpa archive, as IREE's parser (which bounds every segment) reports them."""
    from iree import runtime as rt

    index = rt.ParameterIndex()
    try:
        index.load(str(path), format="irpa")
    except Exception as err:  # noqa: BLE001
        raise ArtifactError(f"{path}: not a readable .irpa archive: {err}") from None
    entries = {}
    for name, e in index.items():
        if name in entries:
            raise ArtifactError(f"{path}: tensor {name!r} appears twice in the archive")
        shape, dtype = _irpa_tensor_info(e.metadata, e.length, path, name)
        if e.is_splat:
            pattern = bytes(e.splat_pattern)
            if not pattern or e.length % len(pattern):
                raise ArtifactError(
                    f"{path}: tensor {name!r}: splat pattern of {len(pattern)} bytes does "
                    f"not divide its {e.length} bytes"
                )
            entries[name] = _Entry(shape, dtype, e.length, str(path), path, "irpa", splat=pattern)
        elif e.is_file:
            entries[name] = _Entry(shape, dtype, e.length, str(path), path, "irpa", e.file_storage[1])
        else:
            raise ArtifactError(f"{path}: tensor {name!r}: unsupported kind of archive entry")
    return entries


def _irpa_tensor_info(metadata: bytes, length: int, path: Path, name: str):
    """(shape, dtype) from an entry's IREE tensor metadata; (None, None) where it records none."""
    prefix = next((p for p in _TENSOR_METADATA if metadata.startswith(p)), None)
    if prefix is None:
        return None, None
    d = _parse_json(metadata[len(prefix) :], path, f"metadata of tensor {name!r}")
    shape, dtype = d.get("shape"), _FROM_IREE.get(d.get("dtype"))
    if (
        d.get("type") != "Tensor"
        or dtype is None
        or not isinstance(shape, list)
        or not all(type(x) is int and x >= 0 for x in shape)
    ):
        raise ArtifactError(
            f"{path}: tensor {name!r}: malformed tensor metadata (type {d.get('type')!r}, "
            f"dtype {d.get('dtype')!r}, shape {shape!r})"
        )
    if math.prod(shape) * DTYPES[dtype].itemsize != length:
        raise ArtifactError(f"{path}: tensor {name!r}: {length} bytes, its metadata says {_typed(shape, dtype)}")
    return tuple(shape), dtype


def _parse_json(raw: bytes, path: Path, what: str) -> dict:
    """A JSON object from untrusted bytes; duplicate keys are rejected rather than silently resolved."""

    def pairs(items):
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise ArtifactError(f"{path}: {what}: key {dup!r} appears twice")
        return dict(items)

    try:
        value = json.loads(raw.decode("utf-8"), object_pairs_hook=pairs)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ArtifactError(f"{path}: {what} is not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise ArtifactError(f"{path}: {what} must be a JSON object, got {type(value).__name__}")
    return value


# ---- serving -------------------------------------------------------------------------------------


def _add_entry(index, name: str, e: _Entry, handle=None) -> None:
    """Add one tensor as it is: an array's bytes, a splat, or a range of a mapped file (`handle`)."""
    if e.splat is not None:
        index.add_splat(name, e.splat, e.nbytes)
    elif e.array is not None:
        index.add_buffer(name, _flat_bytes(e.array))
    else:
        index.add_from_file_handle(name, handle, e.nbytes, e.offset)


def _load_whole(index, path: Path, fmt: str) -> None:
    try:
        index.load(str(path), format=fmt)
    except Exception as err:  # noqa: BLE001
        raise ArtifactError(f"{path}: cannot load as {fmt}: {err}") from None


def _map_file(rt, path: Path):
    """A read-only mapping of `path` as an IREE file handle (which keeps the mapping alive)."""
    try:
        with open(path, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as err:
        raise ArtifactError(f"{path}: cannot map: {err}") from None
    return rt.FileHandle.wrap_memory(mapping)


def _flat_bytes(a: np.ndarray) -> np.ndarray:
    """The array's bytes as a flat uint8 view (a copy only when it is not C-contiguous)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


# ---- small helpers -------------------------------------------------------------------------------


def _dtype_name(spec, what: str) -> str:
    if isinstance(spec, DType):
        spec = spec.name
    if isinstance(spec, str):  # rocmc's names, or numpy's long ones ("float16", not "f2")
        name = spec if spec in DTYPES else _FROM_IREE.get(spec)
    else:
        try:
            name = _BY_NUMPY.get(np.dtype(spec))
        except TypeError:
            name = None
    if name is None:
        raise InputError(f"{what}: unsupported dtype {spec!r}: expected one of {', '.join(DTYPES)}")
    return name


def _specs(specs) -> list[Spec]:
    return [s if isinstance(s, Spec) else Spec(*s) for s in specs]


def _tensor_metadata(shape, dtype: str) -> str:
    return "TENSORv0:" + json.dumps({"type": "Tensor", "dtype": _IREE_NAMES[dtype], "shape": list(shape)})


def _origins(entries) -> str:
    origins = list(dict.fromkeys(e.origin for e in entries))
    if not origins:
        return "an empty parameter set"
    more = f" and {len(origins) - 3} more" if len(origins) > 3 else ""
    return ", ".join(origins[:3]) + more


def _dims(shape) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _typed(shape, dtype: str) -> str:
    return f"{dtype}{_dims(shape)}"
