"""`rocmc launch -n N command...`: start one process per GPU, as torchrun does, and end them together.

Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (a free port
unless given), a ROCMC_GROUP_KEY that only its own ranks know, and NCCL_NVLS_ENABLE=0 unless the caller
set it (NVLink multicast stays off). When NCCL was installed by pip (PyTorch's wheels), the directory of
a link naming it as IREE loads it is put first on the ranks' LD_LIBRARY_PATH. When a rank ends with an
error, the others are stopped (SIGTERM, then SIGKILL after GRACE seconds) and launch returns its code:
no rank is left running.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
import time

from .. import children
from ..errors import InputError
from .distributed import GRACE


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, n: int, port: int, key: str, base=None) -> dict:
    env = dict(os.environ if base is None else base)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(n),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(n),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        ROCMC_GROUP_KEY=key,
    )
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    return env


def launch(n: int, command: list, *, port: int | None = None, grace: float = GRACE) -> int:
    """Run `command` as ranks 0..n-1; returns 0 when every rank succeeded, else the first failing code."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"launch: -n {n!r}: expected a number of processes >= 1")
    if not command:
        raise InputError("launch: no command given (e.g. `rocmc launch -n 2 rocmc generate ...`)")
    if command[0] == "rocmc":  # this installation's rocmc, whatever PATH says
        command = [sys.executable, "-m", "rocmc.cli", *command[1:]]
    port = port or free_port()
    key = secrets.token_hex(16)
    from .native import library_dir

    libs = library_dir("cuda")  # a pip-installed NCCL, linked under the name IREE loads
    procs = []
    for r in range(n):
        env = rank_env(r, n, port, key)
        if libs is not None:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p)
        # Each rank leads its own session (stop() signals its whole group) and ends with this process,
        # even one killed with SIGKILL (rocmc.children).
        procs.append(children.popen(command, env=env, start_new_session=True))

    def stop(sig=signal.SIGTERM):
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    def on_signal(signum, frame):
        stop(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        failed: list = []
        while not failed and any(p.poll() is None for p in procs):
            failed = [(r, p.returncode) for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if not failed:
                time.sleep(0.01)
        failed = failed or [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
        if not failed:
            return 0
        # Every rank found failed at once is named: the one that failed first may not be the lowest.
        said = ", ".join(f"rank {r} exited with " + (f"signal {-c}" if c < 0 else f"code {c}") for r, c in failed)
        if any(p.poll() is None for p in procs):
            print(f"rocmc launch: {said}; stopping the other ranks", file=sys.stderr, flush=True)
            stop()
            deadline = time.monotonic() + grace
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.05)
            stop(signal.SIGKILL)
            for p in procs:
                p.wait()
        else:
            print(f"rocmc launch: {said}", file=sys.stderr, flush=True)
        code = failed[0][1]
        return code if code > 0 else 128 - code
    finally:
        for s, h in old.items():
            signal.signal(s, h)
