"""The Python float64 reference of the tests (kda_testing.reference) against the
project's C++ reference (tests/reference, through the kdajit_test_reference shim),
which runs on the host tensors through the exact kdajit_decode_args_t bytes that
kdajit.dry_run produces: this checks the Python reference (that the GPU tests use)
and, end to end, that the mapping points every view at the right elements."""
import ctypes
import itertools
import os
import unittest

import torch
import kda_testing as kt

import kdajit
from kdajit import _abi


def shim():
    path = os.environ.get("KDAJIT_TEST_REFERENCE")
    if not path:
        raise unittest.SkipTest("KDAJIT_TEST_REFERENCE (the reference shim CMake builds) is not set")
    lib = ctypes.CDLL(path)
    lib.kdajit_test_reference.restype = ctypes.c_int
    lib.kdajit_test_reference.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    return lib.kdajit_test_reference


def ulps_bf16(a, b):
    """Elementwise distance in bf16 ulps (same-sign values; 0 for equal bits)."""
    ia = a.view(torch.int16).to(torch.int32)
    ib = b.view(torch.int16).to(torch.int32)
    return (ia - ib).abs()


class AgainstCppReference(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ref = staticmethod(shim())

    def run_both(self, p, what):
        before = kt.snapshot(p)
        want_out, want_conv, want_state = kt.reference(before)
        fn = kdajit.fused_kda_decode if p.op == "single" else kdajit.packed_fused_kda_decode
        args = kdajit.dry_run(fn, **p.kwargs())
        msg = ctypes.create_string_buffer(512)
        status = self.ref(_abi.enum("op")[p.op], args, msg, len(msg))
        self.assertEqual(status, 0, f"{what}: C++ reference: {msg.value.decode()}")
        out = p.views["output"]
        self.assertFalse(bool(torch.isnan(out.float()).any()), f"{what}: an output element was not written")
        d = ulps_bf16(out.contiguous(), want_out.contiguous())
        # Both are f64 with the same rounding points: only the summation order
        # differs, which can move a value across a bf16 rounding boundary.
        self.assertLessEqual(int(d.max()), 1, f"{what}: output differs by {int(d.max())} bf16 ulps")
        self.assertLessEqual(int((d > 0).sum()), max(2, out.numel() // 200), f"{what}: output ulp flips")
        self.assertTrue(torch.equal(kt.bits(p.views["conv_state"]), kt.bits(want_conv)), f"{what}: conv_state")
        got_state = p.views["state"]
        if got_state.dtype == torch.float32:
            err = kt.rel_l2(got_state, want_state)
            self.assertLessEqual(err, 1e-6, f"{what}: state relative L2 {err:.3g}")
        else:
            d = ulps_bf16(got_state, want_state)
            self.assertLessEqual(int(d.max()), 1, f"{what}: bf16 state differs by {int(d.max())} ulps")
        # And the spec tolerances with it, as the GPU tests apply them.
        kt.check(self, p, before, p.args["output"], what)

    def test_single(self):
        cases = itertools.product((1, 3, 16), (torch.float32, torch.bfloat16), ("sd", "ds"), ("bounded", "softplus"))
        for i, (heads, dtype, conv, gate) in enumerate(cases):
            p = kt.make_problem("single", heads, 6, state_dtype=dtype, conv=conv, gate=gate, seed=100 + i,
                                null_rows=1, oob_rows=1, row_pad=8 * (i % 3), slot_pad=4 * (i % 2),
                                norm_eps=(1e-5, 1e-6)[i % 2])
            self.run_both(p, f"single H={heads} {dtype} {conv} {gate}")

    def test_single_modes_and_forms(self):
        for i, mode in enumerate(("unique_or_null", "positive_unique", "repeated_positive")):
            p = kt.make_problem("single", 2, 7, mode=mode, seed=200 + i,
                                forms={"raw_gate": "RHxD", "x": "1R", "A_log": "11H1", "output": "RHD"})
            self.run_both(p, f"single mode {mode}")

    def test_packed(self):
        cases = (
            dict(tokens=1, seqs=4, lengths=[1, 1, 0, 1]),
            dict(tokens=3, seqs=3, lengths=[3, 2, 1]),
            dict(tokens=4, seqs=4, lengths=[4, 0, 3, 2], null_rows=1),
            dict(tokens=2, seqs=3, lengths=[2, 2, 2], oob_rows=1),
            dict(tokens=5, seqs=2, lengths=[5, 1], accepted=[5, 1]),
        )
        for i, (kw, dtype, conv, gate) in enumerate(itertools.product(cases, (torch.float32, torch.bfloat16),
                                                                     ("sd", "ds"), ("bounded", "softplus"))):
            if i % 3:  # a third of the product keeps the test quick, every case and option still covered
                continue
            p = kt.make_problem("packed", 2, state_dtype=dtype, conv=conv, gate=gate, seed=300 + i, **kw)
            self.run_both(p, f"packed {kw} {dtype} {conv} {gate}")


if __name__ == "__main__":
    unittest.main()
