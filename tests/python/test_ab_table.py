"""bench/ab_table.py: the A/B table of bench/ab_on_device.sh, on synthetic
kdajit_bench runs whose ratios are known (two variants, two rounds), and its
argument errors; the table again from the merged JSON (--from); then on a
recorded A/B (tests/python/data/ab-packed-meta-ring-scales.json)."""
import json
import os
import tempfile
import unittest

import bench_tools

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
tool = bench_tools.load("ab_table")


def run(scale, rnd):
    """One kdajit_bench run: two cells, the selector (stream) and forced rowcta/stream;
    every ratio of the base (scale 1) times `scale`, plus a round-dependent wobble."""
    wobble = 0.01 if rnd == 1 else -0.01
    cells = []
    for name, base in (("packed h16 n8 t2 f32 sd", 1.2), ("packed h64 n128 t2 bf16 sd", 1.3)):
        r = base * scale + wobble
        cells.append({"name": name, "status": "ok", "floor_us": 10.0, "ratio": r, "route": "stream",
                      "routes": {"stream": {"status": "ok", "ratio": r},
                                 "rowcta": {"status": "ok", "ratio": base + 0.1 + wobble},
                                 "sequential": {"status": "n/a", "error": "route sequential does not serve op packed"}}})
    cells.append({"name": "packed h64 n1 t2 f32 sd", "status": "error", "error": "skipped"})
    return {"gpu": {"name": "Test GPU", "sms": 132}, "configs": cells}


class AbTable(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.specs = []
        for v, scale in (("base", 1.0), ("new", 0.9)):
            for rnd in (1, 2):
                path = os.path.join(self.dir.name, f"{v}-{rnd}.json")
                with open(path, "w") as f:
                    json.dump(run(scale, rnd), f)
                self.specs.append(f"{v}-{rnd}={path}")
        self.out = os.path.join(self.dir.name, "ab.json")

    def tearDown(self):
        self.dir.cleanup()

    def main(self, args):
        return bench_tools.run_main(tool, args)

    def test_table_and_merged_json(self):
        code, out, _ = self.main(["--out", self.out, "--about", "synthetic", *self.specs])
        self.assertEqual(code, 0)
        lines = out.splitlines()
        self.assertEqual(lines[0], "cell | route | base | new (xbase)")
        # The median of the two rounds cancels the wobble: stream 1.2 -> 1.08, rowcta unchanged.
        self.assertIn("packed h16 n8 t2 f32 sd | stream | 1.200 | 1.080 (0.900)", lines)
        self.assertIn("packed h16 n8 t2 f32 sd | selector | 1.200 stream | 1.080 stream (0.900)", lines)
        self.assertIn("packed h64 n128 t2 bf16 sd | rowcta | 1.400 | 1.400 (1.000)", lines)
        self.assertFalse(any("sequential" in l or "n1 t2" in l for l in lines))  # n/a routes and failed cells
        self.assertIn("cells: 6 rows in every variant", lines)
        geo = [l for l in lines if l.startswith("geomean new/base")]
        self.assertEqual(len(geo), 1)
        self.assertIn("over 6 rows, min 0.900, max 1.000", geo[0])
        with open(self.out) as f:
            merged = json.load(f)
        self.assertEqual(merged["about"]["variants"], ["base", "new"])
        self.assertEqual(merged["about"]["what"], "synthetic")
        self.assertEqual(sorted(merged["runs"]), ["base-1", "base-2", "new-1", "new-2"])

    def test_families_and_from_merged(self):
        code, out, _ = self.main(["--out", self.out, *self.specs])
        self.assertEqual(code, 0)
        # One family per op, state, T, rows and route; each cell is its own family here.
        self.assertIn("family packed f32 t2 n8 | stream | 1 cells | new 0.900", out.splitlines())
        self.assertIn("family packed bf16 t2 n128 | rowcta | 1 cells | new 1.000", out.splitlines())
        self.assertEqual(tool.family("single h8 r32 bf16 ds", "selector"), "single bf16 t1 r32 | selector")
        code, again, err = self.main(["--from", self.out])
        self.assertEqual((code, err), (0, ""))
        self.assertEqual(again, out)
        for bad in (["--from", self.out, "--out", self.out], ["--from", self.out, *self.specs[:1]], []):
            code, _, err = self.main(bad)
            self.assertEqual(code, 2, bad)
        junk = os.path.join(self.dir.name, "junk.json")
        with open(junk, "w") as f:
            json.dump({"runs": {}}, f)
        code, _, err = self.main(["--from", junk])
        self.assertEqual(code, 2)
        self.assertIn("not a merged A/B", err)

    def test_bad_arguments(self):
        for bad in ("base1=x.json", "base-1", "=x.json", "base-x=x.json"):
            code, out, err = self.main(["--out", self.out, bad])
            self.assertEqual(code, 2, bad)
            self.assertIn("expected NAME-ROUND=FILE", err)
        code, _, err = self.main(["--out", self.out, "base-1=" + os.path.join(self.dir.name, "missing.json")])
        self.assertEqual(code, 2)
        self.assertIn("missing.json", err)
        self.assertFalse(os.path.exists(self.out))

    def test_recorded_ab(self):
        # A real A/B (packed stream, three variants, two rounds each), cut to the fields ab_table reads.
        recorded = os.path.join(DATA, "ab-packed-meta-ring-scales.json")
        with open(recorded) as f:
            merged = json.load(f)
        self.assertEqual(merged["about"]["variants"], ["base", "D", "work"])
        specs = []
        # The variants in their recorded order (the merged JSON's runs are sorted by name).
        for name in sorted(merged["runs"], key=lambda n: merged["about"]["variants"].index(n.rpartition("-")[0])):
            path = os.path.join(self.dir.name, name + ".json")
            with open(path, "w") as f:
                json.dump(merged["runs"][name], f)
            specs.append(f"{name}={path}")
        code, out, _ = self.main(["--out", self.out, *specs])
        self.assertEqual(code, 0)
        self.assertIn("cells: 108 rows in every variant", out)
        self.assertIn("geomean D/base: 1.0093 over 108 rows", out)
        self.assertIn("geomean work/base: 1.0146 over 108 rows", out)
        code, again, _ = self.main(["--from", recorded])
        self.assertEqual((code, again), (0, out))


if __name__ == "__main__":
    unittest.main()
