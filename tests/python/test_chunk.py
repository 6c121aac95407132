"""kdajit.chunk_kda (FLA's chunk_kda over kdajit_chunk_args_t) without a GPU: how
FLA's arguments land in the struct (the packed bytes read back through ctypes:
views, flags, the gate, the scale, cu_seqlens built or converted, the outputs
allocated or given, the max_seq_len hint), the errors that name the argument
before anything is written or launched, and the shapes the traced path gives
(meta tensors; fake tensors through the custom op where torch has one). The
C library's own validation runs where the library has the chunk op."""
import ctypes
import unittest

import torch
import kda_testing as kt
from test_errors import storage_bytes

import kdajit
from kdajit import _abi, _launch, _ops

D = 128
CUSTOM_OP = kdajit.HAS_CUSTOM_OPS
NEEDS = "torch.library.custom_op needs torch >= 2.4; this is " + torch.__version__


def library_has_chunk():
    lib = _abi.load()
    return hasattr(lib.lib, "kdajit_chunk_v1")


class Recorder:
    """Stands in for the launch: records the kdajit_chunk_args_t bytes of each call
    and the cu_seqlens values they point at (an int64 cu_seqlens is converted
    into a temporary that lives as long as the call), and, with run=True, runs
    the f64 reference on them (host tensors)."""

    def __init__(self, run=False):
        self.calls, self.cu, self.run = [], [], run

    def __enter__(self):
        self.saved = _launch._launch_chunk

        def launch(args, mapping):
            self.calls.append(args)
            self.cu.append(kt._host_view(_abi.ChunkArgs.from_buffer_copy(args).cu_seqlens).tolist())
            if self.run:
                kt.run_chunk_args_reference(args)

        _launch._launch_chunk = launch
        return self

    def __exit__(self, *exc):
        _launch._launch_chunk = self.saved

    def struct(self, i=-1):
        return _abi.ChunkArgs.from_buffer_copy(self.calls[i])


def view(t):
    """(data, dtype code, shape, strides) of a kdajit_tensor_t."""
    return t.data, t.dtype, tuple(t.shape)[:t.ndim], tuple(t.strides)[:t.ndim]


def f32(x):
    return ctypes.c_float(x).value


class Mapping(unittest.TestCase):
    def test_varlen_call_fills_every_field(self):
        kw = kt.make_chunk_problem(4, [5, 0, 7], cu_dtype=torch.int32, g_dtype=torch.float32, seed=1)
        with Recorder() as rec:
            o, ht = kdajit.chunk_kda(**kw)
        a = rec.struct()
        self.assertEqual(a.struct_size, ctypes.sizeof(_abi.ChunkArgs))
        rows = 12
        for name, code in (("q", _abi.DTYPE_BF16), ("k", _abi.DTYPE_BF16), ("v", _abi.DTYPE_BF16),
                           ("g", _abi.DTYPE_F32)):
            self.assertEqual(view(getattr(a, name)), (kw[name].data_ptr(), code, (rows, 4, D), (4 * D, D, 1)), name)
        self.assertEqual(view(a.beta), (kw["beta"].data_ptr(), _abi.DTYPE_BF16, (rows, 4), (4, 1)))
        self.assertEqual(view(a.A_log), (kw["A_log"].data_ptr(), _abi.DTYPE_F32, (4,), (1,)))
        self.assertEqual(view(a.dt_bias), (kw["dt_bias"].data_ptr(), _abi.DTYPE_F32, (4 * D,), (1,)))
        state = ((3, 4, D, D), (4 * D * D, D * D, D, 1))
        self.assertEqual(view(a.initial_state), (kw["initial_state"].data_ptr(), _abi.DTYPE_F32) + state)
        self.assertEqual(view(a.final_state), (ht.data_ptr(), _abi.DTYPE_F32) + state)
        self.assertEqual(view(a.output), (o.data_ptr(), _abi.DTYPE_BF16, (rows, 4, D), (4 * D, D, 1)))
        # An int32 cu_seqlens is passed as it is.
        self.assertEqual(view(a.cu_seqlens), (kw["cu_seqlens"].data_ptr(), _abi.DTYPE_INT32, (4,), (1,)))
        self.assertEqual((a.gate, a.lower_bound, a.scale, a.qk_l2norm, a.beta_sigmoid, a.state_v_first, a.max_seq_len),
                         (_abi.GATE_BOUNDED, -5.0, f32(D ** -0.5), 1, 1, 0, 0))
        self.assertEqual((tuple(o.shape), o.dtype), ((1, rows, 4, D), torch.bfloat16))
        self.assertEqual((tuple(ht.shape), ht.dtype), ((3, 4, D, D), torch.float32))
        self.assertIsNot(ht, kw["initial_state"])

    def test_flags_scale_and_the_softplus_gate(self):
        kw = kt.make_chunk_problem(2, [3], gate="softplus", dt_bias=False, seed=2)
        kw.update(use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, scale=0.25, state_v_first=True)
        with Recorder() as rec:
            kdajit.chunk_kda(**kw)
        a = rec.struct()
        self.assertEqual((a.gate, a.scale, a.qk_l2norm, a.beta_sigmoid, a.state_v_first),
                         (_abi.GATE_SOFTPLUS, 0.25, 0, 0, 1))
        self.assertEqual(view(a.dt_bias), (None, 0, (), ()))  # None: the empty view
        # FLA's deprecated name of state_v_first; FLA's safe_gate changes nothing.
        kw.pop("state_v_first")
        with Recorder() as rec:
            kdajit.chunk_kda(**kw, transpose_state_layout=True, safe_gate=True, chunk_size=64,
                             allow_neg_eigval=False, disable_recompute=False, return_intermediate_states=False,
                             cp_context=None)
        self.assertEqual(rec.struct().state_v_first, 1)

    def test_bounded_gate_takes_lower_bound(self):
        kw = kt.make_chunk_problem(2, [3], seed=3)
        kw["lower_bound"] = -2.5
        with Recorder() as rec:
            kdajit.chunk_kda(**kw)
        self.assertEqual((rec.struct().gate, rec.struct().lower_bound), (_abi.GATE_BOUNDED, -2.5))

    def test_dt_bias_h_by_128_is_viewed_flat(self):
        kw = kt.make_chunk_problem(3, [4], seed=4)
        kw["dt_bias"] = kw["dt_bias"].view(3, D)
        with Recorder() as rec:
            kdajit.chunk_kda(**kw)
        self.assertEqual(view(rec.struct().dt_bias), (kw["dt_bias"].data_ptr(), _abi.DTYPE_F32, (3 * D,), (1,)))

    def test_equal_lengths_without_cu_seqlens(self):
        kw = kt.make_chunk_problem(2, [20], form="batch", batch=3, initial=False, seed=5)
        with Recorder() as rec:
            o, ht = kdajit.chunk_kda(**kw)
            o2, _ = kdajit.chunk_kda(**kw)
        a, b = rec.struct(0), rec.struct(1)
        self.assertEqual(view(a.q)[2:], ((60, 2, D), (2 * D, D, 1)))
        self.assertEqual(view(a.beta)[2:], ((60, 2), (2, 1)))
        self.assertEqual(view(a.cu_seqlens)[1:], (_abi.DTYPE_INT32, (4,), (1,)))
        self.assertEqual(rec.cu, [[0, 20, 40, 60]] * 2)
        self.assertEqual(a.cu_seqlens.data, b.cu_seqlens.data, "the [B+1] offsets are made once per (B, T, device)")
        self.assertEqual(a.max_seq_len, 20)  # T: the hint without cu_seqlens
        self.assertEqual(view(a.initial_state), (None, 0, (), ()))
        self.assertEqual((tuple(o.shape), tuple(ht.shape), ht.dtype), ((3, 20, 2, D), (3, 2, D, D), torch.float32))
        self.assertNotEqual(o.data_ptr(), o2.data_ptr())

    def test_batch_rows_on_one_stride_merge(self):
        # [B, T, H, 128] cut from a wider [B*T, H*128 + pad] buffer: one row stride.
        B, T, H = 2, 5, 2
        kw = kt.make_chunk_problem(H, [T], form="batch", batch=B, seed=6)
        base = torch.zeros(B * T, H * D + 64, dtype=torch.bfloat16)
        base[:, :H * D] = kw["q"].reshape(B * T, H * D)
        kw["q"] = base[:, :H * D].view(B, T, H, D)
        with Recorder() as rec:
            kdajit.chunk_kda(**kw)
        self.assertEqual(view(rec.struct().q)[2:], ((B * T, H, D), (H * D + 64, D, 1)))

    def test_three_dims_are_one_sequence_without_cu_seqlens(self):
        kw = kt.make_chunk_problem(2, [9], form="3d", seed=7)
        kw.pop("cu_seqlens")
        kw["initial_state"] = kw["initial_state"][:1]
        with Recorder() as rec:
            o, ht = kdajit.chunk_kda(**kw)
        self.assertEqual(rec.cu, [[0, 9]])
        self.assertEqual((tuple(o.shape), tuple(ht.shape)), ((9, 2, D), (1, 2, D, D)))

    def test_int64_cu_seqlens_become_int32(self):
        kw = kt.make_chunk_problem(2, [3, 4], seed=8)
        given = kw["cu_seqlens"].clone()
        with Recorder() as rec:
            kdajit.chunk_kda(**kw)
        a = rec.struct()
        self.assertEqual(a.cu_seqlens.dtype, _abi.DTYPE_INT32)
        self.assertNotEqual(a.cu_seqlens.data, kw["cu_seqlens"].data_ptr())
        self.assertEqual(rec.cu[0], [0, 3, 7])
        self.assertTrue(torch.equal(kw["cu_seqlens"], given))

    def test_max_seq_len_hint(self):
        kw = kt.make_chunk_problem(2, [3, 9, 4], seed=9)
        with Recorder() as rec:
            kdajit.chunk_kda(**kw)  # no host copy: 0 (T_total)
            kdajit.chunk_kda(**kw, cu_seqlens_cpu=kw["cu_seqlens"].clone())  # FLA's host copy: its longest
            kdajit.chunk_kda(**kw, cu_seqlens_cpu=kw["cu_seqlens"].clone(), max_seq_len=100)  # given: kept
        self.assertEqual([rec.struct(i).max_seq_len for i in range(3)], [0, 9, 100])

    def test_final_state_allocated_given_or_in_place(self):
        kw = kt.make_chunk_problem(2, [3, 4], state_dtype=torch.bfloat16, seed=10)
        with Recorder() as rec:
            _, ht = kdajit.chunk_kda(**kw)
            self.assertEqual(ht.dtype, torch.bfloat16)  # the initial state's dtype
            mine = torch.empty(2, 2, D, D, dtype=torch.bfloat16)
            _, ht2 = kdajit.chunk_kda(**kw, final_state=mine)
            self.assertIs(ht2, mine)
            _, ht3 = kdajit.chunk_kda(**{**kw, "output_final_state": False})
            self.assertIsNone(ht3)
            _, ht4 = kdajit.chunk_kda(**kw, final_state=kw["initial_state"])  # in place
            self.assertIs(ht4, kw["initial_state"])
        self.assertEqual(rec.struct(1).final_state.data, mine.data_ptr())
        self.assertEqual(view(rec.struct(2).final_state), (None, 0, (), ()))
        a = rec.struct(3)
        self.assertEqual(a.final_state.data, a.initial_state.data)

    def test_out_given(self):
        kw = kt.make_chunk_problem(2, [3, 4], seed=11)
        out = torch.empty(7, 2, D, dtype=torch.bfloat16)  # [T_total, H, 128] for a [1, T_total, H, 128] q
        with Recorder() as rec:
            o, _ = kdajit.chunk_kda(**kw, out=out)
        self.assertIs(o, out)
        self.assertEqual(view(rec.struct().output), (out.data_ptr(), _abi.DTYPE_BF16, (7, 2, D), (2 * D, D, 1)))

    def test_the_struct_describes_the_call(self):
        # The f64 reference run on the bytes (as the kernel would read them) gives
        # the reference of the arguments as chunk_kda took them: every view,
        # offset, flag and scalar reached the struct.
        cases = [dict(lengths=[5, 0, 7]),
                 dict(lengths=[6], form="batch", batch=2, gate="softplus", initial=False),
                 dict(lengths=[4, 3], form="3d", state_dtype=torch.bfloat16, g_dtype=torch.float32,
                      beta_dtype=torch.float32, dt_bias=False)]
        for i, case in enumerate(cases):
            with self.subTest(case=i):
                kw = kt.make_chunk_problem(3, seed=20 + i, **case)
                kw.update(scale=0.3 if i == 1 else None, state_v_first=i == 2)
                if i == 2:
                    kw["use_beta_sigmoid_in_kernel"] = False
                    kw["beta"] = torch.sigmoid(kw["beta"])
                before = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
                with Recorder(run=True):
                    o, ht = kdajit.chunk_kda(**kw)
                kt.check_chunk(self, before, o, ht, f"case {i}")

    def test_in_place_state_is_read_then_written(self):
        kw = kt.make_chunk_problem(2, [4, 5], seed=30)
        before = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        with Recorder(run=True):
            o, ht = kdajit.chunk_kda(**kw, final_state=kw["initial_state"])
        self.assertIs(ht, kw["initial_state"])
        kt.check_chunk(self, before, o, ht, "in place")


def base(**kw):
    return kt.make_chunk_problem(2, [3, 4], seed=40, **kw)


def half_heads(t):
    return t[..., :1, :]


# (what, the arguments' change, exception, the argument the message starts with, a phrase)
ERROR_CASES = [
    ("gate outside", lambda a: a.update(use_gate_in_kernel=False), ValueError, "use_gate_in_kernel", "A_log"),
    ("no A_log", lambda a: a.update(A_log=None), ValueError, "A_log", "expected"),
    ("GVA", lambda a: a.update(v=torch.cat([a["v"], a["v"]], -2), g=torch.cat([a["g"], a["g"]], -2)),
     NotImplementedError, "v", "GVA"),
    ("K 64", lambda a: a.update(q=a["q"][..., :64], k=a["k"][..., :64]), NotImplementedError, "q", "K = 64"),
    ("V 64", lambda a: a.update(v=a["v"][..., :64]), NotImplementedError, "v", "V = 64"),
    ("fp16 q", lambda a: a.update(q=a["q"].half()), NotImplementedError, "q", "torch.float16"),
    ("f32 k", lambda a: a.update(k=a["k"].float()), NotImplementedError, "k", "torch.float32"),
    ("f64 q", lambda a: a.update(q=a["q"].double()), ValueError, "q", "bf16"),
    ("allow_neg_eigval", lambda a: a.update(allow_neg_eigval=True), NotImplementedError, "allow_neg_eigval", ""),
    ("chunk 32", lambda a: a.update(chunk_size=32), NotImplementedError, "chunk_size", "64"),
    ("chunk 16", lambda a: a.update(chunk_size=16), ValueError, "chunk_size", "64"),
    ("intermediate", lambda a: a.update(return_intermediate_states=True), NotImplementedError,
     "return_intermediate_states", ""),
    ("cp", lambda a: a.update(cp_context=object()), NotImplementedError, "cp_context", ""),
    ("recompute", lambda a: a.update(disable_recompute=True), NotImplementedError, "disable_recompute", ""),
    ("B 2 varlen", lambda a: a.update(**{n: torch.cat([a[n], a[n]]) for n in ("q", "k", "v", "g", "beta")}),
     ValueError, "q", "batch size 1"),
    ("cu float", lambda a: a.update(cu_seqlens=a["cu_seqlens"].float()), ValueError, "cu_seqlens", "int32 or int64"),
    ("cu 2-D", lambda a: a.update(cu_seqlens=a["cu_seqlens"].view(1, -1)), ValueError, "cu_seqlens", "[N+1]"),
    ("cu list", lambda a: a.update(cu_seqlens=[0, 3, 7]), ValueError, "cu_seqlens", "[N+1]"),
    ("k shape", lambda a: a.update(k=a["k"][:, :6]), ValueError, "k", "shape"),
    ("g dims", lambda a: a.update(g=a["g"][0]), ValueError, "g", "leading dims"),
    ("beta dims", lambda a: a.update(beta=a["beta"][:, :6]), ValueError, "beta", "leading dims"),
    ("q 2-D", lambda a: a.update(q=a["q"][0, 0]), ValueError, "q", "[B, T, H, 128]"),
    ("final without output", lambda a: a.update(output_final_state=False, final_state=torch.empty(2, 2, D, D)),
     ValueError, "final_state", "output_final_state=True"),
    ("fp16 state", lambda a: a.update(initial_state=a["initial_state"].half()), ValueError, "initial_state",
     "f32 or bf16"),
    ("both layout names", lambda a: a.update(state_v_first=True, transpose_state_layout=True), ValueError,
     "transpose_state_layout", "not both"),
    ("lower_bound str", lambda a: a.update(lower_bound="-5"), ValueError, "lower_bound", "f32"),
    ("scale str", lambda a: a.update(scale="x"), ValueError, "scale", "f32"),
    ("max_seq_len", lambda a: a.update(max_seq_len=-1), ValueError, "max_seq_len", "int >= 0"),
    ("flag", lambda a: a.update(use_qk_l2norm_in_kernel=2), ValueError, "use_qk_l2norm_in_kernel", "True or False"),
    ("k device", lambda a: a.update(k=torch.empty(a["k"].shape, dtype=torch.bfloat16, device="meta")), ValueError,
     "k", "(the device of q)"),
    ("g list", lambda a: a.update(g=a["g"].tolist()), ValueError, "g", "torch.Tensor"),
    ("A_log dtype", lambda a: a.update(A_log=a["A_log"].double()), ValueError, "A_log", "f32"),
    ("expanded q", lambda a: a.update(q=a["q"][:, :1].expand(1, 7, 2, D)), ValueError, "q", "overlap"),
]


class Errors(unittest.TestCase):
    def assert_rejected(self, kw, exc, arg, phrase, what):
        before = storage_bytes(kw)
        with Recorder() as rec:
            with self.assertRaises(exc, msg=what) as cm:
                kdajit.chunk_kda(**kw)
        msg = str(cm.exception)
        self.assertTrue(msg.startswith(f"{arg}:") or msg.startswith(f"{arg} ("), f"{what}: should name {arg}: {msg}")
        self.assertIn(phrase, msg, what)
        self.assertEqual(rec.calls, [], f"{what}: launched")
        self.assertEqual(storage_bytes(kw), before, f"{what}: a tensor was written")

    def test_each_violation_names_its_argument(self):
        for what, change, exc, arg, phrase in ERROR_CASES:
            with self.subTest(what):
                kw = base()
                change(kw)
                self.assert_rejected(kw, exc, arg, phrase, what)

    def test_python_checks_come_before_any_allocation(self):
        cases = [(arg, {**base(), arg: value}) for arg, value in (
            ("lower_bound", "x"), ("scale", "x"), ("max_seq_len", -1), ("use_beta_sigmoid_in_kernel", 2),
            ("state_v_first", None))]
        allocated = []
        empty, to = torch.empty, torch.Tensor.to
        torch.empty = lambda *a, **k: allocated.append(a) or empty(*a, **k)
        torch.Tensor.to = lambda self, *a, **k: allocated.append(a) or to(self, *a, **k)
        try:
            for arg, kw in cases:
                with self.subTest(arg), self.assertRaises(ValueError) as cm:
                    kdajit.chunk_kda(**kw)
                self.assertTrue(str(cm.exception).startswith(f"{arg}:"), str(cm.exception))
        finally:
            torch.empty, torch.Tensor.to = empty, to
        self.assertEqual(allocated, [])

    def test_batch_and_token_dims_that_do_not_merge(self):
        kw = kt.make_chunk_problem(2, [6], form="batch", batch=2, initial=False, seed=41)
        for name in ("q", "k", "v", "g"):
            kw[name] = torch.zeros(2, 8, 2, D, dtype=kw[name].dtype)[:, :6]
        kw["beta"] = torch.zeros(2, 6, 2, dtype=kw["beta"].dtype)
        self.assert_rejected(kw, ValueError, "q", "batch stride is T times its token stride", "padded T")

    def test_unknown_keywords_and_extra_positionals_raise_type_error(self):
        kw = base()
        with Recorder() as rec:
            with self.assertRaises(TypeError) as cm:
                kdajit.chunk_kda(**kw, head_first=False)
            self.assertIn("unexpected keyword argument 'head_first'", str(cm.exception))
            q, k, v, g, beta = (kw.pop(n) for n in ("q", "k", "v", "g", "beta"))
            with self.assertRaises(TypeError):  # FLA's 12th positional is allow_neg_eigval: keywords here
                kdajit.chunk_kda(q, k, v, g, beta, None, None, True, True, True, True, False)
        self.assertEqual(rec.calls, [])

    def test_host_tensors_are_named_before_the_library_is_asked(self):
        with self.assertRaises(ValueError) as cm:
            kdajit.chunk_kda(**base())
        self.assertTrue(str(cm.exception).startswith("q: expected a CUDA tensor"), str(cm.exception))


@unittest.skipUnless(library_has_chunk(), "libkdajit.so has no kdajit_chunk_v1 (the chunk op is not in this build)")
class LibraryValidation(unittest.TestCase):
    def test_dry_run_gives_the_validated_bytes(self):
        kw = base()
        args = kdajit.dry_run(kdajit.chunk_kda, **kw)
        self.assertEqual(len(args), ctypes.sizeof(_abi.ChunkArgs))
        a = _abi.ChunkArgs.from_buffer_copy(args)
        self.assertEqual(a.q.data, kw["q"].data_ptr())
        kdajit.dry_run("chunk_kda", **kt.make_chunk_problem(2, [8], form="batch", batch=2, gate="softplus"))

    def test_library_violations_name_the_argument(self):
        cases = [
            ("lower_bound", lambda a: a.update(lower_bound=0.0)),
            ("scale", lambda a: a.update(scale=-1.0)),
            ("initial_state", lambda a: a.update(initial_state=a["initial_state"][:1])),
            ("final_state", lambda a: a.update(final_state=torch.empty(2, 2, D, 64))),
            ("dt_bias", lambda a: a.update(dt_bias=a["dt_bias"][:D])),
            ("g", lambda a: a.update(g=a["g"][..., :1, :])),
        ]
        for arg, change in cases:
            with self.subTest(arg):
                kw = base()
                change(kw)
                before = storage_bytes(kw)
                with self.assertRaises(ValueError) as cm:
                    kdajit.dry_run(kdajit.chunk_kda, **kw)
                msg = str(cm.exception)
                self.assertTrue(msg.startswith(f"{arg}:") or msg.startswith(f"{arg} ("), msg)
                self.assertEqual(storage_bytes(kw), before)

    def test_selected_key_validates_through_the_library_first(self):
        # kdajit_selected_chunk_key validates before it asks a device for its SM count.
        kw = base()
        kw.update(lower_bound=0.0)
        before = storage_bytes(kw)
        with self.assertRaises(ValueError) as cm:
            kdajit.selected_key(kdajit.chunk_kda, **kw)
        self.assertTrue(str(cm.exception).startswith("lower_bound:"), str(cm.exception))
        self.assertEqual(storage_bytes(kw), before)

    def test_the_init_defaults_match_the_ctypes_layout(self):
        _abi.load().chunk_entry_points()  # reads kdajit_chunk_args_init's defaults back; a mismatch raises

    def test_a_workspace_goes_into_the_struct_and_is_checked(self):
        kw = base()
        size = kdajit.prefill_workspace_bytes(2, 1000, 128)
        self.assertEqual(size, (2 + 16) * 128 * 148096)
        self.assertEqual(kdajit.prefill_workspace_bytes(3, 0, 4), 0)
        with self.assertRaises(ValueError):
            kdajit.prefill_workspace_bytes(-1, 10, 2)
        ws = torch.empty(4096, dtype=torch.uint8)
        a = _abi.ChunkArgs.from_buffer_copy(kdajit.dry_run(kdajit.chunk_kda, **kw, workspace=ws))
        self.assertEqual((a.workspace, a.workspace_bytes), (ws.data_ptr(), 4096))
        a = _abi.ChunkArgs.from_buffer_copy(kdajit.dry_run(kdajit.chunk_kda, **kw))
        self.assertEqual((a.workspace, a.workspace_bytes), (None, 0))
        cases = [(ws[1:], "workspace: expected a pointer aligned to 16 bytes"),
                 (torch.empty(64, 2, dtype=torch.uint8)[:, 0], "workspace: expected a contiguous tensor"),
                 ("scratch", "workspace: expected None or a strided torch.Tensor")]
        for bad, phrase in cases:
            with self.subTest(phrase):
                with self.assertRaises(ValueError) as cm:
                    kdajit.dry_run(kdajit.chunk_kda, **kw, workspace=bad)
                self.assertTrue(str(cm.exception).startswith(phrase), str(cm.exception))


class TracedShapes(unittest.TestCase):
    def test_traced_path_allocates_outputs_like_fla(self):
        # What the traced (torch.compile) path hands the custom op, on meta tensors.
        cases = [(dict(lengths=[3, 4]), (1, 7, 2, D), (2, 2, D, D), torch.float32),
                 (dict(lengths=[5], form="batch", batch=3, initial=False), (3, 5, 2, D), (3, 2, D, D), torch.float32),
                 (dict(lengths=[2, 2, 2], form="3d", state_dtype=torch.bfloat16), (6, 2, D), (3, 2, D, D),
                  torch.bfloat16)]
        for case, o_shape, h_shape, h_dtype in cases:
            with self.subTest(**{k: str(v) for k, v in case.items()}):
                kw = kt.make_chunk_problem(2, device="meta", **case)
                names = ("q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state",
                         "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "A_log",
                         "dt_bias", "lower_bound", "cu_seqlens", "state_v_first", "out", "final_state",
                         "max_seq_len")
                args = {n: kw.get(n) for n in names}
                args.update(state_v_first=False, max_seq_len=0)
                a, in_place, returns = _ops._chunk_prepare(True, **args, kwargs={})
                self.assertTrue(returns)
                self.assertFalse(in_place)
                self.assertEqual((tuple(a["out"].shape), a["out"].dtype, a["out"].device.type),
                                 (o_shape, torch.bfloat16, "meta"))
                self.assertEqual((tuple(a["final_state"].shape), a["final_state"].dtype), (h_shape, h_dtype))
                self.assertEqual((a["cu_seqlens"].dtype, a["cu_seqlens"].shape[0]), (torch.int32, h_shape[0] + 1))

    @unittest.skipUnless(CUSTOM_OP, NEEDS)
    def test_schema_mutates_output_and_final_state(self):
        schema = torch.ops.kdajit.chunk_kda.default._schema
        mutated = sorted(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
        self.assertEqual(mutated, ["final_state", "output", "workspace"], str(schema))
        self.assertEqual(len(schema.returns), 0, str(schema))

    @unittest.skipUnless(CUSTOM_OP, NEEDS)
    def test_fake_tensors_go_through_the_fake_implementation(self):
        from torch._subclasses.fake_tensor import FakeTensorMode

        kw = kt.make_chunk_problem(2, [3, 4])
        with Recorder() as rec:
            with FakeTensorMode() as mode:
                fake = {k: (mode.from_tensor(v) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
                o, ht = kdajit.chunk_kda(**fake)
                self.assertEqual((tuple(o.shape), o.dtype), ((1, 7, 2, D), torch.bfloat16))
                self.assertEqual((tuple(ht.shape), ht.dtype), ((2, 2, D, D), torch.float32))
                o, ht = kdajit.chunk_kda(**{**fake, "output_final_state": False})
                self.assertIsNone(ht)
        self.assertEqual(rec.calls, [], "a fake-tensor call reached the launch")

    @unittest.skipUnless(CUSTOM_OP, NEEDS)
    def test_make_fx_records_the_op(self):
        from torch.fx.experimental.proxy_tensor import make_fx

        kw = kt.make_chunk_problem(2, [3, 4], form="batch", batch=2)
        names = [k for k, v in kw.items() if isinstance(v, torch.Tensor)]

        def fn(*ts):
            args = dict(kw)
            args.update(zip(names, ts))
            return kdajit.chunk_kda(**args)

        gm = make_fx(fn, tracing_mode="fake")(*[kw[n] for n in names])
        targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        self.assertTrue(any("kdajit.chunk_kda" in t for t in targets), targets)


if __name__ == "__main__":
    unittest.main()
