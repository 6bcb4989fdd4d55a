"""Child processes end with the process that started them (rocmc.children): when it is killed with SIGKILL,
whichever thread started them, through every path that starts one (iree-compile, the kernel build's clang,
the host C compiler, iree-dump-module, the ranks of `rocmc launch`), and not earlier."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rocmc import children

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals are Linux's")

ROOT = Path(__file__).resolve().parents[1]


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie (one reparented to an init that doesn't reap counts too)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _wait_gone(pids, seconds=5.0) -> list:
    """The pids of `pids` still running after `seconds`."""
    deadline = time.monotonic() + seconds
    while any(not _gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [p for p in pids if not _gone(p)]


def _start(script: str, *args, env=None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_files(paths, parent: subprocess.Popen, seconds=8.0) -> list[int]:
    """The pids written into `paths` (by the fake tools), once all are there."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        texts = [p.read_text().strip() if p.exists() else "" for p in paths]
        if all(texts):
            return [int(t) for t in texts]
        if parent.poll() is not None:
            break
        time.sleep(0.02)
    out, err = _end(parent)
    pytest.fail(
        f"the children never started (missing: {[p.name for p, t in zip(paths, texts) if not t]}):\n{out}\n{err}"
    )


def _end(parent: subprocess.Popen) -> tuple[str, str]:
    """Kill `parent` and return its output (what its children still hold of its pipes is left behind)."""
    parent.kill()
    try:
        return parent.communicate(timeout=2)
    except subprocess.TimeoutExpired:
        parent.stdout.close()
        parent.stderr.close()
        parent.wait()
        return "", ""


def _kill_all(parent: subprocess.Popen, pids) -> None:
    """Cleanup: nothing this test started stays behind, whatever it found."""
    for pid in pids:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)
    _end(parent)


FAKE_TOOL = """\
#!/bin/sh
# Answers a tool probe at once; otherwise writes its pid where FAKE_PID_DIR/<name> says and sleeps.
case "$1" in
  --version) echo "clang version 19.1.7"; exit 0;;
  --print-targets) echo "  Registered Targets:"; echo "    amdgcn     - AMD GCN GPUs"; exit 0;;
esac
name="$FAKE_PID_DIR/$(basename "$0")"
echo $$ > "$name.tmp" && mv "$name.tmp" "$name"
exec sleep 300
"""


def _fake_tool(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(FAKE_TOOL)
    path.chmod(0o755)
    return path


# ---- the mechanism -----------------------------------------------------------------------------------------

THREAD_STARTED = """
import sys, threading, time
from rocmc import children
box = []
worker = threading.Thread(target=lambda: box.append(children.popen(["sleep", "300"])))
worker.start()
worker.join()
print(box[0].pid, flush=True)
time.sleep(300)
"""


def test_child_started_by_an_ended_thread_lives_on_and_ends_with_its_killed_parent():
    parent = _start(THREAD_STARTED)
    child = None
    try:
        line = parent.stdout.readline() if select.select([parent.stdout], [], [], 10)[0] else ""
        assert line.strip().isdigit(), _end(parent)[1]
        child = int(line)
        time.sleep(0.5)  # the thread that started it has ended
        assert not _gone(child), "the child died with the thread that started it"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert not _wait_gone([child]), "the child outlived its SIGKILLed parent"
    finally:
        _kill_all(parent, [child] if child else [])


def test_run_kills_and_reaps_its_child_on_a_timeout_or_an_interrupt(tmp_path):
    script = f"""
    import os, signal, subprocess, threading, time
    from rocmc import children
    cmd = ["sh", "-c", 'echo $$ > "$0"; exec sleep 300']
    try:
        children.run([*cmd, "{tmp_path}/timeout"], timeout=0.5)
    except subprocess.TimeoutExpired as e:
        assert e.cmd[:3] == cmd, e.cmd                        # the command run, not how it was started
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        children.run([*cmd, "{tmp_path}/interrupt"], capture_output=True)
    except KeyboardInterrupt:
        pass
    for name in ("timeout", "interrupt"):
        pid = int(open(os.path.join("{tmp_path}", name)).read())
        try:
            os.kill(pid, 0)
            print(name, "left", pid)
        except ProcessLookupError:                            # killed and reaped by run()
            print(name, "reaped")
    """
    proc = _start(script)
    try:
        out, err = proc.communicate(timeout=10)
    finally:
        left = [tmp_path / n for n in ("timeout", "interrupt") if (tmp_path / n).exists()]
        _kill_all(proc, [int(p.read_text()) for p in left if p.read_text().strip()])
    assert proc.returncode == 0, err
    assert out.split() == ["timeout", "reaped", "interrupt", "reaped"], out + err


def test_run_reports_like_subprocess(tmp_path):
    res = children.run(["sh", "-c", 'cat; echo "$PPID" >&2; exit 3'], input="in", capture_output=True, text=True)
    assert (res.args, res.returncode, res.stdout, res.stderr.strip()) == (
        ["sh", "-c", 'cat; echo "$PPID" >&2; exit 3'],
        3,
        "in",
        str(os.getpid()),
    )
    with pytest.raises(subprocess.CalledProcessError):
        children.run(["false"], check=True)
    with pytest.raises(FileNotFoundError):
        children.run([str(tmp_path / "no-such-tool")])
    (tmp_path / "not-executable").write_text("")
    with pytest.raises(PermissionError):
        children.run([str(tmp_path / "not-executable")])
    with pytest.raises(TypeError):
        children.run(["true"], preexec_fn=lambda: None)
    # the command gets the default dispositions of SIGPIPE and SIGXFSZ, as with subprocess
    ignored = children.run(["sh", "-c", "grep SigIgn /proc/self/status"], capture_output=True, text=True).stdout
    assert int(ignored.split()[1], 16) & ((1 << (signal.SIGPIPE - 1)) | (1 << (signal.SIGXFSZ - 1))) == 0, ignored


FORKED = """
import os, signal
from rocmc import children
children.run(["true"])                      # the spawner of this process is running
pid = os.fork()
if pid == 0:                                # only the forking thread survives a fork: it gets its own spawner
    signal.alarm(5)                         # bounded, should it wait for a spawner that isn't there
    os._exit(children.run(["sh", "-c", "exit 7"]).returncode)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_forked_process_starts_children_too():
    proc = _start(FORKED)
    try:
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert out.strip() == "7", out + err


# ---- every path that starts a tool ---------------------------------------------------------------------------

TOOLS = """
import os, sys, threading, time
from pathlib import Path
fakes = Path(sys.argv[1])

def compile_module():
    from rocmc.lowering import compiler
    from rocmc.lowering.target import Target
    compiler.iree_compile_path = lambda: str(fakes / "iree-compile")
    compiler.compile_bytecode(b"ML\\xefR", Target.parse("cpu"))

def build_kernel():
    from rocmc.lowering import kernels
    kernels.build(kernels.SOURCES[0], "gfx942")

def build_bootstrap():
    from rocmc.runtime import native
    native.build(out_dir=Path(sys.argv[2]))

def dump_module():
    import iree._runtime_libs as libs
    from rocmc.inspect import _dump_module
    libs.__file__ = str(fakes / "__init__.py")
    _dump_module(b"not a module", "module")

import rocmc.lowering.compiler, rocmc.lowering.kernels, rocmc.runtime.native, rocmc.inspect, iree._runtime_libs
for job in (compile_module, build_kernel, build_bootstrap, dump_module):
    threading.Thread(target=job, daemon=True).start()
time.sleep(300)
"""


def test_every_tool_ends_with_its_killed_parent(tmp_path):
    """iree-compile, the kernel build's clang, the host C compiler and iree-dump-module, each started from
    its own thread of a process then killed with SIGKILL."""
    fakes, pids_dir = tmp_path / "fakes", tmp_path / "pids"
    pids_dir.mkdir()
    names = ["iree-compile", "clang-fake", "cc-fake", "iree-dump-module"]
    for name in names:
        _fake_tool(fakes, name)
    env = {
        "FAKE_PID_DIR": str(pids_dir),
        "ROCMC_CLANG": str(fakes / "clang-fake"),
        "CC": str(fakes / "cc-fake"),
        "ROCMC_CACHE_DIR": str(tmp_path / "cache"),
    }
    parent = _start(TOOLS, fakes, tmp_path / "out", env=env)
    pids = []
    try:
        pids = _wait_for_files([pids_dir / n for n in names], parent)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        left = _wait_gone(pids)
        assert not left, f"outlived their SIGKILLed parent: {[n for n, p in zip(names, pids) if p in left]}"
    finally:
        _kill_all(parent, pids)


LAUNCHER = """
import sys
from rocmc.runtime.launch import launch
rank = "import os, sys, time; open(sys.argv[1] + os.environ['RANK'], 'w').write(str(os.getpid())); time.sleep(300)"
launch(2, [sys.executable, "-c", rank, sys.argv[1]])
"""


def test_ranks_keep_their_session_and_end_with_their_killed_launcher(tmp_path):
    parent = _start(LAUNCHER, tmp_path / "rank")
    ranks = []
    try:
        ranks = _wait_for_files([tmp_path / "rank0", tmp_path / "rank1"], parent)
        for pid in ranks:  # each rank leads its own session, for stop()
            assert os.getsid(pid) == pid != os.getsid(parent.pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert not _wait_gone(ranks), "ranks outlived their SIGKILLed launcher"
    finally:
        _kill_all(parent, ranks)
