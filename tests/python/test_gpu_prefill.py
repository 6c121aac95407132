"""GPU tests of kdajit.fused_kda_prefill (CTest label gpu; the runner exits 77
without CUDA): the op against the float64 reference through the Python API
(kda_testing's prefill problems: ragged lengths around the 64-token chunk,
null and out-of-range slots, has_initial_state given, partly 0 or None, K = 5
conv pools, the accepted torch forms), the out-of-range counter, a side
stream, a CUDA graph replayed over other lengths, torch.compile and
torch.library.opcheck of its custom op.

KDAJIT_TEST_FAKE_DEVICE=1 runs the eager tests on the CPU with the C++
reference standing in for the kernels, after the library's own validation of
the same args bytes. A library built without the prefill op skips the file."""
import os
import unittest

import torch
import kda_testing as kt

import kdajit
from kdajit import _abi

FAKE = os.environ.get("KDAJIT_TEST_FAKE_DEVICE") == "1"
NEEDS_CUDA = "needs a CUDA device (KDAJIT_TEST_FAKE_DEVICE=1 runs only the eager tests)"

_lib = _abi.load()
if not (hasattr(_lib.lib, "kdajit_prefill_v1") or hasattr(_lib.lib, "kdajit_prefill")):
    raise unittest.SkipTest(f"{_lib.path} has no kdajit_prefill (built without the prefill op)")
if FAKE:
    kt.fake_launch("prefill", kt.run_prefill_reference)

DEV, _CACHE = kt.gpu_test_device(FAKE, "kdajit-gpu-prefill-tests-")


def sync():
    kt.sync_device(FAKE)


def problem(heads, lengths, **kw):
    return kt.make_prefill_problem(heads, lengths, device=DEV, **kw)


def run_and_check(tc, p, what, **override):
    before = kt.snapshot(p)
    out = p.call(kdajit, **override)
    sync()
    kt.check(tc, p, before, out, what)
    return out


class Eager(unittest.TestCase):
    def test_against_the_reference(self):
        ragged = dict(lengths=[65, 0, 130, 7, 1, 64, 9, 63], kinds=["live", "live", "live", "null", "live", "live",
                                                                    "oob", "live"],
                      initial=[0, 1, 1, 1, 0, 1, 1, 1], rows_after=3)
        cases = [
            dict(heads=16, **ragged),
            dict(heads=16, state_dtype=torch.bfloat16, conv="ds", **ragged),
            dict(heads=16, gate="softplus", slot_pad=8, **ragged),
            dict(heads=8, lengths=[200], initial=None),
            dict(heads=12, lengths=[70, 3], taps=5, state_dtype=torch.bfloat16, initial=[1, 0]),
            dict(heads=32, lengths=[1, 2, 3], forms={"raw_gate": "RHxD", "x": "1R", "A_log": "11H1",
                                                      "output": "RHD"}, initial=[1, 1, 0]),
            dict(heads=4, lengths=[3, 3], qsl=[-1, 3, 9], rows=9, initial=[1, 1]),  # malformed ranges: zeros
            dict(heads=24, lengths=[66, 5], output=False, initial=[1, 1]),  # out allocated: [1, T_total, H, 128]
        ]
        for i, kw in enumerate(cases):
            heads, lengths = kw.pop("heads"), kw.pop("lengths")
            with self.subTest(case=i, heads=heads, lengths=lengths):
                out = run_and_check(self, problem(heads, lengths, seed=7000 + i, **kw), f"case {i}")
                self.assertEqual(out.device.type, DEV)
                if kw.get("output") is False:
                    self.assertEqual(tuple(out.shape), (1, sum(lengths), heads, 128))

    def test_max_seq_len_hints(self):
        # The hint steers the route choice only: 0 (T_total), one below the longest sequence, an exact one.
        for hint in (0, 1, 100, 130):
            p = problem(16, [130, 20], initial=[1, 0], seed=7100 + hint)
            run_and_check(self, p, f"max_seq_len {hint}", max_seq_len=hint)

    @unittest.skipIf(FAKE, NEEDS_CUDA)
    def test_a_workspace_lets_the_selector_pick_twopass(self):
        # A prompt of 128 tokens or more (1100) at H = 2: with a workspace of prefill_workspace_bytes the
        # selector picks the two-kernel route, which must match the reference; a workspace one byte short, or none,
        # keeps a fused route. The workspace starts as NaN bytes and is reused by the second call.
        H, lengths = 2, [1100, 40]
        size = kdajit.prefill_workspace_bytes(len(lengths), sum(lengths), H)
        self.assertEqual(size, (2 + 18) * H * 148096)
        ws = torch.full((size,), 0xFF, dtype=torch.uint8, device=DEV)
        for i in range(2):
            p = problem(H, lengths, initial=[1, 0], seed=7250 + i)
            key = kdajit.selected_key(kdajit.fused_kda_prefill, **p.kwargs(workspace=ws))
            self.assertTrue(key.endswith(".route_twopass." + key.split(".")[-1]), key)
            run_and_check(self, p, f"twopass, call {i}", workspace=ws)
        p = problem(H, lengths, initial=[1, 0], seed=7252)
        short = kdajit.selected_key(kdajit.fused_kda_prefill, **p.kwargs(workspace=ws[:size - 1]))
        self.assertNotIn("route_twopass", short)
        self.assertNotIn("route_twopass", kdajit.selected_key(kdajit.fused_kda_prefill, **p.kwargs()))
        other = torch.empty(size, dtype=torch.uint8)  # on the host: named before the library is asked
        with self.assertRaises(ValueError) as cm:
            kdajit.fused_kda_prefill(**p.kwargs(workspace=other))
        self.assertTrue(str(cm.exception).startswith("workspace: expected a tensor on"), str(cm.exception))

    @unittest.skipIf(FAKE, NEEDS_CUDA)
    def test_oob_counter_counts_out_of_range_sequences(self):
        p = problem(8, [5, 6, 0, 4], kinds=["oob", "live", "live", "oob"], initial=[1, 1, 1, 1], seed=7200)
        counter = torch.zeros(1, dtype=torch.int32, device=DEV)
        run_and_check(self, p, "oob_counter", oob_counter=counter)
        self.assertEqual(int(counter.item()), 2)

    @unittest.skipIf(FAKE, NEEDS_CUDA)
    def test_side_stream(self):
        p = problem(8, [70, 10], initial=[1, 1], seed=7300)
        kt.run_on_side_stream_and_check(self, p, "side stream")


@unittest.skipIf(FAKE, NEEDS_CUDA)
class Graphs(unittest.TestCase):
    def test_graph_replays_other_lengths_and_slots(self):
        # Captured with one batch and hint; replayed over other lengths in the same buffers.
        H, R = 8, 200
        p = problem(H, [100, 100], initial=[1, 1], seed=7400)
        p.call(kdajit, max_seq_len=100)  # compiles and caches the kernel before capture
        sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            p.call(kdajit, max_seq_len=100)
        S = p.views["state"].shape[0]
        for i, (qsl, initial) in enumerate((([0, 200, 200], [1, 1]), ([0, 1, 150], [0, 1]), ([0, 64, 129], [1, 0]))):
            p.views["query_start_loc"].copy_(torch.tensor(qsl, dtype=torch.int32))
            p.views["has_initial_state"].copy_(torch.tensor(initial, dtype=torch.int32))
            p.views["state_indices"].copy_(torch.tensor([1 + i % (S - 1), S - 1 - i % (S - 2)], dtype=torch.int32))
            p.views["out"].fill_(float("nan"))
            sync()
            before = kt.snapshot(p)
            g.replay()
            sync()
            kt.check(self, p, before, p.args["out"], f"replay {i}: qsl {qsl}, {R} rows")


@unittest.skipIf(FAKE, NEEDS_CUDA)
@unittest.skipUnless(kdajit.HAS_CUSTOM_OPS, "torch.library.custom_op needs torch >= 2.4")
class CustomOp(unittest.TestCase):
    def test_torch_compile_matches_the_reference(self):
        import torch._dynamo

        torch._dynamo.reset()
        p = problem(4, [70, 3], initial=[1, 0], seed=7600)
        before = kt.snapshot(p)
        kw = p.kwargs()
        rest = {k: v for k, v in kw.items() if k != "x"}

        def step(x):
            return kdajit.fused_kda_prefill(x, **rest)

        out = torch.compile(step, fullgraph=True)(kw["x"])
        sync()
        kt.check(self, p, before, out, "torch.compile")

    def test_opcheck(self):
        if not hasattr(torch.library, "opcheck"):
            self.skipTest("torch.library.opcheck needs torch >= 2.4")
        p = problem(4, [70, 3], initial=[1, 0], seed=7500)
        p.call(kdajit)  # compile first
        kw = p.kwargs(output=p.args["out"], max_seq_len=0, oob_counter=torch.zeros(1, dtype=torch.int32, device=DEV),
                      workspace=None)
        order = ("x", "conv_weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias", "state_indices",
                 "state", "output_gate", "norm_weight", "query_start_loc", "has_initial_state", "gate", "lower_bound",
                 "norm_eps", "max_seq_len", "output", "oob_counter", "workspace")
        torch.library.opcheck(torch.ops.kdajit.fused_kda_prefill.default, tuple(kw[k] for k in order))


if __name__ == "__main__":
    unittest.main()
