"""Artifact: the compiled .vmfb plus rocmc's metadata, and access to every lowering stage.

The .vmfb is self-describing: rocmc's metadata (graph hash, target, versions, per-node implementation,
signature with symbolic dims) lives in the entry function's `iree.reflection` dictionary, so an
artifact loaded from a file knows what it is. Stages past the input MLIR are produced on request by
recompiling with IREE's phase dumps (plain compiles stay fast); they are kept next to the cached artifact.

A file read from disk is untrusted until checked: its integrity trailer (see `seal`) is verified before
any byte reaches IREE, and its metadata is checked against a schema and against the module's own
function signatures. The trailer detects damage, not tampering (anyone who can write the file can
recompute it): loading a .vmfb runs its native code, so an artifact is trusted like a shared library.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import struct
import tempfile
from pathlib import Path
from typing import Callable

from .archs import known_targets
from .errors import ArtifactError
from .frontend.dtypes import ALL as DTYPES

STAGES = ("graph", "rewrite", "input", "abi", "preprocessing", "global-optimization", "dispatch-creation", "flow",
          "stream", "executable-sources", "executable-configurations", "executable-targets", "hal", "vm")
_GRAPH_STAGES = ("graph", "rewrite")      # rocmc's graph before and after rocmc.rewrite; the rest are MLIR
_VMFB_MAGIC = b"IREE"
# The scope of the module's named parameters (#flow.parameter.named<"model"::"name">).
PARAMETER_SCOPE = "model"
# Version of the metadata rocmc writes. 1 (no "format" key): every extern call is MIOpen's
# (`miopen.<op>`) and its entry names no library; 2: each extern entry names its library.
FORMAT = 2


class Artifact:
    def __init__(self, vmfb: bytes | None, metadata: dict, *, input_mlir: str | Path | None = None,
                 stage_dir: Callable[[], Path] | None = None, path: str | None = None):
        """vmfb None: the module is the file at `path`, read only when its bytes are asked for (a cache
        hit or a module of large weights is mapped by the runtime, not copied)."""
        if vmfb is None and path is None:
            raise ArtifactError("an Artifact needs the module's bytes or its file")
        self._vmfb = vmfb
        self.metadata = metadata
        self._input_mlir = input_mlir
        self._stage_dir = stage_dir    # produces (once) a directory of phase dumps
        self.path = path
        # Bytes of the constants compiled as parameters (compile(constants=...)), by name.
        self.parameter_arrays: dict = {}

    # ---- what it is -----------------------------------------------------------------------
    @property
    def vmfb(self) -> bytes:
        if self._vmfb is None:
            try:
                self._vmfb = Path(self.path).read_bytes()
            except OSError as e:
                raise ArtifactError(f"the module file {self.path!r} can't be read ({e.strerror})") from None
        return self._vmfb

    @property
    def size(self) -> int:
        return len(self._vmfb) if self._vmfb is not None else os.path.getsize(self.path)

    @property
    def target(self) -> str:
        return self.metadata["target"]

    @property
    def signature(self) -> dict:
        return self.metadata["signature"]

    @property
    def implementations(self) -> list:
        return self.metadata["implementations"]

    def __repr__(self) -> str:
        return (f"<rocmc.Artifact {self.metadata.get('graph')} target={self.target} "
                f"{self.size} bytes hash={self.metadata.get('graph_hash', '')[:12]}>")

    # ---- files ----------------------------------------------------------------------------
    def save(self, path) -> Path:
        """Write the module to `path` atomically: a temporary file of a random name, created exclusively
        next to it (never following a planted link), renamed over it once complete. The constants
        compiled as parameters go to an .irpa of the same name beside it."""
        path = Path(path)
        if path.is_dir():
            raise ArtifactError(f"can't save the artifact to {str(path)!r}: it is a directory; give a file name")
        if not path.parent.is_dir():
            raise ArtifactError(f"can't save the artifact to {str(path)!r}: directory {str(path.parent)!r} "
                                f"does not exist")
        try:
            write_atomic(path, self.vmfb, 0o644 & ~_umask())   # mkstemp's 0600 would make a saved model private
        except OSError as e:
            raise ArtifactError(f"can't save the artifact to {str(path)!r}: {e.strerror or e}") from None
        if self.parameter_arrays:
            from .parameters import save_parameters
            save_parameters(path.with_suffix(".irpa"), self.parameter_arrays)
        self.path = str(path)
        return path

    @classmethod
    def load(cls, path, *, verify: bool = True) -> "Artifact":
        """Read a .vmfb file. verify=False skips the integrity check, for a file you trust that has no
        trailer (made by an older rocmc); its metadata is still checked against the module."""
        path = Path(path)
        if path.is_dir():
            raise ArtifactError(f"{str(path)!r} is a directory, expected a .vmfb file")
        if not path.exists():
            raise ArtifactError(f"artifact file {str(path)!r} does not exist")
        if not path.is_file():
            raise ArtifactError(f"{str(path)!r} is not a regular file, expected a .vmfb file")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ArtifactError(f"artifact file {str(path)!r} can't be read ({e.strerror})") from None
        return cls.from_bytes(data, str(path), verify=verify, path=str(path))

    @classmethod
    def from_bytes(cls, data: bytes, what: str = "artifact", *, verify: bool = True,
                   path: str | None = None) -> "Artifact":
        """An Artifact of .vmfb bytes from elsewhere, checked like a file (see `load`)."""
        _check_header(data, what)      # junk gets the plainer message
        if verify:
            check_seal(data, what)
        return cls(data, read_metadata(data, what), path=path)

    # ---- inspection -----------------------------------------------------------------------
    def ir(self, stage: str = "input") -> str:
        """Text of one lowering stage: graph (as given), rewrite (the graph compiled, after
        rocmc.rewrite), input, flow, stream, hal, ... (see STAGES)."""
        if stage not in STAGES and not stage.startswith("dispatch:"):
            raise ArtifactError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)} or 'dispatch:<name>'")
        if stage == "graph":
            return self.metadata.get("graph_text", "")
        if stage == "rewrite":
            if "rewrites" not in self.metadata:
                raise ArtifactError("this artifact was compiled with rewrite=False: it has no rewrite stage; "
                                    "ir('graph') is the graph compiled")
            return self.metadata.get("rewritten_text", self.metadata.get("graph_text", ""))
        if stage == "input" and self._input_mlir is not None:
            if isinstance(self._input_mlir, Path):
                self._input_mlir = self._input_mlir.read_text()
            return self._input_mlir
        d = self.stage_dir()
        if stage.startswith("dispatch:"):
            name = stage.split(":", 1)[1]
            for p in sorted((d / "sources").glob("*.mlir")):
                if p.stem.endswith(name) or name in p.stem:
                    return p.read_text()
            raise ArtifactError(f"no dispatch named {name!r}; dispatches: "
                                f"{', '.join(x['name'] for x in self.dispatches())}")
        for p in d.glob("*.mlir"):
            parts = p.name.split(".")
            if len(parts) >= 3 and parts[-2] == stage:
                return p.read_text()
        raise ArtifactError(f"stage {stage!r} was not produced")

    def stage_dir(self) -> Path:
        if self._stage_dir is None:
            raise ArtifactError("compiler stages are only available for artifacts made by rocmc.compile "
                                f"(this one was loaded from {self.path or 'bytes'}); recompile the graph")
        return self._stage_dir()

    def dump_ir(self, directory) -> Path:
        """Write every stage (and per-dispatch sources) under `directory`."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for stage in STAGES:
            if stage in _GRAPH_STAGES:
                if stage == "graph" or "rewrites" in self.metadata:
                    (out / f"00.{stage}.txt").write_text(self.ir(stage))
                continue
            (out / f"{STAGES.index(stage) - len(_GRAPH_STAGES) + 1:02d}.{stage}.mlir").write_text(self.ir(stage))
        src = self.stage_dir() / "sources"
        if src.is_dir():
            (out / "dispatches").mkdir(exist_ok=True)
            for p in src.glob("*.mlir"):
                (out / "dispatches" / p.name).write_text(p.read_text())
        (out / "metadata.json").write_text(json.dumps(self.metadata, indent=2))
        return out

    def dispatches(self) -> list[dict]:
        """Each dispatch of the compiled module: name, the graph nodes fused into it, implementation."""
        flow = self.ir("flow")
        impl_of = {c["node"]: c for f in functions(self.metadata) for c in f["implementations"]}
        out = []
        for name, nodes in dispatch_nodes(flow):
            impls = sorted({impl_of[n]["impl"] for n in nodes if n in impl_of})
            out.append({"name": name, "nodes": nodes, "ops": sorted({impl_of[n]["op"] for n in nodes if n in impl_of}),
                        "impl": "+".join(impls) or "generated", "kind": "generated"})
        for k in self.metadata.get("kernels", []):
            out.append({"name": k["symbol"], "nodes": [k["node"]], "ops": [k["op"]], "impl": "hip",
                        "kind": "hand-written", "arch": k["arch"]})
        for x in self.metadata.get("externs", []):
            out.append({"name": x["import"], "nodes": [x["node"]], "ops": [x["op"]], "impl": x["impl"],
                        "kind": "extern call"})
        return out

    @property
    def parameters(self) -> list[dict]:
        """The named parameters the module loads: {name, shape, dtype, from} ("graph": a
        graph.parameter; "constant": a constant made external by compile(constants=...))."""
        return self.metadata.get("parameters", [])

    @property
    def functions(self) -> list[str]:
        return [f["name"] for f in functions(self.metadata)]

    def default_parameters(self):
        """What `rocmc.load` takes the parameters from when it is given none: the constants compiled as
        parameters (in memory), else the .irpa saved beside the artifact's file, else None."""
        if self.parameter_arrays:
            return self.parameter_arrays
        irpa = Path(self.path).with_suffix(".irpa") if self.path else None
        return irpa if irpa is not None and irpa.is_file() else None

    def parameter_source(self) -> str:
        """Where `rocmc.load` takes the parameters from when it is given none, in words."""
        if not self.parameters:
            return "none needed"
        found = self.default_parameters()
        if isinstance(found, dict):
            return "the constants of the compiled graph (in memory; save() writes them to an .irpa)"
        if found is not None:
            return str(found)
        return "load(..., parameters=...): an .irpa, .safetensors, checkpoint directory or arrays"

    def summary(self) -> str:
        lines = [repr(self)]
        if self.metadata.get("compile_note"):
            lines.append(f"note: {self.metadata['compile_note']}")
        if len(self.functions) > 1:
            lines.append(f"functions: {', '.join(self.functions)}")
        if self.parameters:
            total = sum(math.prod(p["shape"]) * DTYPES[p["dtype"]].np.itemsize for p in self.parameters)
            lines.append(f"parameters: {len(self.parameters)} ({total / 2**20:.1f} MiB), from {self.parameter_source()}")
            for p in self.parameters:
                n = math.prod(p["shape"]) * DTYPES[p["dtype"]].np.itemsize
                lines.append(f"  {p['name']:<48} {p['dtype']}[{','.join(map(str, p['shape']))}] {n} bytes")
        for st in self.metadata.get("states", []):
            lines.append(f"state: {st['name']} {st['dtype']}[{','.join(map(str, st['shape']))}] (on the device)")
        lines += rewrite_lines(self.metadata) + _collective_lines(self.metadata)
        if self._stage_dir is None:
            lines.append("dispatches: (listed for artifacts made by rocmc.compile; this one was loaded)")
            lines += [f"  {c['node']:<6} {c['op']:<16} {c['impl']}" for f in functions(self.metadata)
                      for c in f["implementations"] if c["impl"] != "generated"]
            return "\n".join(lines)
        lines.append("dispatches:")
        for d in self.dispatches():
            extra = f" [{d['arch']}]" if "arch" in d else ""
            lines.append(f"  {d['name']:<60} {d['kind']:<12} {d['impl']:<10}{extra} {' '.join(d['nodes'])} ({', '.join(d['ops'])})")
        return "\n".join(lines + _passed_over(self.metadata))


def _collective_lines(meta: dict) -> list[str]:
    """A tensor-parallel rank's program: how many ranks, and each function's collectives by implementation."""
    world = meta.get("world_size", 1)
    if world == 1:
        return []
    how = {"iree": "NCCL/RCCL enqueued by IREE on the device stream", "host": "the host process group"}
    lines = [f"tensor parallel: one of {world} ranks (run with `rocmc launch -n {world}`); collectives per call:"]
    for f in functions(meta):
        counts: dict = {}
        for c in f["implementations"]:
            if c["op"] in ("all_reduce", "all_gather"):
                counts[(c["op"], c["impl"])] = counts.get((c["op"], c["impl"]), 0) + 1
        if counts:
            lines.append(f"  {f['name']}: " + ", ".join(f"{n} {op} ({impl}: {how.get(impl, impl)})"
                                                      for (op, impl), n in sorted(counts.items())))
    return lines


def _passed_over(meta: dict) -> list[str]:
    """Nodes where a preferred implementation (a library call, a hand-written kernel) was not used,
    with the reason: e.g. a GEMM too small for a library call."""
    rows = [c for f in functions(meta) for c in f["implementations"] if c.get("skipped")]
    if not rows:
        return []
    return ["passed over:"] + [f"  {c['node']:<6} {c['op']:<16} {c['impl']:<10} ({'; '.join(c['skipped'])})"
                               for c in rows]


def rewrite_lines(meta: dict) -> list[str]:
    """What rocmc.rewrite replaced, one line per fused node: `rewrite: rms_norm %16 <- 8 nodes (...)`."""
    if "rewrites" not in meta:
        return ["rewrite: off"]
    if not meta["rewrites"]:
        return ["rewrite: nothing recognized"]
    out = []
    for r in meta["rewrites"]:
        where = f"{r['function']}: " if r["function"] != meta.get("function", "main") else ""
        nodes = ", ".join(f"{i} {op}" for i, op in r["replaced"])
        out.append(f"rewrite: {where}{r['op']} {r['node']} <- {len(r['replaced'])} nodes ({nodes})")
    return out


_LOC_DEF = re.compile(r"^(#loc\d*) = loc\((.*)\)\s*$", re.M)
_ROCMC_LOC = re.compile(r'"rocmc\.(\d+):([A-Za-z0-9_]+)"')
_EXEC = re.compile(r"^\s*flow\.executable (?:private |public )?@([\w$.-]+)", re.M)


def dispatch_nodes(flow_text: str) -> list[tuple[str, list[str]]]:
    """Resolve IREE's location aliases to find which rocmc nodes each flow.executable computes.

    IREE deduplicates identical executables, so a dispatch reused by several nodes lists the first.
    """
    aliases = {m.group(1): m.group(2) for m in _LOC_DEF.finditer(flow_text)}
    memo: dict[str, set] = {}

    def nodes_in(text: str, depth=0) -> set:
        found = {f"%{m.group(1)}" for m in _ROCMC_LOC.finditer(text) if m.group(2) not in ("input",)}
        if depth < 50:
            for ref in re.findall(r"#loc\d*", text):
                if ref not in memo:
                    memo[ref] = set()
                    memo[ref] = nodes_in(aliases.get(ref, ""), depth + 1)
                found |= memo[ref]
        return found

    out = []
    for m in _EXEC.finditer(flow_text):
        end = flow_text.find("\n  }", m.end())           # the executable's closing brace (2-space indent)
        block = flow_text[m.start():end if end >= 0 else len(flow_text)]
        exports = re.findall(r"flow\.executable\.export public @([\w$.-]+)", block)
        # Only compute ops say which nodes a dispatch computes; loads, stores and shape ties carry the
        # locations of the producers and consumers around it.
        compute = "\n".join(line for line in block.splitlines() if _is_compute(line))
        nodes = sorted(nodes_in(compute), key=lambda s: int(s[1:]))
        out.append((exports[0] if exports else m.group(1), nodes))
    return out


def _is_compute(line: str) -> bool:
    s = line.strip()
    if s.startswith("} -> tensor<"):
        return True
    if "arith.constant" in s or "dispatch.tensor." in s or "tie_shape" in s or "tensor.empty" in s:
        return False
    return any(k in s for k in ("linalg.", "iree_linalg_ext.", "arith.", "math.", "tensor.extract", "tensor.insert"))


# ---- integrity ---------------------------------------------------------------------------------

# A sealed module is the .vmfb followed by this trailer. IREE reads a module from its start and
# ignores bytes past it (VmModule.mmap, copy_buffer and iree-dump-module all accept a sealed file).
_SEAL = struct.Struct("<8s32sQ8s")       # magic, sha256 of the module bytes, their length, magic
_SEAL_MAGIC = b"rocmc\x00s1"


def seal(vmfb: bytes) -> bytes:
    """The module followed by its integrity trailer."""
    return vmfb + _SEAL.pack(_SEAL_MAGIC, hashlib.sha256(vmfb).digest(), len(vmfb), _SEAL_MAGIC)


def check_seal(data: bytes, what: str = "artifact") -> None:
    """ArtifactError unless `data` is a module followed by the trailer `seal` gave it."""
    n = len(data) - _SEAL.size
    head, digest, length, tail = _SEAL.unpack_from(data, n) if n > 0 else (b"",) * 4
    if head != _SEAL_MAGIC or tail != _SEAL_MAGIC:
        raise ArtifactError(f"{what}: no rocmc integrity trailer at the end of the file: it is truncated or "
                            f"damaged, was made by an older rocmc, or is not a rocmc artifact; recompile it, "
                            f"or load it with verify=False if you trust the file")
    if length != n:
        raise ArtifactError(f"{what}: damaged: its trailer records a module of {length} bytes, the file "
                            f"holds {n}; recompile it")
    if hashlib.sha256(memoryview(data)[:n]).digest() != digest:
        raise ArtifactError(f"{what}: damaged: the module's sha256 differs from the one in its trailer; "
                            f"recompile it")


def _check_header(data: bytes, what: str) -> None:
    if len(data) < 16 or _VMFB_MAGIC not in data[:256]:
        raise ArtifactError(f"{what}: not an IREE .vmfb module (bad header, {len(data)} bytes)")


def write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write `path` whole or not at all: through a temporary file of a random name, created exclusively
    in the same directory (never following a planted link; mode 0600 unless `mode`), renamed over it
    once complete, and removed on any failure."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0o022)     # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


# ---- metadata --------------------------------------------------------------------------------

def read_metadata(data: bytes, what: str = "artifact") -> dict:
    """rocmc's metadata from .vmfb bytes, checked against its schema and against the module's own
    function signatures; ArtifactError if the file is not a valid rocmc module."""
    _check_header(data, what)
    from iree import runtime as rt
    try:
        inst = rt.VmInstance()
        mod = rt.VmModule.copy_buffer(inst, data)
        # The metadata is on the module's first function: `main`, or the first of a program.
        fns = [f for f in (mod.lookup_function(n) for n in mod.function_names) if f is not None]
    except Exception as e:
        raise ArtifactError(f"{what}: corrupt or truncated .vmfb ({e})") from None
    fn = next((f for f in fns if "rocmc.meta" in f.reflection), None)
    if fn is None and not any(f.name == "main" for f in fns):
        raise ArtifactError(f"{what}: the module has no 'main' function; not built by rocmc")
    meta = None if fn is None else fn.reflection.get("rocmc.meta")
    if meta is None:
        raise ArtifactError(f"{what}: no rocmc metadata in the module; was it built by rocmc?")
    try:
        meta = json.loads(meta)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ArtifactError(f"{what}: unreadable rocmc metadata ({e})") from None
    check_metadata(meta, what)
    check_signatures(mod, meta, what)
    return meta


_DIM = (int, str)        # a static size, or a symbol or size expression
_TENSOR = {"name": str, "dtype": frozenset(DTYPES), "shape": [_DIM]}
# Keys ending in "?" are optional. Unknown keys are allowed (read by newer versions only).
METADATA_SCHEMA = {
    "rocmc": str, "iree": str, "graph": str, "graph_hash": str, "target": frozenset(known_targets()),
    "signature": {"inputs": [_TENSOR], "outputs": [_TENSOR]},
    "implementations": [{"node": str, "op": str, "impl": str}],
    "kernels": [{"node": str, "op": str, "symbol": str, "arch": str}],
    "format?": int,      # FORMAT; absent in modules of format 1
    "externs": [{"node": str, "op": str, "import": str, "impl": str, "dtype": str, "attrs?": dict,
                 "library?": str}],
    "graph_text?": str, "compile_flags?": [str], "compile_note?": str,
    "long_form?": {"function": str, "scores": [[_DIM]], "limit": int},
    # A program of several functions: the first is described above (named `function`, default "main").
    "function?": str,
    "functions?": [{"name": str, "signature": {"inputs": [_TENSOR], "outputs": [_TENSOR]}, "constraints": list,
                    "implementations": [{"node": str, "op": str, "impl": str}],
                    "long_form?": {"function": str, "scores": [[_DIM]], "limit": int}}],
    "parameters?": [{"name": str, "shape": [int], "dtype": frozenset(DTYPES), "from": frozenset(("graph", "constant"))}],
    "states?": [{"name": str, "shape": [int], "dtype": frozenset(DTYPES)}],
    "info?": dict,
    # rocmc.rewrite ran (compile(rewrite=True)): what it replaced, and the graph compiled if it changed.
    "rewrites?": [{"function": str, "pattern": str, "op": str, "node": str, "replaced": [[str]]}],
    "rewritten_text?": str,
}
_KIND = {str: "a string", int: "a non-negative integer", dict: "an object", _DIM: "a size or a symbol"}


def check_metadata(meta, what: str = "artifact") -> None:
    """ArtifactError naming the first key of rocmc's metadata that is missing or malformed."""
    _check(meta, METADATA_SCHEMA, "", what)


def _check(value, spec, key: str, what: str) -> None:
    def bad(expected: str):
        raise ArtifactError(f"{what}: rocmc metadata key {key or 'root'!r} is {_short(value)}, expected {expected}")
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            bad("an object")
        for name, sub in spec.items():
            optional, name = name.endswith("?"), name.rstrip("?")
            child = f"{key}.{name}" if key else name
            if name in value:
                _check(value[name], sub, child, what)
            elif not optional:
                raise ArtifactError(f"{what}: rocmc metadata lacks the key {child!r}; the file was edited or "
                                    f"made by another rocmc: recompile it")
    elif isinstance(spec, list):
        if not isinstance(value, list):
            bad("a list")
        for i, item in enumerate(value):
            _check(item, spec[0], f"{key}[{i}]", what)
    elif isinstance(spec, frozenset):
        if not isinstance(value, str) or value not in spec:
            bad(f"one of {', '.join(sorted(spec))}")
    else:
        types = spec if isinstance(spec, tuple) else (spec,)
        ok = isinstance(value, types) and not isinstance(value, bool)
        if not ok or (isinstance(value, int) and value < 0) or value == "":
            bad(_KIND[spec])


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- metadata against the module -------------------------------------------------------------

_DECLARATION = re.compile(r"(?:sync |async )?func @([\w$.-]+)\((.*)\) -> \((.*)\)")
_ABI_VALUE = re.compile(r"%[\w$.-]+: (tensor<[^>]*>|[^,]+)")
_CCONV = re.compile(r"<VmFunction [\w$.-]+\(0(\w*)_(\w*)\)")


def check_signatures(module, meta: dict, what: str = "artifact") -> None:
    """ArtifactError unless the metadata's signature is the one of each function it names (main, and
    the long form): counts, element types, ranks and static sizes, as IREE's reflection and the
    functions' calling conventions state them. Symbolic sizes show as `?` there; the module itself
    checks the equalities between them when called."""
    for f in functions(meta):
        _check_function(module, f, what)


def functions(meta: dict) -> list[dict]:
    """Each function of the module as {name, signature, constraints, implementations, long_form?}: the
    first as the top level of the metadata describes it, then those of `functions`."""
    first = {"name": meta.get("function", "main"), "signature": meta["signature"],
             "constraints": meta.get("constraints", []), "implementations": meta["implementations"]}
    if "long_form" in meta:
        first["long_form"] = meta["long_form"]
    return [first, *meta.get("functions", [])]


def _check_function(module, f: dict, what: str) -> None:
    sig = f["signature"]
    want = ([_abi_type(x) for x in sig["inputs"]], [_abi_type(x) for x in sig["outputs"]])
    names = [f["name"]] + ([f["long_form"]["function"]] if "long_form" in f else [])
    for name in names:
        fn = module.lookup_function(name)
        if fn is None:
            raise ArtifactError(f"{what}: the metadata names function {name!r}, which the module lacks")
        got = _declared(fn, name, what)
        for kind, specs, w, g in (("input", sig["inputs"], want[0], got[0]),
                                  ("output", sig["outputs"], want[1], got[1])):
            if len(w) != len(g):
                raise ArtifactError(f"{what}: the metadata lists {len(w)} {kind}(s) but function {name!r} has "
                                    f"{len(g)}; the metadata does not describe this module")
            for spec, a, b in zip(specs, w, g):
                if a != b:
                    raise ArtifactError(f"{what}: the metadata says {kind} {spec['name']!r} is {a} but function "
                                        f"{name!r} has {b}; the metadata does not describe this module")


def _abi_type(spec: dict) -> str:
    """The type IREE's reflection prints for a signature entry."""
    dims = "".join(f"{d if isinstance(d, int) else '?'}x" for d in spec["shape"])
    return f"tensor<{dims}{DTYPES[spec['dtype']].abi_mlir}>"


def _declared(fn, name: str, what: str) -> tuple[list, list]:
    """(input types, output types) of a function as IREE declares it, checked against the number of
    values its calling convention passes."""
    m = _DECLARATION.fullmatch(fn.reflection.get("iree.abi.declaration", ""))
    cc = _CCONV.match(repr(fn))
    if m is None or m.group(1) != name or cc is None:
        raise ArtifactError(f"{what}: function {name!r} has no readable ABI declaration; not built by rocmc")
    ins, outs = (_ABI_VALUE.findall(m.group(i)) for i in (2, 3))
    if cc.group(1).strip("v") != "r" * len(ins) or cc.group(2).strip("v") != "r" * len(outs):
        raise ArtifactError(f"{what}: function {name!r} passes ({cc.group(1)}) -> ({cc.group(2)}) but declares "
                            f"{len(ins)} input(s) and {len(outs)} output(s); the module is inconsistent")
    return [t.strip() for t in ins], [t.strip() for t in outs]
