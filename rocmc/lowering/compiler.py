"""The iree-compile driver: one call per (module, target), typed errors, optional stage dumps."""
from __future__ import annotations

import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from ..errors import CompileError
from .target import Target

# What `ir(stage)` names, and the file suffix IREE's phase dump gives it.
PHASES = ("input", "abi", "preprocessing", "global-optimization", "dispatch-creation", "flow", "stream",
          "executable-sources", "executable-configurations", "executable-targets", "hal", "vm")


@lru_cache(maxsize=None)
def iree_compile_path() -> str:
    from iree.compiler.tools.binaries import find_tool
    return find_tool("iree-compile")


@lru_cache(maxsize=None)
def iree_version() -> str:
    try:
        from iree.compiler.version import VERSION
        return VERSION
    except Exception:   # older layouts
        import importlib.metadata as md
        return md.version("iree-base-compiler")


def compile_bytecode(bytecode: bytes, target: Target, extra_flags=(), dump_dir: str | Path | None = None) -> bytes:
    """Compile an MLIR bytecode module to .vmfb bytes. With dump_dir, also write IREE's phase dumps
    (<dump_dir>/module.<n>.<phase>.mlir) and per-dispatch sources and binaries."""
    with tempfile.TemporaryDirectory(prefix="rocmc-") as tmp:
        src = Path(tmp) / "module.mlirbc"
        out = Path(tmp) / "module.vmfb"
        src.write_bytes(bytecode)
        cmd = [iree_compile_path(), str(src), "-o", str(out), *target.iree_flags(), *extra_flags]
        if dump_dir is not None:
            d = Path(dump_dir)
            d.mkdir(parents=True, exist_ok=True)
            cmd += [f"--dump-compilation-phases-to={d}", "--mlir-print-debuginfo",
                    f"--iree-hal-dump-executable-sources-to={d / 'sources'}",
                    f"--iree-hal-dump-executable-binaries-to={d / 'binaries'}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            diag = proc.stderr.replace(str(src), "<module>")
            if proc.returncode < 0:
                diag += f"\niree-compile was killed by signal {-proc.returncode}"
            raise CompileError(f"iree-compile failed for target {target}", stage="iree-compile",
                               diagnostics=_trim(diag))
        return out.read_bytes()


def _trim(text: str, limit: int = 8000) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"


def stage_files(dump_dir: str | Path) -> dict[str, Path]:
    """Map phase name -> dump file in a directory written by compile_bytecode(dump_dir=...)."""
    out = {}
    for p in Path(dump_dir).glob("*.mlir"):
        parts = p.name.split(".")
        if len(parts) >= 4 and parts[-3].isdigit():
            out[parts[-2]] = p
    return out
