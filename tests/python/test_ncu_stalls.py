"""bench/ncu_stalls.py: the per-stretch stall report of an ncu source page, on a
synthetic page whose sums are known, and its errors on a file that is not one."""
import contextlib
import io
import os
import tempfile
import unittest

import bench_tools

tool = bench_tools.load("ncu_stalls")

HEAD = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
        '"Instructions Executed","stall_barrier","stall_long_sb","stall_selected","stall_barrier (Not Issued)"')
# (sass, samples, executed, barrier, long_sb, selected): stretch 1 = lines 0-2 (ends at the
# BAR.SYNC), stretch 2 = lines 3-5.
ROWS = [("LDG.E R2, [R2.64]", 10, 64, 0, 0, 10), ("STS [R3], R2", 50, 64, 0, 50, 0),
        ("BAR.SYNC.DEFER_BLOCKING 0x0", 0, 64, 0, 0, 0), ("FFMA R1, R2, R3, R4", 20, 128, 20, 0, 0),
        ("FFMA R5, R2, R3, R4", 15, 128, 0, 0, 15), ("EXIT", 5, 64, 0, 0, 5)]


def page(rows):
    lines = ['"Kernel Name","kda_packed_decode",', HEAD]
    for k, (sass, s, e, b, l, sel) in enumerate(rows):
        lines.append(f'"0x{0x1000 + 16 * k:x}","      {sass}","{s}","{s - sel}","{e}","{b}","{l}","{sel}","{b}"')
    return "\n".join(lines) + "\n"


class NcuStalls(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "k.source.csv")
        with open(self.path, "w") as f:
            f.write(page(ROWS))

    def tearDown(self):
        self.dir.cleanup()

    def report(self, *args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(tool.main([self.path, *args]), 0)
        return out.getvalue()

    def test_read(self):
        kernel, rows = tool.read(self.path)
        self.assertEqual(kernel, "kda_packed_decode")
        self.assertEqual(len(rows), 6)
        self.assertEqual(rows[1]["reasons"], {"barrier": 0.0, "long_sb": 50.0, "selected": 0.0})

    def test_stretches_and_totals(self):
        text = self.report("--per-item", "64", "--top", "20")
        self.assertIn("100 samples, 8.0 warp instructions executed per 64 warp items", text)
        self.assertIn("reasons: long_sb:50.0 selected:30.0 barrier:20.0", text)
        lines = text.splitlines()
        first = next(l for l in lines if l.strip().startswith("0-2"))
        second = next(l for l in lines if l.strip().startswith("3-5"))
        self.assertRegex(first, r"0-2\s+3\.0\s+60\.0%\s+long_sb:50\.0 selected:10\.0")
        self.assertRegex(second, r"3-5\s+5\.0\s+40\.0%\s+selected:20\.0 barrier:20\.0")  # a tie: by name, descending
        tops = lines[lines.index(next(l for l in lines if l.startswith("instructions with"))) + 1:]
        self.assertEqual([t.split()[0] for t in tops], ["1", "3"])  # 50% and 20%; 15% is below --top

    def test_errors(self):
        bad = os.path.join(self.dir.name, "details.csv")
        with open(bad, "w") as f:
            f.write('"ID","Metric Name","Metric Value"\n"0","Duration","1"\n')
        with self.assertRaises(SystemExit) as e:
            tool.main([bad])
        self.assertIn("no header row with 'Address' and 'Source'", str(e.exception))
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            tool.main([self.path, "--per-item", "0"])


if __name__ == "__main__":
    unittest.main()
