import atexit
import os
import secrets
import shutil
import tempfile
import zlib

import numpy as np
import pytest

# Every test run gets its own compile cache, so tests never see artifacts of another run. Its xdist workers share it
# (they inherit the variable from the controller, which imports this file first): a kernel or module one worker
# builds serves the others, entries being written atomically and verified when read. The process that made it
# removes it when it ends (a cache dir the caller chose is left alone).
if "ROCMC_CACHE_DIR" not in os.environ:
    os.environ["ROCMC_CACHE_DIR"] = tempfile.mkdtemp(prefix="rocmc-test-cache-")
    atexit.register(shutil.rmtree, os.environ["ROCMC_CACHE_DIR"], ignore_errors=True)


# ---- random inputs: fresh on every run, reproducible from one printed seed --------------------------


def pytest_addoption(parser):
    parser.addoption(
        "--seed",
        type=int,
        default=None,
        help="seed of the run's random inputs (printed in the report header; replays a run)",
    )
    # tests/gpu: compile here, run on a GPU machine (tests/gpu/gpu_harness.py)
    parser.addoption(
        "--gpu-compile",
        metavar="DIR",
        default=None,
        help="compile the GPU tests' modules for cuda:sm_80 into DIR (with a manifest.json)",
    )
    parser.addoption(
        "--gpu-artifacts",
        metavar="DIR",
        default=None,
        help="run the GPU tests on the cuda device from the modules compiled into DIR",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "gpu: numerics on an NVIDIA GPU from modules compiled ahead "
        "(--gpu-compile / --gpu-artifacts); skipped without them",
    )
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker: the controller chose the seed
        config.rocmc_seed = int(workerinput["rocmc_seed"])
    else:
        seed = config.getoption("--seed")
        if seed is None and os.environ.get("ROCMC_TEST_SEED"):
            seed = int(os.environ["ROCMC_TEST_SEED"])
        config.rocmc_seed = seed if seed is not None else secrets.randbits(32)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):  # xdist: every worker draws from the same run seed
    node.workerinput["rocmc_seed"] = node.config.rocmc_seed


def pytest_report_header(config):
    return f"rocmc random inputs: seed {config.rocmc_seed} (replay with --seed {config.rocmc_seed})"


def pytest_runtest_makereport(item, call):
    if call.when == "call" and call.excinfo is not None:
        item.add_report_section("call", "seed", f"replay with: pytest '{item.nodeid}' --seed {item.config.rocmc_seed}")


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator of fresh random inputs for one test: seeded by the run's seed and the test's id, so a
    failing test replays alone or in the whole suite, on any number of workers."""
    return np.random.default_rng([request.config.rocmc_seed, zlib.crc32(request.node.nodeid.encode())])
