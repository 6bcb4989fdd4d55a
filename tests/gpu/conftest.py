"""The `gpu` fixture: compiles a case (--gpu-compile DIR), runs it on the cuda device
(--gpu-artifacts DIR), or skips it with the reason when neither was asked for or no GPU is there."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_harness import Compiler, Runner

_NOT_ASKED = (
    "GPU numerics tests: compile with `pytest tests/gpu --gpu-compile DIR` (needs iree-compile), "
    "run with `pytest tests/gpu -m gpu --gpu-artifacts DIR` on a machine with an NVIDIA GPU"
)


@pytest.fixture(scope="session")
def gpu_step(request):
    """The session's Compiler or Runner (one per session: the manifest is read or written once)."""
    cfg = request.config
    out, artifacts = cfg.getoption("--gpu-compile"), cfg.getoption("--gpu-artifacts")
    if out and artifacts:
        raise pytest.UsageError("--gpu-compile and --gpu-artifacts are two steps on two machines: pass one")
    if out:
        step = Compiler(Path(out))
        yield step
        step.write()
        return
    if not artifacts:
        pytest.skip(_NOT_ASKED)
    try:
        runner = Runner(Path(artifacts))
    except FileNotFoundError as e:
        pytest.skip(str(e))
    try:
        _torch_cudnn_first()
        import rocmc

        rocmc.runtime.get_device("cuda")
    except Exception as e:  # noqa: BLE001 - no driver, no device: a CPU machine
        pytest.skip(f"no cuda device to run the GPU tests on: {e}")
    yield runner


def _torch_cudnn_first() -> None:
    """Where torch is installed, let it load its bundled cuDNN before the cuDNN provider looks for one:
    the provider then binds that already loaded library instead of another copy."""
    try:
        import torch

        torch.backends.cudnn.is_available()
    except Exception:  # noqa: BLE001 - no torch: the provider finds cuDNN itself
        pass


@pytest.fixture
def gpu(gpu_step, rng):
    """check(case): compile it (compile step) or run it against its float64 reference (run step)."""
    if isinstance(gpu_step, Compiler):
        return gpu_step
    return lambda case: gpu_step(case, rng)
