"""Files rocmc writes and the directories it keeps them in, shared by every layer.

`write_atomic` writes a file whole or not at all; `umask` reads the process's umask (a saved model or
weights file gets 0644 less it, not mkstemp's 0600); `cache_root` is the user's private cache directory
(created 0700, used only if it is this user's and no one else can write it: `distrust` says why not),
where the lowering keeps its compile cache and kernels and the runtime its native pieces.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import warnings
from pathlib import Path

from .errors import CacheWarning


def write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write `path` whole or not at all: through a temporary file of a random name, created exclusively
    in the same directory (never following a planted link; mode 0600 unless `mode`), renamed over it
    once complete, and removed on any failure."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def umask() -> int:
    """The process's umask."""
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def distrust(st: os.stat_result, *, directory: bool) -> str | None:
    """Why a cache file or directory can't be trusted, or None: it must be a plain file (directory) of
    this user's that no one else can write."""
    if not (stat.S_ISDIR if directory else stat.S_ISREG)(st.st_mode):
        return "not a plain directory" if directory else "not a plain file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o022:
        return f"group- or world-writable (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def cache_root() -> Path | None:
    """The user's cache directory (created 0700). None when caching is off (ROCMC_CACHE=0) or when the
    directory can't be used or trusted (with a CacheWarning)."""
    if os.environ.get("ROCMC_CACHE", "1").lower() in ("0", "off", "false", "no"):
        return None
    root = os.environ.get("ROCMC_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "rocmc")
    root = Path(root)
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        why = distrust(os.stat(root), directory=True)
    except OSError as e:
        why = e.strerror or str(e)
    if why is None and not os.access(root, os.W_OK | os.X_OK):
        why = "not writable"
    if why is not None:
        # stacklevel: the caller of whoever asked for the root (rocmc.compile's caller, say)
        warnings.warn(
            f"compile cache {root} can't be used ({why}); compiling without the cache", CacheWarning, stacklevel=3
        )
        return None
    return root
