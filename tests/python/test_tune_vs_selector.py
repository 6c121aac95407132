"""bench/tune_vs_selector.py: reads `kdajit tune` output (JSON and text) and
compares each cell's built-in route, as the library selects it, with the
fastest measured route (no GPU needed)."""
import contextlib
import io
import json
import os
import tempfile
import unittest

import bench_tools
from bench_tools import PACKED, SINGLE

tool = bench_tools.load("tune_vs_selector")


def run(path, *args):
    return bench_tools.run_main(tool, [path, *args])


class TuneVsSelector(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        bench_tools.check_band_cells(self)

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def check_two_cells(self, path):
        rc, out, err = run(path, "--sm-count", "132")
        self.assertEqual(rc, 0, err)
        first = out.splitlines()[0]
        self.assertIn("all: 2 cells", first)
        self.assertIn("median 1.038", first)
        self.assertIn("worst 1.077", first)
        self.assertIn("the built-in route is the fastest in 1", first)
        self.assertIn("1.077  packed h64 bf16 sd t4 bounded rows 2: built-in rowcta 14.00 us, fastest split2 13.00 us",
                      out)

    def test_text_output_of_tune(self):
        path = self.write("tune.txt", "\n".join([
            "kdajit: compiled " + SINGLE.format("rowcta") + " in 339 ms (128 registers, 0 bytes spilled, NVRTC 13.0)",
            SINGLE.format("rowcta") + " rows 1: rowcta 8.00 us split4 7.00 us stream 9.00 us -> split4",
            PACKED.format("rowcta") + " rows 2: rowcta 14.00 us split2 13.00 us stream 14.50 us -> split2",
            "tune: 2 families tuned (0 with one eligible route skipped), table written to /x"]))
        self.check_two_cells(path)

    def test_json_output_of_tune(self):
        m = [{"key": SINGLE.format(r), "rows": 1, "median_us": us} for r, us in (("rowcta", 8.0), ("split4", 7.0))]
        m += [{"key": PACKED.format(r), "rows": 2, "median_us": us} for r, us in (("rowcta", 14.0), ("split2", 13.0))]
        path = self.write("tune.json", json.dumps({"path": "/x", "table": {}, "measurements": m}))
        self.check_two_cells(path)

    def test_errors(self):
        rc, _, err = run(self.write("empty.txt", "nothing here\n"))
        self.assertEqual(rc, 2)
        self.assertIn("no measurements found", err)
        # The built-in route was not among the measured ones.
        rc, _, err = run(self.write("missing.txt", SINGLE.format("rowcta") + " rows 1: rowcta 8.00 us -> rowcta\n"))
        self.assertEqual(rc, 1)
        self.assertIn("the built-in route split4 was not measured", err)
        with self.assertRaises(SystemExit):
            with contextlib.redirect_stderr(io.StringIO()):
                tool.main([self.write("x.txt", ""), "--sm-count", "0"])


if __name__ == "__main__":
    unittest.main()
