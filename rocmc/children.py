"""The one way rocmc starts a child process, so that no child outlives the process that started it.

Every tool rocmc runs (iree-compile, clang, the host C compiler, iree-dump-module, the ranks of
`rocmc launch`) starts through `run` or `popen`. On Linux each child gets a parent-death signal
(PR_SET_PDEATHSIG, SIGKILL), so it ends even when this process is killed with SIGKILL. That signal fires
when the *thread* that forked the child ends, not the process, so every child is forked by one daemon
thread that lives as long as the process (the spawner); the calling thread only waits for its child,
which therefore neither dies with a short-lived worker thread nor outlives the process.

The signal is armed by a tiny exec wrapper, not a preexec_fn: `python -I -S -c <wrapper>` calls prctl,
exits if its parent is no longer this process (it died before the signal was armed), then execs the
command in place, keeping the pid. A preexec_fn runs Python between fork and exec, which can deadlock on
a lock another thread held at the fork (and rules out vfork); the wrapper costs one interpreter start
(about 15 ms) per child and keeps subprocess on its thread-safe path. A command that can't be executed
raises the same OSError as with subprocess (reported through a close-on-exec pipe). Elsewhere than on
Linux, children are plain subprocesses.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading

__all__ = ["run", "popen"]

_LINUX = sys.platform.startswith("linux")

# Runs in the child, between the fork and the command: argv = [parent pid, status fd, restore signals, command...].
_WRAPPER = """\
import ctypes, os, signal, sys
parent, status, restore = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
if ctypes.CDLL(None, use_errno=True).prctl(1, 9) != 0:      # PR_SET_PDEATHSIG, SIGKILL
    os.write(status, b"prctl:%d" % ctypes.get_errno())
    os._exit(255)
if os.getppid() != parent:                                  # the parent died before the signal was armed
    os._exit(255)
os.set_inheritable(status, False)                           # closed by a successful exec: EOF for the parent
if restore:                                                 # as subprocess's restore_signals: Python ignores these
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
try:
    os.execvp(sys.argv[4], sys.argv[4:])
except OSError as e:
    os.write(status, b"exec:%d" % (e.errno or 0))
os._exit(255)
"""

# Popen options that would bypass the wrapper or the thread-safety it gives.
_UNSUPPORTED = ("preexec_fn", "executable", "shell")


def run(
    cmd, *, input=None, capture_output: bool = False, timeout: float | None = None, check: bool = False, **kwargs
) -> subprocess.CompletedProcess:
    """As subprocess.run: run `cmd` to its end and return a CompletedProcess. On any exception while
    waiting (TimeoutExpired, KeyboardInterrupt, ...) the child is killed and reaped before it propagates."""
    if input is not None:
        if kwargs.get("stdin") is not None:
            raise ValueError("stdin and input arguments may not both be used")
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        if kwargs.get("stdout") is not None or kwargs.get("stderr") is not None:
            raise ValueError("stdout and stderr arguments may not be used with capture_output")
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with popen(cmd, **kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except BaseException:
            _kill(proc)
            raise
        code = proc.poll()
    if check and code:
        raise subprocess.CalledProcessError(code, proc.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(proc.args, code, stdout, stderr)


def popen(cmd, **kwargs) -> subprocess.Popen:
    """As subprocess.Popen(cmd, **kwargs), for a child that ends with this process (see the module's
    docstring). The caller owns the returned Popen: wait for it, or kill it, as with subprocess."""
    bad = [k for k in _UNSUPPORTED if kwargs.get(k)]
    if bad:
        raise TypeError(
            f"rocmc.children: {', '.join(bad)} can't be used (the child is started through a "
            "wrapper that arms its parent-death signal)"
        )
    args = [cmd] if isinstance(cmd, (str, bytes, os.PathLike)) else list(cmd)
    if not args:
        raise ValueError("rocmc.children: empty command")
    if not _LINUX or not sys.executable:
        return subprocess.Popen(args, **kwargs)
    status_r, status_w = os.pipe()
    restore = "1" if kwargs.get("restore_signals", True) else "0"
    argv = [sys.executable, "-I", "-S", "-c", _WRAPPER, str(os.getpid()), str(status_w), restore, *args]
    kwargs["pass_fds"] = (*kwargs.get("pass_fds", ()), status_w)
    req = _Request(argv, kwargs, status_w)
    proc, status = None, b""
    try:
        _spawner().put(req)
        req.done.wait()
        proc = req.proc
        if proc is not None:
            status = _read_to_end(status_r)
    except BaseException:
        with req.lock:
            req.abandoned = True
            proc = req.proc
        if proc is not None:
            _kill(proc)
        raise
    finally:
        os.close(status_r)
    if req.error is not None:
        raise req.error
    proc.args = cmd  # what the caller ran, in errors and CompletedProcess, not the wrapper
    if status:
        _kill(proc)
        what, _, number = status.decode("ascii", "replace").partition(":")
        err = int(number) if number.isdigit() else 0
        if what == "exec":
            raise OSError(err, os.strerror(err), os.fsdecode(args[0]))
        raise OSError(err, f"arming the parent-death signal of {os.fsdecode(args[0])} failed: {os.strerror(err)}")
    return proc


# ---- the spawner thread ------------------------------------------------------------------------------------


class _Request:
    __slots__ = ("argv", "kwargs", "status_w", "done", "lock", "proc", "error", "abandoned")

    def __init__(self, argv, kwargs, status_w):
        self.argv, self.kwargs, self.status_w = argv, kwargs, status_w
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.proc = self.error = None
        self.abandoned = False  # the caller gave up waiting (an exception): the spawner kills the child


def _serve(requests: queue.SimpleQueue) -> None:
    """The spawner's loop: fork each requested child from this thread, which never ends while the process
    lives, so the children's parent-death signal fires only when the process ends."""
    while True:
        req = requests.get()
        try:
            if not req.abandoned:
                proc = subprocess.Popen(req.argv, **req.kwargs)
                with req.lock:
                    req.proc = proc
                    abandoned = req.abandoned
                if abandoned:
                    _kill(proc)
        except BaseException as e:  # noqa: BLE001 - reported to the caller, which raises it
            req.error = e
        finally:
            os.close(req.status_w)  # the child holds its own copy; this one would hide its exec's EOF
            req.done.set()


_lock = threading.Lock()
_requests: queue.SimpleQueue | None = None


def _spawner() -> queue.SimpleQueue:
    global _requests
    with _lock:
        if _requests is None:
            requests = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(requests,), name="rocmc-spawner", daemon=True).start()
            _requests = requests
        return _requests


def _after_fork() -> None:
    """A forked child has no spawner thread (only the forking thread survives a fork): it starts its own."""
    global _lock, _requests
    _lock, _requests = threading.Lock(), None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _read_to_end(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 256):
        data += chunk
    return data


def _kill(proc: subprocess.Popen) -> None:
    """Kill and reap `proc`, closing its pipes."""
    try:
        proc.kill()
    except OSError:
        pass
    proc.wait()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
