"""Artifacts of format 2 (library roles named after their ROCm providers: imports `miopen.*` and
`hipblaslt.*`, implementations `miopen`, `hipblaslt`, `hip`) still load and run, and read with the
current names; the old names are accepted by compile as aliases; new artifacts are of format 3 and
import `dnn.*` and `blas.*`. tests/data/README.md says what the two stored artifacts compute."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.aliases import ALIASES
from rocmc.artifact import FORMAT

from helpers import TOL

DATA = Path(__file__).resolve().parents[1] / "data"


def _conv2d_pad1(x, w):
    """conv2d(x, w, padding=1), stride 1, no bias, in float64 (cross-correlation, as torch's)."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.zeros((n, c, h + 2, wd + 2))
    xp[:, :, 1:-1, 1:-1] = x
    y = np.zeros((n, k, h, wd))
    for i in range(r):
        for j in range(s):
            y += np.einsum("nchw,kc->nkhw", xp[:, :, i : i + h, j : j + wd], w[:, :, i, j])
    return y


def _imports(art, tmp_path: Path) -> set:
    """The module's imports of library roles (not IREE's own `hal.*`), as iree-dump-module lists them."""
    path = tmp_path / "m.vmfb"
    path.write_bytes(art.vmfb)
    tool = Path(sys.executable).with_name("iree-dump-module")
    dump = subprocess.run([str(tool), str(path)], check=True, capture_output=True, text=True).stdout
    return {i for i in re.findall(r"vm\.import @([\w.]+) cconv", dump) if not i.startswith("hal.")}


def _close(got, want, tol):
    rtol, atol = tol
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)


def test_format2_cpu_artifact_loads_and_runs(rng):
    art = rocmc.Artifact.load(DATA / "format2_cpu.vmfb")
    assert art.metadata["format"] == 2
    assert {x["import"] for x in art.metadata["externs"]} == {"miopen.conv2d", "miopen.relu", "hipblaslt.matmul"}
    mod = rocmc.load(DATA / "format2_cpu.vmfb")
    g = np.random.default_rng(7)
    w = g.standard_normal((4, 3, 3, 3)).astype(np.float32).astype(np.float64)
    wm = g.standard_normal((24, 20)).astype(np.float32).astype(np.float64)
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    m = rng.standard_normal((2, 7, 24)).astype(np.float32)  # rows: 7, odd
    y, z = mod(x, m)
    assert y.shape == (2, 4, 9, 11) and z.shape == (2, 7, 20)
    _close(y, np.maximum(_conv2d_pad1(x.astype(np.float64), w), 0.0), TOL["f32"])
    _close(z, m.astype(np.float64) @ wm, TOL["f32"])


def test_format2_cpu_summary_names_the_roles():
    art = rocmc.Artifact.load(DATA / "format2_cpu.vmfb")
    summary = art.summary()
    impl = {c["op"]: c["impl"] for c in art.implementations}
    assert impl["conv2d"] == impl["relu"] == "dnn" and impl["matmul"] == "blas"
    assert (
        {x["impl"] for x in art.metadata["externs"]}
        == {x["library"] for x in art.metadata["externs"]}
        == {"dnn", "blas"}
    )
    assert re.search(r"conv2d +dnn\b", summary) and re.search(r"relu +dnn\b", summary)
    assert re.search(r"matmul +blas\b", summary)
    assert "miopen" not in summary and "hipblaslt" not in summary


def test_format2_cuda_artifact_loads_with_the_current_names():
    art = rocmc.Artifact.load(DATA / "format2_cuda.vmfb")  # cuda:sm_80: it can't run on the CPU
    assert isinstance(art, rocmc.Artifact) and art.target.startswith("cuda")
    assert art.metadata["format"] == 2
    summary = art.summary()
    assert re.search(r"rms_norm +kernel\b", summary) and re.search(r"matmul +blas\b", summary)
    assert "hipblaslt" not in summary and not re.search(r"\bhip\b", summary)
    assert {x["import"].split(".")[0] for x in art.metadata["externs"]} == {"hipblaslt"}  # the module's own


def _conv_matmul_graph(rng):
    g = rocmc.Graph("roles")
    x = g.input("x", (2, 3, 9, 11), "f32")
    m = g.input("m", (2, "rows", 24), "f32")
    w = g.constant("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    wm = g.constant("wm", rng.standard_normal((24, 20)).astype(np.float32))
    g.output(ops.relu(ops.conv2d(x, w, padding=1)))
    g.output(ops.matmul(m, wm))
    return g


def test_new_artifacts_are_format_3_and_import_the_roles(rng, tmp_path):
    assert FORMAT == 3
    art = rocmc.compile(_conv_matmul_graph(rng), "cpu", libraries=["dnn", "blas"], rewrite=False)
    assert art.metadata["format"] == 3
    assert {x["import"] for x in art.metadata["externs"]} == {"dnn.conv2d", "dnn.relu", "blas.matmul"}
    assert _imports(art, tmp_path) == {"dnn.conv2d", "dnn.relu", "blas.matmul"}
    loaded = rocmc.Artifact.load(art.save(tmp_path / "new.vmfb"))
    assert loaded.metadata["format"] == 3 and loaded.implementations == art.implementations


def _choices(art) -> list:
    return [(c["node"], c["op"], c["impl"], tuple(c["skipped"])) for c in art.implementations]


@pytest.mark.parametrize(
    "old, new",
    [
        ({"libraries": ["miopen"]}, {"libraries": ["dnn"]}),
        ({"libraries": ["hipblaslt"]}, {"libraries": ["blas"]}),
        ({"libraries": ("miopen", "hipblaslt")}, {"libraries": ("dnn", "blas")}),
        ({"impl": {"conv2d": "miopen", "matmul": "hipblaslt"}}, {"impl": {"conv2d": "dnn", "matmul": "blas"}}),
    ],
)
def test_old_library_names_are_aliases(rng, old, new):
    g = _conv_matmul_graph(rng)
    a = rocmc.compile(g, "cpu", rewrite=False, cache=False, **old)
    b = rocmc.compile(g, "cpu", rewrite=False, cache=False, **new)
    assert _choices(a) == _choices(b)
    assert a.metadata["externs"] == b.metadata["externs"] and a.metadata["externs"]


def _norm_graph():
    g = rocmc.Graph("norms")
    x = g.input("x", (3, "seq", 64), "f16")
    w = g.constant("w", np.ones(64, np.float16))
    g.output(ops.rms_norm(x, w, eps=1e-5))
    return g


@pytest.mark.parametrize("old, new", [("hip", "kernel"), ({"rms_norm": "hip"}, {"rms_norm": "kernel"})])
def test_old_kernel_name_is_an_alias(old, new):
    a = rocmc.compile(_norm_graph(), "gfx942", impl=old, rewrite=False)
    b = rocmc.compile(_norm_graph(), "gfx942", impl=new, rewrite=False)
    assert _choices(a) == _choices(b)
    assert [c["impl"] for c in a.implementations] == ["kernel"]
    assert a.metadata["kernels"] and a.metadata["kernels"] == b.metadata["kernels"]


def test_one_alias_table():
    assert ALIASES == {"miopen": "dnn", "hipblaslt": "blas", "hip": "kernel"}
