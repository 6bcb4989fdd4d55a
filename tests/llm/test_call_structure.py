"""What a call issues on a GPU, read off the compiled HAL program (rocmc.artifact.structure): kernel launches,
fills, copies, queue submissions, host waits, queue allocations and frees, for decode and prefill of a tiny
Llama compiled for gfx942 and cuda:sm_80 from its config alone (compile-only: no GPU needed)."""

from __future__ import annotations

import json

import pytest

import rocmc
from rocmc.artifact.structure import CallStructure, call_structure
from llm_models import hf_config

TARGETS = ["gfx942", "cuda:sm_80"]


def _compile(tmp_path, target, layers, functions=("decode",), max_batch=1):
    cfg = hf_config("llama3").to_dict()
    cfg["num_hidden_layers"] = layers
    d = tmp_path / f"l{layers}"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return rocmc.llm.compile_hf(d, target, dtype="f16", max_seq_len=64, max_batch=max_batch, functions=functions)


@pytest.fixture(scope="module")
def per_layer(tmp_path_factory):
    """{(target, max_batch): (decode call with 2 layers, what a second layer adds, what a third adds)} (batch 3:
    the third is not compiled, the two differences being the same at batch 1)."""
    out = {}
    for target in TARGETS:
        for b, layers in ((1, (1, 2, 3)), (3, (1, 2))):
            calls = [
                _compile(tmp_path_factory.mktemp("s"), target, n, max_batch=b).call_structure()["decode"]
                for n in layers
            ]
            diffs = [y - x for x, y in zip(calls, calls[1:])]
            out[target, b] = (calls[1], diffs[0], diffs[-1])
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_every_layer_issues_the_same(per_layer, target):
    """The counts are per call and grow by the same amount with each layer (a layer's share is well defined)."""
    call, layer, next_layer = per_layer[target, 1]
    assert layer == next_layer
    assert layer.dispatches > 0 and call.dispatches > 2 * layer.dispatches - 1
    assert call.submissions >= 1


@pytest.mark.parametrize("max_batch", [1, 3])
@pytest.mark.parametrize("target", TARGETS)
def test_decode_step_is_one_submission_without_waits_copies_or_fills(per_layer, target, max_batch):
    """The decode issue's first goal: a step records every layer into one queue submission, with no host wait,
    allocation, copy or fill inside it (the one host wait is the call's end, where the synchronous ABI hands
    the results back; the allocations are the call's results and transients, stream-ordered)."""
    call, layer, _ = per_layer[target, max_batch]
    inside = ("host_waits", "allocations", "frees", "fills", "copies", "submissions")
    assert {k: getattr(layer, k) for k in inside} == dict.fromkeys(inside, 0)
    assert (call.submissions, call.host_waits, call.fills, call.copies) == (1, 1, 0, 0)


@pytest.mark.parametrize("target", TARGETS)
def test_stream_ordered_step_allocates_frees_and_waits_for_nothing(tmp_path, target):
    """decode$async, the form a decode loop issues ahead, is one queue submission with no allocation, free or host
    wait in the whole call (not only per layer): the KV cache is the caller's buffer, updated in place, and the
    caller gives its results' buffers and its transient storage (held states, lowering/module.py). IREE's CUDA
    HAL would block the issuing thread in an allocation or free until the work before it is done."""
    art = _compile(tmp_path, target, 2, max_batch=3)
    call = art.call_structure()["decode$async"]
    assert (call.submissions, call.host_waits, call.allocations, call.frees, call.copies, call.fills) == (
        1,
        0,
        0,
        0,
        0,
        0,
    )
    meta = art.metadata  # decode, the module's only function, is its top level
    assert (meta["function"], meta["held_states"], meta["assigned_states"], meta["async_storage"]) == (
        "decode",
        ["kv_cache"],
        ["kv_cache"],
        "caller",
    )


@pytest.mark.parametrize("target", TARGETS)
def test_prefill_layer_has_no_host_wait(tmp_path, target):
    """A prefill's layers add no host wait: the check that every row's slot is inside the cache reads the slots'
    range to the host once a call, not once a layer (each read is a wait inside the call, the GPU idle)."""
    one, two = (
        _compile(tmp_path, target, n, functions=("prefill",), max_batch=3).call_structure()["prefill"] for n in (1, 2)
    )
    assert (two - one).host_waits == 0 and (two - one).copies == 0


@pytest.mark.parametrize("max_batch", [1, 3])
@pytest.mark.parametrize("target", TARGETS)
def test_decode_layer_takes_at_most_nine_dispatches(per_layer, target, max_batch):
    """The decode issue's kernel goal: per layer at most 9 dispatches. One row: 6, the linear_vec kernel taking
    every projection with what surrounds it (rms_norm + the joined q/k/v, RoPE with the cache store, attention,
    o + residual, rms_norm + the joined gate/up + silu(gate) * up, down + residual). 3 rows: 8, the linear_rows
    kernel after each norm's own dispatch."""
    _, layer, _ = per_layer[target, max_batch]
    assert layer.dispatches == (6 if max_batch == 1 else 8)


HAL = """
  util.global private @__s_memoize_result_0_device_0 : !hal.command_buffer
  util.initializer {
    %0 = util.call @__s_memoize_apply() : () -> !hal.command_buffer
    util.global.store %0, @__s_memoize_result_0_device_0 : !hal.command_buffer
    util.return
  }
  util.func private @__s_memoize_apply() -> !hal.command_buffer {
    hal.command_buffer.dispatch<%cmd : !hal.command_buffer> target(%e : !hal.executable)[%c0]
    hal.command_buffer.dispatch<%cmd : !hal.command_buffer> target(%e : !hal.executable)[%c1]
    util.return %cmd : !hal.command_buffer
  }
  util.func private @helper() {
    hal.command_buffer.fill_buffer<%cmd : !hal.command_buffer> target(%b : !hal.buffer)[%c0, %c4] pattern(%p : i32)
    util.return
  }
  util.func public @f(%arg0: !hal.buffer_view) {
    %t = hal.device.queue.alloca<%dev : !hal.device> affinity(%a) wait(%w) signal(%s) pool(%c0) type(%t) usage(%u)
    %c = util.global.load immutable @__s_memoize_result_0_device_0 : !hal.command_buffer
    hal.device.queue.execute.indirect<%dev : !hal.device> affinity(%a) wait(%w) signal(%s) commands(%c)
    util.call @helper() : () -> ()
    hal.command_buffer.dispatch<%cmd : !hal.command_buffer> target(%e : !hal.executable)[%c2]
    hal.device.queue.execute<%dev : !hal.device> affinity(%a) wait(%w) signal(%s) commands(%cmd)
    %r = hal.fence.await until([%f]) timeout_millis(%m) flags("None") : i32
    hal.device.queue.dealloca<%dev : !hal.device> affinity(%a) wait(%w) signal(%s) buffer(%t : !hal.buffer)
    util.return
  }
"""


def test_counts_follow_calls_and_memoized_command_buffers():
    """A public function's count includes the functions it calls and the command buffers it replays."""
    assert call_structure(HAL) == {
        "f": CallStructure(dispatches=3, fills=1, submissions=2, host_waits=1, allocations=1, frees=1)
    }
