"""The kdajit Python package, with the libkdajit.so of a CMake build inside it.

    KDAJIT_BUILD_DIR=build python3 -m pip install --no-index --no-build-isolation ./python

KDAJIT_BUILD_DIR is a CMake build directory (its runtime/libkdajit.so) or a
`cmake --install` prefix (its lib/libkdajit.so); default: ../build next to this
file. The library is copied into the built package only, never into the source
tree. Pure Python otherwise (ctypes over the C ABI); torch is not declared as a
dependency so that the offline install never tries to fetch it.
"""
import os
import re
import shutil

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SONAME = "libkdajit.so.0"


def _version():
    with open(os.path.join(HERE, "kdajit", "_abi.py")) as f:
        return re.search(r'^ABI_VERSION = "([^"]+)"', f.read(), re.M).group(1)


def _library():
    root = os.environ.get("KDAJIT_BUILD_DIR") or os.path.join(HERE, os.pardir, "build")
    tried = [os.path.join(root, *p, "libkdajit.so") for p in (("runtime",), ("lib",), ("lib64",), ())]
    for path in tried:
        if os.path.exists(path):
            return os.path.realpath(path)
    raise SystemExit("kdajit setup: libkdajit.so not found (tried " + ", ".join(tried) + "); build it first "
                     "(bash .ci/setup.sh, or cmake --build build --target kdajit) or set KDAJIT_BUILD_DIR to a "
                     "CMake build directory or install prefix")


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        lib = _library()
        dst = os.path.join(self.build_lib, "kdajit", SONAME)
        self.announce(f"copying {lib} -> {dst}", level=2)
        shutil.copyfile(lib, dst)
        os.chmod(dst, 0o755)


class BinaryDistribution(Distribution):
    """The wheel carries a shared library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(
    name="kdajit",
    version=_version(),
    description="JIT-compiled fused KDA decode kernels for PyTorch serving engines (FlashInfer-compatible ops)",
    packages=["kdajit"],
    python_requires=">=3.9",
    cmdclass={"build_py": BuildPyWithLibrary},
    distclass=BinaryDistribution,
    zip_safe=False,
)
