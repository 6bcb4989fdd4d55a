"""`rocmc ops`, `rocmc models` and `rocmc targets`: what rocmc supports, from its own tables; and the
cuda:sm_90 / sm_100 targets they list."""

import json

import numpy as np
import pytest

import rocmc
from rocmc import cli, ops
from rocmc.frontend.registry import OPS
from rocmc.llm import config as llm_config
from rocmc.lowering.registry import REGISTRY
from rocmc.lowering.target import Target


def run(capsys, *argv) -> str:
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def test_ops_json_lists_every_op_with_its_implementations(capsys):
    rows = json.loads(run(capsys, "ops", "--json"))["ops"]
    by_op = {r["op"]: r for r in rows}
    assert set(by_op) == set(OPS) | set(REGISTRY)
    for op, impls in REGISTRY.items():
        for kind in ("cpu", "rocm", "cuda"):
            listed = {i["name"] for i in by_op[op]["targets"][kind]}
            assert listed == {i.name for i in impls.values() if kind in i.kinds}, (op, kind)
    # preference order: rms_norm's hand-written kernel first on GPUs; generated alone on the CPU
    assert [i["name"] for i in by_op["rms_norm"]["targets"]["rocm"]][0] == "kernel"
    assert by_op["rms_norm"]["targets"]["rocm"][0]["use"] == "default"
    assert [i["name"] for i in by_op["rms_norm"]["targets"]["cpu"]] == ["generated"]
    # an opt-in library says how to turn it on
    blas = next(i for i in by_op["matmul"]["targets"]["rocm"] if i["name"] == "blas")
    assert blas["use"] == "libraries=['blas']"


def test_ops_text(capsys):
    out = run(capsys, "ops").splitlines()
    assert out[1].split() == ["op", "cpu", "rocm", "cuda"]
    row = next(l for l in out if l.startswith("rms_norm "))
    assert row.split(None, 1)[1].split() == ["generated", "kernel,", "generated", "kernel,", "generated"]
    assert any(l.startswith("matmul ") and "blas+" in l for l in out)
    assert len(out) == 2 + len(set(OPS) | set(REGISTRY))


def test_models_lists_the_families(capsys):
    data = json.loads(run(capsys, "models", "--json"))
    fams = {r["family"]: r for r in data["families"]}
    assert set(fams) == set(llm_config._FAMILIES) >= {"llama", "mistral", "qwen2", "gemma"}
    assert fams["mistral"]["architectures"] == ["MistralForCausalLM"]
    assert any("sliding attention window on every layer" in n for n in fams["mistral"]["notes"])
    assert any("no sliding window" in n for n in fams["llama"]["notes"])
    assert any("(1 + w)" in n for n in fams["gemma"]["notes"])
    assert data["all_families"]["rope_types"] == list(llm_config.SUPPORTED_ROPE_TYPES)
    # every listed model_type / architecture is one the config reader accepts
    for r in data["families"]:
        assert (
            llm_config._family_of({"model_type": r["model_type"], "architectures": r["architectures"]}, "test")
            == r["family"]
        )
    text = run(capsys, "models")
    assert "mistral: model_type 'mistral', architectures MistralForCausalLM" in text


def test_quiet_option_works_on_the_new_commands(capsys):
    assert "rms_norm" in run(capsys, "-q", "ops")
    assert "llama" in run(capsys, "models", "-q")


# ---- targets that run sm_80 code ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,target",
    [
        ("cuda:sm_90", "cuda:sm_90"),
        ("sm_90a", "cuda:sm_90"),
        ("cuda:sm_100", "cuda:sm_100"),
        ("cuda:sm_100a", "cuda:sm_100"),
    ],
)
def test_newer_cuda_targets_compile_sm80_code(spec, target):
    t = Target.parse(spec)
    assert str(t) == target and t.code_arch == "sm_80"
    assert "--iree-cuda-target=sm_80" in t.iree_flags()
    assert "sm_80 code generated for" in t.code_note
    assert Target.parse("cuda:sm_80").code_note is None


def test_sm90_artifact_records_the_code_it_holds(capsys, tmp_path):
    assert {"cuda:sm_90", "cuda:sm_100"} <= set(run(capsys, "targets").split())
    g = rocmc.Graph("hopper")
    x = g.input("x", shape=(4, 64), dtype="f16")
    g.output(ops.silu(ops.matmul(x, g.constant("w", np.ones((64, 32), np.float16)))))
    art = rocmc.compile(g, "cuda:sm_90a", cache=False)
    assert art.target == "cuda:sm_90"
    assert art.metadata["compile_note"].startswith("sm_80 code generated for sm_90")
    # the module holds IREE's sm_80 code
    assert any("sm_80" in line for line in art.ir("hal").splitlines() if "iree_gpu.target" in line)
    assert not any("sm_90" in line for line in art.ir("hal").splitlines() if "iree_gpu.target" in line)
    # a compile cache hit carries the note too (the suite's cache: conftest.py)
    rocmc.compile(g, "cuda:sm_90")
    hit = rocmc.compile(g, "cuda:sm_90")
    assert hit.cached and hit.metadata["compile_note"] == art.metadata["compile_note"]


def test_unknown_cuda_arch_is_refused():
    with pytest.raises(rocmc.TargetError, match="cuda:sm_90"):
        Target.parse("cuda:sm_75")
