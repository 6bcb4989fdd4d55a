"""Artifact: the compiled .vmfb plus rocmc's metadata, and access to every lowering stage.

The .vmfb is self-describing: rocmc's metadata (graph hash, target, versions, per-node implementation,
signature with symbolic dims) lives in the entry function's `iree.reflection` dictionary, so an
artifact loaded from a file knows what it is. Stages past the input MLIR are produced on request by
recompiling with IREE's phase dumps (plain compiles stay fast); they are kept next to the cached artifact.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Callable

from .errors import ArtifactError

STAGES = ("graph", "input", "abi", "preprocessing", "global-optimization", "dispatch-creation", "flow",
          "stream", "executable-sources", "executable-configurations", "executable-targets", "hal", "vm")
_VMFB_MAGIC = b"IREE"


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
        path = Path(path)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_bytes(self.vmfb)
        os.replace(tmp, path)
        self.path = str(path)
        return path

    @classmethod
    def load(cls, path) -> "Artifact":
        path = Path(path)
        if not path.is_file():
            raise ArtifactError(f"artifact file {str(path)!r} does not exist")
        data = path.read_bytes()
        return cls(data, read_metadata(data, str(path)), path=str(path))

    # ---- inspection -----------------------------------------------------------------------
    def ir(self, stage: str = "input") -> str:
        """Text of one lowering stage: graph, input, flow, stream, hal, ... (see STAGES)."""
        if stage not in STAGES and not stage.startswith("dispatch:"):
            raise ArtifactError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)} or 'dispatch:<name>'")
        if stage == "graph":
            return self.metadata.get("graph_text", "")
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
            (out / f"{STAGES.index(stage):02d}.{stage}.mlir" if stage != "graph" else out / "00.graph.txt") \
                .write_text(self.ir(stage))
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
        impl_of = {c["node"]: c for c in self.implementations}
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

    def summary(self) -> str:
        lines = [repr(self), "dispatches:"]
        for d in self.dispatches():
            extra = f" [{d['arch']}]" if "arch" in d else ""
            lines.append(f"  {d['name']:<60} {d['kind']:<12} {d['impl']:<10}{extra} {' '.join(d['nodes'])} ({', '.join(d['ops'])})")
        return "\n".join(lines)


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


def read_metadata(data: bytes, what: str = "artifact") -> dict:
    """Read rocmc's metadata from .vmfb bytes; ArtifactError if the file is not a valid module."""
    if len(data) < 16 or _VMFB_MAGIC not in data[:256]:
        raise ArtifactError(f"{what}: not an IREE .vmfb module (bad header, {len(data)} bytes)")
    from iree import runtime as rt
    try:
        inst = rt.VmInstance()
        mod = rt.VmModule.copy_buffer(inst, data)
        fn = mod.lookup_function("main")
    except Exception as e:
        raise ArtifactError(f"{what}: corrupt or truncated .vmfb ({e})") from None
    if fn is None:
        raise ArtifactError(f"{what}: the module has no 'main' function; not built by rocmc")
    meta = fn.reflection.get("rocmc.meta")
    if meta is None:
        raise ArtifactError(f"{what}: no rocmc metadata in the module; was it built by rocmc?")
    try:
        return json.loads(meta)
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{what}: unreadable rocmc metadata ({e})") from None
