"""Lowering: graph -> MLIR (per-node implementations from the registry) -> iree-compile -> Artifact."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

from .._version import __version__
from ..progress import step
from ..errors import ArtifactError, CompileError, LoweringError
from ..artifact import Artifact, seal
from . import codegen  # noqa: F401  (registers the generated implementation of every op)
from . import kernel  # noqa: F401  (registers the hand-written kernel implementation)
from . import kernels
from . import blas, collective, dnn  # noqa: F401
from .cache import Cache, cache_key, cache_root, code_digest, host_cpu, remove_stale
from .compiler import compile_bytecode, iree_version, owned_tempdir
from .module import asynchronous_functions, lower, program_hash, program_of
from .registry import check_options, current_options
from .target import FNUZ, OCP, Target, native_float8

_stage_lock = threading.Lock()
LOG = "rocmc.lowering"


def compile(
    graph,
    target="cpu",
    *,
    impl=None,
    libraries=(),
    constants="embed",
    cache: bool = True,
    dump_ir=None,
    flags=(),
    info: dict | None = None,
    rewrite: bool = True,
    asynchronous=(),
) -> Artifact:
    """Compile `graph` for `target` ("cpu", "gfx942", "rocm:gfx942", "cuda:sm_80", ...).

    graph: a Graph (the module's function `main`), or a dict {name: Graph} of functions compiled into one
    module, sharing its parameters and states (e.g. {"prefill": g1, "decode": g2}).
    constants: "embed" (the module holds every constant), "external" (constants of at least
    EXTERNAL_MIN_BYTES become named parameters: the module holds none of their bytes, `save` writes
    them to an .irpa beside it), or a size in bytes from which a constant becomes a parameter.

    impl: {op: implementation} overrides, or one implementation name for every op ("generated").
    libraries: opt into library implementations for every op they cover (e.g. ["dnn"], ["blas"]).
    Old names (rocmc.aliases: "miopen", "hipblaslt", "hip") are accepted for the current ones.
    dump_ir: a directory to write every lowering stage to.
    info: a JSON object kept in the artifact's metadata (`art.metadata["info"]`), e.g. what a model was
    built for.
    rewrite: replace the decomposed forms exporters write (RMSNorm, LayerNorm, GELU, SiLU, RoPE,
    attention) with rocmc's fused ops before lowering (rocmc.rewrite); `art.ir("rewrite")` is the graph
    compiled, `art.summary()` lists what was replaced.
    asynchronous: functions (a list of names, or True for all) that the runtime may also issue without
    waiting for them, ordered on the device after earlier calls (`Module.submit`): a decode loop issues
    its next step while the GPU runs this one.
    """
    if not isinstance(rewrite, bool):
        raise LoweringError(f"compile(rewrite={rewrite!r}): expected True or False")
    impl, libraries = current_options(impl, libraries)
    check_options(impl, libraries)
    program = program_of(graph)
    asynchronous = asynchronous_functions(asynchronous, program)
    external = _external(constants)
    info = _info(info)
    target = Target.parse(target)
    libraries = tuple(libraries)
    flags = [*flags, *_type_flags(program, target)]
    root = cache_root() if cache else None
    remove_stale(root, tempfile.gettempdir())
    key = cache_key(
        graph=program_hash(program, external),
        functions=list(program),
        external=external,
        target=str(target),
        impl=impl,
        libraries=libraries,
        flags=list(flags),
        info=info,
        rewrite=rewrite,
        asynchronous=list(asynchronous),
        rocmc=__version__,
        code=code_digest(),
        iree=iree_version(),
        cpu=host_cpu() if target.kind == "cpu" else None,
        kernels=kernels.sources_digest() if target.is_gpu else None,
    )
    with step(f"compiling {_names(program)} for {target}", logger=LOG):
        art, stages = _compile(
            program, target, key, root, impl, libraries, external, info, list(flags), rewrite, asynchronous
        )
    weakref.finalize(art, stages.remove_temporary)
    if dump_ir is not None:
        art.dump_ir(dump_ir)
    return art


def _type_flags(program: dict, target: Target) -> list:
    """Flags the program's element types need on `target` (in the compile flags, so the summary shows them);
    LoweringError for types the target's compiler can't take."""
    types = {v.dtype.name for g in program.values() for v in g.inputs} | {
        o.dtype.name for g in program.values() for n in g.nodes for o in n.outputs
    }
    float8 = types & (FNUZ | OCP)
    if not float8 or target.kind == "cpu":
        return []
    if target.kind == "cuda":
        raise LoweringError(
            f"{', '.join(sorted(float8))} on {target}: IREE {iree_version()}'s CUDA backend can't compile float8 "
            f"types (cpu and rocm targets take them); convert to f16 or bf16 before the module"
        )
    return [] if float8 <= native_float8(target) else ["--iree-llvmgpu-enable-small-float-emulation"]


def _names(program: dict) -> str:
    return ", ".join(g.name for g in program.values())


def _compile(program, target, key, root, impl, libraries, external, info, flags, rewrite, asynchronous):
    """The artifact from the cache, else lowered and compiled (and put in the cache); with its stages."""
    store = Cache(root) if root is not None else None
    hit = store.get(key) if store else None
    if hit is not None:
        logging.getLogger(LOG).info("%s for %s: from the compile cache (%s)", _names(program), target, hit.dir)
        used = _flags_used(target, list(flags), hit.tuning_dropped)
        stages = _Stages(hit.dir / "module.mlirbc", target, used, hit.dir / "stages")
        art = Artifact(
            None,
            {**hit.metadata, "compile_flags": used},
            input_mlir=hit.dir / "input.mlir",
            path=str(hit.dir / "module.vmfb"),
            stage_dir=stages,
        )
        art.cached = True
    else:
        with step(f"lowering {_names(program)} to MLIR for {target}", logger=LOG):
            lowered = lower(
                program,
                target,
                impl=impl,
                libraries=libraries,
                external=external,
                info=info,
                rewrite=rewrite,
                asynchronous=asynchronous,
            )
        vmfb, used, tuning_note = _compile_tuned(lowered.bytecode, target, list(flags), lowered.untuned)
        vmfb = seal(vmfb)
        lowered.metadata["compile_flags"] = used
        note = "; ".join(n for n in (target.code_note, tuning_note) if n)
        if note:
            lowered.metadata["compile_note"] = note
        d = (
            store.put(
                key, vmfb, lowered.metadata, lowered.text, lowered.bytecode, tuning_dropped=tuning_note is not None
            )
            if store is not None
            else None
        )
        stages = (
            _Stages(d / "module.mlirbc", target, used, d / "stages")
            if d
            else _Stages(lowered.bytecode, target, used, None)
        )
        art = Artifact(vmfb, lowered.metadata, input_mlir=lowered.text, stage_dir=stages)
        art.cached = False
    art.parameter_arrays = _constant_parameters(program, art.metadata, rewrite)
    return art, stages


EXTERNAL_MIN_BYTES = 4096


def _external(constants) -> int | None:
    """compile's `constants=` as the size from which a constant becomes a parameter (None: embed all)."""
    if constants == "embed":
        return None
    if constants == "external":
        return EXTERNAL_MIN_BYTES
    if isinstance(constants, int) and not isinstance(constants, bool) and constants >= 0:
        return constants
    raise LoweringError(
        f"compile(constants={constants!r}): expected 'embed', 'external' or a size in bytes "
        f"from which a constant becomes a parameter"
    )


def _info(info) -> dict | None:
    import json

    if info is None:
        return None
    try:
        if not isinstance(info, dict) or json.loads(json.dumps(info)) != info:
            raise TypeError("not a JSON object")
    except (TypeError, ValueError) as e:
        raise LoweringError(
            f"compile(info=...): expected a JSON object (dict of str keys, plain values): {e}"
        ) from None
    return info


def _constant_parameters(program: dict, meta: dict, rewrite: bool) -> dict:
    """The arrays of the constants the module takes as parameters, from the graphs compiled (a cache hit
    has the module but not these bytes). A rewrite may have made new constants (batch norm folded into a
    conv's weight): they come from rewriting the graphs again, which gives the same names and values."""
    wanted = {p["name"] for p in meta.get("parameters", []) if p.get("from") == "constant"}
    if rewrite and wanted - {name for g in program.values() for name in g.constants}:
        from ..rewrite import rewrite_program

        program = rewrite_program(program)[0]
    return {name: g.constants[name] for g in program.values() for name in g.constants if name in wanted}


def _compile_tuned(bytecode: bytes, target: Target, flags: list, untuned: Sequence[str] = ()):
    """Compile with the target's performance options; without them if IREE fails with them, or at once when the
    lowering named code that IREE fails to compile with them (`untuned`: the reasons).
    Returns (vmfb, flags used, note or None)."""
    tuned = target.tuning_flags()
    note = None
    if tuned and untuned:
        note = f"compiled without {' '.join(tuned)}: {'; '.join(untuned)}"
    elif tuned:
        try:
            with step(f"iree-compile for {target}", logger=LOG):
                return compile_bytecode(bytecode, target, [*tuned, *flags]), [*tuned, *flags], None
        except CompileError as e:
            first = next((l for l in e.diagnostics.splitlines() if "error:" in l), "").strip()
            note = f"compiled without {' '.join(tuned)}: IREE failed with them ({first[:200]})"
    with step(f"iree-compile for {target}{' (without the tuning flags)' if tuned else ''}", logger=LOG):
        return compile_bytecode(bytecode, target, flags), flags, note


def _flags_used(target: Target, flags: list, tuning_dropped: bool) -> list:
    """The flags a module was compiled with: the request's, after the target's tuning flags unless IREE
    failed with them."""
    return flags if tuning_dropped else [*target.tuning_flags(), *flags]


class _Stages:
    """IREE's phase dumps of a module, produced by one more compile on the first request. Kept in the
    module's cache entry, or else in a temporary directory that lives as long as the artifact."""

    def __init__(self, source: bytes | Path, target: Target, flags: list, keep_in: Path | None):
        self.source, self.target, self.flags, self.keep_in = source, target, flags, keep_in
        self.dir: Path | None = None
        self.temporary: Path | None = None

    def __call__(self) -> Path:
        with _stage_lock:
            if self.dir is None:
                self.dir = self._produce()
            return self.dir

    def _produce(self) -> Path:
        d = self.keep_in
        if d is not None and (d / "done").exists():
            return d
        if d is None:
            d = self.temporary = self.temporary or owned_tempdir("rocmc-stages-")
        else:
            shutil.rmtree(d, ignore_errors=True)  # dumps of a compile that did not finish
        try:
            source = self.source.read_bytes() if isinstance(self.source, Path) else self.source
        except OSError as e:
            raise ArtifactError(
                f"the stages of this artifact can't be produced: its cached module "
                f"{e.filename} is gone ({e.strerror}); compile it again"
            ) from None
        with step(f"iree-compile for {self.target}, writing the stage dumps", logger=LOG):
            compile_bytecode(source, self.target, self.flags, dump_dir=d)
        (d / "done").write_text("")
        return d

    def remove_temporary(self) -> None:
        if self.temporary is not None:
            shutil.rmtree(self.temporary, ignore_errors=True)
