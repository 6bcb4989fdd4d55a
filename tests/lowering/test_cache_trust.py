"""The compile cache as a boundary of trust: damaged, planted or unusable entries and directories, and
what a compile leaves behind when it is killed or its artifact is dropped."""

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.lowering import cache as cache_mod
from rocmc.lowering.cache import Cache, CacheWarning

from helpers import rand


def graph(name="victim", scale=1.0):
    g = rocmc.Graph(name)
    x = g.input("x", (2, "seq", 8), "f32")
    g.output(ops.silu(x * g.constant("w", np.linspace(-1, 1, 8).astype(np.float32) * scale) + 1.0))
    return g


def check_result(art, g, rng):
    x = rand(rng, (2, 5, 8))
    np.testing.assert_allclose(rocmc.load(art)(x), rocmc.evaluate(g, x), rtol=2e-5, atol=2e-5)


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ROCMC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def entry_of(root: Path, g) -> Path:
    """Compile `g` into the cache and return its entry's directory."""
    before = set(root.glob("??/*"))
    assert not rocmc.compile(g, "cpu").cached
    (d,) = set(root.glob("??/*")) - before
    return d


def replant(d: Path, source: Path, **metadata):
    """Write a valid entry (digests that match) at `d` with the files of the entry at `source`: what a
    planter with the same install can write."""
    hit = Cache(source.parents[1]).get(source.name)
    files = {n: (source / n).read_bytes() for n in cache_mod.FILES}
    shutil.rmtree(d)
    assert (
        Cache(d.parents[1]).put(
            d.name,
            files["module.vmfb"],
            {**hit.metadata, **metadata},
            files["input.mlir"].decode(),
            files["module.mlirbc"],
            tuning_dropped=False,
        )
        == d
    )
    assert Cache(d.parents[1]).verify(d.name)


# ---- the directory ---------------------------------------------------------------------------------


def test_cache_dir_and_entries_are_private(root):
    d = entry_of(root, graph())
    assert (root.stat().st_mode & 0o777) == 0o700
    assert all(p.stat().st_mode & 0o077 == 0 for p in [d.parent, d, *d.iterdir()])


def test_unusable_cache_dir_compiles_without_the_cache(tmp_path, monkeypatch, rng):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("ROCMC_CACHE_DIR", str(tmp_path / "file" / "cache"))
    with pytest.warns(CacheWarning, match=r"compile cache .*file/cache can't be used"):
        art = rocmc.compile(graph(), "cpu")
    assert not art.cached
    check_result(art, graph(), rng)


READ_ONLY = """
import warnings, numpy as np, rocmc
from rocmc import ops
from rocmc.lowering.cache import CacheWarning
g = rocmc.Graph("victim")
x = g.input("x", (2, "seq", 8), "f32")
g.output(ops.silu(x * 0.5 + 1.0))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    art = rocmc.compile(g, "cpu")
assert not art.cached
assert [str(w.message) for w in caught if w.category is CacheWarning and "not writable" in str(w.message)], caught
x = np.linspace(-3, 3, 80, dtype=np.float32).reshape(2, 5, 8)
np.testing.assert_allclose(rocmc.load(art)(x), rocmc.evaluate(g, x), rtol=2e-5, atol=2e-5)
"""


def test_read_only_cache_dir_compiles_without_the_cache(tmp_path):
    ro = tmp_path / "cache"
    ro.mkdir(mode=0o500)
    cmd = [sys.executable, "-c", READ_ONLY]
    if os.geteuid() == 0:  # root writes through permission bits unless it gives up the capability
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv to drop CAP_DAC_OVERRIDE")
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *cmd]
    p = subprocess.run(cmd, env={**os.environ, "ROCMC_CACHE_DIR": str(ro)}, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert list(ro.iterdir()) == []


def test_entry_that_cannot_be_written_is_a_warning(root, rng):
    g = graph()
    d = entry_of(root, g)
    shutil.rmtree(d.parent)
    d.parent.write_text("")  # the shard's place is taken: writing the entry fails
    with pytest.warns(CacheWarning, match="can't write cache entry"):
        art = rocmc.compile(g, "cpu")
    assert not art.cached
    check_result(art, g, rng)


# ---- damaged entries -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["module.vmfb", "module.mlirbc", "input.mlir", "entry.json"])
def test_damaged_file_is_rebuilt(root, name, rng):
    g = graph()
    d = entry_of(root, g)
    assert rocmc.compile(g, "cpu").cached  # verified in this process: later hits trust the stamp
    data = bytearray((d / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (d / name).write_bytes(bytes(data))
    with pytest.warns(CacheWarning, match=rf"{d.name}: .*damaged"):
        art = rocmc.compile(g, "cpu")
    assert not art.cached
    check_result(art, g, rng)
    again = rocmc.compile(g, "cpu")
    assert again.cached and Cache(root).verify(d.name)
    check_result(again, g, rng)


def test_first_hit_in_a_process_hashes_every_file_and_later_hits_only_stat(root, monkeypatch):
    g = graph()
    d = entry_of(root, g)
    hashed = []
    real = cache_mod._sha256
    monkeypatch.setattr(cache_mod, "_sha256", lambda p: hashed.append(p.name) or real(p))
    monkeypatch.setattr(cache_mod, "_verified", {})  # as in a fresh process
    assert rocmc.compile(g, "cpu").cached
    assert sorted(hashed) == sorted(cache_mod.FILES)
    assert rocmc.compile(g, "cpu").cached and len(hashed) == 3
    os.utime(d / "input.mlir")  # a changed stamp: verified again
    assert rocmc.compile(g, "cpu").cached and len(hashed) == 6


def test_entry_moved_from_another_key_is_rebuilt(root, rng):
    victim, other = graph("victim"), graph("other", scale=-3.0)
    d, o = entry_of(root, victim), entry_of(root, other)
    shutil.rmtree(d)
    shutil.copytree(o, d)  # the other entry's files and its own valid record
    with pytest.warns(CacheWarning, match="record of another entry"):
        art = rocmc.compile(victim, "cpu")
    assert not art.cached
    check_result(art, victim, rng)


# ---- planted entries -------------------------------------------------------------------------------


def _group_writable(d):
    (d / "module.vmfb").chmod(0o620)


def _world_writable(d):
    d.chmod(0o777)


def _other_user(d):
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    for p in [d, *d.iterdir()]:
        os.chown(p, 4242, 4242)


@pytest.mark.parametrize(
    "plant", [_group_writable, _world_writable, _other_user], ids=["group-writable", "world-writable", "other-user"]
)
def test_planted_entry_is_ignored(root, plant, rng):
    victim, planted = graph("victim"), graph("planted", scale=-3.0)
    d = entry_of(root, victim)
    replant(d, entry_of(root, planted))
    plant(d)
    with pytest.warns(CacheWarning, match=rf"ignoring cache entry .*{d.name}: .*(owned by uid 4242|writable)"):
        art = rocmc.compile(victim, "cpu")
    assert not art.cached
    check_result(art, victim, rng)
    again = rocmc.compile(victim, "cpu")  # replaced by the victim's own entry
    assert again.cached
    check_result(again, victim, rng)


def test_planted_compile_flags_never_reach_iree_compile(root, tmp_path):
    g = graph()
    d = entry_of(root, g)
    target = tmp_path / "planted-dump"
    replant(d, d, compile_flags=[f"--iree-hal-dump-executable-files-to={target}"])
    art = rocmc.compile(g, "cpu")
    assert art.cached
    assert "flow.executable" in art.ir("flow")
    assert not target.exists()
    assert not any("dump-executable-files" in f for f in art.metadata["compile_flags"])


def test_tuning_dropped_must_be_a_boolean(root, rng):
    g = graph()
    d = entry_of(root, g)
    record = json.loads((d / "entry.json").read_text())
    record.pop("digest")
    record["tuning_dropped"] = "--iree-hal-dump-executable-files-to=/tmp"
    (d / "entry.json").write_text(json.dumps({**record, "digest": cache_mod._digest(record)}))
    with pytest.warns(CacheWarning, match="tuning_dropped"):
        art = rocmc.compile(g, "cpu")
    assert not art.cached
    check_result(art, g, rng)


# ---- what a compile leaves behind -----------------------------------------------------------------

SLOW_COMPILE = """
import numpy as np, rocmc
from rocmc import ops
g = rocmc.Graph("slow")
x = g.input("x", ("n", 256), "f32")
for i in range(24):
    w = g.constant(f"w{i}", np.full((256, 256), 0.01 * (i + 1), np.float32))
    x = ops.tanh(ops.matmul(x, w)) + ops.sigmoid(x)
g.output(x)
rocmc.compile(g, "cpu")
"""

SMALL_COMPILE = """
import rocmc
from rocmc import ops
g = rocmc.Graph("small")
g.output(ops.tanh(g.input("x", (4,), "f32")))
rocmc.compile(g, "cpu")
"""


def _children(pid: int) -> list[tuple[int, str]]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append((int(p.name), stat[stat.index("(") + 1 : stat.rindex(")")]))
    return out


def _running(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killed_compile_leaves_no_process_and_its_temporary_files_go_at_the_next_start(tmp_path):
    tmp, root = tmp_path / "tmp", tmp_path / "cache"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "ROCMC_CACHE_DIR": str(root)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_COMPILE], env=env)
    compiler = None
    try:
        deadline = time.monotonic() + 120
        while compiler is None and proc.poll() is None and time.monotonic() < deadline:
            compiler = next((pid for pid, name in _children(proc.pid) if name == "iree-compile"), None)
            time.sleep(0.01)
        assert compiler is not None, "iree-compile never started"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while _running(compiler) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(compiler), "iree-compile outlived the process that started it"
    finally:
        proc.kill()
        if compiler is not None and _running(compiler):
            os.kill(compiler, signal.SIGKILL)
    left = list(tmp.glob(f"rocmc-{proc.pid}-*"))
    assert left  # what the next start has to remove
    # iree-compile died with its parent, before writing the module (an orphan would finish it)
    assert all(not (d / "module.vmfb").exists() or (d / "module.vmfb").stat().st_size == 0 for d in left)
    staging = root / "ab" / f".abcdef01-{proc.pid}-x1y2z3"  # an entry the killed process was writing
    staging.mkdir(parents=True)
    subprocess.run([sys.executable, "-c", SMALL_COMPILE], env=env, check=True)
    assert not any(p.exists() for p in left) and not staging.exists()


def test_uncached_stage_dumps_are_removed_with_the_artifact(tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("ROCMC_CACHE", "0")
    art = rocmc.compile(graph(), "cpu")
    assert "flow.executable" in art.ir("flow")
    assert "stream.executable" in art.ir("stream")  # the dumps stay while the artifact lives
    assert list(tmp.iterdir())
    del art
    gc.collect()
    assert list(tmp.iterdir()) == []
