"""GPU tests of the Python package (CTest label gpu; the runner exits 77 without
CUDA): both ops against the float64 reference through the Python API, eager, on
a side stream, in CUDA graphs replayed with other metadata, the compile-during-
capture error, torch.compile of a module that calls the op, torch.library.opcheck,
and contract violations on CUDA tensors (nothing written).

The process runtime uses a fresh kernel cache directory (every run compiles the
keys it needs, so the capture test really finds its key missing).

KDAJIT_TEST_FAKE_DEVICE=1 runs the eager and error tests on the CPU with the
project's C++ reference standing in for the kernels (after the library's own
validation of the same args bytes): CI thereby runs this file's problem
building, mapping and checking logic, which the real GPU run depends on."""
import itertools
import os
import unittest

import torch
import kda_testing as kt

import kdajit
from kdajit import _abi, _launch

FAKE = os.environ.get("KDAJIT_TEST_FAKE_DEVICE") == "1"
NEEDS_CUDA = "needs a CUDA device (KDAJIT_TEST_FAKE_DEVICE=1 runs only the eager and error tests)"

if FAKE:
    def _reference_launch(fn_index, op, args, mapping):
        c = _launch._c or _launch._bind()
        status = c[2](fn_index, args)  # the library's validation, as the real entry points run it
        if status:
            raise _launch._fail(status, op, mapping)
        kt.run_reference(fn_index, args)  # fn_index: 0 single, 1 packed (kdajit_op_t)

    _launch._allow_host_tensors = True
    _launch._launch = _reference_launch

DEV, _CACHE = kt.gpu_test_device(FAKE, "kdajit-gpu-tests-")


def sync():
    kt.sync_device(FAKE)


def capture(call):
    """A CUDA graph of call() (already warmed up) and its replay; with the fake
    device, replay simply calls again (the metadata logic is what CI checks)."""
    if FAKE:
        return call
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    return g.replay


def gpu_problem(*args, **kwargs):
    return kt.make_problem(*args, device=DEV, **kwargs)


def run_and_check(tc, p, what):
    before = kt.snapshot(p)
    out = p.call(kdajit)
    sync()
    kt.check(tc, p, before, out, what)
    return out


class Eager(unittest.TestCase):
    def test_single(self):
        cases = [
            dict(heads=1, rows=1),
            dict(heads=8, rows=5, null_rows=1, oob_rows=1),
            dict(heads=7, rows=9, state_dtype=torch.bfloat16, conv="ds", null_rows=2),
            dict(heads=16, rows=33, gate="softplus", norm_eps=1e-6, slot_pad=8),
            dict(heads=64, rows=4, state_dtype=torch.bfloat16, gate="softplus", row_pad=0),
            dict(heads=128, rows=2, conv="ds"),
            dict(heads=4, rows=6, mode="repeated_positive"),
            dict(heads=4, rows=6, mode="positive_unique", forms={"raw_gate": "RHxD", "x": "1R", "A_log": "11H1"}),
            dict(heads=12, rows=3, output=False),  # output allocated: [1, R, H, 128]
        ]
        for i, kw in enumerate(cases):
            heads, rows = kw.pop("heads"), kw.pop("rows")
            with self.subTest(**{k: str(v) for k, v in kw.items()}, heads=heads, rows=rows):
                out = run_and_check(self, gpu_problem("single", heads, rows, seed=1000 + i, **kw), f"case {i}")
                self.assertEqual(out.device.type, DEV)

    def test_packed(self):
        cases = [
            dict(heads=8, tokens=1, seqs=4, lengths=[1, 1, 0, 1]),
            dict(heads=8, tokens=4, seqs=3, lengths=[4, 2, 3], null_rows=1),
            dict(heads=5, tokens=3, seqs=4, lengths=[3, 0, 1, 2], state_dtype=torch.bfloat16, conv="ds"),
            dict(heads=16, tokens=2, seqs=5, lengths=[2] * 5, gate="softplus", oob_rows=1),
            dict(heads=32, tokens=16, seqs=2, lengths=[16, 7], accepted=[16, 3]),
            dict(heads=3, tokens=4, seqs=3, lengths=[4, 4, 4], output=False),
        ]
        for i, kw in enumerate(cases):
            heads = kw.pop("heads")
            with self.subTest(case=i):
                run_and_check(self, gpu_problem("packed", heads, seed=2000 + i, **kw), f"packed case {i}")

    @unittest.skipIf(FAKE, NEEDS_CUDA)
    def test_side_stream_and_current_device(self):
        kt.run_on_side_stream_and_check(self, gpu_problem("single", 8, 6, seed=3000), "side stream")

    def test_second_device(self):
        if FAKE or torch.cuda.device_count() < 2:
            self.skipTest("one CUDA device")
        p = kt.make_problem("single", 4, 3, device="cuda:1", seed=3100)
        before = kt.snapshot(p)
        with torch.cuda.device(0):  # the op follows the tensors, not the current device
            out = p.call(kdajit)
        torch.cuda.synchronize(1)
        kt.check(self, p, before, out, "cuda:1")


@unittest.skipIf(FAKE, NEEDS_CUDA)
class Hotpath(unittest.TestCase):
    """Calls after the first of a layout take kdajit._hotpath (the C++ cache-hit
    path): same results, the same errors, nothing written by a rejected call."""

    def setUp(self):
        info = kdajit.hotpath_info()
        if not info["enabled"] and not (info["path"] and os.path.exists(info["path"])):
            self.skipTest(f"kdajit._hotpath not built: {info['reason']}")
        self.assertTrue(info["enabled"], info)  # built but not loaded: a failure, not a skip
        self.hot = _launch._hot_module

    def calls(self, op):
        return self.hot.stats()[op]

    def test_second_call_of_a_layout_takes_the_hotpath_and_matches_the_reference(self):
        for op, make in (("single", lambda seed: gpu_problem("single", 16, 7, seed=seed, null_rows=1, oob_rows=1)),
                         ("packed", lambda seed: gpu_problem("packed", 8, tokens=3, seqs=4, lengths=[3, 1, 0, 2],
                                                             seed=seed))):
            run_and_check(self, make(4000), f"{op}: first call (Python path)")
            for seed in (4001, 4002):
                n = self.calls(op)
                run_and_check(self, make(seed), f"{op}: call with new tensors of the same layout")
                self.assertEqual(self.calls(op), n + 1, f"{op}: the call went through kdajit._hotpath")
            # On a side stream too (the stream is read per call).
            p = make(4003)
            n = self.calls(op)
            kt.run_on_side_stream_and_check(self, p, f"{op}: side stream, _hotpath")
            self.assertEqual(self.calls(op), n + 1)

    def test_a_rejected_call_raises_as_the_python_path_does_and_writes_nothing(self):
        p = gpu_problem("single", 4, 3, seed=4100)
        run_and_check(self, p, "first call")
        q = gpu_problem("single", 4, 3, seed=4101)
        sync()
        before = {k: kt.bits(v).clone() for k, v in q.mutables().items()}
        n = self.calls("single")
        with self.assertRaises(ValueError) as cm:
            q.call(kdajit, lower_bound=0.5)
        self.assertEqual(self.calls("single"), n + 1, "the C call was made from kdajit._hotpath")
        self.assertTrue(str(cm.exception).startswith("lower_bound: expected a finite value < 0"), str(cm.exception))
        sync()
        for k, v in before.items():
            self.assertTrue(torch.equal(kt.bits(q.mutables()[k]), v), f"{k} was written by a rejected call")


class Graphs(unittest.TestCase):
    def test_single_graph_replays_other_slots_and_inputs(self):
        H, R = 8, 6
        p = gpu_problem("single", H, R, seed=4000, null_rows=1)
        self.assertIs(p.call(kdajit), p.args["output"])  # compiles and caches the kernel before capture
        sync()
        replay = capture(lambda: p.call(kdajit))
        gen = torch.Generator().manual_seed(4001)
        S = p.views["state"].shape[0]
        for i in range(3):
            # New metadata and inputs in the captured buffers: other slots, other nulls.
            slots = (torch.randperm(S - 1, generator=gen)[:R] + 1).to(torch.int32)
            slots[i % R] = 0
            slots[(i + 3) % R] = -1 if i % 2 else S + 2  # a null or an out-of-range row
            p.views["state_indices"].copy_(slots)
            p.views["x"].copy_(torch.randn(p.views["x"].shape, generator=gen).to(torch.bfloat16))
            p.views["raw_gate"].copy_(torch.randn(p.views["raw_gate"].shape, generator=gen).to(torch.bfloat16))
            p.views["output"].fill_(float("nan"))
            sync()
            before = kt.snapshot(p)
            replay()
            sync()
            kt.check(self, p, before, p.args["output"], f"replay {i}")

    def test_packed_graph_replays_other_lengths_and_accepted_tokens(self):
        H, T, N = 8, 3, 4
        p = gpu_problem("packed", H, tokens=T, seqs=N, lengths=[T] * N, seed=5000)
        p.call(kdajit)
        sync()
        replay = capture(lambda: p.call(kdajit))
        for i, (lengths, accepted) in enumerate((([3, 1, 0, 2], [1, 3, 2, 1]), ([1, 1, 1, 1], [2, 2, 2, 2]),
                                                     ([3, 3, 3, 3], [3, 1, 1, 3]))):
            qsl = [0]
            for L in lengths:
                qsl.append(qsl[-1] + L)
            p.views["query_start_loc"].copy_(torch.tensor(qsl, dtype=torch.int32))
            p.views["num_accepted_tokens"].copy_(torch.tensor(accepted, dtype=torch.int32))
            p.views["output"].fill_(float("nan"))
            sync()
            before = kt.snapshot(p)
            replay()
            sync()
            kt.check(self, p, before, p.args["output"], f"packed replay {i} lengths {lengths}")

    @unittest.skipIf(FAKE, NEEDS_CUDA)
    def test_capture_of_an_uncached_kernel_fails_before_anything_runs(self):
        # A configuration no other test uses: its kernel is not in this run's fresh cache.
        p = gpu_problem("packed", 11, tokens=7, seqs=2, lengths=[7, 5], state_dtype=torch.bfloat16, conv="ds",
                        gate="softplus", seed=6000)
        torch.cuda.synchronize()
        state_before = kt.bits(p.views["state"]).clone()
        conv_before = kt.bits(p.views["conv_state"]).clone()
        g = torch.cuda.CUDAGraph()
        with self.assertRaises(kdajit.KdajitError) as cm:
            with torch.cuda.graph(g):
                p.call(kdajit)
        self.assertEqual(cm.exception.status, _abi.ERROR_CAPTURE, str(cm.exception))
        self.assertIn("kda_packed.h11.state_bf16.conv_ds.t7.gate_softplus", str(cm.exception))
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(kt.bits(p.views["state"]), state_before))
        self.assertTrue(torch.equal(kt.bits(p.views["conv_state"]), conv_before))
        # Outside a capture the same call compiles and runs.
        run_and_check(self, p, "after the failed capture")

    @unittest.skipIf(FAKE, NEEDS_CUDA)
    def test_prewarm_then_capture(self):
        keys = kdajit.keys_for(13, op="packed", tokens=5, state_dtype="f32", conv_layout="sd")
        results = kdajit.prewarm(keys, strict=True)
        self.assertEqual({r.status for r in results}, {"compiled"})
        p = gpu_problem("packed", 13, tokens=5, seqs=3, lengths=[5, 4, 1], seed=6100)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # no eager call first: the pre-warmed cache alone serves the capture
            p.call(kdajit)
        p.views["output"].fill_(float("nan"))
        torch.cuda.synchronize()
        before = kt.snapshot(p)
        g.replay()
        torch.cuda.synchronize()
        kt.check(self, p, before, p.args["output"], "prewarmed capture")


class Decode(torch.nn.Module):
    """A layer that owns the weights and the cache pools and calls the op (a
    small stand-in for an engine's attention module)."""

    def __init__(self, p, conv_as_view):
        super().__init__()
        v = p.views
        self.weight = torch.nn.Parameter(v["weight"].clone(), requires_grad=False)
        self.A_log = torch.nn.Parameter(v["A_log"].clone().view(1, 1, -1, 1), requires_grad=False)
        self.dt_bias = torch.nn.Parameter(v["dt_bias"].clone(), requires_grad=False)
        self.norm_weight = torch.nn.Parameter(v["norm_weight"].clone(), requires_grad=False)
        self.conv_as_view = conv_as_view
        # Every buffer is a copy the module owns: two modules made from one problem
        # must not share a pool. (`.contiguous()` of the SD view's transpose is that
        # view itself, since it is already contiguous: the eager and the compiled
        # module of the compile test once shared one conv pool, so the second call
        # of a step read the history the first had already advanced.)
        if conv_as_view:  # vLLM: a [S, K, qkv] pool seen as [S, qkv, K] (SD strides)
            self.register_buffer("conv_pool", kt.copy_strided(v["conv_state"].transpose(1, 2)))
        else:
            self.register_buffer("conv_pool", kt.copy_strided(v["conv_state"]))
        self.register_buffer("state", kt.copy_strided(v["state"]))
        self.lower_bound = p.lower_bound

    def conv_state(self):
        return self.conv_pool.transpose(1, 2) if self.conv_as_view else self.conv_pool

    def forward(self, x, raw_gate, raw_beta, output_gate, state_indices):
        return kdajit.fused_kda_decode(x, self.weight, self.conv_state(), raw_gate, raw_beta, self.A_log,
                                       self.dt_bias, state_indices, self.state, output_gate, self.norm_weight,
                                       lower_bound=self.lower_bound)


def decode_inputs(step):
    """The per-step inputs of a Decode module (H = 8, R = 5) and their problem."""
    q = gpu_problem("single", 8, 5, seed=7100 + step, conv="sd", null_rows=step % 2)
    return q, (q.args["x"], q.args["raw_gate"], q.args["raw_beta"], q.args["output_gate"], q.args["state_indices"])


def assert_own_storage(tc, a, b):
    """Modules a and b share no storage (a buffer or parameter of one is no view of the other's)."""
    theirs = {kt._storage_key(t): n for n, t in itertools.chain(b.named_buffers(), b.named_parameters())}
    for n, t in itertools.chain(a.named_buffers(), a.named_parameters()):
        tc.assertNotIn(kt._storage_key(t), theirs, f"{n} shares its storage with the other module's "
                                                   f"{theirs.get(kt._storage_key(t))}")


class Modules(unittest.TestCase):
    def test_two_modules_of_one_problem_own_their_pools_and_agree(self):
        # The compile test's control, without torch.compile: two Decode modules of one
        # problem, called with the same inputs, give the same bits (and the reference's).
        for conv_as_view in (True, False):
            with self.subTest(conv_as_view=conv_as_view):
                p = gpu_problem("single", 8, 5, seed=7000, conv="sd" if conv_as_view else "ds", null_rows=1)
                a, b = Decode(p, conv_as_view).to(DEV), Decode(p, conv_as_view).to(DEV)
                assert_own_storage(self, a, b)
                if conv_as_view:
                    self.assertEqual(a.conv_state().stride()[1:], (1, 3 * 8 * 128))  # SD, as the test means
                for step in range(2):
                    q, args = decode_inputs(step)
                    views = dict(q.views, weight=a.weight, conv_state=a.conv_state(), A_log=a.A_log.view(-1),
                                 dt_bias=a.dt_bias, state=a.state, norm_weight=a.norm_weight)
                    r = kt.Problem("single", dict(q.args, **views), views, a.lower_bound, 1e-5)
                    before = kt.snapshot(r)
                    want = a(*args)
                    got = b(*args)
                    sync()
                    kt.check(self, r, before, want, f"step {step}")
                    self.assertTrue(torch.equal(kt.bits(got), kt.bits(want)), f"step {step}: output")
                    self.assertTrue(torch.equal(kt.bits(b.state), kt.bits(a.state)), f"step {step}: state")
                    self.assertTrue(torch.equal(kt.bits(b.conv_pool), kt.bits(a.conv_pool)), f"step {step}: conv")


@unittest.skipIf(FAKE, NEEDS_CUDA)
@unittest.skipUnless(kdajit.HAS_CUSTOM_OPS, "torch.library.custom_op needs torch >= 2.4")
class Compile(unittest.TestCase):
    def test_torch_compile_of_a_module_matches_eager(self):
        import torch._dynamo

        for conv_as_view in (True, False):
            with self.subTest(conv_as_view=conv_as_view):
                torch._dynamo.reset()
                p = gpu_problem("single", 8, 5, seed=7000, conv="sd" if conv_as_view else "ds", null_rows=1)
                eager, compiled_m = Decode(p, conv_as_view).to(DEV), Decode(p, conv_as_view).to(DEV)
                assert_own_storage(self, eager, compiled_m)
                compiled = torch.compile(compiled_m, fullgraph=True)
                for step in range(3):
                    q, args = decode_inputs(step)
                    want = eager(*args)
                    got = compiled(*args)
                    torch.cuda.synchronize()
                    self.assertEqual(tuple(got.shape), (1, 5, 8, 128))
                    self.assertTrue(torch.equal(kt.bits(got), kt.bits(want)), f"step {step}: output")
                    self.assertTrue(torch.equal(kt.bits(compiled_m.state), kt.bits(eager.state)), f"step {step}")
                    self.assertTrue(torch.equal(kt.bits(compiled_m.conv_pool), kt.bits(eager.conv_pool)),
                                    f"step {step}: conv")

    def test_opcheck(self):
        if not hasattr(torch.library, "opcheck"):
            self.skipTest("torch.library.opcheck needs torch >= 2.4")
        p = gpu_problem("single", 4, 3, seed=7300)
        p.call(kdajit)  # compile first
        kw = p.kwargs()
        order = ("x", "weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias", "state_indices", "state",
                 "output_gate", "norm_weight", "lower_bound", "norm_eps", "output", "state_indices_mode")
        torch.library.opcheck(torch.ops.kdajit.fused_kda_decode.default, tuple(kw[k] for k in order))
        q = gpu_problem("packed", 4, tokens=2, seqs=2, seed=7301)
        q.call(kdajit)
        kw = q.kwargs()
        order = order[:-1] + ("query_start_loc", "num_accepted_tokens")
        torch.library.opcheck(torch.ops.kdajit.packed_fused_kda_decode.default, tuple(kw[k] for k in order))


class ErrorsOnTheDevice(unittest.TestCase):
    def test_violations_raise_before_launch_and_write_nothing(self):
        p = gpu_problem("single", 4, 5, seed=8000)
        p.call(kdajit)
        sync()
        snapshot = {k: kt.bits(v).clone() for k, v in p.mutables().items()}
        bad = [
            ("x", p.args["x"].float(), ValueError),
            ("state", p.args["state"][:, :3], ValueError),
            ("lower_bound", 0.5, ValueError),
            ("A_log", torch.zeros(200, device=DEV), NotImplementedError),
        ]
        if not FAKE:
            bad.append(("dt_bias", p.args["dt_bias"].cpu(), ValueError))  # a host tensor among CUDA ones
        for name, value, exc in bad:
            with self.assertRaises(exc, msg=name) as cm:
                p.call(kdajit, **{name: value})
            self.assertTrue(str(cm.exception).startswith(name), str(cm.exception))
        sync()
        for k, before in snapshot.items():
            self.assertTrue(torch.equal(kt.bits(p.mutables()[k]), before), f"{k} was written")

    @unittest.skipIf(FAKE, NEEDS_CUDA)
    def test_support_query_reads_the_device(self):
        s = kdajit.supported(64)  # arch None: this device's
        major, minor = torch.cuda.get_device_capability()
        if major * 10 + minor >= 90:
            self.assertTrue(s, s.reason)
        key = kdajit.key_for(64)
        self.assertTrue(key.startswith("kda_single.h64.state_f32.conv_sd.t1.gate_bounded."), key)
        self.assertTrue(key.endswith(f".sm_{major}{minor}a") or key.endswith(f".sm_{major}{minor}"), key)

    @unittest.skipIf(FAKE, NEEDS_CUDA)
    def test_selected_key_is_the_key_for_that_call(self):
        for rows in (1, 4, 64):
            p = gpu_problem("single", 16, rows, seed=8100 + rows)
            key = kdajit.selected_key(kdajit.fused_kda_decode, **p.kwargs())
            self.assertEqual(key, kdajit.key_for(16, rows=rows), rows)
            self.assertIn(key, kdajit.keys_for(16))
        q = gpu_problem("packed", 16, tokens=3, seqs=5, seed=8200)
        key = kdajit.selected_key("packed_fused_kda_decode", **q.kwargs())
        self.assertEqual(key, kdajit.key_for(16, rows=5, op="packed", tokens=3))


if __name__ == "__main__":
    unittest.main()
