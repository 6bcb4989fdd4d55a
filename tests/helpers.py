"""Shared test helpers: fresh random inputs, running graphs, comparing with the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import rocmc
from rocmc import ops
from rocmc.frontend.ops.rnn import GATES

# (rtol, atol) per dtype, for results compared with the float64 reference.
TOL = {"f32": (2e-5, 2e-5), "f16": (4e-3, 4e-3), "bf16": (2.5e-2, 2.5e-2)}
GPU_TARGETS = ("gfx942", "cuda:sm_80")


def rand(rng: np.random.Generator, shape, dtype="f32", low=-2.0, high=2.0):
    """Fresh random values (never zeros) of a rocmc dtype."""
    d = rocmc.dtype(dtype)
    if d.kind == "float":
        return rng.uniform(low, high, size=shape).astype(d.np)
    if d.kind == "int":
        return rng.integers(int(low) - 3, int(high) + 4, size=shape).astype(d.np)
    return rng.random(size=shape) < 0.5


def run(graph, *inputs, target="cpu", **kw):
    art = rocmc.compile(graph, target, **kw)
    return rocmc.load(art)(*inputs)


class CpuBatch:
    """The graphs of a parametrized test compiled for the CPU as the functions of one module, `size` graphs a
    module: iree-compile's cost a module (about 0.45 s, against about 0.1 s for each further function) is paid
    once for them, as bench/onnx_conformance.py does for its cases. `build(*key)` makes the graph of a key; each
    function is that graph, lowered as it is alone (its own dispatches, signature, input checks and choice of
    implementations).

    `batch(*key)` -> (graph, its compiled function): the module of the key's `size` neighbours in `keys` is
    compiled on the first use of any of them (keys in the order the tests run, so a worker's run of tests
    compiles each module once; a key not in `keys` is compiled alone). Graph by graph instead, so that each is
    compiled as it would be alone and a failure is its graph's: a module IREE can't compile, or one compiled
    without the CPU's tuning flags (which a module drops as a whole when IREE fails with them)."""

    def __init__(self, build, keys, size=24, **compile_kw):
        self.build, self.size, self.compile_kw = build, size, compile_kw
        self.keys = [tuple(k) for k in keys]
        self._graphs: dict = {}
        self._modules: dict = {}

    @classmethod
    def grid(cls, build, *axes, size=24, **compile_kw):
        """The batch over every combination of `axes` (lists of values, one per argument of `build`), the first
        axis varying fastest: the order of pytest's stacked parametrize decorators, the first one nearest the
        test. `parametrize(argnames)` is the decorator that runs them in that order."""
        keys = [()]
        for values in axes:
            keys = [(*k, v) for v in values for k in keys]
        return cls(build, keys, size=size, **compile_kw)

    def parametrize(self, argnames: str):
        """pytest's parametrize over this batch's keys, in their order (so a worker compiles a module once)."""
        single = "," not in argnames
        return pytest.mark.parametrize(argnames, [k[0] for k in self.keys] if single else self.keys)

    def graph(self, *key):
        if key not in self._graphs:
            self._graphs[key] = self.build(*key)
        return self._graphs[key]

    def _module(self, first: int):
        """(artifact, module) of the batch from keys[first], or None where its graphs go one by one."""
        if first not in self._modules:
            self._modules[first] = None
            try:
                program = {f"f{j}": self.graph(*k) for j, k in enumerate(self.keys[first : first + self.size])}
                art = rocmc.compile(program, "cpu", **self.compile_kw)
            except Exception:  # noqa: BLE001 - built and compiled alone, the failing graph says why
                return None
            if "compiled without" not in art.metadata.get("compile_note", ""):
                self._modules[first] = art, rocmc.load(art)
        return self._modules[first]

    def _place(self, key):
        """(batch of the key or None, its function's name): a key not in `keys` is compiled alone."""
        if key not in self.keys:
            return None, None
        i = self.keys.index(key)
        first = i - i % self.size
        return self._module(first), f"f{i - first}"

    def __call__(self, *key):
        (batch, name), graph = self._place(key), self.graph(*key)
        if batch is None:
            return graph, rocmc.load(rocmc.compile(graph, "cpu", **self.compile_kw))
        return graph, lambda *args, **kw: batch[1].call(name, *args, **kw)

    def implementations(self, *key) -> list:
        """The implementation chosen for each node of the key's graph (art.implementations of it alone)."""
        batch, name = self._place(key)
        if batch is None:
            return rocmc.compile(self.graph(*key), "cpu", **self.compile_kw).implementations
        from rocmc.artifact.schema import functions

        (function,) = [f for f in functions(batch[0].metadata) if f["name"] == name]
        return function["implementations"]


def check(graph, *inputs, tol=None, module=None, **compile_kw):
    """Compile for the CPU (or take `module`, the graph's compiled function: CpuBatch), run, and compare every
    output with the float64 reference."""
    got = module(*inputs) if module is not None else run(graph, *inputs, **compile_kw)
    want = rocmc.evaluate(graph, *inputs)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w, v in zip(got, want, graph.outputs):
        assert g.shape == w.shape, f"shape {g.shape} vs reference {w.shape}"
        if v.dtype.kind == "float":
            rtol, atol = tol or TOL[v.dtype.name]
            np.testing.assert_allclose(g.astype(np.float64), w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)
    return got


def compile_gpu(graph, targets=GPU_TARGETS, **kw):
    """Compile-only check for the GPU targets (no GPU here): the module builds."""
    for t in targets:
        art = rocmc.compile(graph, t, **kw)
        assert len(art.vmfb) > 0


def resnet_block(rng, cin, cout, groups, dtype="f32", h=9, w=11):
    """ResNet's basic block with a downsampling shortcut (stride 2, a grouped first conv), batch norms
    after every conv, and a second output conv(x) + r with neither bias nor relu."""
    g = rocmc.Graph("block")
    np_t = rocmc.dtype(dtype).np
    x = g.input("x", ("n", cin, h, w), dtype)
    r = g.input("r", ("n", cout, h, w), dtype)

    def conv_bn(v, cin, k, stride, padding, groups=1, bias=False):
        wt = rng.uniform(-1, 1, (cout, cin // groups, k, k)) / np.sqrt(cin * k * k)
        b = rng.uniform(-0.5, 0.5, cout).astype(np_t) if bias else None
        y = ops.conv2d(v, wt.astype(np_t), b, stride=stride, padding=padding, groups=groups)
        stats = [
            rng.uniform(-0.5, 0.5, cout),
            rng.uniform(0.5, 2.0, cout),
            rng.uniform(-1.5, 1.5, cout),
            rng.uniform(-0.5, 0.5, cout),
        ]
        return ops.batch_norm(y, *(s.astype(np_t) for s in stats), eps=1e-5)

    hid = ops.relu(conv_bn(x, cin, 3, 2, 1, groups=groups))
    main = conv_bn(hid, cout, 3, 1, 1, bias=True)
    plain = ops.conv2d(x, (rng.uniform(-1, 1, (cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np_t), padding=1)
    g.output(ops.relu(main + conv_bn(x, cin, 1, 2, 0)), plain + r)
    return g


# ---- LSTM / GRU graphs (tests/lowering/test_rnn.py, tests/runtime/test_rnn_extern.py) ----------


def rnn_weight(rng, *shape, dtype="f32", scale=0.6):
    return rand(rng, shape, dtype, -scale, scale)


def rnn_graph(op, rng, dtype="f32", seq="seq", batch=3, inp=5, hidden=7, biases=True, states=True):
    """A graph with x (and the initial states) as inputs and weights as constants."""
    g = rocmc.Graph(op)
    x = g.input("x", (seq, batch, inp), dtype)
    gates = GATES[op] * hidden
    feeds = [rand(rng, (seq if isinstance(seq, int) else 6, batch if isinstance(batch, int) else 2, inp), dtype)]
    kw = {}
    if biases:
        kw.update(b_ih=rnn_weight(rng, gates, dtype=dtype), b_hh=rnn_weight(rng, gates, dtype=dtype))
    if states:
        kw["h0"] = g.input("h0", (1, batch, hidden), dtype)
        feeds.append(rand(rng, (1, feeds[0].shape[1], hidden), dtype, -1.0, 1.0))
        if op == "lstm":
            kw["c0"] = g.input("c0", (1, batch, hidden), dtype)
            feeds.append(rand(rng, (1, feeds[0].shape[1], hidden), dtype, -1.0, 1.0))
    outs = getattr(ops, op)(
        x, rnn_weight(rng, gates, inp, dtype=dtype), rnn_weight(rng, gates, hidden, dtype=dtype), **kw
    )
    g.output(*outs)
    return g, feeds


def greedy_alone(lm, prompt: list, n: int) -> tuple[list, list]:
    """One prompt alone in cache slot 0 of a rocmc.llm LanguageModel, driven call by call: its n greedy tokens
    and the logits each was chosen from (the prefill's last position, then each decode step's)."""
    from rocmc.llm.runtime import _SlotTable

    slots = _SlotTable(lm.sizes, lm.config)
    for feeds in slots.prefill(0, prompt):
        nxt, last, _ = lm.module.prefill(**feeds)
    toks, logits = [int(nxt[0])], [last[0]]
    for _ in range(n - 1):
        nxt, last = lm.module.decode(**slots.decode(np.resize(nxt, lm.sizes.max_batch)))
        toks.append(int(nxt[0]))
        logits.append(last[0])
    return toks, logits
