"""bench/results_table.py: the markdown tables of docs/PERFORMANCE.md from a
kdajit_bench JSON, --fit (device time = fixed + per-MB cost per family),
--targets and --against, on synthetic grids whose times are known; the
summary bench/summarize.py makes of a run prints the same tables as the run;
and the committed summaries under bench/results/ print in every mode."""
import contextlib
import glob
import io
import json
import os
import tempfile
import unittest

import bench_tools

BENCH = bench_tools.BENCH
tool = bench_tools.load("results_table")
summarize = bench_tools.load("summarize")
MODES = [[], ["--fit"], ["--flat"], ["--value", "tuned"], ["--value", "diff"], ["--value", "host"], ["--value", "pdl"],
         ["--route", "stream"], ["--targets"]]


def cell(op, heads, count, tokens, state, mb, us, floor_us, route, forced):
    """One kdajit_bench cell (the fields results_table reads)."""
    return {"op": op, "heads": heads, "count": count, "rows": count * tokens, "tokens": tokens, "state": state,
            "conv": "sd", "status": "ok", "route": route, "bytes_per_call": int(mb * 1e6),
            "device_us": {"median": us}, "floor_us": floor_us, "floor_shape": "cta256", "ratio": us / floor_us,
            "host_us_per_call": {"median": 4.0}, "host_minus_bare_us": 0.25,
            "bare_launch": {"status": "ok", "us_per_call": {"median": 3.75}},
            "tuned": {"status": "ok", "route": route, "ratio": us / floor_us},
            "routes": {r: {"status": "ok", "device_us": {"median": t}, "ratio": t / floor_us}
                       for r, t in forced.items()}}


def synthetic():
    """Single f32 H = 8: stream at the two small N, rowcta at the three large ones; forced
    rowcta is 10 + 0.3 us/MB everywhere, the floor 5 + 0.25 us/MB (MB = N here)."""
    cells = []
    for n in (1, 2, 16, 64, 128):
        rowcta = 10.0 + 0.3 * n
        stream = rowcta - 1.0 if n < 16 else rowcta + 2.0
        route = "stream" if n < 16 else "rowcta"
        cells.append(cell("single", 8, n, 1, "f32", n, min(rowcta, stream), 5.0 + 0.25 * n, route,
                          {"rowcta": rowcta, "stream": stream}))
    return {"schema": "kdajit-bench-decode/2", "date": "2026-12-01T00:00:00Z", "commit": "abc1234",
            "copy_bandwidth_gbps": 4000.0, "settings": {"iters": 50},
            "gpu": {"name": "Test GPU", "sms": 132, "cuda_driver_version": "13.0"}, "configs": cells}


class ResultsTable(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "grid.json")
        with open(self.path, "w") as f:
            json.dump(synthetic(), f)

    def tearDown(self):
        self.dir.cleanup()

    def run_tool(self, *args, path=None):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            tool.main([path or self.path, *args])
        return out.getvalue()

    def test_grid_cells_are_ratio_and_route(self):
        out = self.run_tool()
        self.assertIn("**single, f32 state, conv sd**: kdajit / floor (route)", out)
        self.assertIn("| H | N=1 | N=2 | N=16 | N=64 | N=128 |", out)
        # N = 1: stream 9.3 us over a 5.25 us floor; N = 128: rowcta 48.4 over 37.
        self.assertIn("| 8 | 1.77 (stream) |", out)
        self.assertIn("| 1.31 (rowcta) |", out)

    def test_fit_recovers_the_lines(self):
        rows = [l for l in self.run_tool("--fit").splitlines() if l.startswith("| single")]
        self.assertEqual(len(rows), 1, rows)
        cols = [c.strip() for c in rows[0].strip("|").split("|")]
        # The largest cell's route (rowcta), forced, over the cells >= 128/8 MB: N 16, 64, 128.
        self.assertEqual(cols[5:], ["rowcta", "16,64,128", "10.0", "5.0", "+5.0", "0.3000", "0.2500", "1.200"])

    def test_fit_skips_a_family_with_one_size(self):
        j = synthetic()
        j["configs"] = j["configs"][-1:]
        with open(self.path, "w") as f:
            json.dump(j, f)
        self.assertNotIn("| single", self.run_tool("--fit"))

    def test_targets_count_the_bands(self):
        j = synthetic()
        j["configs"][-1]["ratio"] = 1.05  # N = 128 exactly at its limit: met
        with open(self.path, "w") as f:
            json.dump(j, f)
        row = next(l for l in self.run_tool("--targets").splitlines() if l.startswith("| single f32"))
        # N <= 8: N = 1 (9.3 / 5.25) and N = 2 (9.6 / 5.5); no N = 32 cell; N >= 128: the one at 1.05.
        self.assertEqual(row, "| single f32 | 1.75-1.77 (0 of 2 met) | - | 1.05-1.05 (1 of 1 met) |")

    def test_against_an_older_run(self):
        new = synthetic()
        for c, f in zip(new["configs"], (0.9, 1.0, 1.0, 1.0, 1.1)):
            c["device_us"]["median"] *= f
        new["configs"].append(cell("single", 8, 512, 1, "f32", 512, 1.0, 1.0, "rowcta", {}))  # only in new
        newpath = os.path.join(self.dir.name, "new.json")
        with open(newpath, "w") as f:
            json.dump(new, f)
        out = self.run_tool("--against", self.path, path=newpath)
        self.assertIn("| single | f32 | all | 5 | 1.000 | 0.900 | 1.100 |", out)
        row = next(l for l in self.run_tool("--targets", "--against", self.path, path=newpath).splitlines()
                   if l.startswith("| single f32"))
        self.assertIn("; was 1.31-1.31 (0 of 1 met)", row)

    def test_targets_and_against_need_the_current_schema(self):
        old = {"schema": "kdajit-bench-decode/1", "configs": []}
        oldpath = os.path.join(self.dir.name, "old.json")
        with open(oldpath, "w") as f:
            json.dump(old, f)
        for args in (["--targets"], ["--against", oldpath]):
            with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
                tool.main([oldpath if args == ["--targets"] else self.path, *args])

    def test_a_summary_prints_what_its_run_prints(self):
        j = synthetic()
        j["configs"][0]["device_us"] = {"median": 9.3, "p10": 9.0, "p90": 9.9, "n": 50}
        j["configs"][0]["pdl"] = {"saving_us": 0.25, "two_calls": {"status": "ok", "device_us": {"median": 18.0}}}
        with open(self.path, "w") as f:
            json.dump(j, f)
        out = os.path.join(self.dir.name, "summary.json")
        self.assertEqual(bench_tools.run_main(summarize, ["--grid", self.path, "--out", out])[0], 0)
        with open(out) as f:
            s = json.load(f)
        self.assertEqual(s["schema"], "kdajit-bench-summary/1")
        self.assertEqual(s["grid"]["configs"][0]["device_us"], {"median": 9.3})
        for args in MODES + [["--against", self.path]]:
            self.assertEqual(self.run_tool(*args, path=out), self.run_tool(*args), args)

    def test_summarize_rejects_what_is_not_a_grid(self):
        out = os.path.join(self.dir.name, "summary.json")
        bad = os.path.join(self.dir.name, "bad.json")
        with open(bad, "w") as f:
            json.dump({"schema": "kdajit-bench-decode/1", "configs": []}, f)
        code, _, err = bench_tools.run_main(summarize, ["--grid", bad, "--out", out])
        self.assertEqual(code, 2)
        self.assertIn(f"--grid {bad}: expected a kdajit-bench-decode/2 grid", err)
        code, _, err = bench_tools.run_main(summarize, ["--grid", self.path, "--tune", self.path, "--out", out])
        self.assertEqual(code, 2)
        self.assertIn(f"--tune {self.path}: expected what `kdajit tune --json` wrote", err)
        self.assertFalse(os.path.exists(out))

    def test_committed_summaries_print_in_every_mode(self):
        runs = sorted(glob.glob(os.path.join(BENCH, "results", "summary-*.json")))
        self.assertTrue(runs, "no committed run summary under bench/results")
        for args in MODES + [["--against", runs[0]], ["--targets", "--against", runs[0]]]:
            out = self.run_tool(*args, path=runs[-1])
            self.assertIn("NVIDIA H200", out.splitlines()[0], args)
            self.assertGreater(len(out.splitlines()), 5 if "--targets" in args else 10, args)


if __name__ == "__main__":
    unittest.main()
