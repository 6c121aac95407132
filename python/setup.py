"""The kdajit Python package, with the libkdajit.so of a CMake build inside it.

    KDAJIT_BUILD_DIR="$PWD/build" python3 -m pip install --no-index --no-build-isolation ./python

KDAJIT_BUILD_DIR is the absolute path of a CMake build directory (its runtime/libkdajit.so) or a
`cmake --install` prefix (its lib/libkdajit.so); default: ../build next to this
file. The library is copied into the built package only, never into the source
tree, and with it kdajit._hotpath (the C++ cache-hit path) when the build made one
for this interpreter. Python otherwise (ctypes over the C ABI); torch is not declared as a
dependency so that the offline install never tries to fetch it.
"""
import os
import re
import shutil
import sysconfig

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SONAME = "libkdajit.so.0"


def _version():
    with open(os.path.join(HERE, "kdajit", "_abi.py")) as f:
        return re.search(r'^ABI_VERSION = "([^"]+)"', f.read(), re.M).group(1)


def _library():
    root = os.environ.get("KDAJIT_BUILD_DIR") or os.path.join(HERE, os.pardir, "build")
    if not os.path.isabs(root):
        # pip runs this file in its own directory, not the caller's: a relative
        # path would silently name another place.
        raise SystemExit(f"kdajit setup: KDAJIT_BUILD_DIR: expected an absolute path (e.g. \"$PWD/build\"), "
                         f"got {root!r}")
    tried = [os.path.join(root, *p, "libkdajit.so") for p in (("runtime",), ("lib",), ("lib64",), ())]
    for path in tried:
        if os.path.exists(path):
            return os.path.realpath(path)
    raise SystemExit("kdajit setup: libkdajit.so not found (tried " + ", ".join(tried) + "); build it first "
                     "(bash .ci/setup.sh, or cmake --build build --target kdajit) or set KDAJIT_BUILD_DIR to a "
                     "CMake build directory or install prefix")


def _hotpath(lib):
    """kdajit._hotpath for this interpreter, built next to the library, or None."""
    path = os.path.join(os.path.dirname(lib), "_hotpath" + sysconfig.get_config_var("EXT_SUFFIX"))
    return path if os.path.exists(path) else None


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        lib = _library()
        dst = os.path.join(self.build_lib, "kdajit", SONAME)
        self.announce(f"copying {lib} -> {dst}", level=2)
        shutil.copyfile(lib, dst)
        os.chmod(dst, 0o755)
        hot = _hotpath(lib)
        if hot:
            dst = os.path.join(self.build_lib, "kdajit", os.path.basename(hot))
            self.announce(f"copying {hot} -> {dst}", level=2)
            shutil.copyfile(hot, dst)
            os.chmod(dst, 0o755)
        else:
            self.announce("kdajit._hotpath not built for this interpreter: the package uses its pure-Python "
                          "call path", level=2)


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
