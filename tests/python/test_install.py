"""The README's offline install (pip --no-index --no-build-isolation, here with
--target into a scratch directory) and where the package finds libkdajit.so:
next to itself, then KDAJIT_LIBRARY, then the system, in processes whose
environment has nothing else (no LD_LIBRARY_PATH, so no /usr/local/cuda on it)."""
import ctypes.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest

from kda_testing import SOURCE_DIR

BUILD_DIR = os.environ.get("KDAJIT_BUILD_DIR") or os.path.join(SOURCE_DIR, "build")
LIBRARY = os.environ.get("KDAJIT_TEST_LIBRARY") or os.path.join(BUILD_DIR, "runtime", "libkdajit.so")

PROBE = """
import kdajit, torch
path, origin = kdajit.library_path()
print(origin, path)
assert kdajit.supported(64, arch="sm_90"), "supported(64, sm_90)"
H = 2
args = dict(x=torch.zeros(3, 3 * H * 128, dtype=torch.bfloat16), weight=torch.zeros(3, 4, H * 128),
            conv_state=torch.zeros(4, 3, 3 * H * 128, dtype=torch.bfloat16).transpose(1, 2),
            raw_gate=torch.zeros(1, 3, H, 128, dtype=torch.bfloat16), raw_beta=torch.zeros(1, 3, H, dtype=torch.bfloat16),
            A_log=torch.zeros(H), dt_bias=torch.zeros(H * 128), state_indices=torch.zeros(3, dtype=torch.int32),
            state=torch.zeros(4, H, 128, 128), output_gate=torch.zeros(3, H, 128, dtype=torch.bfloat16),
            norm_weight=torch.ones(128))
assert len(kdajit.dry_run(kdajit.fused_kda_decode, **args)) > 0
info = kdajit.hotpath_info()
print("hotpath", info["enabled"], info["path"])
print("ok")
"""


def clean_env(**extra):
    """Only what a Python process needs: no LD_LIBRARY_PATH, KDAJIT_*, PYTHONPATH."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env["KDAJIT_CACHE_DIR"] = os.environ.get("KDAJIT_CACHE_DIR", tempfile.gettempdir())
    env.update(extra)
    return env


def probe(env, cwd):
    return subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=cwd, capture_output=True, text=True)


class Install(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(LIBRARY):
            raise unittest.SkipTest(f"{LIBRARY} is not built")
        cls.tmp = tempfile.TemporaryDirectory(prefix="kdajit-install-")
        # pip builds in the source directory: build from a copy, the tree stays clean.
        cls.src = os.path.join(cls.tmp.name, "src")
        shutil.copytree(os.path.join(SOURCE_DIR, "python"), cls.src,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        cls.site = os.path.join(cls.tmp.name, "site")
        cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps",
               "--disable-pip-version-check", "--target", cls.site, cls.src]
        cls.pip = subprocess.run(cmd, env=dict(os.environ, KDAJIT_BUILD_DIR=BUILD_DIR, PIP_NO_INPUT="1"),
                                 capture_output=True, text=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_pip_install_puts_the_library_in_the_package(self):
        self.assertEqual(self.pip.returncode, 0, self.pip.stdout + self.pip.stderr)
        copy = os.path.join(self.site, "kdajit", "libkdajit.so.0")
        self.assertTrue(os.path.isfile(copy))
        with open(copy, "rb") as a, open(os.path.realpath(LIBRARY), "rb") as b:
            self.assertEqual(a.read(), b.read(), "the installed copy is not the built library")
        self.assertFalse(os.path.exists(os.path.join(SOURCE_DIR, "python", "kdajit", "libkdajit.so.0")),
                         "setup.py must not copy the library into the source tree")

    def test_installed_package_finds_its_own_copy(self):
        self.assertEqual(self.pip.returncode, 0, self.pip.stderr)
        r = probe(clean_env(PYTHONPATH=self.site), self.tmp.name)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        origin, path = r.stdout.split()[:2]
        self.assertEqual((origin, path), ("package", os.path.join(self.site, "kdajit", "libkdajit.so.0")))
        # The copy comes before KDAJIT_LIBRARY, even a wrong one.
        r = probe(clean_env(PYTHONPATH=self.site, KDAJIT_LIBRARY="/nonexistent/libkdajit.so"), self.tmp.name)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith("package "), r.stdout)

    def test_installed_package_uses_its_hotpath(self):
        built = os.path.join(os.path.dirname(os.path.realpath(LIBRARY)),
                             "_hotpath" + sysconfig.get_config_var("EXT_SUFFIX"))
        if not os.path.exists(built):
            self.skipTest(f"kdajit._hotpath not built for this interpreter ({built})")
        self.assertEqual(self.pip.returncode, 0, self.pip.stderr)
        copy = os.path.join(self.site, "kdajit", os.path.basename(built))
        self.assertTrue(os.path.isfile(copy), "setup.py copies kdajit._hotpath with the library")
        r = probe(clean_env(PYTHONPATH=self.site), self.tmp.name)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"hotpath True {copy}\n", r.stdout)
        # From the source tree, the one next to KDAJIT_LIBRARY.
        r = probe(clean_env(PYTHONPATH=os.path.join(SOURCE_DIR, "python"), KDAJIT_LIBRARY=LIBRARY), self.tmp.name)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"hotpath True {built}\n", r.stdout)

    def test_source_tree_uses_KDAJIT_LIBRARY(self):
        r = probe(clean_env(PYTHONPATH=os.path.join(SOURCE_DIR, "python"), KDAJIT_LIBRARY=LIBRARY), self.tmp.name)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.split()[:2], ["KDAJIT_LIBRARY", LIBRARY])

    def test_source_tree_falls_back_to_the_system(self):
        r = probe(clean_env(PYTHONPATH=os.path.join(SOURCE_DIR, "python"),
                            LD_LIBRARY_PATH=os.path.dirname(LIBRARY)), self.tmp.name)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.split()[0], "system")

    def test_missing_library_is_a_clear_error(self):
        r = probe(clean_env(PYTHONPATH=os.path.join(SOURCE_DIR, "python"), KDAJIT_LIBRARY="/nonexistent/lib.so"),
                  self.tmp.name)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("LibraryNotFound", r.stderr)
        self.assertIn("KDAJIT_LIBRARY: /nonexistent/lib.so", r.stderr)
        if ctypes.util.find_library("kdajit") is None:
            r = probe(clean_env(PYTHONPATH=os.path.join(SOURCE_DIR, "python")), self.tmp.name)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("set KDAJIT_LIBRARY", r.stderr)

    def test_setup_without_a_built_library_fails_clearly(self):
        cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps",
               "--disable-pip-version-check", "--target", os.path.join(self.tmp.name, "nolib"), self.src]
        r = subprocess.run(cmd, env=dict(os.environ, KDAJIT_BUILD_DIR=os.path.join(self.tmp.name, "nobuild")),
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("libkdajit.so not found", r.stdout + r.stderr)

    def test_setup_rejects_a_relative_build_dir(self):
        # pip runs setup.py in the package's directory: "build" would mean python/build there.
        cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps",
               "--disable-pip-version-check", "--target", os.path.join(self.tmp.name, "relative"), self.src]
        r = subprocess.run(cmd, env=dict(os.environ, KDAJIT_BUILD_DIR="build"), capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("KDAJIT_BUILD_DIR: expected an absolute path", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
