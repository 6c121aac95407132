"""bench/peers/bench_fla_chunk_kda.py without a GPU: its shapes (the serving mix
is the issue's 64 prompts, 74,979 tokens), its argument checks, and a clear
error when the peer package is missing."""
import contextlib
import importlib.util
import io
import os
import tempfile
import unittest

import bench_tools

spec = importlib.util.spec_from_file_location(
    "bench_fla_chunk_kda", os.path.join(bench_tools.BENCH, "peers", "bench_fla_chunk_kda.py"))
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)


class Shapes(unittest.TestCase):
    def test_fixed_shapes(self):
        self.assertEqual(tool.lengths_of("8x2048"), [2048] * 8)
        self.assertEqual(tool.lengths_of("1x16384"), [16384])

    def test_serving_mix_is_fixed(self):
        lengths = tool.lengths_of("mix64")
        self.assertEqual(len(lengths), 64)
        self.assertEqual(sum(lengths), 74979)
        self.assertTrue(all(100 <= n <= 2000 for n in lengths))
        self.assertEqual(lengths, tool.lengths_of("mix64"))


class Arguments(unittest.TestCase):
    def parse_error(self, *args):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as cm:
            tool.parse_args(["--fla", "x", *args])
        self.assertEqual(cm.exception.code, 2)
        return err.getvalue()

    def test_bad_values_name_the_option(self):
        self.assertIn("--heads: expected comma-separated integers, got 'x'", self.parse_error("--heads", "x"))
        self.assertIn("--heads: expected values >= 1", self.parse_error("--heads", "0"))
        self.assertIn("--iters: expected at least 3", self.parse_error("--iters", "1"))

    def test_a_folder_without_the_package_is_refused(self):
        with tempfile.TemporaryDirectory() as d, self.assertRaises(SystemExit) as cm:
            tool.load_fla(d)
        self.assertIn("--fla: expected a folder holding fla/", str(cm.exception.code))


if __name__ == "__main__":
    unittest.main()
