"""Tensor-parallel LLMs (rocmc.llm.sharding) on the CPU.

- The sharding: every rank's graph run through rocmc.evaluate (ranks as threads exchanging numpy arrays)
  gives the unsharded graph's logits and cache, for every family (GQA, tied embeddings, biases, sliding
  windows, gemma's scaled embedding) and degrees 2 and 4; a rank given another rank's slices does not.
- Each rank reads only its slices of the checkpoint: axis-0 slices as ranges of the file.
- Compiled for the CPU and run as 2 processes under `rocmc launch`: the same greedy and sampled tokens as
  one process, and as transformers; typed errors for a wrong degree, mismatched checkpoints, a dead rank.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rocmc
from llm_models import PROMPT_IDS, hf_greedy, llm_checkpoint  # noqa: F401
from tp_ranks import RANK_SCRIPT, launch, results
from rocmc.llm import sharding
from rocmc.llm.config import load_config
from rocmc.llm.model import CACHE, Shape, build, cache_shape
from rocmc.parameters import Parameters
from rocmc.runtime import distributed

SHAPE = Shape(max_seq_len=16, max_batch=2, dtype="f32")


def _feeds(cfg, ids, slot=1):
    """A prompt's prefill into a slot of the cache, as the runtime makes it."""
    from rocmc.llm.runtime import _SlotTable

    (feeds,) = _SlotTable(SHAPE, cfg).prefill(slot, ids)
    return feeds


def _run_sharded(cfg, params, degree, feeds, ranks_from=None):
    plan = sharding.plan(cfg, degree)
    graph = build(cfg, SHAPE, ["prefill"], plan)["prefill"]

    def rank(r):
        mine = plan.parameters(params, r if ranks_from is None else ranks_from)
        return rocmc.evaluate(
            graph,
            **feeds,
            parameters={n: mine.array(n) for n in plan.shards},
            state={CACHE: np.zeros(cache_shape(cfg, SHAPE, degree))},
        )

    return graph, distributed.simulate(degree, rank)


@pytest.mark.parametrize(
    "family,degree", [("llama", 2), ("llama", 4), ("llama3", 2), ("mistral", 2), ("qwen2", 2), ("gemma", 2)]
)
def test_every_rank_through_evaluate_equals_the_unsharded_graph(llm_checkpoint, family, degree):  # noqa: F811
    d = llm_checkpoint(family)
    cfg, params = load_config(d), Parameters.open(d)
    feeds = _feeds(cfg, list(PROMPT_IDS))
    full = build(cfg, SHAPE, ["prefill"])["prefill"]
    whole = sharding.plan(cfg, 1).parameters(params)  # the checkpoint's tensors, q/k/v and gate/up joined
    want, want_state = rocmc.evaluate(
        full,
        **feeds,
        parameters={n: whole.array(n) for n in whole},
        state={CACHE: np.zeros(cache_shape(cfg, SHAPE))},
    )
    graph, ranks = _run_sharded(cfg, params, degree, feeds)
    ops = [n.op for n in graph.nodes]
    assert ops.count("all_reduce") == 2 * cfg.num_hidden_layers and ops.count("all_gather") == 2
    scale = np.abs(want[2]).max()
    for r, (got, state) in enumerate(ranks):
        np.testing.assert_array_equal(got[0], want[0])  # the same next tokens
        assert np.abs(got[1] - want[1]).max() <= 1e-12 * scale
        assert np.abs(got[2] - want[2]).max() <= 1e-12 * scale  # every position's logits
        # the rank's cache holds its kv heads of every position: the unsharded cache's columns of them
        hkv, hd, b, s = cfg.num_key_value_heads // degree, cfg.head_dim, SHAPE.max_batch, SHAPE.max_seq_len
        full_cache = want_state[CACHE].reshape(-1, b, cfg.num_key_value_heads, s, hd)
        assert np.abs(full_cache[:, 1, :, : len(PROMPT_IDS)]).min() > 0  # the prompt's slot is written
        np.testing.assert_allclose(
            state[CACHE].reshape(-1, b, hkv, s, hd),
            full_cache[:, :, r * hkv : (r + 1) * hkv],
            rtol=1e-12,
            atol=1e-12 * np.abs(full_cache).max(),
        )
    # the check can fail: every rank holding rank 0's slices computes another model
    _, wrong = _run_sharded(cfg, params, degree, feeds, ranks_from=0)
    assert np.abs(wrong[0][0][2] - want[2]).max() > 1e-3 * scale


def test_the_plan_splits_heads_and_says_so(llm_checkpoint):  # noqa: F811
    cfg = load_config(llm_checkpoint("qwen2"))  # tied embeddings, q/k/v biases
    plan = sharding.plan(cfg, 2)
    s = plan.shards
    qkv = "model.layers.0.self_attn.qkv_proj."
    assert (s[qkv + "weight"].axis, s[qkv + "bias"].axis) == (0, 0)
    assert s[qkv + "weight"].sources == tuple(f"model.layers.0.self_attn.{m}_proj.weight" for m in "qkv")
    assert s["model.layers.0.self_attn.o_proj.weight"].axis == 1 and s["model.layers.0.mlp.down_proj.weight"].axis == 1
    assert s["model.embed_tokens.weight"].axis == 1 and s["model.norm.weight"].axis is None
    assert (s["lm_head.weight"].sources, s["lm_head.weight"].axis) == (("model.embed_tokens.weight",), 0)
    assert s[qkv + "weight"].local(2) == ((cfg.q_dim + 2 * cfg.kv_dim) // 2, cfg.hidden_size)
    text = "\n".join(plan.describe())
    assert "2 ranks" in text and "row-split (axis 1) then all_reduce" in text
    # a degree that does not divide the heads (2 kv heads), named with the degrees that work
    with pytest.raises(rocmc.InputError, match=r"tensor_parallel=4 does not divide .*num_key_value_heads.*1, 2"):
        sharding.plan(cfg, 4)
    for bad in (0, 3, "2", True):
        with pytest.raises(rocmc.InputError, match="tensor_parallel"):
            sharding.plan(cfg, bad)
    # degree 1 is the unsharded program
    one = build(cfg, SHAPE, ["decode"], sharding.plan(cfg, 1))["decode"]
    assert str(one) == str(build(cfg, SHAPE, ["decode"])["decode"])


def test_ranks_read_their_own_slices(llm_checkpoint, rng):  # noqa: F811
    d = llm_checkpoint("llama3", sharded=True)  # several safetensors files
    params = Parameters.open(d)
    name = "model.layers.1.self_attn.q_proj.weight"
    whole = np.asarray(params.array(name))
    mine = params.shard(
        {"q": (name, 0), "o": ("model.layers.1.self_attn.o_proj.weight", 1), "n": ("model.norm.weight", None)}, 1, 2
    )
    rows = whole.shape[0] // 2
    np.testing.assert_array_equal(mine.array("q"), whole[rows:])
    assert mine._entries["q"].part and mine._entries["q"].array is None  # a range of the file, not a copy
    o = np.asarray(params.array("model.layers.1.self_attn.o_proj.weight"))
    np.testing.assert_array_equal(mine.array("o"), o[:, o.shape[1] // 2 :])
    np.testing.assert_array_equal(mine.array("n"), params.array("model.norm.weight"))
    with pytest.raises(rocmc.InputError, match="does not split into 3"):
        params.shard({"q": (name, 0)}, 0, 3)
    with pytest.raises(rocmc.InputError, match="rank 2 of 2"):
        params.shard({"q": (name, 0)}, 2, 2)
    arrays = Parameters.open({"w": rng.standard_normal((4, 6)).astype(np.float32)})
    np.testing.assert_array_equal(arrays.shard({"w": ("w", 1)}, 0, 2).array("w"), arrays.array("w")[:, :3])


# ---- compiled, as processes -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tp_artifacts(llm_checkpoint, tmp_path_factory):  # noqa: F811
    d = llm_checkpoint("llama3")
    out = tmp_path_factory.mktemp("tp")
    for degree in (1, 2):  # the sizes of tests/llm/test_llm.py's models: its llama3 module is degree 1's
        rocmc.llm.compile_hf(d, "cpu", max_seq_len=64, max_batch=2, tensor_parallel=degree).save(
            out / f"tp{degree}.vmfb"
        )
    (out / "rank.py").write_text(RANK_SCRIPT)
    return d, out


def test_two_processes_give_the_tokens_of_one(tp_artifacts, tmp_path):
    d, out = tp_artifacts
    one = subprocess.run(
        [sys.executable, str(out / "rank.py"), str(out / "tp1.vmfb"), str(d), "1", str(tmp_path / "one")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    two = launch(2, str(out / "rank.py"), str(out / "tp2.vmfb"), str(d), "2", str(tmp_path / "two"))
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    (ref,), ranks = results(tmp_path / "one"), results(tmp_path / "two")
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ref["greedy"] == hf_greedy(d, PROMPT_IDS, 10)
    for r in ranks:
        assert (r["greedy"], r["sampled"], r["batch"]) == (ref["greedy"], ref["sampled"], ref["batch"])
    text = ranks[0]["summary"]
    assert "tensor parallel: 2 ranks" in text and "this is rank 0" in text
    assert "all_reduce (host" in text and "one of 2 ranks" in text


def test_generate_command_streams_from_rank_0(tp_artifacts):
    d, out = tp_artifacts
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocmc.cli",
            "launch",
            "-n",
            "2",
            "rocmc",
            "generate",
            str(d),
            "--module",
            str(out / "tp2.vmfb"),
            "--tp",
            "2",
            "--ids",
            "-p",
            ",".join(map(str, PROMPT_IDS)),
            "-n",
            "6",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1  # rank 0 prints, rank 1 is silent
    assert [int(t) for t in lines[0].split()] == hf_greedy(d, PROMPT_IDS, 6)


def test_tensor_parallel_errors(tp_artifacts, tmp_path):
    d, out = tp_artifacts
    with pytest.raises(rocmc.InputError, match="compiled for tensor_parallel=2, not 1"):
        rocmc.llm.load(out / "tp2.vmfb", d)
    with pytest.raises(rocmc.InputError, match="compiled for tensor_parallel=1, not 2"):
        rocmc.llm.load(out / "tp1.vmfb", d, tensor_parallel=2)
    # started alone (WORLD_SIZE unset): the error says how to start the ranks
    alone = subprocess.run(
        [
            sys.executable,
            "-c",
            "import rocmc, sys; rocmc.llm.load(sys.argv[1], sys.argv[2], tensor_parallel=2)",
            str(out / "tp2.vmfb"),
            str(d),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert alone.returncode != 0 and "WORLD_SIZE=1" in alone.stderr and "rocmc launch -n 2" in alone.stderr
    # rank 1 with another checkpoint of the same shapes: every rank fails, naming what differs
    other = tmp_path / "other"
    shutil.copytree(d, other)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(other / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 2
    save_file(tensors, other / "model.safetensors")
    script = tmp_path / "mixed.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, rocmc
        ckpt = {str(d)!r} if os.environ["RANK"] == "0" else {str(other)!r}
        try:
            rocmc.llm.load({str(out / "tp2.vmfb")!r}, ckpt, tensor_parallel=2)
        except rocmc.DistributedError as e:
            open({str(tmp_path)!r} + "/refused." + os.environ["RANK"], "w").write(str(e))
    """)
    )
    launch(2, str(script), timeout=120)
    refused = [p.read_text() for p in sorted(tmp_path.glob("refused.*"))]
    assert len(refused) == 2 and all("different checkpoints" in e and "rank(s) 1" in e for e in refused)


def test_a_rank_that_dies_ends_the_others(tp_artifacts, tmp_path):
    d, out = tp_artifacts
    script = tmp_path / "dies.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, rocmc
        lm = rocmc.llm.load({str(out / "tp2.vmfb")!r}, {str(d)!r}, tensor_parallel=2)
        lm.generate({list(PROMPT_IDS)}, 2, stop_tokens=())
        if os.environ["RANK"] == "1":
            os._exit(7)                      # a crash between two calls
        lm.generate({list(PROMPT_IDS)}, 4, stop_tokens=())
    """)
    )
    import time

    t = time.monotonic()
    proc = launch(2, str(script), timeout=120)
    assert time.monotonic() - t < 90
    assert proc.returncode != 0
    assert "rank 1 ended unexpectedly" in proc.stderr or "rank 1 exited with code 7" in proc.stderr
    assert "rank 1 exited with code 7" in proc.stderr  # the launcher names it
