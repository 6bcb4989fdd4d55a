"""The rocmc command: compile, run, inspect, kernels, targets, ops, models, generate, launch."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import runpy
import sys
import time
from pathlib import Path

import numpy as np

from .archs import DRIVERS
from .dtypes import np_kind
from .errors import RocmcError


def _parse_value(s: str):
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(s.lower(), s)


def _settings(pairs) -> dict:
    """--set KEY=VALUE options as {key: int, float, bool or str}."""
    out = {}
    for kv in pairs:
        key, eq, value = kv.partition("=")
        if not eq or not key.isidentifier():
            raise RocmcError(f"--set {kv!r}: expected KEY=VALUE, e.g. --set hidden=4096")
        out[key] = _parse_value(value)
    return out


def _check_settings(path: str, build_graph, settings: dict) -> None:
    """The options must be parameters of build_graph, and its required ones must be given."""
    params = inspect.signature(build_graph).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    names = ", ".join(p.name for p in named) or "none"
    for key in settings:
        if key not in {p.name for p in named}:
            raise RocmcError(
                f"--set {key}=...: build_graph() in {path} has no parameter {key!r} (its parameters: {names})"
            )
    for p in named:
        if p.default is p.empty and p.name not in settings:
            raise RocmcError(f"build_graph() in {path} needs --set {p.name}=VALUE (its parameters: {names})")


def _output_file(path: str, what: str) -> str:
    """A path a file can be written to: not a directory, in a directory that exists."""
    p = Path(path)
    if p.is_dir():
        raise RocmcError(f"{what} {path!r} is a directory; expected a file name")
    if not p.parent.is_dir():
        raise RocmcError(f"{what} {path!r}: the directory {str(p.parent)!r} does not exist")
    return path


def _model_file(path: str) -> Path:
    p = Path(path)
    if p.is_dir():
        raise RocmcError(f"model file {path!r} is a directory; expected a .py, .onnx or .pt2 file")
    if not p.is_file():
        raise RocmcError(f"model file {path!r} does not exist")
    return p


def load_graph(path: str, settings: dict):
    """A Graph from a .onnx file, a saved torch.export program (.pt2: unpickled, so trusted like code) or
    a Python file defining `build_graph(**settings)` (or `graph`)."""
    from .frontend.graph import Graph

    p = _model_file(path)
    if p.suffix == ".pt2" and settings:
        raise RocmcError(
            f"--set {next(iter(settings))}=...: {path} is a torch.export program; --set is for build_graph()"
        )
    if p.suffix == ".onnx":
        from . import import_onnx

        return import_onnx(str(p))
    if p.suffix == ".pt2":
        from .frontend.torch import load_program

        return load_program(p)
    ns = runpy.run_path(str(p), run_name="rocmc_model")
    if callable(ns.get("build_graph")):
        _check_settings(path, ns["build_graph"], settings)
        g = ns["build_graph"](**settings)
    elif isinstance(ns.get("graph"), Graph):
        if settings:
            raise RocmcError(
                f"--set {next(iter(settings))}=...: {path} defines a Graph named `graph`, "
                f"not build_graph(**options), so it takes no options"
            )
        g = ns["graph"]
    else:
        raise RocmcError(f"{path}: defines neither build_graph(**options) nor a Graph named `graph`")
    if not isinstance(g, Graph):
        raise RocmcError(f"{path}: build_graph() returned {type(g).__name__}, expected rocmc.Graph")
    return g


def cmd_compile(args) -> int:
    from . import compile

    settings = _settings(args.set)
    out = _output_file(args.output or _model_file(args.model).with_suffix(".vmfb").name, "-o")
    if args.dump_ir and Path(args.dump_ir).exists() and not Path(args.dump_ir).is_dir():
        raise RocmcError(f"--dump-ir {args.dump_ir!r} is an existing file; expected a directory")
    g = load_graph(args.model, settings)
    impl = None
    if args.impl:
        impl = {}
        for kv in args.impl:
            if "=" not in kv:
                impl = kv  # one implementation for every op, e.g. --impl generated
                break
            op, name = kv.split("=", 1)
            impl[op] = name
    t0 = time.perf_counter()
    art = compile(
        g,
        args.target,
        impl=impl,
        libraries=args.library,
        cache=not args.no_cache,
        dump_ir=args.dump_ir,
        rewrite=not args.no_rewrite,
    )
    dt = time.perf_counter() - t0
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
    except Exception as e:  # noqa: BLE001
        raise RocmcError(f"--input {name}: {str(path)!r} is not a readable .npy file ({e})") from None


def cmd_run(args) -> int:
    from . import load

    if args.save:
        _output_file(args.save, "--save")
    mod = load(args.module, device=args.device, verify=not args.no_verify)
    feeds = dict(_read_input(s) for s in args.input)
    outs = mod(**feeds)
    outs = outs if isinstance(outs, tuple) else (outs,)
    for spec, o in zip(mod.signature["outputs"], outs):
        stats = ""
        if o.size and np_kind(o.dtype) in "fiu":
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

    art = Artifact.load(args.module, verify=not args.no_verify)
    if args.ir:
        print(art.ir(args.ir))
        return 0
    d = describe(art)
    print(json.dumps(d, indent=2) if args.json else format_description(d))
    return 0


def cmd_kernels(args) -> int:
    from .lowering.kernels import build_all

    rows = build_all(args.arch)
    print(f"{'kernel':<28} {'arch':<8} {'bytes':>7} {'wg':>4} {'vgprs':>5} {'scratch':>7} {'spills':>6}  object")
    for k in rows:
        print(
            f"{k['symbol']:<28} {k['arch']:<8} {k['bytes']:>7} {k['workgroup'][0]:>4} {str(k.get('vgprs', '-')):>5} "
            f"{str(k.get('scratch', '-')):>7} {str(k.get('spills', '-')):>6}  {k['path']}"
        )
    return 0


def cmd_quantize(args) -> int:
    """Write a GPTQ checkpoint of a float one (round-to-nearest; rocmc.llm.quantize)."""
    from . import llm

    out = llm.quantize(args.src, args.dst, bits=args.bits, group_size=args.group_size, sym=not args.asym)
    print(f"wrote {out}: GPTQ {args.bits}-bit, group size {args.group_size}")
    return 0


def cmd_targets(args) -> int:
    from .lowering.target import known_targets

    print("\n".join(known_targets()))
    return 0


def cmd_serve(args) -> int:
    """Load (or compile) the model, say what its KV cache holds, and serve it until SIGINT / SIGTERM (uvicorn
    finishes the requests in flight, for at most 30 s)."""
    from pathlib import Path

    from . import llm
    from .artifact import Artifact
    from .runtime.module import device_for

    try:
        import uvicorn

        from .serve import create_app
    except ImportError as e:
        raise RocmcError(f"rocmc serve needs the serve extra (pip install 'rocmc[serve]'): {e}") from None
    cfg = llm.check_checkpoint(args.checkpoint, tokenizer=True)
    # The KV cache and the weights are checked against the device's free memory before anything compiles or loads.
    if args.module:
        art = Artifact.load(args.module)
        target = art.target
        sizes = llm.runtime.artifact_sizes(art, cfg)
    else:
        target = args.target
        sizes = llm.runtime.model_shape(cfg, target, args.dtype, args.max_seq_len, args.max_batch)
    device = device_for(target, args.device)
    memory = llm.serving_memory(cfg, sizes, device)
    if args.module:
        lm = llm.load(art, args.checkpoint, device=device)
    else:
        kw = dict(dtype=sizes.dtype, max_seq_len=sizes.max_seq_len, max_batch=sizes.max_batch)
        lm = llm.load_hf(args.checkpoint, target, device=device, **kw)
    name = args.model_name or Path(args.checkpoint).resolve().name
    print(f"rocmc serve: {name} on {lm.module.device_name}: {memory}", flush=True)
    app = create_app(lm, name, api_key=args.api_key, max_waiting=args.max_waiting, prefill_chunk=args.prefill_chunk)
    uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=30, log_level="info")
    return 0


def cmd_generate(args) -> int:
    """Stream a continuation of --prompt (text, or comma-separated token ids) as it is made; with --chat,
    the reply to --prompt as a user message, by the checkpoint's chat template."""
    from . import llm
    from .llm.generation import DEFAULT_MAX_NEW_TOKENS

    if args.chat and args.ids:
        raise RocmcError("--chat takes a text prompt (the user's message), not --ids")
    if args.system is not None and not args.chat:
        raise RocmcError("--system is the system message of a --chat conversation: add --chat")
    ids = _token_ids(args.prompt) if args.ids else None
    # The checkpoint is checked (config, tensors' headers, tokenizer, template) before anything compiles.
    llm.check_checkpoint(args.checkpoint, tokenizer=not args.ids, chat_template=args.chat)
    kw = dict(device=args.device, max_seq_len=args.max_seq_len, dtype=args.dtype, tensor_parallel=args.tp)
    if args.module:
        lm = llm.load(args.module, args.checkpoint, device=args.device, tensor_parallel=args.tp)
    else:
        lm = llm.load_hf(args.checkpoint, args.target, **kw)
    settings = dict(
        do_sample=True if args.do_sample else None,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        stop_strings=args.stop or None,
        seed=args.seed,
    )
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system is not None else []) + [
            {"role": "user", "content": args.prompt}
        ]
        prompt = lm.encode_chat(messages)
    elif args.truncate and ids is None:
        prompt = lm.tokenizer.encode(args.prompt)
    else:
        prompt = ids if ids is not None else args.prompt
    if args.truncate:
        cfg = lm.generation_config(max_new_tokens=args.max_new_tokens, **settings)
        reserve = cfg.max_new_tokens if cfg.max_new_tokens is not None else DEFAULT_MAX_NEW_TOKENS
        keep = lm.sizes.max_seq_len - reserve
        if keep < 1:
            raise RocmcError(
                f"--truncate: {reserve} new tokens leave no room for the prompt in the KV cache of "
                f"{lm.sizes.max_seq_len} positions (--max-seq-len)"
            )
        prompt = prompt[-keep:]
    if args.ids:
        pieces, sep = (str(tok) for tok in lm.stream(prompt, args.max_new_tokens, **settings)), " "
    else:
        pieces, sep = lm.text_stream(prompt, args.max_new_tokens, **settings), ""
    show = lm.rank == 0  # every rank computes the same tokens; rank 0 streams them
    for piece in pieces:
        if show:
            print(piece, end=sep, flush=True)
    if show:
        print()
    return 0


def _token_ids(text: str) -> list:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise RocmcError(f"--ids: the prompt {text!r} is not a list of token ids (e.g. '1, 450, 7483')") from None


def cmd_launch(args) -> int:
    """Start the command as ranks 0..n-1 of a tensor-parallel run (one process per GPU)."""
    from .runtime.launch import launch

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return launch(args.nproc, command, port=args.master_port)


def op_table() -> list[dict]:
    """Every graph op with its implementations (the lowering registry's) and, per target kind, the ones
    that can lower it in the order they are preferred: the default ones, then those a library role
    switch turns on (`libraries=`), then those used only when asked for by name (`impl=`)."""
    from .frontend.registry import OPS
    from .lowering.registry import REGISTRY

    rows = []
    for op in sorted(set(OPS) | set(REGISTRY)):
        impls = REGISTRY.get(op, {})
        doc = OPS[op].doc.strip().splitlines()[0] if op in OPS and OPS[op].doc.strip() else ""
        targets = {}
        for kind in DRIVERS:
            usable = sorted(
                (i for i in impls.values() if kind in i.kinds),
                key=lambda i: (0 if kind in i.default_on else 1 if i.library else 2, i.priority),
            )
            targets[kind] = [
                {
                    "name": i.name,
                    "use": "default"
                    if kind in i.default_on
                    else f"libraries=[{i.library!r}]"
                    if i.library
                    else "by name",
                }
                for i in usable
            ]
        rows.append({"op": op, "targets": targets} | ({"doc": doc} if doc else {}))
    return rows


_MARK = {"default": "", "by name": "?"}


def cmd_ops(args) -> int:
    rows = op_table()
    if args.json:
        print(json.dumps({"ops": rows}, indent=2))
        return 0
    print(
        f"{len(rows)} ops; per target kind, the implementations in the order they are preferred "
        f"(+: opt-in with libraries=[...], ?: only when asked for with impl=)"
    )
    table = [["op", *DRIVERS]] + [
        [r["op"], *(", ".join(i["name"] + _MARK.get(i["use"], "+") for i in r["targets"][k]) or "-" for k in DRIVERS)]
        for r in rows
    ]
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def model_table() -> list[dict]:
    """The language-model families rocmc.llm builds: the config.json `model_type` and `architectures`
    each accepts, and what the family's model does differently (from rocmc.llm.config's family table)."""
    from .llm import config as C

    rows = []
    for name, fam in C._FAMILIES.items():
        notes = []
        for what, how in (("q/k/v bias", fam.qkv_bias), ("o_proj bias", fam.o_bias), ("MLP bias", fam.mlp_bias)):
            notes.append(f"{what}: {'always' if how is True else 'none' if how is False else f'when {how}'}")
        if fam.sliding == "all":
            notes.append("sliding attention window on every layer (sliding_window)")
        elif fam.sliding == "qwen2":
            notes.append(
                "sliding window when use_sliding_window, on the layers from max_window_layers (or as layer_types says)"
            )
        else:
            notes.append("no sliding window")
        if fam.gemma_style:
            notes.append("embeddings scaled by sqrt(hidden_size), RMSNorm weight used as (1 + w)")
        act = fam.defaults.get("hidden_act", "silu")
        notes.append(f"activation: {act} by default (read from {' or '.join(fam.activation_keys)})")
        rows.append({"family": name, "model_type": name, "architectures": [fam.architecture], "notes": notes})
    return rows


def cmd_models(args) -> int:
    from .llm import config as C

    rows = model_table()
    common = {
        "rope_types": list(C.SUPPORTED_ROPE_TYPES),
        "dtypes": list(C.SUPPORTED_DTYPES),
        "activations": list(C.SUPPORTED_ACTIVATIONS),
    }
    if args.json:
        print(json.dumps({"families": rows, "all_families": common}, indent=2))
        return 0
    for r in rows:
        print(f"{r['family']}: model_type {r['model_type']!r}, architectures {', '.join(r['architectures'])}")
        for n in r["notes"]:
            print(f"  - {n}")
    print(
        f"all families: RoPE {', '.join(common['rope_types'])}; weights in {', '.join(common['dtypes'])}; "
        f"a config with anything else is a ModelImportError naming the field"
    )
    return 0


NO_VERIFY = "skip the integrity check (a trusted module with no rocmc trailer)"
QUIET = "no progress display on the terminal (also: ROCMC_QUIET=1)"
VERBOSE = "log each step (import, rewrite, lowering, iree-compile, loading) with its time to stderr"


def _common_options(sub) -> None:
    """-q/-v on every parser of the subcommands `sub`, nested ones too, so that they may also follow the
    subcommand (the top-level parser has them, with their defaults)."""
    for sp in sub.choices.values():
        sp.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=QUIET)
        sp.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE)
        for action in sp._actions:
            if isinstance(action, argparse._SubParsersAction):
                _common_options(action)


def _apply_common_options(args) -> None:
    from . import progress

    if args.quiet:
        progress.set_quiet(True)
        os.environ["ROCMC_QUIET"] = "1"  # the ranks `rocmc launch` starts are quiet too
    if args.verbose:
        progress.log_to_stderr()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="rocmc", description="Compile ML graphs to AMD GPUs (and CUDA, CPU) through IREE."
    )
    ap.add_argument("-q", "--quiet", action="store_true", help=QUIET)
    ap.add_argument("-v", "--verbose", action="store_true", help=VERBOSE)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser(
        "compile",
        help="compile a model (.py with build_graph(), .onnx, or a torch.export .pt2) to a "
        ".vmfb; a .py runs as code and a .pt2 is unpickled: trust both as code",
    )
    c.add_argument("model")
    c.add_argument("-t", "--target", default="cpu", help="cpu, gfx942, rocm:gfx90a, cuda:sm_80, ... (rocmc targets)")
    c.add_argument("-o", "--output")
    c.add_argument("--dump-ir", metavar="DIR", help="write every lowering stage to DIR")
    c.add_argument(
        "--impl",
        action="append",
        default=[],
        metavar="OP=IMPL",
        help="choose an implementation per op (rms_norm=generated), or IMPL for all ops",
    )
    c.add_argument(
        "--library",
        action="append",
        default=[],
        metavar="ROLE",
        help="opt into a library role: dnn (MIOpen, cuDNN) or blas (hipBLASLt, cuBLASLt); "
        "the old names miopen and hipblaslt are aliases",
    )
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="option for build_graph()")
    c.add_argument("--no-cache", action="store_true")
    c.add_argument("--no-rewrite", action="store_true", help="compile the graph as given (no fused-op rewrites)")
    c.set_defaults(fn=cmd_compile)
    r = sub.add_parser("run", help="run a compiled module on .npy inputs")
    r.add_argument("module")
    r.add_argument("--input", action="append", default=[], metavar="NAME=@FILE.npy")
    r.add_argument("--device", help="local-task, local-sync, hip, cuda (default: the artifact's)")
    r.add_argument("--save", metavar="OUT.npz")
    r.add_argument("--no-verify", action="store_true", help=NO_VERIFY)
    r.set_defaults(fn=cmd_run)
    i = sub.add_parser("inspect", help="functions, signature, target, executables, kernels, imports of a .vmfb")
    i.add_argument("module")
    i.add_argument("--json", action="store_true")
    i.add_argument("--ir", choices=("graph", "rewrite"), help="print the graph as given, or as compiled (rewritten)")
    i.add_argument("--no-verify", action="store_true", help=NO_VERIFY)
    i.set_defaults(fn=cmd_inspect)
    k = sub.add_parser("kernels", help="hand-written kernels")
    ksub = k.add_subparsers(dest="kcmd", required=True)
    kb = ksub.add_parser("build", help="build (and cache) every kernel for an arch and list them")
    kb.add_argument("--arch", required=True, help="gfx90a, gfx942, gfx1100, sm_80, sm_90, ...")
    kb.set_defaults(fn=cmd_kernels)
    gn = sub.add_parser("generate", help="continue a prompt with a Hugging Face causal LM (streams tokens)")
    gn.add_argument("checkpoint", help="directory with config.json, *.safetensors (and tokenizer.json for text)")
    gn.add_argument("--prompt", "-p", required=True)
    gn.add_argument("--ids", action="store_true", help="the prompt is token ids ('1, 450, 7483'); print ids")
    gn.add_argument(
        "-n",
        "--max-new-tokens",
        type=int,
        help="new tokens at most (default: the checkpoint's generation_config.json, else 32)",
    )
    gn.add_argument(
        "--chat",
        action="store_true",
        help="the prompt is a user message: render it with the checkpoint's chat template and print the reply",
    )
    gn.add_argument("--system", help="with --chat: a system message before the user's")
    gn.add_argument(
        "--truncate",
        action="store_true",
        help="keep the end of a prompt too long for the KV cache (its last max-seq-len minus max-new-tokens tokens)",
    )
    gn.add_argument("-t", "--target", default="cpu", help="compile for this target (cpu, gfx942, cuda:sm_80, ...)")
    gn.add_argument("--module", help="a .vmfb from rocmc.llm.compile_hf to run instead of compiling")
    gn.add_argument("--device", help="local-task, hip, cuda (default: the target's)")
    gn.add_argument(
        "--dtype",
        choices=("f32", "f16", "bf16"),
        help="compute dtype (default: f32 on the CPU, the checkpoint's on a GPU)",
    )
    gn.add_argument("--max-seq-len", type=int, help="positions of the KV cache")
    gn.add_argument(
        "--do-sample",
        action="store_true",
        help="sample (default: the checkpoint's generation_config.json, else greedy; a --temperature > 0 also samples)",
    )
    gn.add_argument("--temperature", type=float, help="0: greedy; > 0: sample at this temperature")
    gn.add_argument("--top-k", type=int, help="sample among the k most likely tokens (0: all)")
    gn.add_argument("--top-p", type=float)
    gn.add_argument("--repetition-penalty", type=float, help="> 1 makes tokens already in the text less likely")
    gn.add_argument("--stop", action="append", metavar="TEXT", help="stop once the new text contains TEXT (repeatable)")
    gn.add_argument("--seed", type=int)
    gn.add_argument(
        "--tp",
        type=int,
        default=1,
        metavar="N",
        help="tensor parallel over N GPUs: one of N ranks "
        "started by `rocmc launch -n N` (the module compiled with tensor_parallel=N)",
    )
    gn.set_defaults(fn=cmd_generate)
    from .llm.engine import DEFAULT_PREFILL_CHUNK

    sv = sub.add_parser("serve", help="serve a Hugging Face causal LM over the OpenAI HTTP API (continuous batching)")
    sv.add_argument("checkpoint", help="directory with config.json, *.safetensors and tokenizer.json")
    sv.add_argument("-t", "--target", default="cpu", help="compile for this target (cpu, gfx942, cuda:sm_80, ...)")
    sv.add_argument("--module", help="a .vmfb from rocmc.llm.compile_hf to run instead of compiling")
    sv.add_argument("--device", help="local-task, hip, cuda (default: the target's)")
    sv.add_argument("--dtype", choices=("f32", "f16", "bf16"), help="compute dtype")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--max-batch", type=int, default=8, help="requests decoded together (KV cache slots)")
    sv.add_argument("--max-seq-len", type=int, help="positions of each slot's KV cache (the context)")
    sv.add_argument("--max-waiting", type=int, default=256, help="requests that may wait for a slot (429 beyond)")
    sv.add_argument(
        "--prefill-chunk",
        type=int,
        help="prompt tokens prefilled a step while other rows decode (default %d): smaller stalls them less"
        % DEFAULT_PREFILL_CHUNK,
    )
    sv.add_argument("--model-name", help="the model's name in the API (default: the checkpoint directory's name)")
    sv.add_argument("--api-key", help="require 'Authorization: Bearer KEY'")
    sv.set_defaults(fn=cmd_serve)
    qz = sub.add_parser("quantize", help="write a GPTQ int4/int8 checkpoint of a float Hugging Face checkpoint")
    qz.add_argument("src", help="the float checkpoint directory (config.json, *.safetensors)")
    qz.add_argument("dst", help="the directory to write (new or empty)")
    qz.add_argument("--bits", type=int, default=4, choices=(4, 8))
    qz.add_argument("--group-size", type=int, default=128, help="input features a scale covers (-1: a whole row)")
    qz.add_argument("--asym", action="store_true", help="a zero point per group (default: symmetric)")
    qz.set_defaults(fn=cmd_quantize)
    la = sub.add_parser(
        "launch",
        help="run a command as N ranks of a tensor-parallel run, one process per GPU "
        "(sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT as torchrun does)",
    )
    la.add_argument("-n", "--nproc", type=int, required=True, help="number of processes (GPUs)")
    la.add_argument("--master-port", type=int, help="rank 0's rendezvous port (default: a free one)")
    la.add_argument("command", nargs=argparse.REMAINDER, help="e.g. rocmc generate CKPT --module m.vmfb --tp 2 ...")
    la.set_defaults(fn=cmd_launch)
    t = sub.add_parser("targets", help="list the known compile targets")
    t.set_defaults(fn=cmd_targets)
    o = sub.add_parser("ops", help="list the graph ops and each one's implementations per target kind")
    o.add_argument("--json", action="store_true")
    o.set_defaults(fn=cmd_ops)
    m = sub.add_parser("models", help="list the language-model families rocmc.llm builds (rocmc generate)")
    m.add_argument("--json", action="store_true")
    m.set_defaults(fn=cmd_models)
    _common_options(sub)
    args = ap.parse_args(argv)
    _apply_common_options(args)
    try:
        return args.fn(args)
    except RocmcError as e:
        print(f"rocmc: error: {e}", file=sys.stderr)
    except OSError as e:  # a path given on the command line that can't be read or written
        where = f"{e.filename}: " if e.filename else ""
        print(f"rocmc: error: {where}{e.strerror or e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
