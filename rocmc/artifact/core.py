"""The Artifact: the compiled .vmfb plus rocmc's metadata, and access to every lowering stage.

Stages past the input MLIR are produced on request by recompiling with IREE's phase dumps (plain
compiles stay fast); they are kept next to the cached artifact. Constants over a thousand elements
(weights) are printed elided in IREE's phases, so a model's stages are about the size of its code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from ..errors import ArtifactError
from ..files import umask, write_atomic
from ..parameters import save_parameters
from .dispatches import dispatch_list
from .integrity import check_header, check_seal
from .schema import functions, read_metadata
from .structure import CallStructure, call_structure
from .summary import summary_text

STAGES = (
    "graph",
    "rewrite",
    "input",
    "abi",
    "preprocessing",
    "global-optimization",
    "dispatch-creation",
    "flow",
    "stream",
    "executable-sources",
    "executable-configurations",
    "executable-targets",
    "hal",
    "vm",
)
_GRAPH_STAGES = ("graph", "rewrite")  # rocmc's graph before and after rocmc.rewrite; the rest are MLIR
# The scope of the module's named parameters (#flow.parameter.named<"model"::"name">).
PARAMETER_SCOPE = "model"
# A module whose caller holds its states (held states): the function that makes their buffers, zeros.
STATE_BUFFERS = "rocmc$states"


class Artifact:
    def __init__(
        self,
        vmfb: bytes | None,
        metadata: dict,
        *,
        input_mlir: str | Path | None = None,
        stage_dir: Callable[[], Path] | None = None,
        path: str | None = None,
    ):
        """vmfb None: the module is the file at `path`, read only when its bytes are asked for (a cache
        hit or a module of large weights is mapped by the runtime, not copied)."""
        if vmfb is None and path is None:
            raise ArtifactError("an Artifact needs the module's bytes or its file")
        self._vmfb = vmfb
        self.metadata = metadata
        self._input_mlir = input_mlir
        self._stage_dir = stage_dir  # produces (once) a directory of phase dumps
        self.path = path
        # Bytes of the constants compiled as parameters (compile(constants=...)), by name.
        self.parameter_arrays: dict = {}

    # ---- what it is -----------------------------------------------------------------------
    @property
    def vmfb(self) -> bytes:
        if self._vmfb is None:
            assert self.path is not None, "an Artifact has its module's bytes or its file"
            try:
                self._vmfb = Path(self.path).read_bytes()
            except OSError as e:
                raise ArtifactError(f"the module file {self.path!r} can't be read ({e.strerror})") from None
        return self._vmfb

    @property
    def size(self) -> int:
        if self._vmfb is not None:
            return len(self._vmfb)
        assert self.path is not None, "an Artifact has its module's bytes or its file"
        return os.path.getsize(self.path)

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
        return (
            f"<rocmc.Artifact {self.metadata.get('graph')} target={self.target} "
            f"{self.size} bytes hash={self.metadata.get('graph_hash', '')[:12]}>"
        )

    # ---- files ----------------------------------------------------------------------------
    def save(self, path) -> Path:
        """Write the module to `path` atomically: a temporary file of a random name, created exclusively
        next to it (never following a planted link), renamed over it once complete. The constants
        compiled as parameters go to an .irpa of the same name beside it."""
        path = Path(path)
        if path.is_dir():
            raise ArtifactError(f"can't save the artifact to {str(path)!r}: it is a directory; give a file name")
        if not path.parent.is_dir():
            raise ArtifactError(
                f"can't save the artifact to {str(path)!r}: directory {str(path.parent)!r} does not exist"
            )
        try:
            write_atomic(path, self.vmfb, 0o644 & ~umask())  # mkstemp's 0600 would make a saved model private
        except OSError as e:
            raise ArtifactError(f"can't save the artifact to {str(path)!r}: {e.strerror or e}") from None
        if self.parameter_arrays:
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
    def from_bytes(
        cls, data: bytes, what: str = "artifact", *, verify: bool = True, path: str | None = None
    ) -> "Artifact":
        """An Artifact of .vmfb bytes from elsewhere, checked like a file (see `load`)."""
        check_header(data, what)  # junk gets the plainer message
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
                raise ArtifactError(
                    "this artifact was compiled with rewrite=False: it has no rewrite stage; "
                    "ir('graph') is the graph compiled"
                )
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
            raise ArtifactError(
                f"no dispatch named {name!r}; dispatches: {', '.join(x['name'] for x in self.dispatches())}"
            )
        for p in d.glob("*.mlir"):
            parts = p.name.split(".")
            if len(parts) >= 3 and parts[-2] == stage:
                return p.read_text()
        raise ArtifactError(f"stage {stage!r} was not produced")

    @property
    def can_produce_stages(self) -> bool:
        """Whether the lowering stages can be produced (an artifact made by rocmc.compile in this process;
        a loaded one has none)."""
        return self._stage_dir is not None

    def stage_dir(self) -> Path:
        if self._stage_dir is None:
            raise ArtifactError(
                "compiler stages are only available for artifacts made by rocmc.compile "
                f"(this one was loaded from {self.path or 'bytes'}); recompile the graph"
            )
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
        return dispatch_list(self.metadata, self.ir("flow"))

    def call_structure(self) -> dict[str, CallStructure]:
        """{function: what one call issues}: kernel launches, fills, copies, queue submissions, host waits
        and queue allocations/frees, counted in IREE's HAL program (rocmc.artifact.structure); needs the
        stages, like `ir("hal")`."""
        return call_structure(self.ir("hal"))

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
        return summary_text(self, stages=self._stage_dir is not None)
