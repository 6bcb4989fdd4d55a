"""ONNX backend node conformance: run ONNX's own node test cases for every op rocmc imports.

The cases ship with the onnx wheel (onnx==1.22.0: fixed inputs and expected outputs under
onnx/backend/test/data/node/<case>/). Each case is imported, compiled for the host CPU (the data sets of
BATCH cases as the functions of one module), run on every data set and compared with the expected outputs. Cases rocmc cannot import are skipped with
the importer's reason; anything else that goes wrong is a failure.

    python -m bench.onnx_conformance [-j JOBS] [-k SUBSTRING] [--out docs/onnx-conformance.md]
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from rocmc.dtypes import np_kind

ROOT = Path(__file__).resolve().parents[1]

# float32 at ONNX's own backend-test default (rtol 1e-3, atol 1e-7); half types at their precision.
TOLERANCE = {"float32": (1e-3, 1e-7), "float16": (4e-3, 4e-3), "bfloat16": (2.5e-2, 2.5e-2)}


@dataclass(frozen=True)
class Case:
    name: str  # directory name, e.g. test_conv_with_strides_padding
    op: str  # the ONNX op the case exercises
    path: str


@dataclass(frozen=True)
class Result:
    case: Case
    status: str  # passed | failed | skipped
    reason: str = ""
    bound: tuple = ()  # graph inputs bound to the data set's values as constants


def data_dir() -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"


def _base_name(name: str) -> str:
    """test_elu_expanded_ver18 -> test_elu: an expanded case tests the same op through its function body."""
    i = name.find("_expanded")
    return name if i < 0 else name[:i]


@lru_cache(maxsize=None)
def _single_op(path: str) -> str | None:
    import onnx

    model = onnx.load(os.path.join(path, "model.onnx"), load_external_data=False)
    ops = {n.op_type for n in model.graph.node if n.op_type != "Constant"} or {"Constant"}
    return ops.pop() if len(ops) == 1 else None


def all_cases() -> list[Case]:
    """Every node test case, labelled with the op it exercises (None-labelled cases are dropped)."""
    root = data_dir()
    out = []
    for d in sorted(root.iterdir()):
        if not (d / "model.onnx").exists():
            continue
        base = root / _base_name(d.name)
        op = _single_op(str(base)) if (base / "model.onnx").exists() else None
        if op is None:
            op = _single_op(str(d))
        if op is not None:
            out.append(Case(d.name, op, str(d)))
    return out


def supported_cases() -> list[Case]:
    from rocmc.frontend.onnx import CONVERTERS

    return [c for c in all_cases() if c.op in CONVERTERS]


def _load_set(set_dir: str, prefix: str) -> list:
    import onnx
    from onnx import numpy_helper

    arrays = []
    for f in sorted(glob.glob(os.path.join(set_dir, f"{prefix}_*.pb")), key=lambda p: int(p.rsplit("_", 1)[1][:-3])):
        t = onnx.TensorProto()
        with open(f, "rb") as fh:
            t.ParseFromString(fh.read())
        arrays.append(numpy_helper.to_array(t))
    return arrays


def _compare(got, want, what: str) -> str | None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"{what}: shape {got.shape}, expected {want.shape}"
    if np_kind(want.dtype) == "f":  # bfloat16 and the float8 types too
        if want.dtype.itemsize == 1:  # float8: bit for bit, but for NaN's encodings
            g, w = got.astype(want.dtype), want
            same = (g.view(np.uint8) == w.view(np.uint8)) | (
                np.isnan(g.astype(np.float32)) & np.isnan(w.astype(np.float32))
            )
            return None if same.all() else f"{what}: {int((~same).sum())}/{same.size} float8 values differ"
        rtol, atol = TOLERANCE.get(want.dtype.name, TOLERANCE["float32"])
        g, w = got.astype(np.float64), want.astype(np.float64)
        bad = ~np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        if bad.any():
            i = np.unravel_index(np.argmax(np.where(bad, np.abs(g - w), -1)), bad.shape)
            return f"{what}: {int(bad.sum())}/{bad.size} values differ, e.g. at {tuple(map(int, i))}: {g[i]} vs {w[i]}"
        return None
    if not np.array_equal(got, want.astype(got.dtype) if got.dtype != want.dtype else want):
        return f"{what}: values differ"
    return None


_NEEDS_KNOWN = re.compile(r"\(([^()]*)\) must be known at import time")


def _bind(model, values: dict):
    """A copy of `model` whose inputs named in `values` are initializers holding those values."""
    import onnx
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [vi for vi in m.graph.input if vi.name not in values]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), name) for name, v in values.items())
    return m


def import_case(model, inputs: dict, bound: tuple = ()):
    """Import, binding graph inputs that the importer needs as constants (axes, shape, pads, ...)
    to the data set's values: a compiler takes these at compile time. Returns (graph, bound names)."""
    import rocmc

    bound = set(bound)
    while True:
        try:
            return rocmc.import_onnx(_bind(model, {k: inputs[k] for k in bound})), tuple(sorted(bound))
        except rocmc.ModelImportError as e:
            wanted = {name for name in _NEEDS_KNOWN.findall(str(e)) if name in inputs} - bound
            if not wanted:
                raise
            bound |= wanted


@dataclass
class _Run:
    """One data set of a case, imported: the graph and its arguments (graph inputs the importer needed as
    constants left out), and the expected outputs."""

    name: str
    graph: object
    args: list
    expected: list


def _prepare(case: Case) -> tuple[list[_Run], tuple] | Result:
    """Every data set of `case` imported (no compile): the runs and the inputs bound as constants, or the
    case's Result when it cannot be imported (skipped) or its files are wrong (failed)."""
    import onnx
    import rocmc

    model = onnx.load(os.path.join(case.path, "model.onnx"))
    init = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in init]
    bound: tuple = ()
    runs = []
    for s in sorted(glob.glob(os.path.join(case.path, "test_data_set_*"))):
        try:
            inputs = dict(zip(names, _load_set(s, "input")))
        except ValueError:  # sequence or optional inputs: let the importer say what it lacks
            inputs = {}
        try:
            graph, bound = import_case(model, inputs, bound)
        except rocmc.ModelImportError as e:
            lines = str(e).splitlines()
            return Result(case, "skipped", "; ".join(l.strip() for l in lines[1:]) or lines[0])
        args = [np.array(inputs[n]) for n in names if n not in bound]
        runs.append(_Run(os.path.basename(s), graph, args, _load_set(s, "output")))
    return runs, bound


def _failure(case: Case, e: Exception) -> Result:
    text = f"{type(e).__name__}: {e}".splitlines()
    return Result(case, "failed", " ".join(text[:3])[:300])


def _check(case: Case, runs: list[_Run], bound: tuple, call) -> Result:
    """Run every data set through `call(index, args)` and compare with the expected outputs."""
    try:
        for j, run in enumerate(runs):
            got = call(j, run.args)
            got = got if isinstance(got, tuple) else (got,)
            if len(got) != len(run.expected):
                return Result(case, "failed", f"{len(got)} outputs, expected {len(run.expected)}")
            for i, (g, w) in enumerate(zip(got, run.expected)):
                problem = _compare(g, w, f"{run.name} output {i}")
                if problem:
                    return Result(case, "failed", problem)
        return Result(case, "passed", bound=bound)
    except Exception as e:  # noqa: BLE001 - a conformance run records every failure and goes on
        return _failure(case, e)


def run_case(case: Case) -> Result:
    """Import, compile for the CPU (a module a data set), run every data set and compare. Never raises."""
    import rocmc

    try:
        prepared = _prepare(case)
        if isinstance(prepared, Result):
            return prepared
        runs, bound = prepared
        modules = [rocmc.load(rocmc.compile(run.graph, "cpu")) for run in runs]
        return _check(case, runs, bound, lambda j, args: modules[j](*args))
    except Exception as e:  # noqa: BLE001 - a conformance run records every failure and goes on
        return _failure(case, e)


def run_batch(cases: list[Case]) -> list[Result]:
    """run_case of each case, their data sets compiled as the functions of one module: iree-compile's cost a
    module (about 0.45 s on the CPU, against 0.1 s for each further dispatch) is paid once for the batch. A batch
    IREE cannot compile goes case by case, so a failure names its case. Never raises."""
    import rocmc

    prepared: list = []
    for case in cases:
        try:
            prepared.append(_prepare(case))
        except Exception as e:  # noqa: BLE001
            prepared.append(_failure(case, e))
    program = {
        f"c{i}_{j}": run.graph
        for i, p in enumerate(prepared)
        if not isinstance(p, Result)
        for j, run in enumerate(p[0])
    }
    if not program:
        return list(prepared)
    try:
        module = rocmc.load(rocmc.compile(program, "cpu"))
    except Exception:  # noqa: BLE001 - whichever case it is, run_case says
        return [p if isinstance(p, Result) else run_case(case) for case, p in zip(cases, prepared)]
    return [
        p if isinstance(p, Result) else _check(case, p[0], p[1], lambda j, args, i=i: module.call(f"c{i}_{j}", *args))
        for i, (case, p) in enumerate(zip(cases, prepared))
    ]


BATCH = 16  # cases a module (run_all, the tests)


def run_all(cases, jobs: int) -> list[Result]:
    batches = [cases[i : i + BATCH] for i in range(0, len(cases), BATCH)]
    if jobs <= 1:
        return [r for b in batches for r in run_batch(b)]
    with ProcessPoolExecutor(jobs) as pool:
        return [r for rs in pool.map(run_batch, batches) for r in rs]


def _cell(text: str) -> str:  # noqa: D401 - a markdown table cell
    return text.replace("|", "\\|").replace("\n", " ")


def report(results: list[Result], total_cases: int) -> str:
    by_op = defaultdict(list)
    for r in results:
        by_op[r.case.op].append(r)
    count = lambda rs, s: sum(r.status == s for r in rs)  # noqa: E731
    p, f, s = (count(results, k) for k in ("passed", "failed", "skipped"))
    lines = [
        "# ONNX backend node conformance",
        "",
        "ONNX's own backend node test cases (the `onnx==1.22.0` wheel's fixed inputs and expected outputs),",
        "for every op `rocmc.import_onnx` supports: imported, compiled for the host CPU, run and compared",
        f"with the expected outputs (float32: rtol {TOLERANCE['float32'][0]}, atol {TOLERANCE['float32'][1]}, ONNX's default;",
        "float16/bfloat16 at their own precision; integers and booleans exactly). Expanded cases",
        "(`*_expanded`) test the same op through its ONNX function body and count under that op.",
        "Graph inputs that the importer needs at compile time (Reshape's `shape`, Slice's `starts`, reduction",
        "`axes`, ...) are bound to the data set's values as constants, the way a compiler receives them;",
        f"{sum(bool(r.bound) for r in results)} passing cases use this.",
        "Regenerate with `python -m bench.onnx_conformance`; CI runs the same cases in `tests/onnx/test_onnx.py`.",
        "",
        f"**{len(results)} cases of {len(by_op)} ops: {p} passed, {f} failed, {s} skipped** "
        f"({total_cases - len(results)} further cases exercise ops rocmc does not import).",
        "",
        "| op | cases | passed | failed | skipped | reasons (skipped and failed) |",
        "|---|---|---|---|---|---|",
    ]
    for op in sorted(by_op):
        rs = by_op[op]
        lines.append(
            f"| {op} | {len(rs)} | {count(rs, 'passed')} | {count(rs, 'failed')} | {count(rs, 'skipped')} | "
            f"{'<br>'.join(_notes(rs))} |"
        )
    return "\n".join(lines) + "\n"


_DTYPE = re.compile(r"element type (\w+) \(rocmc has [^)]*\)")


def _notes(results) -> list:
    """One line per distinct reason: status, how many cases, the reason, and which cases. Cases
    skipped only for element types rocmc lacks share one line that names those types."""
    groups, dtypes = defaultdict(list), set()
    for r in results:
        if r.status == "passed":
            continue
        reason = _reason(r.reason, r.case.op)
        found = _DTYPE.findall(reason)
        if found and r.status == "skipped" and len(found) == len(reason.split("; ")):
            dtypes.update(found)
            reason = "element types rocmc lacks"
        groups[(r.status, reason)].append(r.case.name[5:])
    out = []
    for (status, reason), names in sorted(groups.items()):
        if reason == "element types rocmc lacks":
            out.append(f"{status} {len(names)}: element types rocmc lacks ({', '.join(sorted(dtypes))})")
            continue
        shown = ", ".join(f"`{n}`" for n in names[:3]) + (f" +{len(names) - 3} more" if len(names) > 3 else "")
        out.append(f"{status} {len(names)}: {_cell(reason)} ({shown})")
    return out


def _reason(reason: str, op: str) -> str:
    """The informative part of a reason, without node and value names, so equal reasons group."""
    parts = []
    for item in reason.split("; "):
        head, _, text = item.partition(": ")
        m = re.fullmatch(r"(\S+) '[^']*'", head)  # "<op type or (input)> '<name>'"
        if m and text:
            text = re.sub(r"^(input|target type) '[^']*'", r"\1", text)
            item = text if m.group(1) == op or m.group(1).startswith("(") else f"{m.group(1)}: {text}"
        parts.append(item)
    text = "; ".join(dict.fromkeys(parts))
    return text if len(text) <= 140 or _DTYPE.search(text) else text[:137] + "..."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    ap.add_argument("--out", default=str(ROOT / "docs" / "onnx-conformance.md"))
    args = ap.parse_args(argv)
    every = all_cases()
    cases = [c for c in supported_cases() if args.k in c.name]
    results = run_all(cases, args.jobs)
    text = report(results, len(every))
    if not args.k:
        Path(args.out).write_text(text)
    for r in results:
        if r.status != "passed":
            print(f"{r.status:8} {r.case.name}: {r.reason}")
    print(text.split("\n\n")[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
