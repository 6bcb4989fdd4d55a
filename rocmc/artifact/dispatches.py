"""The dispatch map: which graph nodes each dispatch of a compiled module computes.

Every op the lowering emits carries the location `rocmc.<value id>:<op>`, which IREE keeps through
fusion; the flow phase's executables name their compute ops' locations (through `#loc` aliases),
and the metadata adds the hand-written kernels and the extern calls, which are not dispatches IREE made.
"""

from __future__ import annotations

import re

from .schema import functions


def dispatch_list(meta: dict, flow_text: str) -> list[dict]:
    """Each dispatch of the compiled module: name, the graph nodes fused into it, implementation."""
    impl_of = {c["node"]: c for f in functions(meta) for c in f["implementations"]}
    out = []
    for name, nodes in dispatch_nodes(flow_text):
        impls = sorted({impl_of[n]["impl"] for n in nodes if n in impl_of})
        out.append(
            {
                "name": name,
                "nodes": nodes,
                "ops": sorted({impl_of[n]["op"] for n in nodes if n in impl_of}),
                "impl": "+".join(impls) or "generated",
                "kind": "generated",
            }
        )
    for k in meta.get("kernels", []):
        out.append(
            {
                "name": k["symbol"],
                "nodes": [k["node"]],
                "ops": [k["op"]],
                "impl": "kernel",
                "kind": "hand-written",
                "arch": k["arch"],
            }
        )
    for x in meta.get("externs", []):
        out.append(
            {"name": x["import"], "nodes": [x["node"]], "ops": [x["op"]], "impl": x["impl"], "kind": "extern call"}
        )
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
        end = flow_text.find("\n  }", m.end())  # the executable's closing brace (2-space indent)
        block = flow_text[m.start() : end if end >= 0 else len(flow_text)]
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
