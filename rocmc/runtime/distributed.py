"""The processes of a tensor-parallel run: the launcher's environment, the rendezvous, and the group.

One process per GPU, started by `rocmc launch -n N` or any torchrun-style launcher: RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT say who each process is and where rank 0 listens. The ranks meet
there over TCP and keep that connection for what they must agree on around the device work: the
collective library's unique id (broadcast from rank 0 when IREE creates its channel, see
rocmc/runtime/native), a fingerprint of what each rank loaded, a sampling seed, and, on the CPU target
only, the all-reduce and all-gather themselves (the CPU has no collective library; `collectives` calls
of a CPU module come here). Device tensors never travel here: on GPUs the collectives are NCCL or RCCL
calls that IREE enqueues on its own stream.

A rank that ends without leaving the group (a crash, a kill) closes its connection: rank 0 sees it and
tells the others. A rank waiting on the group then raises DistributedError naming the rank; a rank busy on
its device (inside NCCL, waiting for the dead peer) is ended after GRACE seconds by an alarm, with the
message printed first. No rank is left hanging.

`simulate(n)` runs n ranks as threads of one process over numpy: `rocmc.evaluate` of every rank's
graph, which is how the sharding of a model is checked against the unsharded one.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..errors import DistributedError
from ..group import OUTSIDE, install as _install

TIMEOUT = float(os.environ.get("ROCMC_RENDEZVOUS_TIMEOUT", "300"))  # seconds for every rank to join
GRACE = int(os.environ.get("ROCMC_ABORT_GRACE", "10"))  # seconds a failed rank may take to end
_MAGIC = 0x524F434D  # "ROCM"
_FRAME = struct.Struct("!IIQ")  # magic, header bytes, payload bytes
_MAX_HEADER = 1 << 20


@dataclass(frozen=True)
class Env:
    """Who this process is in its run, from the launcher's variables."""

    rank: int
    world_size: int
    local_rank: int
    addr: str
    port: int
    key: str = ""  # ROCMC_GROUP_KEY: set by `rocmc launch`, so that only its ranks join

    @classmethod
    def from_environ(cls, environ=None) -> "Env":
        e = os.environ if environ is None else environ

        def number(name, default=None):
            raw = e.get(name)
            if raw is None or raw == "":
                if default is None:
                    raise DistributedError(
                        f"{name} is not set: start the ranks with `rocmc launch -n N ...` "
                        f"(or a torchrun-style launcher setting RANK, WORLD_SIZE, LOCAL_RANK, "
                        f"MASTER_ADDR, MASTER_PORT)"
                    )
                return default
            try:
                return int(raw)
            except ValueError:
                raise DistributedError(f"{name}={raw!r}: expected an integer") from None

        world = number("WORLD_SIZE", 1)
        rank = number("RANK", 0)
        if world < 1 or not 0 <= rank < world:
            raise DistributedError(f"RANK={rank}, WORLD_SIZE={world}: expected 0 <= RANK < WORLD_SIZE")
        local = number("LOCAL_RANK", rank)
        port = number("MASTER_PORT") if world > 1 else number("MASTER_PORT", 0)
        if world > 1 and not 0 < port < 65536:
            raise DistributedError(f"MASTER_PORT={port}: expected a TCP port in 1..65535")
        return cls(rank, world, local, e.get("MASTER_ADDR") or "127.0.0.1", port, e.get("ROCMC_GROUP_KEY", ""))


# ---- wire format: a JSON header and raw bytes, bounded and checked ---------------------------------


def _send(sock, kind: str, seq: int, meta=None, payload: bytes = b"") -> None:
    head = json.dumps({"k": kind, "s": seq, "m": meta or {}}).encode()
    sock.sendall(_FRAME.pack(_MAGIC, len(head), len(payload)) + head + payload)


def _recv_exact(sock, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 22))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(sock):
    """(kind, seq, meta, payload), or None when the peer closed the connection."""
    raw = _recv_exact(sock, _FRAME.size)
    if raw is None:
        return None
    magic, nhead, npay = _FRAME.unpack(raw)
    if magic != _MAGIC or nhead > _MAX_HEADER:
        raise DistributedError("a connection to the group sent something that is not a rocmc message")
    head = _recv_exact(sock, nhead)
    payload = _recv_exact(sock, npay) if npay else b""
    if head is None or payload is None:
        return None
    try:
        msg = json.loads(head)
        return str(msg["k"]), int(msg["s"]), dict(msg["m"]), payload
    except (ValueError, KeyError, TypeError):
        raise DistributedError("a connection to the group sent a malformed rocmc message") from None


class ProcessGroup:
    """The ranks of one run, connected through rank 0. Every method is collective: each rank calls it in
    the same order (a rank that calls another method is an error in every rank)."""

    def __init__(self, env: Env, timeout: float = TIMEOUT):
        self.env, self.rank, self.world_size, self.local_rank = env, env.rank, env.world_size, env.local_rank
        self._seq = 0
        self._cond = threading.Condition()
        self._inbox: dict = {}  # seq -> {rank: (kind, meta, payload)}  (rank 0) / (kind, meta, payload)
        self._failure: str | None = None
        self._left: set = set()
        self._closing = False
        self._peers: dict = {}
        self._sock = None
        if self.world_size > 1:
            (self._serve if self.rank == 0 else self._join)(timeout)

    # ---- rendezvous ----
    def _serve(self, timeout: float) -> None:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind((self.env.addr, self.env.port))
        except OSError as e:
            raise DistributedError(
                f"rank 0 can't listen on {self.env.addr}:{self.env.port} (MASTER_ADDR, MASTER_PORT): {e.strerror or e}"
            ) from None
        srv.listen(self.world_size)
        deadline = time.monotonic() + timeout
        try:
            while len(self._peers) < self.world_size - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(1, self.world_size)) - set(self._peers))
                    raise DistributedError(
                        f"rank(s) {', '.join(map(str, missing))} did not join the group at {self.env.addr}:"
                        f"{self.env.port} within {timeout:.0f} s (WORLD_SIZE={self.world_size}): start every "
                        f"rank (`rocmc launch -n {self.world_size}` starts them all)"
                    )
                srv.settimeout(left)
                try:
                    conn, _ = srv.accept()
                except socket.timeout:
                    continue
                conn.settimeout(max(1.0, min(left, 30.0)))
                try:
                    hello = _recv(conn)
                except (OSError, DistributedError):
                    hello = None
                conn.settimeout(None)
                if hello is None or hello[0] != "hello" or hello[2].get("key", "") != self.env.key:
                    conn.close()  # not one of this run's ranks
                    continue
                r, world = hello[2].get("rank"), hello[2].get("world_size")
                why = (
                    f"WORLD_SIZE={world} differs from rank 0's {self.world_size}"
                    if world != self.world_size
                    else f"rank {r} joined twice"
                    if r in self._peers
                    else f"rank {r} is outside 1..{self.world_size - 1}"
                    if not (isinstance(r, int) and 0 < r < self.world_size)
                    else None
                )
                if why:
                    _send(conn, "abort", 0, {"why": why})
                    conn.close()
                    raise DistributedError(f"a rank could not join the group: {why}")
                self._peers[r] = conn
        except BaseException:
            for c in self._peers.values():
                with contextlib.suppress(OSError):
                    _send(c, "abort", 0, {"why": "rank 0 could not form the group"})
                    c.close()
            raise
        finally:
            srv.close()
        for c in self._peers.values():
            _send(c, "welcome", 0)
        threading.Thread(target=self._monitor_hub, name="rocmc-group", daemon=True).start()

    def _join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock = socket.create_connection((self.env.addr, self.env.port), timeout=5)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise DistributedError(
                        f"rank {self.rank} could not reach rank 0 at {self.env.addr}:"
                        f"{self.env.port} within {timeout:.0f} s ({e.strerror or e}): is "
                        f"rank 0 running (MASTER_ADDR, MASTER_PORT)?"
                    ) from None
                time.sleep(0.1)
        sock.settimeout(None)
        _send(sock, "hello", 0, {"rank": self.rank, "world_size": self.world_size, "key": self.env.key})
        sock.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            reply = _recv(sock)
        except socket.timeout:
            reply = ("timeout", 0, {"why": f"the group did not form within {timeout:.0f} s (a missing rank?)"}, b"")
        sock.settimeout(None)
        if reply is None or reply[0] != "welcome":
            why = reply[2].get("why", "") if reply else "rank 0 closed the connection"
            raise DistributedError(f"rank {self.rank} could not join the group: {why}")
        self._sock = sock
        threading.Thread(target=self._monitor_peer, name="rocmc-group", daemon=True).start()

    # ---- failure handling ----
    def _monitor_hub(self) -> None:
        sel = selectors.DefaultSelector()
        for r, c in self._peers.items():
            sel.register(c, selectors.EVENT_READ, r)
        while True:
            for key, _ in sel.select():
                r = key.data
                try:
                    msg = _recv(key.fileobj)
                except (OSError, DistributedError):
                    msg = None
                if msg is None or msg[0] == "bye":
                    sel.unregister(key.fileobj)
                    if msg is None and not self._closing:
                        self._fail(f"rank {r} ended unexpectedly (its connection to rank 0 closed)")
                    else:
                        self._leave(r)
                    if not sel.get_map():
                        return
                    continue
                kind, seq, meta, payload = msg
                with self._cond:
                    self._inbox.setdefault(seq, {})[r] = (kind, meta, payload)
                    self._cond.notify_all()

    def _monitor_peer(self) -> None:
        while True:
            try:
                msg = _recv(self._sock)
            except (OSError, DistributedError):
                msg = None
            if msg is None or msg[0] == "bye":
                if msg is None and not self._closing:
                    self._fail("rank 0 ended unexpectedly (its connection closed)")
                else:
                    self._leave(0)
                return
            kind, seq, meta, payload = msg
            if kind == "abort":
                self._fail(meta.get("why", "rank 0 ended the group"))
                return
            with self._cond:
                self._inbox[seq] = (kind, meta, payload)
                self._cond.notify_all()

    def _fail(self, why: str) -> None:
        with self._cond:
            if self._failure is not None:
                return
            self._failure = why
            self._cond.notify_all()
        if self.rank == 0:
            for r, c in self._peers.items():
                with contextlib.suppress(OSError):
                    _send(c, "abort", 0, {"why": why})
        print(f"rocmc: rank {self.rank}: {why}; ending this rank", file=sys.stderr, flush=True)
        # A rank inside device work (an NCCL call waiting for the dead peer) can't see an exception:
        # the alarm's default action ends the process if it has not ended by then.
        with contextlib.suppress(ValueError, AttributeError):
            signal.alarm(GRACE)

    def _leave(self, rank: int) -> None:
        """`rank` left the group at its end (not a failure); a collective that needs it fails."""
        with self._cond:
            self._left.add(rank)
            self._cond.notify_all()

    def _check(self) -> None:
        if self._failure is not None:
            raise DistributedError(f"rank {self.rank}: {self._failure}")
        if self._left:
            raise DistributedError(
                f"rank {self.rank}: a collective needs rank(s) {', '.join(map(str, sorted(self._left)))}, "
                f"which already left the group (ranks called different collectives?)"
            )

    # ---- the collective exchange every operation is made of ----
    def _exchange(self, kind: str, meta: dict, payload: bytes, combine):
        """Send this rank's part to rank 0; rank 0 combines all parts (in rank order) with
        `combine(parts) -> [(meta, payload) per rank]` and sends each rank its result."""
        self._check()
        if self.world_size == 1:
            return combine([(meta, payload)])[0]
        self._seq += 1
        seq = self._seq
        if self.rank != 0:
            try:
                _send(self._sock, kind, seq, meta, payload)
            except OSError:
                self._fail("rank 0 ended unexpectedly (its connection closed)")
                self._check()
            with self._cond:
                while seq not in self._inbox and self._failure is None and not self._left:
                    self._cond.wait()
                if seq not in self._inbox:
                    self._check()
                got = self._inbox.pop(seq)
            if got[0] == "error":
                raise DistributedError(got[1]["why"])
            return got[1], got[2]
        with self._cond:
            while (
                len(self._inbox.get(seq, {})) < self.world_size - 1
                and self._failure is None
                and not (self._left - set(self._inbox.get(seq, {})))
            ):
                self._cond.wait()
            if len(self._inbox.get(seq, {})) < self.world_size - 1:
                self._check()
            parts = self._inbox.pop(seq)
        kinds = {r: p[0] for r, p in parts.items()}
        wrong = {r: k for r, k in kinds.items() if k != kind}
        if wrong:
            r, k = next(iter(wrong.items()))
            why = f"ranks called different collectives: rank 0 called {kind}, rank {r} called {k}"
            for c in self._peers.values():
                _send(c, "error", seq, {"why": why})
            raise DistributedError(why)
        ordered = [(meta, payload)] + [(parts[r][1], parts[r][2]) for r in range(1, self.world_size)]
        try:
            results = combine(ordered)
        except DistributedError as e:
            for c in self._peers.values():
                _send(c, "error", seq, {"why": str(e)})
            raise
        for r in range(1, self.world_size):
            _send(self._peers[r], "result", seq, *results[r])
        return results[0]

    # ---- operations ----
    def broadcast(self, data: bytes | None, root: int = 0) -> bytes:
        """Rank `root`'s bytes, on every rank."""
        if not 0 <= root < self.world_size:
            raise DistributedError(f"broadcast: root {root} is outside 0..{self.world_size - 1}")
        mine = bytes(data or b"") if self.rank == root else b""
        return self._exchange("broadcast", {"root": root}, mine, lambda parts: [({}, parts[root][1])] * len(parts))[1]

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's bytes, in rank order, on every rank."""

        def combine(parts):
            sizes = [len(p[1]) for p in parts]
            return [({"sizes": sizes}, b"".join(p[1] for p in parts))] * len(parts)

        meta, blob = self._exchange("all_gather", {}, bytes(data), combine)
        out, at = [], 0
        for n in meta["sizes"]:
            out.append(blob[at : at + n])
            at += n
        return out

    def agree(self, what: str, value: str) -> None:
        """Every rank must hold the same `value` (e.g. a checkpoint fingerprint); DistributedError on all
        ranks naming those that differ from rank 0 otherwise."""
        values = [v.decode() for v in self.all_gather_bytes(value.encode())]
        differ = [r for r, v in enumerate(values) if v != values[0]]
        if differ:
            raise DistributedError(
                f"the ranks loaded different {what}: rank(s) {', '.join(map(str, differ))} "
                f"differ from rank 0 ({values[differ[0]][:80]!r} vs {values[0][:80]!r})"
            )

    def all_reduce(self, x: np.ndarray) -> np.ndarray:
        """The sum over ranks (in rank order, in x's dtype) of a host array."""
        x = np.ascontiguousarray(x)
        meta = {"dtype": x.dtype.str, "shape": list(x.shape)}

        def combine(parts):
            _same_layout("all_reduce", parts)
            acc = np.frombuffer(parts[0][1], np.dtype(parts[0][0]["dtype"])).copy()
            for m, p in parts[1:]:
                acc += np.frombuffer(p, acc.dtype)
            return [(parts[0][0], acc.tobytes())] * len(parts)

        m, payload = self._exchange("all_reduce", meta, x.tobytes(), combine)
        return np.frombuffer(payload, x.dtype).reshape(x.shape).copy()

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        """The ranks' arrays stacked on a new leading axis, (world_size, *x.shape)."""
        x = np.ascontiguousarray(x)
        parts = self.all_gather_bytes(x.tobytes())
        if any(len(p) != x.nbytes for p in parts):
            raise DistributedError(f"all_gather: the ranks' arrays differ in size ({[len(p) for p in parts]} bytes)")
        return np.stack([np.frombuffer(p, x.dtype).reshape(x.shape) for p in parts])

    def barrier(self) -> None:
        self._exchange("barrier", {}, b"", lambda parts: [({}, b"")] * len(parts))

    def close(self) -> None:
        """Leave the group (each rank, at the end): its connection closing is then not a failure."""
        if self._closing:
            return
        self._closing = True
        socks = [self._sock] if self._sock is not None else list(self._peers.values())
        for s in socks:
            with contextlib.suppress(OSError):
                _send(s, "bye", 0)
                s.shutdown(socket.SHUT_WR)


def _same_layout(op: str, parts) -> None:
    first = parts[0][0]
    for r, (m, _) in enumerate(parts):
        if m.get("dtype") != first.get("dtype") or m.get("shape") != first.get("shape"):
            raise DistributedError(
                f"{op}: rank {r} gave {m.get('dtype')}{m.get('shape')}, rank 0 {first.get('dtype')}{first.get('shape')}"
            )


# ---- the group of this process ------------------------------------------------------------------

_group: ProcessGroup | None = None
_group_lock = threading.Lock()
_local = threading.local()


def init(world_size: int | None = None, timeout: float = TIMEOUT) -> ProcessGroup:
    """This process's group (formed on first use from the launcher's environment). `world_size`, when
    given, must be the launcher's WORLD_SIZE."""
    global _group
    with _group_lock:
        if _group is None:
            env = Env.from_environ()
            if world_size is not None and env.world_size != world_size:
                raise DistributedError(
                    f"tensor_parallel={world_size} but this process was started as one of WORLD_SIZE="
                    f"{env.world_size}: start {world_size} processes, one per GPU (`rocmc launch -n "
                    f"{world_size} ...`)"
                )
            _group = ProcessGroup(env, timeout)
            atexit.register(_leave_at_exit, _group)
        elif world_size is not None and _group.world_size != world_size:
            raise DistributedError(
                f"tensor_parallel={world_size} but this process's group has {_group.world_size} ranks"
            )
        return _group


def prepare(world_size: int, target_kind: str, device: str) -> tuple[ProcessGroup | None, str]:
    """Set this process up as one rank of a tensor-parallel program of `world_size` ranks, before its
    device opens: join the group and, on a GPU target, make IREE's collective channel span the ranks
    (runtime/native) and take this rank's own GPU (a `device` without an index gets LOCAL_RANK's).
    Returns (the group, the device to open); (None, device) for a program of one rank. Calling it again
    gives the same group and device."""
    if world_size <= 1:
        return None, device
    group = init(world_size)
    if target_kind != "cpu":
        from . import native

        native.collective_library(target_kind)
        native.install(group)
        if ":" not in device:
            device = f"{device}:{group.local_rank}"
    return group, device


def _leave_at_exit(group: ProcessGroup) -> None:
    """A rank that ends normally leaves the group, so that its peers (still finishing) don't take its end
    for a crash; one ending on an uncaught exception (sys.last_value) stays a failure for them."""
    if getattr(sys, "last_value", None) is None:
        group.close()


def current():
    """The group collectives of this thread use: a simulated rank's (see `simulate`), else the process's."""
    sim = getattr(_local, "rank", None)
    if sim is not None:
        return sim
    if _group is None:
        raise DistributedError(OUTSIDE)
    return _group


_install(current)  # rocmc.group.current() (the frontend's collective references) asks this


# ---- ranks as threads of one process, for checking shardings with rocmc.evaluate ---------------


class _SimulatedRank:
    def __init__(self, world, rank: int):
        self.world, self.rank, self.world_size, self.local_rank = world, rank, world.size, rank

    def all_reduce(self, x: np.ndarray) -> np.ndarray:
        parts = self.world.exchange(self.rank, np.asarray(x))
        return sum(parts[1:], parts[0].copy())

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        return np.stack(self.world.exchange(self.rank, np.asarray(x)))


class _SimulatedWorld:
    def __init__(self, size: int):
        self.size = size
        self.slots = [None] * size
        self.barrier = threading.Barrier(size)

    def exchange(self, rank: int, x):
        self.slots[rank] = x
        self.barrier.wait()
        parts = list(self.slots)
        self.barrier.wait()
        shapes = {p.shape for p in parts}
        if len(shapes) != 1:
            raise DistributedError(f"simulated collective: the ranks' arrays differ in shape {sorted(shapes)}")
        return parts


def simulate(world_size: int, fn):
    """Run fn(rank) for every rank as threads of this process, their collectives exchanging numpy arrays;
    returns [fn(0), ..., fn(world_size - 1)]. An exception in any rank is raised (the others are released)."""
    world = _SimulatedWorld(world_size)
    results, errors = [None] * world_size, [None] * world_size

    def run(r):
        _local.rank = _SimulatedRank(world, r)
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the caller's thread
            errors[r] = e
            world.barrier.abort()
        finally:
            _local.rank = None

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next(
        (e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
        next((e for e in errors if e is not None), None),
    )
    if first is not None:
        raise first
    return results
