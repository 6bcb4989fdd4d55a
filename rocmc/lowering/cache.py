"""Content-addressed compile cache: (graph hash, target, options, versions) -> compiled artifact.

Layout: <root>/<key[:2]>/<key>/{module.vmfb, module.mlirbc, input.mlir, entry.json}; the root is private to
its user (created 0700). An entry is written to a staging directory `.<key[:8]>-<pid>-*` and renamed into
place, so a reader never sees a half-written entry; a staging directory whose process died is removed at
the next start.

Trust: an entry is used only if its shard directory, its directory and its files are this user's and
writable by no one else (anything else may have been planted by another user: it is ignored with a
CacheWarning), and if entry.json names this entry's key and sha256s that every file matches. A process
checks the digests the first time it uses an entry and again whenever a file's stamp (size, mtime, ctime,
inode) changes, so a later hit costs a few stats, not a read of the module (hashing a 339 MB module takes
~0.35 s). A damaged entry is removed and rebuilt. No compile flags are read from an entry: it records only
whether the target's tuning flags were dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import CacheWarning
from ..files import cache_root, distrust  # noqa: F401  (cache_root: also the lowering's name for it)
from .compiler import owned_tempdir, remove_orphans

FILES = ("module.vmfb", "module.mlirbc", "input.mlir")
RECORD = "entry.json"
FORMAT = 3  # 3: modules import the library roles (dnn.*, blas.*); entries of 2 are rebuilt
_STAGING = re.compile(r"\.[0-9a-f]{8}-(\d+)-[a-z0-9_]+")  # owned_tempdir(".<key[:8]>-")


def _warn(message: str) -> None:
    warnings.warn(message, CacheWarning, stacklevel=4)


@lru_cache(maxsize=None)
def remove_stale(root: Path | None, tmp: str) -> None:
    """Once per process: remove what processes killed midway left behind (their iree-compile and stage
    temporary directories in `tmp`, their staging directories in the cache)."""
    remove_orphans(tmp)
    for shard in root.glob("??") if root is not None else ():
        remove_orphans(shard, _STAGING)


@lru_cache(maxsize=None)
def host_cpu() -> str:
    """CPU artifacts are built for the host's features: the cache key includes the CPU model."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=None)
def code_digest() -> str:
    """Digest of rocmc's own sources: an artifact built by other lowering code is another entry."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def cache_key(**parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Hit:
    dir: Path
    metadata: dict
    tuning_dropped: bool  # the module was compiled without the target's tuning flags


class _Rejected(Exception):
    """Why an entry is not used; `path` is what gets removed."""

    def __init__(self, why: str, path: Path):
        super().__init__(why)
        self.path = path


# entry directory -> stamp of its files when their digests last matched, in this process
_verified: dict[Path, tuple] = {}


class Cache:
    def __init__(self, root: Path):
        self.root = Path(root)

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> Hit | None:
        d = self.entry_dir(key)
        try:
            stamp = _trusted_stamp(d)
            if stamp is None:
                return None
            record = _read_record(d, key)
            if _verified.get(d) != stamp:
                _check_files(d, record)
                _verified[d] = stamp
            return Hit(d, record["metadata"], record["tuning_dropped"])
        except _Rejected as e:
            why, path = str(e), e.path
        except OSError as e:
            why, path = e.strerror or str(e), d
        _warn(f"ignoring cache entry {d}: {why}; compiling afresh")
        _verified.pop(d, None)
        _remove(path)
        return None

    def put(
        self, key: str, vmfb: bytes, metadata: dict, input_mlir: str, bytecode: bytes, *, tuning_dropped: bool
    ) -> Path | None:
        """Store an entry and return its directory; None when it can't be stored (a CacheWarning says
        why) or another process stored it first."""
        d = self.entry_dir(key)
        files = {"module.vmfb": vmfb, "module.mlirbc": bytecode, "input.mlir": input_mlir.encode()}
        record = json.loads(
            json.dumps(
                {  # as it reads back, so the digest of what is read matches
                    "format": FORMAT,
                    "key": key,
                    "files": {n: hashlib.sha256(b).hexdigest() for n, b in files.items()},
                    "tuning_dropped": bool(tuning_dropped),
                    "metadata": metadata,
                }
            )
        )
        files[RECORD] = json.dumps({**record, "digest": _digest(record)}).encode()
        tmp = None
        try:
            d.parent.mkdir(mode=0o700, exist_ok=True)
            tmp = owned_tempdir(f".{key[:8]}-", dir=d.parent)
            for name, data in files.items():
                _write_private(tmp / name, data)
            os.rename(tmp, d)
        except OSError as e:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            if not os.path.isdir(d):  # else another process won the race to store it
                _warn(f"can't write cache entry {d} ({e.strerror or e}); the module is not cached")
            return None
        try:
            _verified[d] = _trusted_stamp(d)
        except (_Rejected, OSError):
            pass
        return d

    def verify(self, key: str) -> bool:
        """Full check of one entry (trust, record and every file's digest), whatever this process saw."""
        d = self.entry_dir(key)
        try:
            if _trusted_stamp(d) is None:
                return False
            _check_files(d, _read_record(d, key))
            return True
        except (_Rejected, OSError):
            return False


def _trusted_stamp(d: Path) -> tuple | None:
    """The stamp of an entry's files after checking that it, its files and its shard can be trusted;
    None when there is no entry."""
    try:
        entry = os.lstat(d)
    except (FileNotFoundError, NotADirectoryError):
        return None
    why = distrust(os.lstat(d.parent), directory=True)
    if why:
        raise _Rejected(f"its shard directory {d.parent.name} is {why}", d.parent)
    why = distrust(entry, directory=True)
    if why:
        raise _Rejected(f"its directory is {why}", d)
    stamp = []
    for name in (*FILES, RECORD):
        try:
            st = os.lstat(d / name)
        except FileNotFoundError:
            raise _Rejected(f"{name} is missing", d) from None
        why = distrust(st, directory=False)
        if why:
            raise _Rejected(f"{name} is {why}", d)
        stamp.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(stamp)


def _read_record(d: Path, key: str) -> dict:
    try:
        record = json.loads((d / RECORD).read_bytes())
    except (ValueError, RecursionError):
        raise _Rejected(f"{RECORD} is not valid JSON (damaged)", d) from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise _Rejected(f"{RECORD} is not of format {FORMAT}", d)
    if record.pop("digest", None) != _digest(record):
        raise _Rejected(f"{RECORD} does not match its digest (damaged)", d)
    if record.get("key") != key:
        raise _Rejected(f"{RECORD} is the record of another entry", d)
    files = record.get("files")
    if not (
        isinstance(files, dict)
        and sorted(files) == sorted(FILES)
        and all(isinstance(v, str) for v in files.values())
        and type(record.get("tuning_dropped")) is bool
        and isinstance(record.get("metadata"), dict)
    ):
        raise _Rejected(f"{RECORD} lacks the files' digests, tuning_dropped (a boolean) or the metadata", d)
    return record


def _check_files(d: Path, record: dict) -> None:
    with ThreadPoolExecutor(len(FILES)) as pool:  # hashlib releases the GIL: large files in parallel
        digests = dict(zip(FILES, pool.map(lambda name: _sha256(d / name), FILES)))
    for name in FILES:
        if digests[name] != record["files"][name]:
            raise _Rejected(f"{name} does not match its digest (damaged)", d)


def _digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_private(path: Path, data: bytes) -> None:
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(data)


def _remove(path: Path) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)
