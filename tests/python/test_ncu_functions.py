"""bench/ncu_functions.py: instructions and samples per function of the
source, on a synthetic CUDA-and-SASS page whose sums are known, and its
errors on files that are not such a page."""
import os
import tempfile
import unittest

import bench_tools

tool = bench_tools.load("ncu_functions")

SOURCE = """// kdajit kernel demo
__device__ __forceinline__ float helper(float x) {
  return x * 2.f;
}
template <class S>
__device__ __forceinline__ void step(const S& s) {
  auto f = [](int k) { return k + 1; };
  s.out[0] = helper(f(1));
}
extern "C" __global__ void __launch_bounds__(256) demo_kernel(const int p) {
  step(p);
}
"""
HEAD = ('"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)",'
        '"Warp Stall Sampling (Not-issued Samples)","# Samples","Instructions Executed",'
        '"L1 Wavefronts Shared Excessive"')
# (line, samples, executed): helper's body 30 / 100, step's lambda and call 50 / 300, the kernel 20 / 100;
# each line's excess shared wavefronts are 3 x its samples (step 150, helper 90, the kernel 60).
LINES = [(3, 30, 100), (7, 10, 200), (8, 40, 100), (11, 20, 100)]


def page(lines):
    out = ['"File Path","/tmp/kernel.cu"', '"Function Name","demo_kernel"', HEAD]
    for line, s, e in lines:
        out.append(f'"{line}","src","-","-","{s}","{s}","{s}","{e}","{3 * s}"')
        out.append(f'"","","0x{0x1000 + line:x}","      FFMA R1, R2, R3, R4","{s}","{s}","{s}","{e}","{3 * s}"')
    return "\n".join(out) + "\n"


class NcuFunctions(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.page = os.path.join(self.dir.name, "k.cudasass.csv")
        self.source = os.path.join(self.dir.name, "kernel.cu")
        with open(self.page, "w") as f:
            f.write(page(LINES))
        with open(self.source, "w") as f:
            f.write(SOURCE)

    def tearDown(self):
        self.dir.cleanup()

    def test_owner_of_each_line(self):
        owner = tool.functions_by_line(SOURCE)
        self.assertEqual(owner[1], "?")
        self.assertEqual(owner[3], "helper")
        self.assertEqual(owner[7], "step")  # a lambda counts in the function around it
        self.assertEqual(owner[11], "demo_kernel")

    def test_sums(self):
        sums, total = tool.by_function(tool.read_lines(self.page), tool.functions_by_line(SOURCE))
        self.assertEqual(total, [100.0, 500.0])
        self.assertEqual(sums["step"], [50.0, 300.0])
        self.assertEqual(sums["helper"], [30.0, 100.0])

    def test_report(self):
        rc, out, err = bench_tools.run_main(tool, [self.page, self.source, "--per-item", "10"])
        self.assertEqual(rc, 0, err)
        self.assertIn("100 samples on CUDA lines, 50 warp instructions executed per 10 items", out)
        rows = [l.split() for l in out.splitlines()[2:]]
        self.assertEqual([r[0] for r in rows], ["step", "helper", "demo_kernel"])  # by samples
        self.assertEqual(rows[0][1:], ["30", "60.0%", "50.0%"])

    def test_extra_column(self):
        lines = tool.read_lines(self.page, ["L1 Wavefronts Shared Excessive"])
        sums, total = tool.by_function(lines, tool.functions_by_line(SOURCE))
        self.assertEqual(total, [100.0, 500.0, 300.0])
        self.assertEqual(sums["step"], [50.0, 300.0, 150.0])
        rc, out, err = bench_tools.run_main(
            tool, [self.page, self.source, "--per-item", "10", "--column", "L1 Wavefronts Shared Excessive"])
        self.assertEqual(rc, 0, err)
        self.assertIn("L1 Wavefronts Shared Excessive: 30 per 10 items", out)
        step = next(l for l in out.splitlines() if l.startswith("step"))
        self.assertTrue(step.endswith("| 15"), step)
        rc, _, err = bench_tools.run_main(tool, [self.page, self.source, "--column", "No Such Column"])
        self.assertEqual(rc, 2)
        self.assertIn("No Such Column", err)

    def test_min_leaves_out_small_functions(self):
        rc, out, _ = bench_tools.run_main(tool, [self.page, self.source, "--min", "25"])
        self.assertEqual(rc, 0)
        self.assertNotIn("demo_kernel", out)  # 20% of the samples, 20% of the instructions

    def test_not_a_page(self):
        bad = os.path.join(self.dir.name, "bad.csv")
        with open(bad, "w") as f:
            f.write('"Address","Source"\n"0x10","FFMA"\n')
        rc, _, err = bench_tools.run_main(tool, [bad, self.source])
        self.assertEqual(rc, 2)
        self.assertIn("no 'Line No' header", err)
        rc, _, err = bench_tools.run_main(tool, [self.page, os.path.join(self.dir.name, "missing.cu")])
        self.assertEqual(rc, 2)


if __name__ == "__main__":
    unittest.main()
