"""The iree-compile driver: one call per (module, target), typed errors, optional stage dumps."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from ..children import run
from ..errors import CompileError
from .target import Target


@lru_cache(maxsize=None)
def iree_compile_path() -> str:
    from iree.compiler.tools.binaries import find_tool

    return find_tool("iree-compile")


@lru_cache(maxsize=None)
def iree_version() -> str:
    try:
        from iree.compiler.version import VERSION

        return VERSION
    except Exception:  # noqa: BLE001 - older layouts
        import importlib.metadata as md

        return md.version("iree-base-compiler")


# Constants larger than these are elided in the stage dumps (elements; characters of a resource's hex).
ELIDE_ELEMENTS = 1024
ELIDE_RESOURCE_CHARS = 8192


def compile_bytecode(bytecode: bytes, target: Target, extra_flags=(), dump_dir: str | Path | None = None) -> bytes:
    """Compile an MLIR bytecode module to .vmfb bytes. With dump_dir, also write IREE's phase dumps
    (<dump_dir>/module.<n>.<phase>.mlir) and per-dispatch sources and binaries."""
    tmp = owned_tempdir("rocmc-")
    try:
        src, out = tmp / "module.mlirbc", tmp / "module.vmfb"
        src.write_bytes(bytecode)
        cmd = [iree_compile_path(), str(src), "-o", str(out), *target.iree_flags(), *extra_flags]
        if dump_dir is not None:
            d = Path(dump_dir)
            d.mkdir(parents=True, exist_ok=True)
            cmd += [
                f"--dump-compilation-phases-to={d}",
                "--mlir-print-debuginfo",
                # Weights are left out of the dumps ("..." / a resource's name without its bytes):
                # printed, a model's weights would be written once per phase, in hex.
                f"--mlir-elide-elementsattrs-if-larger={ELIDE_ELEMENTS}",
                f"--mlir-elide-resource-strings-if-larger={ELIDE_RESOURCE_CHARS}",
                f"--iree-hal-dump-executable-sources-to={d / 'sources'}",
                f"--iree-hal-dump-executable-binaries-to={d / 'binaries'}",
            ]
        # run() kills the child on any exception here (KeyboardInterrupt included), and the child ends
        # with this process when it is killed outright (rocmc.children).
        proc = run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            diag = proc.stderr.replace(str(src), "<module>")
            if proc.returncode < 0:
                diag += f"\niree-compile was killed by signal {-proc.returncode}"
            raise CompileError(
                f"iree-compile failed for target {target}", stage="iree-compile", diagnostics=_trim(diag)
            )
        return out.read_bytes()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# Temporary directories name their owner's pid, so those left by a killed process can be found and removed.
_OWNED_TEMP = re.compile(r"rocmc-(?:stages-)?(\d+)-[a-z0-9_]+")


def owned_tempdir(prefix: str, dir=None) -> Path:
    """A new private temporary directory whose name carries this process's pid (see remove_orphans)."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=dir))


def remove_orphans(directory, pattern: re.Pattern = _OWNED_TEMP) -> None:
    """Remove this user's directories in `directory` whose name matches `pattern` (group 1: the owner's
    pid) and whose owner is no longer running."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for e in entries:
        m = pattern.fullmatch(e.name)
        try:
            mine = e.is_dir(follow_symlinks=False) and e.stat(follow_symlinks=False).st_uid == os.geteuid()
        except OSError:
            continue
        if m and mine and not _running(int(m.group(1))):
            shutil.rmtree(e.path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # running, as another user
        pass
    return True


def _trim(text: str, limit: int = 8000) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"
