"""Content-addressed compile cache: (graph hash, target, options, versions) -> compiled artifact.

Layout: <root>/<key[:2]>/<key>/{module.vmfb, input.mlir, module.mlirbc, entry.json}. Entries are
written to a temporary directory and renamed into place (atomic), so a reader never sees a half-written
entry. A hit costs the entry.json read and a check of the module's size and header, not a read of the
module: the Artifact maps the file when it is loaded (large modules are mostly weights). A truncated or
damaged entry (size or header wrong, files missing) is removed and rebuilt; entry.json also keeps the
module's sha256, which `Cache.verify` checks in full.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path


def cache_root() -> Path | None:
    """None when caching is off (ROCMC_CACHE=0)."""
    if os.environ.get("ROCMC_CACHE", "1").lower() in ("0", "off", "false", "no"):
        return None
    root = os.environ.get("ROCMC_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rocmc"


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


VMFB_HEADER_PROBE = b"\0" * 64     # how many leading bytes of the module an entry records


class Cache:
    def __init__(self, root: Path):
        self.root = Path(root)

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> dict | None:
        d = self.entry_dir(key)
        try:
            entry = json.loads((d / "entry.json").read_text())
            module = d / "module.vmfb"
            with open(module, "rb") as f:
                header = f.read(len(VMFB_HEADER_PROBE))
                size = os.fstat(f.fileno()).st_size
            if size != entry["size"] or header != entry["header"].encode("latin-1"):
                raise ValueError("size or header mismatch")
            if not (d / "input.mlir").is_file() or not (d / "module.mlirbc").is_file():
                raise FileNotFoundError(d)
            return {"path": module, "metadata": entry["metadata"], "input_mlir": d / "input.mlir", "dir": d}
        except FileNotFoundError:
            if d.exists():
                shutil.rmtree(d, ignore_errors=True)   # partial entry
            return None
        except (ValueError, KeyError, OSError, json.JSONDecodeError):
            shutil.rmtree(d, ignore_errors=True)       # corrupt: rebuild
            return None

    def put(self, key: str, vmfb: bytes, metadata: dict, input_mlir: str, bytecode: bytes) -> Path:
        d = self.entry_dir(key)
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=d.parent))
        (tmp / "module.vmfb").write_bytes(vmfb)
        (tmp / "input.mlir").write_text(input_mlir)
        (tmp / "module.mlirbc").write_bytes(bytecode)
        (tmp / "entry.json").write_text(json.dumps({
            "sha256": hashlib.sha256(vmfb).hexdigest(), "size": len(vmfb),
            "header": vmfb[:len(VMFB_HEADER_PROBE)].decode("latin-1"), "metadata": metadata}))
        try:
            os.rename(tmp, d)
        except OSError:          # another process won the race; its entry is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
        return d

    def verify(self, key: str) -> bool:
        """Full check of one entry: the module's sha256 against the one recorded when it was written."""
        d = self.entry_dir(key)
        try:
            entry = json.loads((d / "entry.json").read_text())
            return hashlib.sha256((d / "module.vmfb").read_bytes()).hexdigest() == entry["sha256"]
        except (OSError, ValueError, KeyError):
            return False
