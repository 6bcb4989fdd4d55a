"""Op registration is explicit: one list of op families (rocmc.frontend.ops.FAMILIES) gives both the op
registry and the rocmc.ops namespace, every op has a builder and a generated lowering (or is listed as
having none), and the generated lowerings register the same way whatever order their modules are
imported in."""

import json
import subprocess
import sys
from pathlib import Path

import rocmc
from rocmc import ops
from rocmc.frontend import ops as families
from rocmc.frontend.registry import OPS
from rocmc.lowering import codegen as generated
from rocmc.lowering.registry import GENERATED, REGISTRY

ROOT = Path(rocmc.__file__).parent


def _modules(package: Path) -> set:
    return {p.stem for p in package.glob("*.py") if p.stem != "__init__"}


def test_families_list_every_op_module():
    assert len(set(families.FAMILIES)) == len(families.FAMILIES)
    assert set(families.FAMILIES) == _modules(ROOT / "frontend" / "ops")
    assert set(generated.MODULES) == _modules(ROOT / "lowering" / "codegen") - {"padding"}


def test_rocmc_ops_is_the_families_builders():
    names = [n for f in families.family_modules() for n in f.__all__]
    assert len(names) == len(set(names)), "two families export the same builder"
    assert sorted(names) == ops.__all__
    for f in families.family_modules():
        for n in f.__all__:
            assert getattr(ops, n) is getattr(f, n), n


def test_every_op_has_a_builder():
    missing = sorted(op for op in OPS if op not in families.INTERNAL and not callable(getattr(ops, op, None)))
    assert not missing, f"ops without a builder in rocmc.ops (nor listed in INTERNAL): {missing}"
    assert families.INTERNAL <= set(OPS)


def test_every_op_has_a_generated_lowering():
    missing = sorted(op for op in OPS if op not in generated.NOT_GENERATED and GENERATED not in REGISTRY.get(op, {}))
    assert not missing, f"ops without a generated lowering (nor listed in NOT_GENERATED): {missing}"
    assert not set(REGISTRY) - set(OPS), "lowerings of ops the frontend does not define"
    for op in generated.NOT_GENERATED:
        assert op in OPS and GENERATED not in REGISTRY[op]
    assert set(REGISTRY["all_reduce"]) == set(REGISTRY["all_gather"]) == {"iree", "host"}


# Run in a fresh interpreter: each order imports the modules anew (sys.modules purged) into an empty
# registry, and prints what each order registered.
_ORDERS = r"""
import importlib, json, random, sys
import rocmc
from rocmc.frontend import opdef, ops as families, registry as op_registry
from rocmc.lowering import codegen as generated, registry

def name(fn):
    return None if fn is None else f"{fn.__module__}:{fn.__qualname__}"

def lowerings():
    return {op: {impl: [name(i.fn), list(i.kinds), list(i.default_on), i.priority, name(i.supports), i.library,
                        name(i.rule), i.fallback] for impl, i in impls.items()}
            for op, impls in registry.REGISTRY.items()}

def definitions():
    return {op: [list(d.attrs), name(d.reference), d.doc] for op, d in op_registry.OPS.items()}

def orders(names):
    rng = random.Random(0)
    out = [list(names), list(reversed(names))] + [rng.sample(names, len(names)) for _ in range(4)]
    return out + [[n] + [m for m in names if m != n] for n in names]

def run(package, names, registry_of, snapshot):
    results = []
    for order in orders(names):
        for n in names:
            sys.modules.pop(f"{package}.{n}", None)
        registry_of().clear()
        for n in order:
            importlib.import_module(f"{package}.{n}")
        results.append([order, snapshot()])
    return results

gen_prefix = generated.__name__ + "."
real = {op: {impl: v for impl, v in impls.items() if v[0].startswith(gen_prefix)}
        for op, impls in lowerings().items()}
real = {op: impls for op, impls in real.items() if impls}
real_ops = definitions()
print(json.dumps({
    "generated": real,
    "generated_orders": run(generated.__name__, generated.MODULES, lambda: registry.REGISTRY, lowerings),
    "ops": real_ops,
    "ops_orders": run(families.__name__, families.FAMILIES, lambda: op_registry.OPS, definitions),
}))
"""


def test_registration_does_not_depend_on_import_order():
    res = subprocess.run([sys.executable, "-c", _ORDERS], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["generated"] and out["ops"]
    for order, got in out["generated_orders"]:
        assert got == out["generated"], f"generated lowerings imported in the order {order}"
    for order, got in out["ops_orders"]:
        assert got == out["ops"], f"op families imported in the order {order}"
