"""GPU numerics tests in two steps: compile on a machine with iree-compile, run on one with a GPU.

A `Case` is a graph (built the same way on both machines, constants from fixed seeds), its compile
options and a maker of fresh random inputs for each run-time size of its symbolic dims. The compile
step (`--gpu-compile DIR`) writes DIR/<case>.vmfb for cuda:sm_80 and records every case in
DIR/manifest.json: the graph's content hash, the compile options and the input shapes and dtypes per
size. The run step (`--gpu-artifacts DIR`) rebuilds the graph, refuses an artifact compiled from
another graph (a stale directory is a failure, not a silent pass), loads the module on the cuda
device and compares each output with a float64 reference computed there. Only the compile step needs
the compiler: `import rocmc` imports iree.compiler on the first compile, never before.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

import rocmc

TARGET = "cuda:sm_80"
MANIFEST = "manifest.json"


# ---- errors: one number per output, compared with the case's tolerance ---------------------------


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    """Relative L2 error: robust to a few rounding outliers, blind to none of a wrong region."""
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def max_rel1(got: np.ndarray, want: np.ndarray) -> float:
    """Largest elementwise error relative to |want| + 1 (absolute near zero, relative elsewhere)."""
    return float(np.max(np.abs(got - want) / (np.abs(want) + 1.0))) if want.size else 0.0


def max_over_max(got: np.ndarray, want: np.ndarray) -> float:
    """Largest elementwise error relative to the reference's largest magnitude."""
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)) if want.size else 0.0


@dataclass
class Case:
    """One module of the GPU tests.

    graph: builds the graph (no compiler needed; constants from fixed seeds, so both machines build
    the same one). inputs(rng, n): fresh inputs with the symbolic dims at size n (n is None for a
    static graph). reference(*inputs) -> output(s) in float64 (default: rocmc.evaluate, the graph's
    float64 semantics). variant: a context manager factory the compile step runs under; with it, a
    module equal to the plain one is recorded as such and its run is skipped.
    """

    name: str
    graph: Callable[[], "rocmc.Graph"]
    inputs: Callable[[np.random.Generator, int | None], list]
    tol: float
    error: Callable[[np.ndarray, np.ndarray], float] = rel_l2
    sizes: tuple = (None,)
    compile: dict = field(default_factory=dict)
    reference: Callable | None = None
    variant: Callable | None = None
    poison: bool = False  # run once on NaN inputs first: an unwritten output element shows as NaN
    runs: int = 1  # >1: every run must agree with the reference (a result that moves is a race)
    calls: str = ""  # "kernels" or an import ("dnn", "dnn.lstm"): what the module must call
    target: str = TARGET  # the compile target (cuda:sm_90 compiles sm_80 code and says so)


def ids(cases: list[Case]) -> list[str]:
    return [c.name for c in cases]


def _key(n: int | None) -> str:
    return "static" if n is None else str(n)


def _spec(a: np.ndarray) -> list:
    return [list(a.shape), str(a.dtype)]


# ---- compile step ------------------------------------------------------------------------------------


class Compiler:
    """Compiles cases into a directory: each case's module and its manifest entry (`<case>.json`, one
    file per case, so parallel workers (-n) never write the same file); `write` gathers them into
    the manifest."""

    def __init__(self, out: Path):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)

    def __call__(self, case: Case) -> None:
        g = case.graph()
        with (case.variant or contextlib.nullcontext)():
            art = rocmc.compile(g, case.target, cache=case.variant is None, **case.compile)
        _check_calls(case, art.metadata)
        entry = {
            "hash": g.hash(),
            "compile": repr(case.compile),
            "target": case.target,
            "inputs": {_key(n): [_spec(a) for a in case.inputs(np.random.default_rng(0), n)] for n in case.sizes},
            "imports": sorted({x["import"] for x in art.metadata.get("externs", [])}),
            "kernels": [k["symbol"] for k in art.metadata.get("kernels", [])],
        }
        if case.variant is not None:
            plain = rocmc.compile(g, case.target, **case.compile)
            if plain.vmfb == art.vmfb:
                entry["same_as_plain"] = True
        if not entry.get("same_as_plain"):
            art.save(self.out / f"{case.name}.vmfb")
        (self.out / f"{case.name}.json").write_text(json.dumps(entry, sort_keys=True))

    def write(self) -> None:
        """The manifest: every case entry in the directory (a -k subset adds to what is there)."""
        cases = {
            p.name[: -len(".json")]: json.loads(p.read_text())
            for p in sorted(self.out.glob("*.json"))
            if p.name != MANIFEST
        }
        (self.out / MANIFEST).write_text(json.dumps({"target": TARGET, "cases": cases}, indent=1, sort_keys=True))


def _check_calls(case: Case, meta: dict) -> None:
    """A test named for a kernel or a library call must run it: the module holds it."""
    if case.calls == "kernels":
        assert meta.get("kernels"), f"{case.name}: no hand-written kernel in the module"
    elif case.calls:
        imports = [x["import"] for x in meta.get("externs", [])]
        assert any(i == case.calls or i.startswith(case.calls + ".") for i in imports), (
            f"{case.name}: no {case.calls} call in the module (imports: {imports})"
        )


# ---- run step ----------------------------------------------------------------------------------------


class Runner:
    """Runs compiled cases on the cuda device against float64 references."""

    def __init__(self, directory: Path):
        self.dir = directory
        path = directory / MANIFEST
        if not path.exists():
            raise FileNotFoundError(
                f"{path}: no manifest; compile the artifacts first "
                f"(python -m pytest tests/gpu --gpu-compile {directory})"
            )
        self.manifest = json.loads(path.read_text())["cases"]

    def __call__(self, case: Case, rng: np.random.Generator) -> None:
        import pytest

        entry = self.manifest.get(case.name)
        assert entry is not None, f"{case.name}: not in {self.dir / MANIFEST}; rerun the compile step"
        if entry.get("same_as_plain"):
            pytest.skip(f"{case.name}: the variant compiles to the plain module (tested without it)")
        g = case.graph()
        assert entry["hash"] == g.hash(), (
            f"{case.name}: the artifact was compiled from another graph "
            f"(stale directory or numpy drift); rerun the compile step"
        )
        mod = rocmc.load(self.dir / f"{case.name}.vmfb", device="cuda")
        try:
            for n in case.sizes:
                ins = case.inputs(rng, n)
                assert [_spec(a) for a in ins] == entry["inputs"][_key(n)], (
                    f"{case.name}: inputs differ from the manifest"
                )
                want = _tuple(
                    case.reference(*[np.asarray(a, np.float64) for a in ins])
                    if case.reference
                    else rocmc.evaluate(g, *ins)
                )
                if case.poison:
                    mod(*[np.full_like(a, np.nan) if _is_float(a) else a for a in ins])
                for run in range(case.runs):
                    got = _tuple(mod(*ins))
                    _compare(case, n, run, got, want)
        finally:
            mod.close()


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" or a.dtype.name == "bfloat16"


def _tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _compare(case: Case, n, run: int, got: tuple, want: tuple) -> None:
    where = f"{case.name}" + (f" n={n}" if n is not None else "") + (f" run {run + 1}" if case.runs > 1 else "")
    assert len(got) == len(want), f"{where}: {len(got)} outputs, the reference has {len(want)}"
    for i, (a, w) in enumerate(zip(got, want)):
        a, w = np.asarray(a), np.asarray(w)
        assert a.shape == w.shape, f"{where} output {i}: shape {a.shape}, reference {w.shape}"
        if not _is_float(a):
            np.testing.assert_array_equal(a, w, err_msg=f"{where} output {i}")
            continue
        a64 = a.astype(np.float64)
        bad = int((~np.isfinite(a64) & np.isfinite(w)).sum())
        assert bad == 0, f"{where} output {i}: {bad} non-finite elements where the reference is finite"
        err = case.error(a64, w.astype(np.float64))
        assert err <= case.tol, f"{where} output {i}: error {err:.3e} over tolerance {case.tol:.0e}"
