"""bench/tune_vs_selector.py: reads `kdajit tune` output (JSON and text) and
compares each cell's built-in route, as the library selects it, with the
fastest measured route (no GPU needed)."""
import contextlib
import importlib.util
import io
import json
import os
import tempfile
import unittest

import kdajit

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "bench", "tune_vs_selector.py")
spec = importlib.util.spec_from_file_location("tune_vs_selector", TOOL)
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

SINGLE = "kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_{}.sm_90"
PACKED = "kda_packed.h64.state_bf16.conv_sd.t4.gate_bounded.route_{}.sm_90"


def run(path, *args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = tool.main([path, *args])
    return rc, out.getvalue(), err.getvalue()


class TuneVsSelector(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        # On 132 SMs the bands pick split4 for single H = 8, R = 1 (8 CTAs x 8 <= 132)
        # and rowcta for packed bf16 H = 64, N = 2, T = 4 (128 sequence-heads).
        self.assertIn("route_split4", kdajit.key_for(8, rows=1, arch="sm_90", sm_count=132))
        self.assertIn("route_rowcta", kdajit.key_for(64, rows=2, op="packed", tokens=4, state_dtype="bf16",
                                                     arch="sm_90", sm_count=132))

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
