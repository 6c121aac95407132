"""The package's mapping, end to end, against the project's f64 reference (the C++
one, tools/reference, through libkdajit_reference_shim.so): each problem's call as
an engine passes it (padded rows, 1RHD / RHxD forms, FlashInfer's and vLLM's
shapes) is mapped by kdajit.dry_run (the prefill op: by the package's mapping,
kdajit._launch.prefill_args) and run by the reference; kda_testing.reference
runs the same reference on the problem's canonical views. Both must agree bit for
bit: the mapping points every view at the right elements."""
import itertools
import unittest

import torch
import kda_testing as kt

import kdajit
from kdajit import _abi


class MappingAgainstCanonicalViews(unittest.TestCase):
    def run_both(self, p, what):
        before = kt.snapshot(p)
        want_out, want_conv, want_state = kt.reference(before)
        if p.op == "prefill":
            kt.prefill_reference_call(**p.kwargs())
        else:
            fn = kdajit.fused_kda_decode if p.op == "single" else kdajit.packed_fused_kda_decode
            kt.run_reference(_abi.enum("op")[p.op], kdajit.dry_run(fn, **p.kwargs()))
        out = p.views["out" if p.op == "prefill" else "output"]
        self.assertFalse(bool(torch.isnan(out.float()).any()), f"{what}: an output element was not written")
        self.assertTrue(torch.equal(kt.bits(out.contiguous()), kt.bits(want_out.contiguous())), f"{what}: output")
        self.assertTrue(torch.equal(kt.bits(p.views["conv_state"]), kt.bits(want_conv)), f"{what}: conv_state")
        self.assertTrue(torch.equal(kt.bits(p.views["state"]), kt.bits(want_state)), f"{what}: state")
        # And the spec tolerances with it, as the GPU tests apply them.
        kt.check(self, p, before, p.args["out" if p.op == "prefill" else "output"], what)

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

    def test_prefill(self):
        cases = (
            dict(lengths=[5, 0, 3, 4], kinds=["live", "live", "null", "live"], initial=[1, 1, 1, 0]),
            dict(lengths=[70, 2], kinds=["live", "oob"], initial=None, rows_after=3),
            dict(lengths=[4, 6], taps=5, initial=[0, 1]),
            dict(lengths=[3, 3], qsl=[-1, 3, 7], rows=9, initial=[1, 1]),  # malformed first range
        )
        forms = ({}, {"raw_gate": "RHxD", "x": "1R", "A_log": "11H1", "output": "RHD"})
        for i, (kw, dtype, conv, gate) in enumerate(itertools.product(cases, (torch.float32, torch.bfloat16),
                                                                     ("sd", "ds"), ("bounded", "softplus"))):
            if i % 3:  # a third of the product, every case and option still covered
                continue
            p = kt.make_prefill_problem(2, state_dtype=dtype, conv=conv, gate=gate, seed=400 + i,
                                        forms=forms[i % 2], slot_pad=4 * (i % 2), **kw)
            self.run_both(p, f"prefill {kw} {dtype} {conv} {gate}")


if __name__ == "__main__":
    unittest.main()
