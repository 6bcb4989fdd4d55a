"""The HIP kernel sources live in custom_kernels/ at the repository root; wheels ship them as rocmc/kernels/.

Editable installs skip the copy: rocmc.lowering.kernels reads the source tree's custom_kernels/ directly.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

KERNEL_SOURCES = Path(__file__).resolve().parent / "custom_kernels"


class BuildPyWithKernels(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "rocmc" / "kernels"
        dest.mkdir(parents=True, exist_ok=True)
        for src in sorted(KERNEL_SOURCES.iterdir()):
            if src.suffix in (".hip", ".h"):
                self.copy_file(str(src), str(dest / src.name))


setup(cmdclass={"build_py": BuildPyWithKernels})
