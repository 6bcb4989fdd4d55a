"""What a .vmfb holds: functions and signatures, target, executables, embedded kernels, imports.

Reads rocmc's metadata from the module's reflection and the module's structure from IREE's
iree-dump-module (shipped with the runtime), so it needs no compiler. The artifact was checked when
it was loaded (`Artifact.load`); what the tool is handed is those checked bytes, not the file again.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile

from . import children
from .artifact import Artifact, functions, rewrite_lines
from .dtypes import ALL as DTYPES
from .errors import ArtifactError

DUMP_TIMEOUT_S = 120


def _dump_module(vmfb: bytes, what: str) -> str:
    import iree._runtime_libs as libs

    tool = os.path.join(os.path.dirname(libs.__file__), "iree-dump-module")
    with tempfile.NamedTemporaryFile(suffix=".vmfb") as f:
        f.write(vmfb)
        f.flush()
        try:
            proc = children.run(
                [tool, f.name], capture_output=True, text=True, errors="replace", timeout=DUMP_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise ArtifactError(f"{what}: iree-dump-module did not finish in {DUMP_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise ArtifactError(f"{what}: iree-dump-module can't read the module ({reason})")
    return proc.stdout


def describe(art: Artifact) -> dict:
    """A dict of everything `rocmc inspect` prints."""
    dump = _dump_module(art.vmfb, art.path or "artifact")
    section = lambda title: re.search(rf"{title}:\n((?:  .*\n)+)", dump)
    imports = []
    m = section("Imported Functions")
    if m:
        for line in m.group(1).splitlines():
            name = line.split("]", 1)[1].strip() if "]" in line else line.strip()
            if not name.startswith("hal."):
                imports.append(name)
    exports = []
    m = section("Exported Functions")
    if m:
        exports = [f.group(1) for f in re.finditer(r"^\s*\[\s*\d+\]\s+(\S+\(.*\) -> .*)$", m.group(1), re.M)]
    formats = sorted(set(re.findall(r"`((?:rocm-hsaco|cuda-nvptx|embedded-elf|system-elf|vmvx)[\w-]*)`", dump)))
    # The dump shortens long strings to 32 characters and marks them with "...".
    executables = sorted(
        {n + ("..." if cut else "") for n, cut in re.findall(r"`(\w+_dispatch_\d+[\w$.-]*)`(\.\.\.)?", dump)},
        key=lambda n: int(re.search(r"_dispatch_(\d+)", n).group(1)),
    )
    meta = art.metadata
    return {
        "graph": meta.get("graph"),
        "graph_hash": meta.get("graph_hash"),
        "target": meta.get("target"),
        "rocmc": meta.get("rocmc"),
        "iree": meta.get("iree"),
        "size": art.size,
        "signature": meta.get("signature"),
        "functions": exports,
        "executable_formats": formats,
        "executables": executables,
        "kernels": meta.get("kernels", []),
        "imports": imports,
        "implementations": meta.get("implementations", []),
        "signatures": {f["name"]: f["signature"] for f in functions(meta)},
        "parameters": art.parameters,
        "parameter_source": art.parameter_source(),
        "states": meta.get("states", []),
        "rewrites": meta.get("rewrites"),
        "rewrite_summary": rewrite_lines(meta),
    }


def format_description(d: dict) -> str:
    fmt = lambda x: f"{x['name']}: {x['dtype']}[{','.join(map(str, x['shape']))}]"
    lines = [
        f"graph      {d['graph']}  (hash {str(d['graph_hash'])[:16]})",
        f"target     {d['target']}",
        f"versions   rocmc {d['rocmc']}, IREE {d['iree']}",
        f"size       {d['size']} bytes",
        *[
            f"signature  {name}({', '.join(fmt(x) for x in sig['inputs'])}) -> "
            f"({', '.join(fmt(x) for x in sig['outputs'])})"
            for name, sig in d["signatures"].items()
        ],
        "functions",
        *[f"  {f}" for f in d["functions"]],
        f"executables ({', '.join(d['executable_formats']) or 'none'})",
        *[f"  {e}" for e in d["executables"]],
    ]
    if d["parameters"]:
        total = sum(math.prod(p["shape"]) * DTYPES[p["dtype"]].np.itemsize for p in d["parameters"])
        lines.append(f"parameters  {len(d['parameters'])}, {total} bytes, from {d['parameter_source']}")
        lines += [f"  {fmt(p)}  ({p['from']})" for p in d["parameters"]]
    lines += [f"state       {fmt(st)}" for st in d["states"]]
    lines.append("embedded kernels" + ("" if d["kernels"] else "  none"))
    lines += [f"  {k['symbol']}  [{k['arch']}]  for {k['node']} ({k['op']})" for k in d["kernels"]]
    lines.append("imports (external calls)" + ("" if d["imports"] else "  none"))
    lines += [f"  {i}" for i in d["imports"]]
    lines += d["rewrite_summary"]
    lines.append("implementations")
    for c in d["implementations"]:
        why = f"  (skipped: {'; '.join(c['skipped'])})" if c.get("skipped") else ""
        lines.append(f"  {c['node']:<6} {c['op']:<16} {c['impl']}{why}")
    return "\n".join(lines)
