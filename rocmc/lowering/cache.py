"""Content-addressed compile cache: (graph hash, target, options, versions) -> compiled artifact.

Layout: <root>/<key[:2]>/<key>/{module.vmfb, input.mlir, module.mlirbc, entry.json}. Entries are
written to a temporary directory and renamed into place (atomic); entry.json holds the vmfb's
sha256, so a truncated or corrupted entry is detected, removed and rebuilt.
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


class Cache:
    def __init__(self, root: Path):
        self.root = Path(root)

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> dict | None:
        d = self.entry_dir(key)
        try:
            entry = json.loads((d / "entry.json").read_text())
            vmfb = (d / "module.vmfb").read_bytes()
            if hashlib.sha256(vmfb).hexdigest() != entry["sha256"]:
                raise ValueError("checksum mismatch")
            return {"vmfb": vmfb, "metadata": entry["metadata"], "input_mlir": (d / "input.mlir").read_text(),
                    "dir": d}
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
        (tmp / "entry.json").write_text(json.dumps({"sha256": hashlib.sha256(vmfb).hexdigest(),
                                                    "metadata": metadata}))
        try:
            os.rename(tmp, d)
        except OSError:          # another process won the race; its entry is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
        return d
