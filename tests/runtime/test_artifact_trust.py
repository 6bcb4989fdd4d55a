"""A .vmfb read from disk is untrusted: its integrity trailer is checked before IREE sees a byte, its
metadata is checked against a schema and against the module's own signature, and saving never writes
through a planted link."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.artifact import _SEAL, check_seal, seal

ROOT = Path(__file__).resolve().parents[2]


def tiny_graph():
    g = rocmc.Graph("tiny")
    x = g.input("x", (2, "seq", 8))
    g.output(ops.silu(x * g.constant("w", np.linspace(-1, 1, 8).astype(np.float32)) + 1.0))
    return g


@pytest.fixture(scope="module")
def sealed() -> bytes:
    return rocmc.compile(tiny_graph(), "cpu").vmfb


def module_part(data: bytes) -> bytes:
    return data[: len(data) - _SEAL.size]


def edited(data: bytes, old: str, new: str) -> bytes:
    """The module with a same-length edit of its metadata JSON, resealed as an attacker could."""
    assert len(old) == len(new)
    module = module_part(data)
    assert old.encode() in module, old
    return seal(module.replace(old.encode(), new.encode()))


def write(tmp_path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


# ---- the trailer ---------------------------------------------------------------------------------


def test_saved_artifact_loads_and_runs(tmp_path, rng):
    art = rocmc.compile(tiny_graph(), "cpu")
    p = art.save(tmp_path / "m.vmfb")
    check_seal(p.read_bytes())
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(rocmc.load(p)(x), rocmc.evaluate(tiny_graph(), x), rtol=1e-5, atol=1e-6)


def test_iree_reads_a_sealed_file(tmp_path, sealed):
    from iree import runtime as rt
    import iree._runtime_libs as libs

    p = write(tmp_path, "m.vmfb", sealed)
    assert rt.VmModule.mmap(rt.VmInstance(), str(p)).lookup_function("main") is not None
    tool = Path(libs.__file__).parent / "iree-dump-module"
    dump = subprocess.run([str(tool), str(p)], capture_output=True, text=True, timeout=60)
    assert dump.returncode == 0 and "main" in dump.stdout


def test_a_flipped_byte_in_the_module_is_an_artifact_error(tmp_path, sealed, rng):
    for pos in rng.choice(len(module_part(sealed)), 8, replace=False):
        data = bytearray(sealed)
        data[pos] ^= int(rng.integers(1, 256))
        with pytest.raises(rocmc.ArtifactError, match="damaged"):
            rocmc.load(write(tmp_path, "m.vmfb", bytes(data)))


def test_a_truncated_file_is_an_artifact_error(tmp_path, sealed):
    with pytest.raises(rocmc.ArtifactError, match="t.vmfb: no rocmc integrity trailer"):
        rocmc.load(write(tmp_path, "t.vmfb", sealed[:-100]))


def test_a_file_without_trailer_says_how_to_proceed(tmp_path, sealed, rng):
    p = write(tmp_path, "old.vmfb", module_part(sealed))
    with pytest.raises(rocmc.ArtifactError, match="old.vmfb: no rocmc integrity trailer.*recompile.*verify=False"):
        rocmc.load(p)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    np.testing.assert_array_equal(rocmc.load(p, verify=False)(x), rocmc.load(sealed)(x))


def test_the_cli_loads_a_trusted_file_without_trailer_only_when_told(tmp_path, sealed, rng, capsys):
    from rocmc.cli import main

    p = write(tmp_path, "old.vmfb", module_part(sealed))
    np.save(tmp_path / "x.npy", rng.standard_normal((2, 3, 8)).astype(np.float32))
    assert main(["run", str(p), "--input", f"x=@{tmp_path / 'x.npy'}"]) == 2
    assert "no rocmc integrity trailer" in capsys.readouterr().err
    assert main(["run", str(p), "--input", f"x=@{tmp_path / 'x.npy'}", "--no-verify"]) == 0
    assert main(["inspect", str(p), "--no-verify"]) == 0


# ---- fuzz: one flipped byte, anywhere --------------------------------------------------------------

# Loads and calls each damaged module in turn and prints its outcome; a crash or a hang (killed by
# SIGALRM) ends the process, and the parent restarts it after the case that ended it.
_WORKER = """
import json, signal, sys
import numpy as np
import rocmc
base, verify = open(sys.argv[1], "rb").read(), sys.argv[2] == "1"
x, want = np.load(sys.argv[3]), np.load(sys.argv[4])
for i, pos, mask in json.load(sys.stdin):
    data = bytearray(base)
    data[pos] ^= mask
    signal.alarm(int(sys.argv[5]))
    try:
        got = rocmc.load(bytes(data), verify=verify)(x)
        same = isinstance(got, np.ndarray) and got.shape == want.shape and np.array_equal(got, want)
        outcome = "ok" if same else "wrong"
    except rocmc.RocmcError as e:
        outcome = "typed:" + type(e).__name__
    except Exception as e:
        outcome = "untyped:" + type(e).__name__
    signal.alarm(0)
    print("rocmc-fuzz-outcome", i, outcome, flush=True)
"""
HANG_S = 5


def _fuzz(tmp_path, cases: list, verify: bool) -> list[str]:
    outcomes: dict[int, str] = {}
    todo = list(range(len(cases)))
    while todo:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                _WORKER,
                str(tmp_path / "m.vmfb"),
                "1" if verify else "0",
                str(tmp_path / "x.npy"),
                str(tmp_path / "want.npy"),
                str(HANG_S),
            ],
            input=json.dumps([[i, *cases[i]] for i in todo]),
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=HANG_S * 3 + len(todo),
        )
        for line in proc.stdout.splitlines():  # damaged native code may print too: only the worker's lines
            fields = line.split()
            if len(fields) == 3 and fields[0] == "rocmc-fuzz-outcome" and fields[1].isdigit():
                outcomes[int(fields[1])] = fields[2]
        left = [i for i in todo if i not in outcomes]
        if left and proc.returncode == 0:
            raise AssertionError(f"the worker stopped early: {proc.stderr[-2000:]}")
        if left:  # the first case left ended the process
            rc = proc.returncode
            outcomes[left[0]] = (
                "hang" if rc == -signal.SIGALRM else f"crash:{signal.Signals(-rc).name if rc < 0 else rc}"
            )
        todo = left[1:]
    return [outcomes[i] for i in range(len(cases))]


def test_fuzzed_module_gives_a_correct_result_or_a_typed_error(tmp_path, sealed, rng):
    write(tmp_path, "m.vmfb", sealed)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "want.npy", rocmc.load(sealed)(x))
    # One position in each of 120 equal slices of the module, and 8 in the trailer.
    edges = np.linspace(0, len(module_part(sealed)), 121).astype(int)
    positions = [int(rng.integers(a, b)) for a, b in zip(edges[:-1], edges[1:])]
    positions += [int(p) for p in rng.choice(np.arange(len(sealed) - _SEAL.size, len(sealed)), 8, replace=False)]
    cases = [(p, int(rng.integers(1, 256))) for p in positions]

    checked = _fuzz(tmp_path, cases, verify=True)
    bad = [(p, o) for (p, _), o in zip(cases, checked) if o != "ok" and not o.startswith("typed:")]
    assert not bad, f"positions with neither a correct result nor a typed error: {bad}"

    # What IREE itself does with the same damage, unchecked: recorded, not required. Damaged native
    # code can loop forever, so a hang is one of the outcomes, cut short by the worker's alarm.
    raw = _fuzz(tmp_path, cases, verify=False)
    print("verify=False outcomes:", {o: [p for (p, _), r in zip(cases, raw) if r == o] for o in sorted(set(raw))})
    assert len(raw) == len(cases)


# ---- metadata against the module ----------------------------------------------------------------


@pytest.mark.parametrize(
    "old,new,match",
    [
        (
            '"outputs": [{"dtype": "f32"',
            '"outputs": [{"dtype": "i32"',
            r"output 'out0' is tensor<2x\?x8xi32> but function 'main' has tensor<2x\?x8xf32>",
        ),
        (
            '"shape": [2, "seq", 8]}], "outputs"',
            '"shape": [2, "seq", 9]}], "outputs"',
            r"input 'x' is tensor<2x\?x9xf32> but function 'main' has tensor<2x\?x8xf32>",
        ),
    ],
    ids=["output-dtype", "input-static-dim"],
)
def test_edited_signature_is_an_artifact_error(tmp_path, sealed, old, new, match):
    with pytest.raises(rocmc.ArtifactError, match=match):
        rocmc.load(write(tmp_path, "m.vmfb", edited(sealed, old, new)))


def test_long_form_signature_is_checked_too():
    # A GPU sdpa with a symbolic key length has a second entry function (compiled, not run, here).
    g = rocmc.Graph("sdpa")
    q, k = g.input("q", (1, 4, "s", 32), "f16"), g.input("k", (1, 2, "s", 32), "f16")
    g.output(ops.sdpa(q, k, k, is_causal=True))
    data = rocmc.compile(g, "cuda:sm_80").vmfb
    assert rocmc.Artifact.from_bytes(data).metadata["long_form"]["function"] == "main_long"
    with pytest.raises(rocmc.ArtifactError, match="names function 'main_lonx', which the module lacks"):
        rocmc.Artifact.from_bytes(edited(data, '"function": "main_long"', '"function": "main_lonx"'))


# ---- metadata schema -----------------------------------------------------------------------------

SCHEMA_EDITS = [
    ('"target": "cpu"', '"target": "cpx"', r"key 'target' is \"cpx\", expected one of cpu, cuda:sm_100, cuda:sm_80"),
    ('"graph_hash"', '"graph_hasx"', "lacks the key 'graph_hash'"),
    ('"inputs": [{"dtype": "f32"', '"inputs": [{"dtypx": "f32"', r"lacks the key 'signature.inputs\[0\].dtype'"),
]
SCHEMA_IDS = ["unknown-target", "missing-key", "missing-nested-key"]


@pytest.mark.parametrize("old,new,match", SCHEMA_EDITS, ids=SCHEMA_IDS)
def test_malformed_metadata_is_an_artifact_error(tmp_path, sealed, old, new, match):
    with pytest.raises(rocmc.ArtifactError, match=match):
        rocmc.load(write(tmp_path, "m.vmfb", edited(sealed, old, new)))


def test_metadata_of_a_wrong_type_is_an_artifact_error(tmp_path, sealed):
    # `"implementations": [...]` becomes `"implementations": 7`, padded with spaces to the same length.
    module = module_part(sealed)
    start = module.index(b'"implementations": [') + len(b'"implementations": ')
    end = module.index(b"}]", start) + 2
    data = seal(module[:start] + b"7" + b" " * (end - start - 1) + module[end:])
    with pytest.raises(rocmc.ArtifactError, match="key 'implementations' is 7, expected a list"):
        rocmc.load(write(tmp_path, "m.vmfb", data))


@pytest.mark.parametrize("old,new,match", SCHEMA_EDITS, ids=SCHEMA_IDS)
def test_inspect_reports_malformed_metadata_as_one_error(tmp_path, sealed, capsys, old, new, match):
    from rocmc.cli import main

    p = write(tmp_path, "m.vmfb", edited(sealed, old, new))
    assert main(["inspect", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rocmc: error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_load_of_a_directory_is_an_artifact_error(tmp_path):
    with pytest.raises(rocmc.ArtifactError, match="is a directory, expected a .vmfb file"):
        rocmc.load(tmp_path)
    with pytest.raises(rocmc.ArtifactError, match="is a directory, expected a .vmfb file"):
        rocmc.Artifact.load(tmp_path)


# ---- save ----------------------------------------------------------------------------------------


def test_save_does_not_follow_a_link_at_the_old_temporary_name(tmp_path, sealed):
    victim = write(tmp_path, "victim", b"precious")
    out = tmp_path / "m.vmfb"
    (tmp_path / f"m.vmfb.tmp{os.getpid()}").symlink_to(victim)
    rocmc.Artifact(sealed, {}).save(out)
    assert victim.read_bytes() == b"precious"
    assert out.read_bytes() == sealed and not out.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.vmfb", f"m.vmfb.tmp{os.getpid()}", "victim"]


def test_save_uses_a_fresh_temporary_name_each_time(tmp_path, sealed, monkeypatch):
    import tempfile

    names = []
    real = tempfile.mkstemp

    def spy(*a, **kw):
        fd, name = real(*a, **kw)
        names.append(name)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", spy)
    for _ in range(2):
        rocmc.Artifact(sealed, {}).save(tmp_path / "m.vmfb")
    assert len(set(names)) == 2 and all(Path(n).parent == tmp_path for n in names)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600)])
def test_saved_file_mode_is_0644_less_the_umask(tmp_path, sealed, umask, mode):
    old = os.umask(umask)
    try:
        p = rocmc.Artifact(sealed, {}).save(tmp_path / "m.vmfb")
    finally:
        os.umask(old)
    assert p.stat().st_mode & 0o777 == mode


@pytest.mark.parametrize(
    "failure,raised",
    [(OSError(28, "No space left on device"), rocmc.ArtifactError), (KeyboardInterrupt(), KeyboardInterrupt)],
    ids=["disk-full", "interrupt"],
)
def test_failed_save_leaves_no_temporary_file(tmp_path, sealed, monkeypatch, failure, raised):
    def fail(src, dst):
        raise failure

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(raised):
        rocmc.Artifact(sealed, {}).save(tmp_path / "m.vmfb")
    assert list(tmp_path.iterdir()) == []


def test_save_error_names_the_file_and_the_reason(tmp_path, sealed, monkeypatch):
    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(rocmc.ArtifactError, match="m.vmfb.*No space left"):
        rocmc.Artifact(sealed, {}).save(tmp_path / "m.vmfb")


def test_save_into_a_missing_directory_or_onto_a_directory(tmp_path, sealed):
    art = rocmc.Artifact(sealed, {})
    with pytest.raises(rocmc.ArtifactError, match="nope.*does not exist"):
        art.save(tmp_path / "nope" / "m.vmfb")
    with pytest.raises(rocmc.ArtifactError, match=f"{tmp_path.name}.*is a directory"):
        art.save(tmp_path)
