"""rocmc's benchmarks: one module per benchmark, run as modules from the repository root.

    python -m bench.run_cpu --out out/bench
    python -m bench.llm_gpu compile --dir out/llm_gpu

Running them with `-m` from the root puts the root on sys.path, so the scripts import each other as
`bench.X` (`from bench.common import timings`, `from bench import models`) and import rocmc from the
source tree, with no sys.path edits. A script that starts itself again in a child process (a worker, a
fresh compile) does it as `python -m bench.X` in the same working directory.

Code shared with the tests lives in one place and is imported by name, never by file path:

- The model zoo of real exports, `tests/export_models.py`, stays with the tests, which import it as
  `export_models` (pytest's default `prepend` import mode puts tests/, a folder without an
  `__init__.py`, on sys.path). The benchmarks import the same file as `tests.export_models`: with the
  root on sys.path, tests/ is a namespace package. The module needs only numpy (torch and transformers
  are imported inside its functions) and never imports bench, so the dependency runs one way. tests/
  must keep having no `__init__.py`: with one, pytest would import the tests as `tests.test_X` and
  their `from helpers import ...` would stop resolving.
- `bench/onnx_conformance.py` (ONNX's backend node tests) is imported by tests/onnx/test_onnx.py as
  `bench.onnx_conformance`; pyproject.toml's `[tool.pytest.ini_options] pythonpath = ["."]` puts the
  root on sys.path under pytest.
- `examples/` (no `__init__.py`) is imported the same way, `from examples import llama_block`, by
  bench/models.py, whose graphs follow the examples' code.
"""
