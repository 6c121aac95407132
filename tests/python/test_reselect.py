"""bench/reselect.py: a kdajit_bench grid (with every route forced) as the
library's built-in bands select it, from the same run's forced timings (no GPU
needed)."""
import json
import os
import tempfile
import unittest

import bench_tools
from bench_tools import PACKED, SINGLE

tool = bench_tools.load("reselect")


def timing(key, us, floor):
    return {"key": key, "device_us": {"median": us}, "ratio": us / floor, "status": "ok"}


def cell(name, op, key_fmt, rows, tokens, selected, times, floor=5.0):
    c = {"name": name, "op": op, "rows": rows, "tokens": tokens, "floor_us": floor, "route": selected,
         "routes": {r: timing(key_fmt.format(r), us, floor) for r, us in times.items()}}
    c.update({k: v for k, v in c["routes"][selected].items() if k != "status"})
    return c


class Reselect(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        bench_tools.check_band_cells(self)
        self.grid = {"gpu": {"sms": 132}, "configs": [
            cell("single h8 r1 f32 sd", "single", SINGLE, 1, 1, "rowcta", {"rowcta": 8.0, "split4": 7.0}),
            cell("packed h64 n2 t4 bf16 sd", "packed", PACKED, 8, 4, "rowcta", {"rowcta": 14.0, "stream": 15.0}),
        ]}

    def tearDown(self):
        self.dir.cleanup()

    def run_tool(self, grid, *args):
        src = os.path.join(self.dir.name, "grid.json")
        dst = os.path.join(self.dir.name, "new.json")
        with open(src, "w") as f:
            json.dump(grid, f)
        rc, out, err = bench_tools.run_main(tool, [src, "--out", dst, *args])
        new = None
        if rc == 0:
            with open(dst) as f:
                new = json.load(f)
        return rc, out, err, new

    def test_the_bands_route_and_its_forced_timing(self):
        rc, out, err, new = self.run_tool(self.grid)
        self.assertEqual(rc, 0, err)
        self.assertIn("2 cells on 132 SMs: 1 change route", out)
        self.assertIn("single h8 r1 f32 sd T1: rowcta -> split4, 8.00 -> 7.00 us (0.875)", out)
        single, packed = new["configs"]
        self.assertEqual(single["route"], "split4")
        self.assertEqual(single["key"], SINGLE.format("split4"))
        self.assertEqual(single["device_us"]["median"], 7.0)
        self.assertAlmostEqual(single["ratio"], 7.0 / 5.0)
        self.assertEqual(single["selected_in_run"]["key"], SINGLE.format("rowcta"))
        self.assertEqual(single["floor_us"], 5.0)
        self.assertEqual(packed["route"], "rowcta")
        self.assertEqual(packed["device_us"]["median"], 14.0)

    def test_sm_count_option(self):
        # On 16 SMs, 4 x 8 CTAs no longer fit: split2 (8 <= 16), which this grid did not time.
        rc, _, err, _ = self.run_tool(self.grid, "--sm-count", "16")
        self.assertEqual(rc, 1)
        self.assertIn("no forced timing of route split2", err)

    def test_packed_rows_must_be_whole_sequences(self):
        self.grid["configs"][1]["rows"] = 7
        rc, _, err, _ = self.run_tool(self.grid)
        self.assertEqual(rc, 1)
        self.assertIn("7 rows are not whole sequences of T = 4", err)


if __name__ == "__main__":
    unittest.main()
