"""GPU tests of kdajit.chunk_kda (CTest label gpu; the runner exits 77 without
CUDA): the op against the float64 token-by-token recurrence (kda_testing's
chunk_reference) on FLA's argument forms (varlen [1, T, H, 128] with int64 or
int32 cu_seqlens and sequences of 0, under one chunk and over one chunk; [B, T,
H, 128] without cu_seqlens; [T, H, 128]; f32 and bf16 states, [k, v] and [v, k]
layouts, in place; both gates, f32 g and beta, no dt_bias, q/k pre-normalised),
the max_seq_len hint, a side stream, CUDA graphs replayed over other inputs
and lengths, torch.compile and torch.library.opcheck of its custom op; and,
where FLA's chunk_kda is importable (a folder holding the fla/ package built
by shared/peers/fla_chunk_kda/make.sh: $KDAJIT_FLA, else .peers in the source
tree), the same call to both within o rel 5e-3 and state rel 2e-3 (f32).

KDAJIT_TEST_FAKE_DEVICE=1 runs the eager tests on the CPU with the f64
reference standing in for the kernel (run on the kdajit_chunk_args_t bytes,
after the library's validation of them where the library has the chunk op):
CI runs the problems, the mapping and the checks. Otherwise a library without
the chunk op skips the file."""
import os
import unittest

import torch
import kda_testing as kt

import kdajit
from kdajit import _abi

D = 128
FAKE = os.environ.get("KDAJIT_TEST_FAKE_DEVICE") == "1"
NEEDS_CUDA = "needs a CUDA device (KDAJIT_TEST_FAKE_DEVICE=1 runs only the eager tests)"

_lib = _abi.load()
_HAS_CHUNK = hasattr(_lib.lib, "kdajit_chunk_v1")
if not _HAS_CHUNK and not FAKE:
    raise unittest.SkipTest(f"{_lib.path} has no kdajit_chunk_v1 (the chunk op is not in this build)")
if FAKE:
    kt.fake_launch("chunk", kt.run_chunk_args_reference, validate=_HAS_CHUNK)

DEV, _CACHE = kt.gpu_test_device(FAKE, "kdajit-gpu-chunk-tests-")


def sync():
    kt.sync_device(FAKE)


def problem(heads, lengths, **kw):
    return kt.make_chunk_problem(heads, lengths, device=DEV, **kw)


def host_copy(kw):
    """The arguments as they are before the call, on the CPU (the reference's input)."""
    return {k: (v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


def run_and_check(tc, kw, what, **extra):
    before = host_copy(kw)
    o, ht = kdajit.chunk_kda(**kw, **extra)
    sync()
    errs = kt.check_chunk(tc, before, o, ht, what)
    return o, ht, errs


def before_n(kw):
    """The sequences of a call's arguments (N of cu_seqlens, else the batch)."""
    cu = kw.get("cu_seqlens")
    return range(cu.shape[0] - 1 if cu is not None else kw["q"].shape[0])


def l2_normalised(t):
    x = t.float()
    return (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)).to(t.dtype)


class Eager(unittest.TestCase):
    def test_against_the_f64_reference(self):
        ragged = [65, 0, 130, 7, 1, 64]
        cases = [
            dict(heads=16, lengths=ragged),
            dict(heads=16, lengths=ragged, state_dtype=torch.bfloat16, gate="softplus", cu_dtype=torch.int32),
            dict(heads=8, lengths=[70], form="batch", batch=3, initial=False),
            dict(heads=4, lengths=[200], form="3d", g_dtype=torch.float32, beta_dtype=torch.float32, dt_bias=False,
                 flags=dict(state_v_first=True, scale=0.3)),
            dict(heads=32, lengths=[1, 2, 3], flags=dict(use_qk_l2norm_in_kernel=False)),
            dict(heads=12, lengths=[129, 63], state_dtype=torch.bfloat16, flags=dict(state_v_first=True)),
            dict(heads=16, lengths=[64, 1], form="batch", batch=2, gate="softplus"),
            dict(heads=8, lengths=[300, 129], slow_decay=True),  # the state carried over chunks shows
            dict(heads=8, lengths=[257], form="batch", batch=2, gate="softplus", slow_decay=True,
                 state_dtype=torch.bfloat16),
        ]
        for i, case in enumerate(cases):
            case = dict(case)
            heads, lengths, flags = case.pop("heads"), case.pop("lengths"), case.pop("flags", {})
            with self.subTest(case=i, heads=heads, lengths=lengths):
                kw = problem(heads, lengths, seed=8000 + i, **case)
                kw.update(flags)
                if not kw["use_qk_l2norm_in_kernel"]:
                    kw["q"], kw["k"] = l2_normalised(kw["q"]), l2_normalised(kw["k"])
                if not kw["use_beta_sigmoid_in_kernel"]:
                    kw["beta"] = torch.sigmoid(kw["beta"])
                o, ht, errs = run_and_check(self, kw, f"case {i}")
                self.assertEqual((o.device.type, ht.device.type), (DEV, DEV))
                self.assertEqual((tuple(o.shape), tuple(ht.shape)), (tuple(kw["q"].shape), (len(before_n(kw)),
                                                                                              heads, D, D)))
                print(f"case {i}: H {heads} lengths {lengths}: o rel {errs[0]:.2e}, state rel {errs[1]:.2e}")

    def test_in_place_and_given_outputs(self):
        kw = problem(8, [100, 30])
        state = kw["initial_state"]
        out = torch.empty(130, 8, D, dtype=torch.bfloat16, device=DEV)
        o, ht, _ = run_and_check(self, kw, "in place", final_state=state, out=out)
        self.assertIs(ht, state)
        self.assertIs(o, out)

    def test_no_final_state(self):
        kw = problem(8, [100, 30])
        kw["output_final_state"] = False
        before = host_copy(kw)
        o, ht = kdajit.chunk_kda(**kw)
        sync()
        self.assertIsNone(ht)
        kt.check_chunk(self, before, o, None, "no final state")
        self.assertTrue(torch.equal(kw["initial_state"].cpu(), before["initial_state"]), "initial_state was written")

    @unittest.skipIf(FAKE, NEEDS_CUDA)
    def test_a_workspace_lets_the_selector_pick_twopass(self):
        # A sequence of 128 tokens or more (1100) at H = 2 with a workspace of prefill_workspace_bytes: the
        # two-kernel route, against the reference, twice on the same (at first NaN) workspace.
        H, lengths = 2, [1100, 40]
        ws = torch.full((kdajit.prefill_workspace_bytes(2, 1140, H),), 0xFF, dtype=torch.uint8, device=DEV)
        for i in range(2):
            kw = problem(H, lengths, seed=8150 + i)
            key = kdajit.selected_key(kdajit.chunk_kda, **kw, workspace=ws)
            self.assertIn(".route_twopass.", key)
            run_and_check(self, kw, f"twopass, call {i}", workspace=ws)
        kw = problem(H, lengths, seed=8152)
        self.assertNotIn(".route_twopass.", kdajit.selected_key(kdajit.chunk_kda, **kw))

    def test_max_seq_len_hints(self):
        for hint in (0, 1, 100, 130, 4096):
            kw = problem(16, [130, 20], seed=8100 + hint)
            run_and_check(self, kw, f"max_seq_len {hint}", max_seq_len=hint)
        kw = problem(16, [130, 20], seed=8199)
        run_and_check(self, kw, "cu_seqlens_cpu", cu_seqlens_cpu=kw["cu_seqlens"].cpu())

    @unittest.skipIf(FAKE, NEEDS_CUDA)
    def test_side_stream(self):
        kw = problem(8, [70, 10], seed=8200)
        before = host_copy(kw)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            o, ht = kdajit.chunk_kda(**kw)
        s.synchronize()
        kt.check_chunk(self, before, o, ht, "side stream")


@unittest.skipIf(FAKE, NEEDS_CUDA)
class Graphs(unittest.TestCase):
    def test_equal_lengths_graph_replays_new_inputs(self):
        # No cu_seqlens: the [B+1] offsets are made by the warm-up call and kept.
        kw = problem(8, [100], form="batch", batch=2, seed=8300)
        o, ht = kdajit.chunk_kda(**kw)  # compiles and caches the kernel and the offsets before capture
        sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            o, ht = kdajit.chunk_kda(**kw)
        for i in range(3):
            fresh = problem(8, [100], form="batch", batch=2, seed=8310 + i)
            for name in ("q", "k", "v", "g", "beta", "initial_state"):
                kw[name].copy_(fresh[name])
            o.fill_(float("nan"))
            sync()
            before = host_copy(kw)
            g.replay()
            sync()
            kt.check_chunk(self, before, o, ht, f"replay {i}")

    def test_varlen_graph_replays_other_lengths(self):
        kw = problem(8, [100, 100], cu_dtype=torch.int32, seed=8400)
        kdajit.chunk_kda(**kw, max_seq_len=200)
        sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            o, ht = kdajit.chunk_kda(**kw, max_seq_len=200)
        for i, cu in enumerate(([0, 200, 200], [0, 1, 150], [0, 64, 129])):
            kw["cu_seqlens"].copy_(torch.tensor(cu, dtype=torch.int32))
            o.fill_(float("nan"))
            sync()
            before = host_copy(kw)
            g.replay()
            sync()
            # Rows past cu_seqlens[N] belong to no sequence: zeros, as the reference's.
            kt.check_chunk(self, before, o, ht, f"replay {i}: cu_seqlens {cu}")


@unittest.skipIf(FAKE, NEEDS_CUDA)
@unittest.skipUnless(kdajit.HAS_CUSTOM_OPS, "torch.library.custom_op needs torch >= 2.4")
class CustomOp(unittest.TestCase):
    def test_torch_compile_matches_the_reference(self):
        import torch._dynamo

        torch._dynamo.reset()
        kw = problem(4, [70, 3], seed=8500)
        before = host_copy(kw)
        rest = {k: v for k, v in kw.items() if k != "q"}

        def step(q):
            return kdajit.chunk_kda(q, **rest)

        o, ht = torch.compile(step, fullgraph=True)(kw["q"])
        sync()
        kt.check_chunk(self, before, o, ht, "torch.compile")

    def test_opcheck(self):
        if not hasattr(torch.library, "opcheck"):
            self.skipTest("torch.library.opcheck needs torch >= 2.4")
        kw = problem(4, [70, 3], cu_dtype=torch.int32, seed=8600)
        o, ht = kdajit.chunk_kda(**kw)  # compile first
        args = (kw["q"], kw["k"], kw["v"], kw["g"], kw["beta"], kw["A_log"], kw["dt_bias"], kw["initial_state"],
                kw["cu_seqlens"], "bounded", -5.0, D ** -0.5, True, True, False, 0, o, ht, False, None)
        torch.library.opcheck(torch.ops.kdajit.chunk_kda.default, args)


def _find_fla():
    """FLA's chunk_kda, or the reason it is not importable here."""
    folder = os.environ.get("KDAJIT_FLA") or os.path.join(kt.SOURCE_DIR, ".peers")
    if not os.path.isfile(os.path.join(folder, "fla", "UPSTREAM_COMMIT")):
        return None, f"no FLA package: {folder}/fla (shared/peers/fla_chunk_kda/make.sh; KDAJIT_FLA names the folder)"
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_fla_chunk_kda", os.path.join(kt.SOURCE_DIR, "bench", "peers", "bench_fla_chunk_kda.py"))
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    try:
        chunk_kda, _ = peer.load_fla(folder)
    except (ImportError, SystemExit) as e:  # triton missing, another fla on the path, ...
        return None, f"FLA in {folder} does not import: {e}"
    return chunk_kda, ""


@unittest.skipIf(FAKE, NEEDS_CUDA)
class AgainstFla(unittest.TestCase):
    """The same call, argument for argument, to FLA's chunk_kda and to kdajit's."""

    @classmethod
    def setUpClass(cls):
        fla, why = _find_fla()
        if fla is None:
            raise unittest.SkipTest(why)
        cls.fla = staticmethod(fla)  # a plain function as a class attribute would be called with self first

    def test_the_same_call_gives_the_same_results(self):
        cases = [
            dict(heads=16, lengths=[65, 130, 7, 1, 64], flags=dict(safe_gate=True)),
            dict(heads=8, lengths=[200, 33], gate="softplus", flags={}),
            dict(heads=16, lengths=[100], form="batch", batch=3, flags=dict(safe_gate=True, state_v_first=True)),
            dict(heads=4, lengths=[300], initial=False, flags=dict(safe_gate=True)),
            dict(heads=8, lengths=[300, 129, 5], slow_decay=True, flags=dict(safe_gate=True)),
            dict(heads=8, lengths=[257], form="batch", batch=2, gate="softplus", slow_decay=True, flags={}),
        ]
        for i, case in enumerate(cases):
            case = dict(case)
            heads, lengths, flags = case.pop("heads"), case.pop("lengths"), case.pop("flags")
            with self.subTest(case=i, heads=heads, lengths=lengths):
                kw = problem(heads, lengths, seed=8700 + i, **case)
                kw.update(flags)
                if kw.get("cu_seqlens") is not None:
                    kw["cu_seqlens_cpu"] = kw["cu_seqlens"].cpu()
                before = host_copy(kw)
                # FLA's chunk_kda takes q, k, v, g and beta positionally (its wrapper names them itself).
                lead = ("q", "k", "v", "g", "beta")
                fla_o, fla_ht = self.fla(*(kw[n] for n in lead), **{n: x for n, x in kw.items() if n not in lead})
                o, ht = kdajit.chunk_kda(**kw)
                sync()
                want_o, want_ht = kt.chunk_reference_of(before)
                o_diff, ht_diff = kt.rel_l2(o.cpu(), fla_o.cpu()), kt.rel_l2(ht.cpu(), fla_ht.cpu())
                errs = (f"kdajit vs FLA: o {o_diff:.2e}, state {ht_diff:.2e}; vs f64: kdajit o "
                        f"{kt.rel_l2(o.cpu(), want_o):.2e} state {kt.rel_l2(ht.cpu(), want_ht):.2e}, FLA o "
                        f"{kt.rel_l2(fla_o.cpu(), want_o):.2e} state {kt.rel_l2(fla_ht.cpu(), want_ht):.2e}")
                print(f"FLA case {i}: H {heads} lengths {lengths}: {errs}")
                self.assertEqual((tuple(o.shape), o.dtype), (tuple(fla_o.shape), fla_o.dtype))
                self.assertEqual((tuple(ht.shape), ht.dtype), (tuple(fla_ht.shape), fla_ht.dtype))
                self.assertLessEqual(o_diff, 5e-3, errs)
                self.assertLessEqual(ht_diff, 2e-3, errs)
                kt.check_chunk(self, before, o, ht, f"FLA case {i}")


if __name__ == "__main__":
    unittest.main()
