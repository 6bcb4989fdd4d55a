"""Tensor parallelism: the launcher's environment, the process group over real sockets (ranks as processes
started by `rocmc launch`), failure detection, the collectives of a compiled CPU module, their GPU
lowering (compiled, not run) and the MPI bootstrap library IREE's channel provider loads."""

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.cli import main as cli_main
from rocmc.errors import DistributedError, GraphError, LoweringError
from rocmc.runtime import distributed, native
from rocmc.runtime.distributed import Env
from rocmc.runtime.launch import free_port

from helpers import TOL

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "ROCMC_GROUP_KEY",
    "PMI_RANK",
    "PMI_SIZE",
)


def _env(**extra) -> dict:
    """This process's environment without a launcher's variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def _launch(n: int, script: Path, *args, env=None) -> subprocess.CompletedProcess:
    """`rocmc launch -n n python script args...`, bounded in time."""
    cmd = [sys.executable, "-m", "rocmc.cli", "launch", "-n", str(n), sys.executable, str(script), *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, env=env or _env(), capture_output=True, text=True, timeout=TIMEOUT)


# ---- 1. the launcher's variables --------------------------------------------------------------------


@pytest.mark.parametrize(
    "environ, names",
    [
        ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_PORT"),
        ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_PORT": "29500"}, "RANK=2, WORLD_SIZE=2"),
        ({"WORLD_SIZE": "two", "MASTER_PORT": "29500"}, "WORLD_SIZE='two'"),
        ({"WORLD_SIZE": "2", "RANK": "1.0", "MASTER_PORT": "29500"}, "RANK='1.0'"),
        ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_PORT": "x"}, "MASTER_PORT='x'"),
        ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_PORT": "70000"}, "MASTER_PORT=70000"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0"),
    ],
)
def test_env_rejects_bad_variables(environ, names):
    with pytest.raises(DistributedError, match=names.replace("(", r"\(").replace(".", r"\.")):
        Env.from_environ(environ)


def test_env_defaults_and_values():
    assert Env.from_environ({}) == Env(0, 1, 0, "127.0.0.1", 0, "")
    e = Env.from_environ(
        {
            "WORLD_SIZE": "4",
            "RANK": "3",
            "LOCAL_RANK": "1",
            "MASTER_ADDR": "10.0.0.2",
            "MASTER_PORT": "29501",
            "ROCMC_GROUP_KEY": "k",
        }
    )
    assert e == Env(3, 4, 1, "10.0.0.2", 29501, "k")


# ---- 2. the group's operations across processes --------------------------------------------------

COLLECTIVES = """
import sys
import numpy as np
from rocmc.errors import DistributedError
from rocmc.runtime import distributed
seed = int(sys.argv[1])
g = distributed.init()
n, r = g.world_size, g.rank
data = [np.random.default_rng([seed, k]).uniform(-2, 2, (3, 5)) for k in range(n)]
last = n - 1
got = np.frombuffer(g.broadcast(data[r].tobytes() if r == last else b"junk", root=last)).reshape(3, 5)
np.testing.assert_array_equal(got, data[last])
parts = g.all_gather_bytes(bytes([r]) * (r + 1))
assert parts == [bytes([k]) * (k + 1) for k in range(n)], parts
np.testing.assert_allclose(g.all_reduce(data[r]), np.sum(data, axis=0), rtol=1e-12)
f32 = g.all_reduce(data[r].astype(np.float32))
assert f32.dtype == np.float32
np.testing.assert_allclose(f32, np.sum(data, axis=0), rtol=1e-5, atol=1e-5)
ints = g.all_reduce(np.arange(6, dtype=np.int32) * (r + 1))
np.testing.assert_array_equal(ints, np.arange(6) * (n * (n + 1) // 2))
np.testing.assert_array_equal(g.all_gather(data[r].astype(np.float32)), np.stack(data).astype(np.float32))
g.agree("weights", "fingerprint-1")
try:
    g.agree("weights", "fingerprint-2" if r == last else "fingerprint-1")
    print(f"NO ERROR {r}")
except DistributedError as e:
    assert f"rank(s) {last} differ from rank 0" in str(e), e
    print(f"AGREE RAISED {r}", flush=True)
g.barrier()
print(f"OK {r}", flush=True)
"""


@pytest.mark.parametrize("n", [2, 3])
def test_group_operations_across_ranks(tmp_path, rng, n):
    res = _launch(n, _script(tmp_path, "collectives.py", COLLECTIVES), int(rng.integers(2**31)))
    assert res.returncode == 0, res.stderr
    for r in range(n):
        assert f"OK {r}" in res.stdout and f"AGREE RAISED {r}" in res.stdout, res.stdout + res.stderr
    assert "NO ERROR" not in res.stdout
    assert "unexpectedly" not in res.stderr, res.stderr  # ranks ending normally are not failures


# ---- 3, 4. failures: a missing rank, a rank that dies, a rank that hangs --------------------------------


def test_missing_rank_times_out():
    env = _env(WORLD_SIZE="2", RANK="0", MASTER_PORT=str(free_port()), ROCMC_RENDEZVOUS_TIMEOUT="2")
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-c", "from rocmc.runtime import distributed; distributed.init()"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert time.monotonic() - t0 < 30
    assert res.returncode != 0
    assert "DistributedError" in res.stderr and "rank(s) 1 did not join" in res.stderr, res.stderr


DYING = """
import os, signal, sys, time
import numpy as np
from rocmc.errors import DistributedError
from rocmc.runtime import distributed
mode = sys.argv[1]
g = distributed.init()
if g.rank == 0:  # rank 0 outlives the launcher's SIGTERM: ignored before the collective that lets rank 1 exit
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
x = np.random.default_rng(g.rank).uniform(1, 2, 4)
g.all_reduce(x)
if g.rank == 1:
    os._exit(3)
if mode == "hang":
    time.sleep(1000)
try:
    g.all_reduce(x)
except DistributedError as e:
    print(f"rank 0 raised: {e}", file=sys.stderr, flush=True)
    time.sleep(1)          # rank 1 is seen failing first (within one poll, the launcher names the lowest rank)
    sys.exit(5)
"""


def test_dead_rank_fails_the_others(tmp_path):
    t0 = time.monotonic()
    res = _launch(2, _script(tmp_path, "dying.py", DYING), "collective")
    assert time.monotonic() - t0 < 30
    assert res.returncode == 3, res.stderr
    assert "rank 0 raised: rank 0: rank 1 ended unexpectedly" in res.stderr, res.stderr
    assert "rocmc launch: rank 1 exited with code 3" in res.stderr


LINGER = """
import signal, sys, time
import numpy as np
from rocmc.errors import DistributedError
from rocmc.runtime import distributed
g = distributed.init()
g.all_reduce(np.ones(3))
if g.rank == 1 and sys.argv[1] == "raise":
    raise RuntimeError("rank 1 failed")
if g.rank == 0 and sys.argv[1] == "raise":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        g.barrier()
    except DistributedError as e:
        print(f"rank 0 raised: {e}", file=sys.stderr, flush=True)
elif g.rank == 0:
    time.sleep(1.5)            # past ROCMC_ABORT_GRACE after rank 1 ended
print(f"OK {g.rank}", flush=True)
"""


@pytest.mark.parametrize("mode", ["ok", "raise"])
def test_rank_ending_normally_is_not_a_failure(tmp_path, mode):
    """A rank that ends normally leaves the group: a peer still finishing is not alarmed. One that ends on
    an uncaught exception is a failure for its peers."""
    res = _launch(2, _script(tmp_path, "linger.py", LINGER), mode, env=_env(ROCMC_ABORT_GRACE="1"))
    if mode == "ok":
        assert res.returncode == 0 and "unexpectedly" not in res.stderr, res.stderr
        assert "OK 0" in res.stdout and "OK 1" in res.stdout
    else:
        assert res.returncode == 1 and "rank 1 exited with code 1" in res.stderr, res.stderr
        assert "rank 0 raised: rank 0: rank 1 ended unexpectedly" in res.stderr, res.stderr


DRIVER = """
import json, os, subprocess, sys, time
from rocmc.runtime.launch import launch
procs = []
real = subprocess.Popen
def spy(*a, **k):
    procs.append(real(*a, **k))
    return procs[-1]
subprocess.Popen = spy
t0 = time.monotonic()
code = launch(2, [sys.executable, sys.argv[1], "hang"], grace=float(sys.argv[2]))
print(json.dumps({"code": code, "codes": [p.returncode for p in procs], "pids": [p.pid for p in procs],
                  "wall": time.monotonic() - t0}))
"""


@pytest.mark.parametrize("launcher_grace, abort_grace, signal_of_rank0", [(2, 60, 9), (60, 1, 14)])
def test_hanging_rank_is_ended(tmp_path, launcher_grace, abort_grace, signal_of_rank0):
    """A rank that neither raises nor heeds SIGTERM is killed by the launcher after its grace, or by its
    own alarm (armed when the group failed) when that comes first."""
    driver = _script(tmp_path, "driver.py", DRIVER)
    res = subprocess.run(
        [sys.executable, str(driver), str(_script(tmp_path, "dying.py", DYING)), str(launcher_grace)],
        cwd=ROOT,
        env=_env(ROCMC_ABORT_GRACE=str(abort_grace)),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["code"] == 3 and out["codes"] == [-signal_of_rank0, 3], out
    assert out["wall"] < min(launcher_grace, abort_grace) + 15, out
    for pid in out["pids"]:  # nothing of either rank is left running
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)


# ---- 5. collectives in a compiled CPU module and in the reference ------------------------------------


def _tp_graph(dtype, shape=("b", 6), worlds=(2, 2)):
    g = rocmc.Graph("tp")
    x = g.input("x", shape, dtype)
    g.output(ops.all_reduce(x, worlds[0]))
    g.output(ops.all_gather(x * 2, worlds[1]))
    return g


@pytest.fixture(scope="module")
def cpu_modules(tmp_path_factory):
    d = tmp_path_factory.mktemp("tp")
    return {dt: rocmc.compile(_tp_graph(dt), "cpu").save(d / f"tp_{dt}.vmfb") for dt in ("f32", "bf16")}


COMPILED = """
import sys
import numpy as np
import rocmc
path, dtype, seed, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
mod = rocmc.load(path)
for rows in (int(sys.argv[5]), int(sys.argv[6])):
    xs = [np.random.default_rng([seed, rows, r]).uniform(-2, 2, (rows, 6)).astype(rocmc.dtype(dtype).np)
          for r in range(2)]
    s, g = mod(xs[mod.rank])
    assert s.shape == (rows, 6) and g.shape == (2 * rows, 6), (s.shape, g.shape)
    want_s = sum(x.astype(np.float64) for x in xs)
    want_g = np.concatenate([2 * x.astype(np.float64) for x in xs])
    np.testing.assert_allclose(np.asarray(s).astype(np.float64), want_s, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(g).astype(np.float64), want_g, rtol=tol, atol=tol)
print(f"OK {mod.rank}", flush=True)
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_compiled_cpu_collectives(tmp_path, rng, cpu_modules, dtype):
    assert rocmc.Artifact.load(cpu_modules[dtype]).metadata["world_size"] == 2
    rows = rng.integers(1, 9, size=2)
    res = _launch(
        2,
        _script(tmp_path, "compiled.py", COMPILED),
        cpu_modules[dtype],
        dtype,
        int(rng.integers(2**31)),
        TOL[dtype][0],
        *rows,
    )
    assert res.returncode == 0, res.stderr
    assert "OK 0" in res.stdout and "OK 1" in res.stdout, res.stdout + res.stderr


def test_reference_collectives_in_simulated_ranks(rng):
    g = _tp_graph("f32")
    xs = [rng.uniform(-2, 2, (5, 6)).astype(np.float32) for _ in range(2)]
    results = distributed.simulate(2, lambda r: rocmc.evaluate(g, xs[r]))
    for s, gathered in results:
        np.testing.assert_allclose(s, xs[0].astype(np.float64) + xs[1], rtol=1e-12)
        np.testing.assert_allclose(gathered, 2 * np.concatenate(xs).astype(np.float64), rtol=1e-12)
    with pytest.raises(DistributedError, match="outside a tensor-parallel group"):
        rocmc.evaluate(g, xs[0])
    with pytest.raises(GraphError, match="built for 2 ranks, run in a group of 3"):
        distributed.simulate(3, lambda r: rocmc.evaluate(g, xs[0]))


# ---- 6. the GPU lowering (compiled only) and graph checks --------------------------------------------


@pytest.mark.parametrize("target", ["cuda:sm_80", "rocm:gfx942"])
def test_gpu_lowering_uses_flow_collectives(target):
    dynamic = rocmc.compile(_tp_graph("bf16"), target)
    static = rocmc.compile(_tp_graph("f32", shape=(4, 6)), target)
    for art in (dynamic, static):
        assert len(art.vmfb) > 0 and art.metadata["world_size"] == 2 and not art.metadata["externs"]
    text = static.ir("input")
    assert text.count("flow.collective.all_reduce") == 1 and text.count("flow.collective.all_to_all") == 1
    assert "scf.for" not in text
    text = dynamic.ir("input")
    assert "flow.collective.all_reduce" in text and "flow.collective.all_to_all" in text
    assert "scf.for" in text


def test_graph_and_program_checks():
    with pytest.raises(LoweringError, match="different numbers of ranks"):
        rocmc.compile(_tp_graph("f32", worlds=(2, 4)), "cpu")
    g = rocmc.Graph("bad")
    x = g.input("x", (4,), "f32")
    for world in (0, "2", True, 1.5):
        with pytest.raises(GraphError, match=r"all_reduce: world="):
            ops.all_reduce(x, world)
    with pytest.raises(GraphError, match="0-d"):
        ops.all_gather(g.input("s", (), "f32"), 2)


# ---- 7. the MPI bootstrap library ----------------------------------------------------------------


def _has_compiler() -> bool:
    import shutil

    return any(c and shutil.which(c) for c in (os.environ.get("CC"), "clang-19", "clang", "gcc", "cc"))


needs_cc = pytest.mark.skipif(not _has_compiler(), reason="no C compiler (clang or gcc) to build the bootstrap")


@needs_cc
def test_bootstrap_library(tmp_path, rng):
    lib_path = native.build(tmp_path)
    assert lib_path.is_file() and native.build(tmp_path) == lib_path  # built once
    lib = ctypes.CDLL(str(lib_path), mode=ctypes.RTLD_LOCAL)
    addr = {
        n: ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(lib, f"ompi_mpi_{n}")))
        for n in ("comm_world", "byte", "int")
    }
    payload = rng.integers(1, 256, size=128, dtype=np.uint8).tobytes()
    calls, fail = [], [False]

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
    def broadcast(buf, nbytes, root):
        calls.append((nbytes, root))
        ctypes.memmove(buf, payload, nbytes)
        return 1 if fail[0] else 0

    assert lib.MPI_Init(None, None) != 0  # not configured by rocmc
    assert lib.rocmc_bootstrap_configure(3, 3, broadcast) != 0
    assert lib.rocmc_bootstrap_configure(1, 3, None) != 0
    assert lib.rocmc_bootstrap_configure(1, 3, broadcast) == 0
    assert lib.MPI_Init(None, None) == 0
    rank, size, flag = ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_int(0)
    assert lib.MPI_Initialized(ctypes.byref(flag)) == 0 and flag.value == 1
    assert lib.MPI_Comm_rank(addr["comm_world"], ctypes.byref(rank)) == 0 and rank.value == 1
    assert lib.MPI_Comm_size(addr["comm_world"], ctypes.byref(size)) == 0 and size.value == 3
    assert lib.MPI_Comm_rank(addr["byte"], ctypes.byref(rank)) != 0
    buf = ctypes.create_string_buffer(128)
    assert lib.MPI_Bcast(buf, 128, addr["byte"], 2, addr["comm_world"]) == 0
    assert buf.raw == payload and calls == [(128, 2)]
    assert lib.MPI_Bcast(buf, 128, addr["int"], 0, addr["comm_world"]) != 0  # only bytes
    assert lib.MPI_Bcast(buf, 128, addr["byte"], 0, addr["byte"]) != 0  # only the world
    assert lib.MPI_Bcast(buf, 128, addr["byte"], 3, addr["comm_world"]) != 0  # root outside
    assert len(calls) == 1
    fail[0] = True
    assert lib.MPI_Bcast(buf, 128, addr["byte"], 0, addr["comm_world"]) != 0  # the group failed
    assert lib.MPI_Allreduce(buf, buf, 1, addr["byte"], None, addr["comm_world"]) != 0


INSTALLED = """
import ctypes, os, sys
import numpy as np
from rocmc.runtime import distributed, native
g = distributed.init()
native.install(g)
assert os.environ["PMI_RANK"] == str(g.rank) and os.environ["PMI_SIZE"] == "2"
lib = ctypes.CDLL("libmpi.so")                      # found by its soname, as IREE's loader finds it
world = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(lib, "ompi_mpi_comm_world")))
byte = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(lib, "ompi_mpi_byte")))
rank = ctypes.c_int(-1)
assert lib.MPI_Init(None, None) == 0 and lib.MPI_Comm_rank(world, ctypes.byref(rank)) == 0 and rank.value == g.rank
ids = [np.random.default_rng([int(sys.argv[1]), r]).bytes(128) for r in range(2)]
buf = ctypes.create_string_buffer(ids[g.rank], 128)
assert lib.MPI_Bcast(buf, 128, byte, 0, world) == 0
assert buf.raw == ids[0], "rank 0's id did not arrive"
print(f"OK {g.rank}", flush=True)
"""


@needs_cc
def test_bootstrap_installed_in_ranks(tmp_path, rng):
    res = _launch(2, _script(tmp_path, "installed.py", INSTALLED), int(rng.integers(2**31)))
    assert res.returncode == 0, res.stderr
    assert "OK 0" in res.stdout and "OK 1" in res.stdout, res.stdout + res.stderr


def test_collective_library_lookup(tmp_path):
    assert native.collective_library("cpu") is None and native.library_dir("cpu", tmp_path) is None
    try:
        ctypes.CDLL("librccl.so")
    except OSError:
        with pytest.raises(DistributedError, match=r"RCCL \(librccl.so\)"):
            native.collective_library("rocm")


# ---- 8. the launch command's errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, says",
    [
        (["launch", "-n", "2"], "no command given"),
        (["launch", "-n", "0", "true"], "-n 0"),
        (["launch", "-n", "2", "--"], "no command given"),
    ],
)
def test_launch_cli_errors(capsys, argv, says):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rocmc: error:") and says in err, err
