"""The rocmc command: compile, run, inspect, kernels, targets."""
from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
from pathlib import Path

import numpy as np

from .errors import RocmcError


def _parse_value(s: str):
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(s.lower(), s)


def load_graph(path: str, settings: dict):
    """A Graph from a .onnx file or a Python file defining `build_graph(**settings)` (or `graph`)."""
    from .frontend.graph import Graph
    p = Path(path)
    if not p.is_file():
        raise RocmcError(f"model file {path!r} does not exist")
    if p.suffix == ".onnx":
        from . import import_onnx
        return import_onnx(str(p))
    ns = runpy.run_path(str(p), run_name="rocmc_model")
    if "build_graph" in ns:
        g = ns["build_graph"](**settings)
    elif isinstance(ns.get("graph"), Graph):
        g = ns["graph"]
    else:
        raise RocmcError(f"{path}: defines neither build_graph(**options) nor a Graph named `graph`")
    if not isinstance(g, Graph):
        raise RocmcError(f"{path}: build_graph() returned {type(g).__name__}, expected rocmc.Graph")
    return g


def cmd_compile(args) -> int:
    from . import compile
    settings = dict(kv.split("=", 1) for kv in args.set)
    g = load_graph(args.model, {k: _parse_value(v) for k, v in settings.items()})
    impl = None
    if args.impl:
        impl = {}
        for kv in args.impl:
            if "=" not in kv:
                impl = kv          # one implementation for every op, e.g. --impl generated
                break
            op, name = kv.split("=", 1)
            impl[op] = name
    t0 = time.perf_counter()
    art = compile(g, args.target, impl=impl, libraries=args.library, cache=not args.no_cache, dump_ir=args.dump_ir)
    dt = time.perf_counter() - t0
    out = args.output or str(Path(args.model).with_suffix(".vmfb").name)
    art.save(out)
    print(f"wrote {out} ({art.size} bytes, target {art.target}, {dt:.2f} s{', cached' if art.cached else ''})")
    if args.dump_ir:
        print(f"stages in {args.dump_ir}/")
    return 0


def _read_input(spec: str):
    if "=" not in spec:
        raise RocmcError(f"--input {spec!r}: expected NAME=@file.npy")
    name, val = spec.split("=", 1)
    if not val.startswith("@"):
        raise RocmcError(f"--input {spec!r}: expected NAME=@file.npy")
    path = Path(val[1:])
    if not path.is_file():
        raise RocmcError(f"--input {name}: file {str(path)!r} does not exist")
    try:
        return name, np.load(path, allow_pickle=False)
    except Exception as e:
        raise RocmcError(f"--input {name}: {str(path)!r} is not a readable .npy file ({e})") from None


def cmd_run(args) -> int:
    from . import load
    mod = load(args.module, device=args.device)
    feeds = dict(_read_input(s) for s in args.input)
    outs = mod(**feeds)
    outs = outs if isinstance(outs, tuple) else (outs,)
    for spec, o in zip(mod.signature["outputs"], outs):
        stats = ""
        if o.size and o.dtype.kind in "fiu" or o.dtype.name == "bfloat16":
            f = o.astype(np.float64)
            stats = f" min {f.min():.6g} max {f.max():.6g} mean {f.mean():.6g}"
        print(f"{spec['name']}: {spec['dtype']}{list(o.shape)}{stats}")
    if args.save:
        np.savez(args.save, **{s["name"]: o for s, o in zip(mod.signature["outputs"], outs)})
        print(f"wrote {args.save}")
    return 0


def cmd_inspect(args) -> int:
    from .artifact import Artifact
    from .inspect import describe, format_description
    d = describe(Artifact.load(args.module))
    print(json.dumps(d, indent=2) if args.json else format_description(d))
    return 0


def cmd_kernels(args) -> int:
    from .lowering.kernels import build_all
    rows = build_all(args.arch)
    print(f"{'kernel':<28} {'arch':<8} {'bytes':>7} {'wg':>4} {'vgprs':>5} {'scratch':>7} {'spills':>6}  object")
    for k in rows:
        print(f"{k['symbol']:<28} {k['arch']:<8} {k['bytes']:>7} {k['workgroup'][0]:>4} {str(k.get('vgprs', '-')):>5} "
              f"{str(k.get('scratch', '-')):>7} {str(k.get('spills', '-')):>6}  {k['path']}")
    return 0


def cmd_targets(args) -> int:
    from .lowering.target import known_targets
    print("\n".join(known_targets()))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rocmc", description="Compile ML graphs to AMD GPUs (and CUDA, CPU) through IREE.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="compile a model (.py with build_graph(), or .onnx) to a .vmfb")
    c.add_argument("model")
    c.add_argument("-t", "--target", default="cpu", help="cpu, gfx942, rocm:gfx90a, cuda:sm_80, ... (rocmc targets)")
    c.add_argument("-o", "--output")
    c.add_argument("--dump-ir", metavar="DIR", help="write every lowering stage to DIR")
    c.add_argument("--impl", action="append", default=[], metavar="OP=IMPL",
                   help="choose an implementation per op (rms_norm=generated), or IMPL for all ops")
    c.add_argument("--library", action="append", default=[], help="opt into a vendor library (miopen)")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="option for build_graph()")
    c.add_argument("--no-cache", action="store_true")
    c.set_defaults(fn=cmd_compile)
    r = sub.add_parser("run", help="run a compiled module on .npy inputs")
    r.add_argument("module")
    r.add_argument("--input", action="append", default=[], metavar="NAME=@FILE.npy")
    r.add_argument("--device", help="local-task, local-sync, hip, cuda (default: the artifact's)")
    r.add_argument("--save", metavar="OUT.npz")
    r.set_defaults(fn=cmd_run)
    i = sub.add_parser("inspect", help="functions, signature, target, executables, kernels, imports of a .vmfb")
    i.add_argument("module")
    i.add_argument("--json", action="store_true")
    i.set_defaults(fn=cmd_inspect)
    k = sub.add_parser("kernels", help="hand-written kernels")
    ksub = k.add_subparsers(dest="kcmd", required=True)
    kb = ksub.add_parser("build", help="build (and cache) every kernel for an arch and list them")
    kb.add_argument("--arch", required=True, help="gfx90a, gfx942, gfx1100, sm_80, sm_90, ...")
    kb.set_defaults(fn=cmd_kernels)
    t = sub.add_parser("targets", help="list the known compile targets")
    t.set_defaults(fn=cmd_targets)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except RocmcError as e:
        print(f"rocmc: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
