"""kdajit.supported / key_for / keys_for / prewarm and the runtime options, on a
machine without a GPU: the support query, the kernel key names (cross-checked
with the CLI), and NVRTC pre-warming into a temporary cache directory."""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import torch

import kdajit
from kdajit import _abi
KEY = re.compile(r"^kda_(single|packed)\.h(\d+)\.state_(f32|bf16)\.conv_(sd|ds)\.t(\d+)\.gate_(bounded|softplus)"
                 r"\.route_([a-z0-9_]+)\.(sm_\w+)$")


class Supported(unittest.TestCase):
    def test_supported_configurations(self):
        for heads in (1, 7, 64, 128):
            for dtype in ("f32", "bf16", torch.float32, torch.bfloat16):
                for conv in ("sd", "ds"):
                    for gate in ("bounded", "softplus"):
                        s = kdajit.supported(heads, state_dtype=dtype, conv_layout=conv, gate=gate, arch="sm_90")
                        self.assertTrue(s, f"H={heads} {dtype} {conv} {gate}: {s.reason}")
                        self.assertEqual(s.reason, "")
                        for tokens in (1, 4, 16):
                            s = kdajit.supported(heads, op="packed", tokens=tokens, state_dtype=dtype,
                                                 conv_layout=conv, gate=gate, arch="sm_90a")
                            self.assertTrue(s, f"packed H={heads} T={tokens}: {s.reason}")

    def test_unsupported_configurations_say_why(self):
        # The reason is the validation message of a synthetic call of this configuration.
        for kwargs, phrase in ((dict(heads=129), "H (heads) in 1..128 (the heads this build serves)"),
                               (dict(heads=300), "got [300]"),
                               (dict(heads=8, op="packed", tokens=17), "T (tokens) in 1..16 (the tokens this build"),
                               (dict(heads=8, arch="sm_80"), "arch: expected one of")):
            kwargs.setdefault("arch", "sm_90")
            s = kdajit.supported(**kwargs)
            self.assertFalse(s, kwargs)
            self.assertIn(phrase, s.reason, kwargs)
            self.assertIn("expected", s.reason)

    def test_malformed_configurations_raise(self):
        for kwargs, phrase in ((dict(heads=0), "H (heads) in 1..128, got [0]"), (dict(heads="64"), "heads: expected"),
                               (dict(heads=8, conv_layout="sdx"), "conv_layout: expected"),
                               (dict(heads=8, op="triple"), "op: expected"),
                               (dict(heads=8, state_dtype="f16"), "state_dtype: expected"),
                               (dict(heads=8, state_dtype=torch.float16), "state_dtype: expected"),
                               (dict(heads=8, gate="linear"), "gate: expected"),
                               (dict(heads=8, tokens=2), "tokens: expected T = 1 for the single op"),
                               (dict(heads=8, op="packed"), "tokens: expected T"),
                               (dict(heads=8, op="packed", tokens=0), "T (tokens) in 1..16, got [1, 0]"),
                               (dict(heads=8, sm_count=-1), "sm_count: expected"),
                               (dict(heads=8, state_indices_mode="x"), "state_indices_mode: expected"),
                               (dict(heads=8, arch="banana"), "arch: expected")):
            kwargs.setdefault("arch", "sm_90")
            fn = kdajit.key_for if "sm_count" in kwargs or "state_indices_mode" in kwargs else kdajit.supported
            with self.assertRaises(ValueError, msg=str(kwargs)) as cm:
                fn(**kwargs)
            self.assertIn(phrase, str(cm.exception))

    def test_integers_the_c_fields_cannot_hold_raise(self):
        # ctypes would wrap them into int32 (2**32 + 8 -> 8): each is named instead.
        for kwargs, name in ((dict(heads=2**32 + 8), "heads"), (dict(heads=-2**31 - 1), "heads"),
                             (dict(heads=8, op="packed", tokens=2**32 + 4), "tokens"),
                             (dict(heads=8, sm_count=2**32 + 132), "sm_count"),
                             (dict(heads=8, device=2**32), "device"), (dict(heads=8, rows=2**64 + 1), "rows"),
                             (dict(heads=8, rows=1.5), "rows")):
            kwargs.setdefault("arch", "sm_90")
            with self.assertRaises(ValueError, msg=str(kwargs)) as cm:
                kdajit.key_for(**kwargs)
            self.assertTrue(str(cm.exception).startswith(f"{name}: expected"), str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            kdajit.prewarm(heads=2**32 + 8, arch="sm_90")  # before any compile
        self.assertTrue(str(cm.exception).startswith("heads: expected an int in 1..128"), str(cm.exception))

    def test_messages_escape_control_bytes(self):
        with self.assertRaises(ValueError) as cm:
            kdajit.key_for(8, arch="sm_\x1b[31m90")
        msg = str(cm.exception)
        self.assertNotIn("\x1b", msg)
        self.assertIn("sm_\\x1b[31m90", msg)
        with self.assertRaises(ValueError) as cm:
            kdajit.supported(8, arch="sm_9\x07")
        self.assertNotIn("\x07", str(cm.exception))
        self.assertIn("sm_9\\x07", str(cm.exception))

    def test_arch_of_the_device_without_a_gpu(self):
        if torch.cuda.is_available():
            self.skipTest("a CUDA device is present (the GPU tests cover arch=None)")
        s = kdajit.supported(64)
        self.assertFalse(s)
        self.assertTrue(s.reason.startswith("arch: NULL means the arch of device"), s.reason)


class Keys(unittest.TestCase):
    def parse(self, key):
        m = KEY.match(key)
        self.assertIsNotNone(m, f"not a kernel key name: {key!r}")
        return m.groups()

    def test_key_for_spells_the_configuration(self):
        for op, heads, dtype, conv, tokens, gate in (("single", 64, "f32", "sd", 1, "bounded"),
                                                     ("single", 7, "bf16", "ds", 1, "softplus"),
                                                     ("packed", 16, "bf16", "sd", 4, "bounded"),
                                                     ("packed", 128, "f32", "ds", 16, "softplus")):
            for rows in (1, 8, 512):
                key = kdajit.key_for(heads, rows=rows, op=op, state_dtype=dtype, conv_layout=conv, tokens=tokens,
                                     gate=gate, arch="sm_90")
                g = self.parse(key)
                self.assertEqual(g[:6] + (g[7],), (op, str(heads), dtype, conv, str(tokens), gate, "sm_90"), key)

    def test_keys_for_covers_every_row_count(self):
        for op, tokens in (("single", 1), ("packed", 3)):
            keys = kdajit.keys_for(32, op=op, tokens=tokens, arch="sm_90")
            self.assertTrue(keys)
            self.assertEqual(len(keys), len(set(keys)))
            for key in keys:
                self.parse(key)
            for rows in (1, 2, 3, 8, 33, 128, 1024, 65536, 200000):
                self.assertIn(kdajit.key_for(32, rows=rows, op=op, tokens=tokens, arch="sm_90"), keys, rows)

    def test_the_cli_preset_is_covered(self):
        cli = os.environ.get("KDAJIT_CLI")
        if not cli:
            self.skipTest("KDAJIT_CLI (the kdajit CLI CMake builds) is not set")
        out = subprocess.run([cli, "keys", "--preset", "glm-5.3-flash", "--arch", "sm_90"], check=True,
                             capture_output=True, text=True).stdout.split()
        mine = set()
        for heads in (8, 16, 32, 64):
            for dtype in ("f32", "bf16"):
                for conv in ("sd", "ds"):
                    mine.update(kdajit.keys_for(heads, state_dtype=dtype, conv_layout=conv, arch="sm_90"))
                    for t in (2, 3, 4):
                        mine.update(kdajit.keys_for(heads, op="packed", tokens=t, state_dtype=dtype,
                                                    conv_layout=conv, arch="sm_90"))
                    mine.update(kdajit.keys_for(heads, op="prefill", state_dtype=dtype, conv_layout=conv,
                                                arch="sm_90"))
        self.assertTrue(out)
        self.assertFalse(set(out) - mine, "CLI preset keys that keys_for does not give")

    def test_chunk_keys_carry_conv_sd_and_their_routes_chunk(self):
        if "chunk" not in _abi.enum("op"):
            with self.assertRaises(ValueError) as cm:
                kdajit.keys_for(16, op="chunk", arch="sm_90")
            self.assertTrue(str(cm.exception).startswith("op: expected one of"), str(cm.exception))
            self.skipTest("the library has no chunk op (its tables do not spell 'chunk')")
        chunk_key = re.compile(r"^kda_chunk\.h(\d+)\.state_(f32|bf16)\.conv_sd\.(t64|t16)\.gate_(bounded|softplus)"
                               r"\.route_([a-z0-9_]+)\.sm_90$")
        for heads, dtype, gate in ((16, "f32", "bounded"), (64, "bf16", "softplus")):
            keys = kdajit.keys_for(heads, op="chunk", state_dtype=dtype, gate=gate, arch="sm_90")
            self.assertTrue(keys)
            for key in keys:
                m = chunk_key.match(key)
                self.assertIsNotNone(m, key)
                self.assertEqual(m.group(1, 2, 4), (str(heads), dtype, gate), key)
                self.assertEqual(m.group(3), "t16" if m.group(5) == "pipe16" else "t64", key)
            self.assertIn(kdajit.key_for(heads, rows=4, op="chunk", state_dtype=dtype, gate=gate, arch="sm_90"),
                          keys)

    def test_prewarm_patterns_leave_out_what_prefill_and_chunk_do_not_take(self):
        from kdajit import _config

        asked = []
        keys_for = _config.keys_for
        _config.keys_for = lambda h, **kw: asked.append((kw["op"], kw["conv_layout"], kw["tokens"])) or []
        try:
            kdajit.prewarm(heads=8, op=["packed", "prefill", "chunk"], conv_layout=["sd", "ds"], tokens=[3, 64],
                           arch="sm_90")
        finally:
            _config.keys_for = keys_for
        self.assertEqual(sorted(asked), sorted([("packed", "sd", 3), ("packed", "ds", 3), ("packed", "sd", 64),
                                                ("packed", "ds", 64), ("prefill", "sd", 64), ("prefill", "ds", 64),
                                                ("chunk", "sd", 64)]))

    def test_default_arch_without_a_gpu_is_sm_90(self):
        if torch.cuda.is_available():
            self.skipTest("a CUDA device is present: arch=None is the device's")
        self.assertTrue(kdajit.key_for(8).endswith(".sm_90"))
        self.assertTrue(all(k.endswith(".sm_90") for k in kdajit.keys_for(8)))


class Prewarm(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kdajit-prewarm-")
        self.rt = kdajit.Runtime(cache_dir=self.tmp.name, log_level="quiet")

    def tearDown(self):
        self.rt.close()
        self.tmp.cleanup()

    def test_compiles_then_finds_cached(self):
        keys = kdajit.keys_for(1, arch="sm_90")
        seen = []
        first = kdajit.prewarm(keys, runtime=self.rt, progress=lambda done, total, r: seen.append((done, total, r)))
        self.assertEqual([r.key for r in first], sorted(keys))
        self.assertEqual({r.status for r in first}, {"compiled"}, first)
        self.assertEqual([(d, t) for d, t, _ in seen], [(i + 1, len(keys)) for i in range(len(keys))])
        again = kdajit.prewarm(keys, runtime=self.rt)
        self.assertEqual({r.status for r in again}, {"cached"}, again)
        # The CLI sees the same entries in that cache directory.
        cli = os.environ.get("KDAJIT_CLI")
        if cli:
            listing = json.loads(subprocess.run([cli, "ls", "--cache-dir", self.tmp.name, "--json"], check=True,
                                                capture_output=True, text=True).stdout)
            rows = listing if isinstance(listing, list) else listing.get("entries", listing.get("results", []))
            names = {e["name"] for e in rows}
            self.assertTrue(set(keys) <= names, (keys, names))

    def test_pattern_expands_every_combination(self):
        results = kdajit.prewarm(heads=[1, 2], op="packed", tokens=2, state_dtype=["f32", "bf16"], arch="sm_90",
                                 runtime=self.rt, jobs=2)
        want = set()
        for h in (1, 2):
            for d in ("f32", "bf16"):
                want.update(kdajit.keys_for(h, op="packed", tokens=2, state_dtype=d, arch="sm_90"))
        self.assertEqual({r.key for r in results}, want)
        # Every route of the packed op reads H at run time: H 1 and 2 of a family
        # are one program, one compiled and the other made from its cubin
        # (reported as cached: nothing compiled).
        self.assertTrue(any(".route_stream." in k for k in want), want)
        statuses = sorted(r.status for r in results)
        self.assertEqual(statuses.count("compiled"), len(want) // 2, results)
        self.assertEqual(statuses.count("cached"), len(want) // 2, results)

    def test_bad_key_names_raise(self):
        with self.assertRaises(ValueError):
            kdajit.prewarm(["kda_single.h0.nonsense"], runtime=self.rt)
        with self.assertRaises(ValueError):
            kdajit.prewarm(runtime=self.rt)

    def test_process_runtime_uses_the_configured_cache_dir(self):
        key = kdajit.key_for(1, arch="sm_90")
        code = ("import kdajit, sys; kdajit.configure(cache_dir=sys.argv[1], log_level='quiet'); "
                "r = kdajit.prewarm([sys.argv[2]]); print(r[0].status); "
                "kdajit.configure(cache_dir=sys.argv[1])\n"
                "try:\n    kdajit.configure(cache_dir='/elsewhere')\nexcept RuntimeError as e:\n    print('refused')")
        out = subprocess.run([sys.executable, "-c", code, self.tmp.name, key], check=True, capture_output=True,
                             text=True, env=dict(os.environ, KDAJIT_CACHE_DIR="/nonexistent/kdajit")).stdout.split()
        self.assertEqual(out, ["compiled", "refused"])


class RuntimeOptions(unittest.TestCase):
    def test_bad_options_raise_value_error(self):
        for kwargs in (dict(log_level="loud"), dict(log_level=[]), dict(device=-2), dict(device=2**32),
                       dict(arch="banana"), dict(cache_dir=""), dict(use_tuning=2), dict(pdl="yes"), dict(route="")):
            with self.assertRaises(ValueError, msg=str(kwargs)):
                kdajit.Runtime(**kwargs)

    def test_cache_dir_follows_the_rule_of_kdajit_cache_dir(self):
        # An empty layer is an error, as in KDAJIT_CACHE_DIR, not a memory-only cache.
        for bad in ("L1::L2", ":", "L1:"):
            with self.assertRaises(ValueError, msg=bad) as cm:
                kdajit.Runtime(cache_dir=bad, log_level="quiet")
            self.assertTrue(str(cm.exception).startswith("options.cache_dir: expected a directory or a ':'-separated "
                                                         "list of directories"), str(cm.exception))

    def test_a_runtime_with_an_arch_and_a_cache_dir(self):
        with tempfile.TemporaryDirectory() as tmp:
            rt = kdajit.Runtime(cache_dir=tmp, arch="sm_90a", log_level="quiet")
            self.assertTrue(rt.handle)
            rt.close()
            self.assertIsNone(rt.handle)
            rt.close()  # twice is fine
            rt = kdajit.Runtime(cache_dir=tmp, route="rowcta", use_tuning=False, pdl=True, log_level="quiet")
            self.assertEqual(rt.options["route"], "rowcta")
            rt.close()


class Nvrtc(unittest.TestCase):
    """The NVRTC of nvidia pip packages on the Python path is handed to libkdajit.so."""

    def tree(self, root, names):
        for rel in names:
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "wb").close()

    def test_candidates_newest_major_first(self):
        with tempfile.TemporaryDirectory() as site:
            self.tree(site, ["nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.8",
                             "nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cu13/lib/libnvrtc.alt.so.13",
                             "nvidia/cublas/lib/libcublas.so.12"])
            self.assertEqual(_abi.nvrtc_candidates([site, "/nonexistent"]),
                             [os.path.join(site, "nvidia/cu13/lib/libnvrtc.so.13"),
                              os.path.join(site, "nvidia/cuda_nvrtc/lib/libnvrtc.so.12")])
            self.assertEqual(_abi.nvrtc_candidates([os.path.join(site, "nvidia")]), [])

    def test_the_library_compiles_with_a_pip_style_nvrtc(self):
        # A site directory whose nvidia/cu13/lib/libnvrtc.so.13 is the toolkit's NVRTC:
        # the package hands it over before the first compile, and compiles work.
        toolkit = [p for p in ("/usr/local/cuda/lib64/libnvrtc.so", "/usr/local/cuda/lib/libnvrtc.so")
                   if os.path.exists(p)]
        if not toolkit:
            self.skipTest("no toolkit NVRTC to stand in for the pip package")
        with tempfile.TemporaryDirectory() as tmp:
            site = os.path.join(tmp, "site")
            os.makedirs(os.path.join(site, "nvidia", "cu13", "lib"))
            link = os.path.join(site, "nvidia", "cu13", "lib", "libnvrtc.so.13")
            os.symlink(os.path.realpath(toolkit[0]), link)
            code = ("import sys; sys.path.insert(0, sys.argv[1]); import kdajit\n"
                    "from kdajit import _abi\n"
                    # First: the test's site is first on sys.path (a machine with real nvidia
                    # pip packages lists theirs after it).
                    "print(_abi.load().nvrtc_candidates[:1] == [sys.argv[2]])\n"
                    "rt = kdajit.Runtime(cache_dir=sys.argv[3], log_level='quiet')\n"
                    "print(kdajit.prewarm([kdajit.key_for(1, arch='sm_90')], runtime=rt)[0].status)")
            out = subprocess.run([sys.executable, "-c", code, site, link, os.path.join(tmp, "cache")],
                                 capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout.split(), ["True", "compiled"])


if __name__ == "__main__":
    unittest.main()
