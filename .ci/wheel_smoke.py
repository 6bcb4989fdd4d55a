"""Smoke test of an installed rocmc wheel, run from outside the source tree (`make wheel-test`).

It catches packaging mistakes the test suite can't see, since the suite imports the checkout: a module or a
kernel source missing from the wheel. Random inputs come from a printed seed (ROCMC_TEST_SEED replays it).
"""

import os
import secrets
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

# A fresh cache: every module and kernel object below is built from the installed files.
os.environ["ROCMC_CACHE_DIR"] = tempfile.mkdtemp(prefix="rocmc-wheel-smoke-")
os.environ.pop("ROCMC_KERNEL_DIR", None)

import rocmc  # noqa: E402
from rocmc import ops  # noqa: E402
from rocmc.lowering import kernels  # noqa: E402

SITE = Path(sysconfig.get_paths()["purelib"]).resolve()


def nonzero(rng, shape):
    return (rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


def check_installed():
    for what, path in (("rocmc", rocmc.__file__), ("kernel sources", kernels.KERNEL_DIR)):
        assert Path(path).resolve().is_relative_to(SITE), f"{what} at {path}, not under {SITE}"
    missing = set(kernels.SOURCES) - {p.name for p in kernels.KERNEL_DIR.glob("*")}
    assert not missing, f"kernel sources {sorted(missing)} missing from {kernels.KERNEL_DIR}"
    print(f"ok: rocmc {rocmc.__version__} from {Path(rocmc.__file__).parent}, kernels from {kernels.KERNEL_DIR}")


# Optional dependencies (extras) a module may need; the wheel is installed without them.
OPTIONAL = {"torch", "onnx", "tokenizers", "jinja2", "safetensors", "transformers", "starlette", "uvicorn"}


def check_every_module_imports():
    """Every module of the installed package imports (a subpackage missing from the wheel fails here),
    except those that need an extra that is not installed."""
    import importlib
    import pkgutil

    count, skipped = 0, []
    for info in pkgutil.walk_packages(rocmc.__path__, "rocmc."):
        try:
            importlib.import_module(info.name)
            count += 1
        except ImportError as e:
            if (e.name or "").split(".")[0] not in OPTIONAL:
                raise
            skipped.append(f"{info.name} ({e.name})")
    print(f"ok: {count} modules import" + (f"; needing an extra: {', '.join(skipped)}" if skipped else ""))


def check_cpu_run(rng):
    g = rocmc.Graph("smoke")
    x = g.input("x", (2, "n", 16), "f32")
    w = g.constant("w", nonzero(rng, (16, 8)))
    g.output(ops.silu(ops.matmul(ops.rms_norm(x, eps=1e-5), w)))
    xv = nonzero(rng, (2, 5, 16))
    got, want = rocmc.load(rocmc.compile(g, "cpu"))(xv), rocmc.evaluate(g, xv)
    assert got.shape == want.shape == (2, 5, 8), (got.shape, want.shape)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-4, atol=1e-5)
    print(f"ok: cpu run matches rocmc.evaluate (max error {np.abs(got - want).max():.2e})")


def check_gfx942_kernel():
    g = rocmc.Graph("smoke_gpu")
    x = g.input("x", (4, 64), "f32")
    g.output(ops.rms_norm(x, g.constant("w", np.linspace(0.5, 1.5, 64, dtype=np.float32))))
    art = rocmc.compile(g, "gfx942")
    assert [k["op"] for k in art.metadata["kernels"]] == ["rms_norm"], art.metadata["kernels"]
    assert kernels.build("rms_norm.hip", "gfx942").data in art.vmfb, "the code object is not embedded"
    summary = art.summary()
    assert "hand-written" in summary, summary
    print(f"ok: gfx942 module embeds {art.metadata['kernels'][0]['symbol']} (hand-written)")


def check_collective_bootstrap():
    """The tensor-parallel bootstrap's C source ships in the wheel and builds."""
    from rocmc.runtime import native

    assert native.SOURCE.resolve().is_relative_to(SITE), native.SOURCE
    lib = native.build(Path(tempfile.mkdtemp(prefix="rocmc-wheel-native-")))
    print(f"ok: collective bootstrap built from the installed source ({lib.stat().st_size} bytes)")


def main():
    seed = int(os.environ.get("ROCMC_TEST_SEED") or secrets.randbits(32))
    print(f"wheel smoke test: python {sys.version.split()[0]}, seed {seed} (replay with ROCMC_TEST_SEED={seed})")
    check_installed()
    check_every_module_imports()
    check_cpu_run(np.random.default_rng(seed))
    check_gfx942_kernel()
    check_collective_bootstrap()


if __name__ == "__main__":
    main()
