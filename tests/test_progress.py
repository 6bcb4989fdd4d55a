"""Progress of long steps: log records under `rocmc`, the terminal display (only on a terminal, not when
quiet), and the CLI's -q/-v."""

import io
import logging
import os

import numpy as np
import pytest

import rocmc
from rocmc import cli, ops, progress


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def environment_decides(monkeypatch):
    """Each test starts with the quiet switch unset and no ROCMC_QUIET."""
    monkeypatch.delenv("ROCMC_QUIET", raising=False)
    progress.set_quiet(None)
    yield
    progress.set_quiet(None)


def small_graph(name="prog"):
    g = rocmc.Graph(name)
    x = g.input("x", shape=(2, 16), dtype="f32")
    g.output(ops.silu(ops.rms_norm(x, g.constant("w", np.ones(16, np.float32)), eps=1e-5)))
    return g


def test_compile_logs_its_stages_with_times(caplog):
    caplog.set_level(logging.INFO, logger="rocmc")
    rocmc.compile(small_graph(), "cpu", cache=False)
    by_step = {r.step: r for r in caplog.records if hasattr(r, "elapsed")}
    assert "compiling prog for cpu" in by_step
    assert "lowering prog to MLIR for cpu" in by_step
    assert any(s.startswith("rewrite: fused ops into prog") for s in by_step)
    iree = [r for s, r in by_step.items() if s.startswith("iree-compile for cpu")]
    assert iree and iree[-1].name == "rocmc.lowering"
    assert iree[-1].elapsed > 0
    assert "iree-compile for cpu" in iree[-1].getMessage() and " s" in iree[-1].getMessage()
    # nested: lowering and iree-compile end inside the whole compile
    whole = by_step["compiling prog for cpu"]
    assert whole.elapsed >= iree[-1].elapsed + by_step["lowering prog to MLIR for cpu"].elapsed
    # a start record precedes each end record
    starts = [r.getMessage() for r in caplog.records if not hasattr(r, "elapsed")]
    assert "compiling prog for cpu ..." in starts


def test_cache_hit_and_loading_are_logged(caplog, tmp_path, monkeypatch):
    monkeypatch.setenv("ROCMC_CACHE_DIR", str(tmp_path / "cache"))
    rocmc.compile(small_graph("cached"), "cpu")
    caplog.set_level(logging.INFO, logger="rocmc")
    art = rocmc.compile(small_graph("cached"), "cpu")
    assert art.cached
    assert any("from the compile cache" in r.getMessage() for r in caplog.records)
    assert not any(getattr(r, "step", "").startswith("iree-compile") for r in caplog.records)
    rocmc.load(art)
    loads = [r for r in caplog.records if r.name == "rocmc.runtime.module" and hasattr(r, "elapsed")]
    assert loads and loads[0].step == "loading cached on local-task"


def test_checkpoint_bytes_are_logged(caplog, tmp_path):
    w = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    rocmc.save_parameters(tmp_path / "w.irpa", {"w": w})
    caplog.set_level(logging.INFO, logger="rocmc")
    p = rocmc.Parameters.open(tmp_path / "w.irpa")
    assert any(r.name == "rocmc.parameters" and "1 tensors, 4.0 KiB" in r.getMessage() for r in caplog.records)
    caplog.clear()
    p.shard({"w": ("w", 1)}, rank=1, parts=2)
    done = [r for r in caplog.records if getattr(r, "bytes", None) is not None and hasattr(r, "elapsed")]
    assert [r.bytes for r in done] == [w.nbytes // 2]
    caplog.clear()
    # a dtype conversion at load reads and converts the bytes: measured
    g = rocmc.Graph("uses_w")
    x = g.input("x", shape=(2, 64), dtype="f16")
    g.output(ops.matmul(x, g.parameter("w", (64, 16), "f16")))
    mod = rocmc.load(rocmc.compile(g, "cpu", cache=False), parameters=tmp_path / "w.irpa")
    conv = [
        r
        for r in caplog.records
        if getattr(r, "step", "").startswith("reading and converting 1 parameters") and hasattr(r, "elapsed")
    ]
    assert conv and conv[0].bytes == w.nbytes
    assert any(
        getattr(r, "step", "").startswith("loading uses_w on local-task with 1 parameters (2.0 KiB)")
        for r in caplog.records
    )
    np.testing.assert_allclose(mod(np.ones((2, 64), np.float16)), np.ones((2, 64)) @ w.astype(np.float16), rtol=1e-2)


def test_library_user_sees_nothing_by_default(capfd):
    """No logging configuration and stderr not a terminal: nothing on stderr or stdout."""
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("rocmc").handlers)
    rocmc.compile(small_graph("silent"), "cpu", cache=False)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_terminal_display_and_quiet(monkeypatch):
    term = FakeTerminal()
    monkeypatch.setattr("sys.stderr", term)
    with progress.step("a step on a terminal"):
        pass
    with progress.byte_progress("bytes on a terminal", 2048) as p:
        p.update(2048)
    shown = term.getvalue()
    assert "a step on a terminal" in shown and "bytes on a terminal" in shown

    for quiet in (lambda: progress.set_quiet(True), lambda: monkeypatch.setenv("ROCMC_QUIET", "1")):
        progress.set_quiet(None)
        quiet()
        term.seek(0)
        term.truncate()
        with progress.step("not shown"):
            pass
        assert term.getvalue() == ""
    # set_quiet(False) wins over the environment
    progress.set_quiet(False)
    with progress.step("shown again"):
        pass
    assert "shown again" in term.getvalue()


def test_spinner_redraws_while_a_step_runs(monkeypatch):
    import time

    term = FakeTerminal()
    monkeypatch.setattr("sys.stderr", term)
    with progress.step("a long step"):
        time.sleep(3 * progress._TICK)
    assert any(f"{c} a long step" in term.getvalue() for c in progress._SPINNER)


def test_failed_step_is_logged_and_raises(caplog):
    caplog.set_level(logging.INFO, logger="rocmc")
    with pytest.raises(rocmc.CompileError):
        with progress.step("a failing step", logger="rocmc.test"):
            raise rocmc.CompileError("boom")
    end = [r for r in caplog.records if hasattr(r, "elapsed")]
    assert end and "failed after" in end[0].getMessage() and "CompileError" in end[0].getMessage()


def test_set_quiet_checks_its_argument():
    with pytest.raises(TypeError):
        progress.set_quiet("yes")


def test_cli_quiet_and_verbose(tmp_path, monkeypatch, capsys):
    model = tmp_path / "m.py"
    model.write_text(
        "import numpy as np, rocmc\nfrom rocmc import ops\n"
        "def build_graph():\n    g = rocmc.Graph('clim')\n"
        "    x = g.input('x', shape=(2, 8), dtype='f32')\n    g.output(ops.relu(x))\n    return g\n"
    )
    monkeypatch.setenv("ROCMC_QUIET", "0")  # restored (unset) after the test: the CLI sets it
    term = FakeTerminal()
    monkeypatch.setattr("sys.stderr", term)
    # on a terminal, the display shows the compile's steps
    assert cli.main(["compile", str(model), "-o", str(tmp_path / "a.vmfb"), "--no-cache"]) == 0
    assert "compiling clim for cpu" in term.getvalue()
    # -q before or after the subcommand turns it off, for this process and the processes it starts
    for argv in (
        ["-q", "compile", str(model), "-o", str(tmp_path / "b.vmfb"), "--no-cache"],
        ["compile", str(model), "-o", str(tmp_path / "c.vmfb"), "--no-cache", "-q"],
    ):
        progress.set_quiet(None)
        os.environ["ROCMC_QUIET"] = "0"
        term.seek(0)
        term.truncate()
        assert cli.main(argv) == 0
        assert term.getvalue() == ""
        assert progress.is_quiet()
        assert os.environ["ROCMC_QUIET"] == "1"
    assert "wrote" in capsys.readouterr().out
    # -v logs each step with its time, above the (quiet) display
    root = logging.getLogger("rocmc")
    handlers, level = list(root.handlers), root.level
    try:
        term.seek(0)
        term.truncate()
        assert cli.main(["-q", "-v", "compile", str(model), "-o", str(tmp_path / "d.vmfb"), "--no-cache"]) == 0
        lines = term.getvalue().splitlines()
        assert any(l.startswith("rocmc: iree-compile for cpu: done in ") for l in lines)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
