"""Which core ATen ops rocmc's torch frontend (rocmc.import_torch) converts, and which ATen ops the model
families of tests/export_models.py use after torch.export's decomposition to the core opset.

    python -m bench.torch_ops [--out docs/torch-ops.md] [--no-zoo]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import defaultdict
from pathlib import Path


HEADER = """# ATen ops of the torch frontend

`rocmc.import_torch` exports a module with `torch.export`, decomposes it to the core ATen opset (keeping
`aten.scaled_dot_product_attention`, which becomes `ops.sdpa`) and converts each node with one converter per
ATen op (`rocmc/frontend/torch/`: `elementwise.py`, `views.py`, `nn.py`). Below: the ops with a converter, the
core ATen ops without one, and the ATen ops each family of `tests/export_models.py` uses.
torch {torch}. Regenerate with `python -m bench.torch_ops --out docs/torch-ops.md`.
"""


def core_aten_ops() -> list[str]:
    """Every ATen overload torch tags as core (the opset run_decompositions() lowers to)."""
    import torch

    out = []
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags:
                out.append(str(op))
    return sorted(set(out))


def zoo_ops() -> dict:
    """family -> the ATen ops (and Python size arithmetic) of its decomposed export."""
    import numpy as np
    import torch
    from rocmc.frontend.torch import decompositions, op_name
    from tests import export_models as zoo

    out = {}
    for family, f in zoo.FAMILIES.items():
        model = zoo.build(family)
        args = tuple(torch.from_numpy(a) for a in f.inputs(np.random.default_rng(0), 2, 8))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(model, args, strict=False).run_decompositions(decompositions())
        out[family] = sorted({op_name(n.target) for n in ep.graph.nodes if n.op == "call_function"})
    return out


def table(zoo: dict | None) -> str:
    import torch
    from rocmc.frontend.torch import CONVERTERS

    by_module = defaultdict(list)
    for name, fn in CONVERTERS.items():
        by_module[fn.__module__.rsplit(".", 1)[-1]].append(name)
    core = core_aten_ops()
    supported_core = [op for op in core if op in CONVERTERS]
    lines = [
        HEADER.format(torch=torch.__version__),
        f"{len(CONVERTERS)} ops have a converter, {len(supported_core)} of the {len(core)} core ATen ops among them.\n",
    ]
    for module in sorted(by_module):
        names = sorted(by_module[module])
        lines.append(f"## Converted: `{module}.py` ({len(names)})\n")
        lines.append(", ".join(f"`{n}`" for n in names) + "\n")
    if zoo is not None:
        lines.append("## The model zoo\n")
        lines.append("| family | ATen ops | without a converter |")
        lines.append("|---|---|---|")
        for family, ops in zoo.items():
            missing = [op for op in ops if op not in CONVERTERS]
            lines.append(f"| {family} | {len(ops)} | {', '.join(f'`{m}`' for m in missing) or 'none'} |")
        lines.append("")
    missing_core = [op for op in core if op not in CONVERTERS]
    lines.append(f"## Core ATen ops without a converter ({len(missing_core)})\n")
    lines.append("An import that meets one reports it (with every other such node) in one `ModelImportError`.\n")
    lines.append(", ".join(f"`{n}`" for n in missing_core) + "\n")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the table here (default: print it)")
    ap.add_argument("--no-zoo", action="store_true", help="skip exporting the model zoo")
    args = ap.parse_args(argv)
    text = table(None if args.no_zoo else zoo_ops())
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
