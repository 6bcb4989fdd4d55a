"""Lowering: graph -> MLIR (per-node implementations from the registry) -> iree-compile -> Artifact."""
from __future__ import annotations

import threading
from pathlib import Path

from .._version import __version__
from ..errors import CompileError
from ..artifact import Artifact
from ..frontend.graph import Graph
from . import generated  # noqa: F401  (registers the generated implementation of every op)
from . import hip  # noqa: F401
from . import kernels
from . import extern  # noqa: F401
from .cache import Cache, cache_key, cache_root, code_digest, host_cpu
from .compiler import compile_bytecode, iree_version
from .module import lower
from .target import Target, known_targets

_stage_lock = threading.Lock()


def compile(graph: Graph, target="cpu", *, impl=None, libraries=(), cache: bool = True,
            dump_ir=None, flags=()) -> Artifact:
    """Compile `graph` for `target` ("cpu", "gfx942", "rocm:gfx942", "cuda:sm_80", ...).

    impl: {op: implementation} overrides, or one implementation name for every op ("generated").
    libraries: opt into vendor-library implementations for every op they cover (e.g. ["miopen"]).
    dump_ir: a directory to write every lowering stage to.
    """
    target = Target.parse(target)
    libraries = tuple(libraries)
    root = cache_root() if cache else None
    key = cache_key(graph=graph.hash(), target=str(target), impl=impl, libraries=libraries, flags=list(flags),
                    rocmc=__version__, code=code_digest(), iree=iree_version(),
                    cpu=host_cpu() if target.kind == "cpu" else None,
                    kernels=kernels.sources_digest() if target.is_gpu else None)
    store = Cache(root) if root is not None else None
    hit = store.get(key) if store else None
    if hit is not None:
        used = hit["metadata"].get("compile_flags", list(flags))
        art = Artifact(None, hit["metadata"], input_mlir=hit["input_mlir"], path=str(hit["path"]),
                       stage_dir=_stage_producer(hit["dir"] / "module.mlirbc", target, used, hit["dir"] / "stages"))
        art.cached = True
    else:
        lowered = lower(graph, target, impl=impl, libraries=libraries)
        vmfb, used, note = _compile_tuned(lowered.bytecode, target, list(flags))
        lowered.metadata["compile_flags"] = used
        if note:
            lowered.metadata["compile_note"] = note
        if store is not None:
            d = store.put(key, vmfb, lowered.metadata, lowered.text, lowered.bytecode)
            producer = _stage_producer(d / "module.mlirbc", target, used, d / "stages")
        else:
            producer = _stage_producer(lowered.bytecode, target, used, None)
        art = Artifact(vmfb, lowered.metadata, input_mlir=lowered.text, stage_dir=producer)
        art.cached = False
    if dump_ir is not None:
        art.dump_ir(dump_ir)
    return art


def _compile_tuned(bytecode: bytes, target: Target, flags: list):
    """Compile with the target's performance options; without them if IREE fails with them.
    Returns (vmfb, flags used, note or None)."""
    tuned = target.tuning_flags()
    note = None
    if tuned:
        try:
            return compile_bytecode(bytecode, target, [*tuned, *flags]), [*tuned, *flags], None
        except CompileError as e:
            first = next((l for l in e.diagnostics.splitlines() if "error:" in l), "").strip()
            note = f"compiled without {' '.join(tuned)}: IREE failed with them ({first[:200]})"
    return compile_bytecode(bytecode, target, flags), flags, note


def _stage_producer(source, target: Target, flags, stage_dir: Path | None):
    """A function that compiles once more with IREE's phase dumps and returns their directory."""
    state = {}

    def produce() -> Path:
        with _stage_lock:
            if "dir" in state:
                return state["dir"]
            d = stage_dir
            if d is not None and (d / "done").exists():
                state["dir"] = d
                return d
            if d is None:
                import tempfile
                d = Path(tempfile.mkdtemp(prefix="rocmc-stages-"))
            bytecode = source.read_bytes() if isinstance(source, Path) else source
            compile_bytecode(bytecode, target, flags, dump_dir=d)
            (d / "done").write_text("")
            state["dir"] = d
            return d
    return produce
