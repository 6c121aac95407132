"""Spec section 6: every contract violation the host can see raises before any
launch, naming the argument and the expected value, and writes nothing.
ValueError for a violation, NotImplementedError for an unsupported configuration.

Each case runs twice: through kdajit.dry_run and through the op itself on host
tensors (the C library validates before it needs a GPU, so the real
kdajit_single_decode / kdajit_packed_decode entry points answer here exactly as
on a device)."""
import math
import unittest

import torch
import kda_testing as kt

import kdajit
from kdajit import _launch

D = 128


def storage_bytes(kwargs):
    """Every byte of the storage of every host tensor argument (NaN-safe, padding included)."""
    return {k: kt._storage_bytes(v).numpy().tobytes() for k, v in kwargs.items()
            if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.layout == torch.strided}


def single(**kw):
    return kt.make_problem("single", 4, 5, null_rows=1, oob_rows=1, **kw)


def packed(**kw):
    return kt.make_problem("packed", 4, tokens=3, seqs=3, lengths=[3, 2, 1], **kw)


def bad_conv(p, slots=None, taps=None, pad=0, offset=0):
    """conv_state like p's (same layout) but with other slots, taps, slot padding or data offset."""
    S, qkv, K = p.args["conv_state"].shape
    layout = "ds" if p.args["conv_state"].stride(2) == 1 else "sd"
    S, K = slots or S, taps or K
    base = kt.conv_pool(S + 1, qkv, K, layout, pad, "cpu")
    t = base.as_strided((S, qkv, K), base.stride(), base.storage_offset() + offset)
    t.copy_(torch.zeros(S, qkv, K, dtype=torch.bfloat16))
    return t


def bad_state(p, dtype=None, slots=None, heads=None, pad=0, offset=0):
    S, H, _, _ = p.args["state"].shape
    base = kt.state_pool((slots or S) + 1, heads or H, dtype or p.args["state"].dtype, pad, "cpu")
    return base.as_strided(((slots or S), heads or H, D, D), base.stride(), base.storage_offset() + offset)


def every_other(t):
    """t's shape with the innermost stride doubled."""
    big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    return big[..., ::2]


# (argument, how to break it, exception, a phrase the message must contain[, the argument blamed])
SINGLE_CASES = [
    # dtypes: kdajit dtypes that are wrong for the argument (C) and torch dtypes kdajit has no code for (Python)
    ("x", lambda p: p.args["x"].float(), ValueError, "expected dtype bf16"),
    ("x", lambda p: p.args["x"].half(), ValueError, "expected dtype bf16, got torch.float16"),
    ("weight", lambda p: p.args["weight"].to(torch.bfloat16), ValueError, "expected dtype f32"),
    ("conv_state", lambda p: p.args["conv_state"].float(), ValueError, "expected dtype bf16"),
    ("raw_gate", lambda p: p.args["raw_gate"].float(), ValueError, "expected dtype bf16"),
    ("raw_beta", lambda p: p.args["raw_beta"].double(), ValueError, "expected dtype bf16, got torch.float64"),
    ("A_log", lambda p: p.args["A_log"].to(torch.bfloat16), ValueError, "expected dtype f32"),
    ("dt_bias", lambda p: p.args["dt_bias"].to(torch.bfloat16), ValueError, "expected dtype f32"),
    ("state_indices", lambda p: p.args["state_indices"].long(), ValueError, "expected dtype int32, got torch.int64"),
    ("state_indices", lambda p: p.args["state_indices"].float(), ValueError, "expected dtype int32"),
    ("state", lambda p: p.args["state"].int(), ValueError, "expected dtype f32 or bf16"),
    ("state", lambda p: p.args["state"].half(), ValueError, "expected dtype f32 or bf16, got torch.float16"),
    ("output_gate", lambda p: p.args["output_gate"].float(), ValueError, "expected dtype bf16"),
    ("norm_weight", lambda p: p.args["norm_weight"].to(torch.bfloat16), ValueError, "expected dtype f32"),
    ("output", lambda p: p.args["output"].float(), ValueError, "expected dtype bf16"),
    # shapes, and H / R / S that disagree between arguments
    ("x", lambda p: p.args["x"][:, :-D], ValueError, "expected shape"),
    ("x", lambda p: p.args["x"].unsqueeze(0).expand(2, -1, -1), ValueError, "expected ndim 2"),
    ("weight", lambda p: p.args["weight"][:, :3], ValueError, "expected shape [3, 4, H*128=512]"),
    ("conv_state", lambda p: bad_conv(p, taps=4), ValueError, "expected shape"),
    ("conv_state", lambda p: p.args["conv_state"][:-1], ValueError, "expected shape [S="),
    # state defines S: a state pool with one more slot is blamed on conv_state
    ("state", lambda p: bad_state(p, slots=p.args["state"].shape[0] + 1), ValueError, "expected shape [S=",
     "conv_state"),
    ("raw_gate", lambda p: torch.zeros(1, 5, 3, D, dtype=torch.bfloat16), ValueError, "expected shape"),
    ("raw_gate", lambda p: torch.zeros(2, 5, 4, D, dtype=torch.bfloat16), ValueError, "expected ndim 3"),
    ("raw_gate", lambda p: torch.zeros(1, 1, 5, 4, D, dtype=torch.bfloat16), ValueError, "at most 4 dims"),
    ("raw_beta", lambda p: torch.zeros(1, 5, 5, dtype=torch.bfloat16), ValueError, "expected shape"),
    ("dt_bias", lambda p: torch.zeros(5 * D), ValueError, "expected shape [H*128=512]"),
    ("state_indices", lambda p: torch.zeros(6, dtype=torch.int32), ValueError, "expected shape [R=5]"),
    ("state", lambda p: bad_state(p, heads=3), ValueError, "expected shape"),
    ("output_gate", lambda p: p.args["output_gate"][:4], ValueError, "expected shape [R=5"),
    ("norm_weight", lambda p: torch.zeros(64), ValueError, "expected shape [128]"),
    ("output", lambda p: p.args["output"][:, :4], ValueError, "expected shape [R=5"),
    # strides
    ("x", lambda p: every_other(p.args["x"]), ValueError, "expected strides"),
    ("x", lambda p: torch.zeros(5 * 1536, dtype=torch.bfloat16).as_strided((5, 1536), (1535, 1)), ValueError,
     "expected strides (row >= 1536, 1)"),
    ("weight", lambda p: torch.zeros(3, 512, 4).transpose(1, 2), ValueError, "expected strides"),
    ("conv_state", lambda p: torch.zeros(p.args["state"].shape[0], 2 * 1536, 3, dtype=torch.bfloat16)[:, ::2],
     ValueError, "[SD] or"),
    ("raw_gate", lambda p: every_other(p.args["raw_gate"]), ValueError, "expected strides"),
    ("raw_beta", lambda p: every_other(p.args["raw_beta"]), ValueError, "expected strides"),
    ("A_log", lambda p: torch.zeros(4, 2)[:, :1], ValueError, "expected strides (1)"),
    ("A_log", lambda p: torch.zeros(2, 4)[:, :2], ValueError, "elements on one stride"),
    ("dt_bias", lambda p: every_other(p.args["dt_bias"]), ValueError, "expected strides (1)"),
    ("state_indices", lambda p: every_other(p.args["state_indices"]), ValueError, "expected strides"),
    ("state", lambda p: p.args["state"].transpose(2, 3), ValueError, "expected strides"),
    ("output_gate", lambda p: every_other(p.args["output_gate"]), ValueError, "expected strides"),
    ("norm_weight", lambda p: every_other(p.args["norm_weight"]), ValueError, "expected strides (1)"),
    ("output", lambda p: every_other(p.args["output"]), ValueError, "expected strides"),
    # alignment (spec: 8-byte conv slots, 16-byte state slots)
    ("conv_state", lambda p: bad_conv(p, pad=1), ValueError, "multiple of 8 bytes"),
    ("conv_state", lambda p: bad_conv(p, offset=1), ValueError, "aligned to 8 bytes"),
    ("state", lambda p: bad_state(p, pad=1), ValueError, "multiple of 16 bytes"),
    ("state", lambda p: bad_state(p, offset=1), ValueError, "aligned to 16 bytes"),
    # an unsupported configuration: well formed, beyond what this build serves
    ("A_log", lambda p: torch.zeros(129), NotImplementedError, "the heads this build serves"),
    # devices and non-tensors (torch-side facts the C ABI cannot see)
    ("dt_bias", lambda p: torch.zeros(4 * D, device="meta"), ValueError, "expected a tensor on cpu"),
    ("output_gate", lambda p: None, ValueError, "expected a torch.Tensor"),
    # layouts without strides
    ("x", lambda p: p.args["x"].to_sparse(), ValueError, "expected a strided (dense) tensor"),
    ("A_log", lambda p: p.args["A_log"].to_sparse(), ValueError, "expected a strided (dense) tensor"),
    ("state", lambda p: p.args["state"].to_sparse(), ValueError, "expected a strided (dense) tensor"),
]

SCALAR_CASES = [
    ("lower_bound", 0.0, "expected a finite value < 0"),
    ("lower_bound", 1.0, "expected a finite value < 0"),
    ("lower_bound", math.inf, "expected a finite value < 0"),
    ("lower_bound", math.nan, "expected a finite value < 0"),
    ("lower_bound", 1e39, "representable as f32"),
    ("lower_bound", "-5", "representable as f32"),
    ("norm_eps", -1e-5, "expected a finite value >= 0"),
    ("norm_eps", math.nan, "expected a finite value >= 0"),
    ("norm_eps", math.inf, "expected a finite value >= 0"),
    ("norm_eps", -1e39, "representable as f32"),
    ("state_indices_mode", "sequential", "expected 'unique_or_null'"),
    ("state_indices_mode", [], "expected 'unique_or_null'"),
    ("state_indices_mode", None, "expected 'unique_or_null'"),
]

PACKED_CASES = [
    ("state_indices", lambda p: torch.ones(3, 17, dtype=torch.int32), NotImplementedError,
     "the tokens this build serves"),
    ("state_indices", lambda p: torch.ones(3, dtype=torch.int32), ValueError, "expected ndim 2"),
    # T from state_indices, K from conv_state: a T that disagrees is blamed on conv_state
    ("state_indices", lambda p: torch.ones(3, 4, dtype=torch.int32), ValueError, "K=T+2=6", "conv_state"),
    ("conv_state", lambda p: bad_conv(p, taps=4), ValueError, "K=T+2=5"),
    ("query_start_loc", lambda p: torch.zeros(3, dtype=torch.int32), ValueError, "expected shape [N+1=4]"),
    ("query_start_loc", lambda p: torch.zeros(4, dtype=torch.int64), ValueError, "expected dtype int32"),
    ("query_start_loc", lambda p: every_other(torch.zeros(4, dtype=torch.int32)), ValueError, "expected strides"),
    ("num_accepted_tokens", lambda p: torch.ones(4, dtype=torch.int32), ValueError, "expected shape [N=3]"),
    ("num_accepted_tokens", lambda p: torch.ones(3), ValueError, "expected dtype int32"),
    ("x", lambda p: p.args["x"].float(), ValueError, "expected dtype bf16"),
    ("state", lambda p: bad_state(p, offset=2), ValueError, "aligned to 16 bytes"),
]


class Violations(unittest.TestCase):
    def setUp(self):
        _launch._allow_host_tensors = True

    def tearDown(self):
        _launch._allow_host_tensors = False

    def assert_rejected(self, p, arg, exc, phrase, blamed=None, **override):
        blamed = blamed or arg
        kwargs = p.kwargs(**override)
        before = storage_bytes(kwargs)
        fn = kdajit.fused_kda_decode if p.op == "single" else kdajit.packed_fused_kda_decode
        for path in ("dry_run", "launch"):
            with self.assertRaises(exc, msg=f"{arg} ({phrase}) via {path}") as cm:
                if path == "dry_run":
                    kdajit.dry_run(fn, **kwargs)
                else:
                    fn(**kwargs)
            msg = str(cm.exception)
            self.assertNotIsInstance(cm.exception, kdajit.KdajitError, msg)
            self.assertTrue(msg.startswith(f"{blamed}:") or msg.startswith(f"{blamed} ("),
                            f"{arg} via {path}: the message should name {blamed} first: {msg}")
            self.assertIn("expected", msg, f"{arg} via {path}: {msg}")
            self.assertIn(phrase, msg, f"{arg} via {path}")
            self.assertEqual(storage_bytes(kwargs), before, f"{arg} via {path}: a tensor was written")

    def test_the_base_problems_are_valid(self):
        # Each case changes one thing of these; both validate as they are.
        for p in (single(), packed(), single(state_dtype=torch.bfloat16, conv="ds")):
            fn = kdajit.fused_kda_decode if p.op == "single" else kdajit.packed_fused_kda_decode
            kdajit.dry_run(fn, **p.kwargs())

    def test_single(self):
        for arg, mutate, exc, phrase, *blamed in SINGLE_CASES:
            p = single()
            self.assert_rejected(p, arg, exc, phrase, *blamed, **{arg: mutate(p)})

    def test_single_bf16_state_and_ds_layout(self):
        for arg, mutate, exc, phrase, *blamed in SINGLE_CASES:
            if arg in ("conv_state", "state") and "dtype" not in phrase:
                p = single(state_dtype=torch.bfloat16, conv="ds")
                self.assert_rejected(p, arg, exc, phrase, *blamed, **{arg: mutate(p)})

    def test_scalars(self):
        for arg, value, phrase in SCALAR_CASES:
            p = single()
            self.assert_rejected(p, arg, ValueError, phrase, **{arg: value})
        for arg, value, phrase in SCALAR_CASES:
            if arg == "state_indices_mode":
                continue
            p = packed()
            self.assert_rejected(p, arg, ValueError, phrase, **{arg: value})

    def test_softplus_ignores_lower_bound_only_when_none(self):
        p = single(gate="softplus")
        kdajit.dry_run(kdajit.fused_kda_decode, **p.kwargs(lower_bound=None))

    def test_packed(self):
        for arg, mutate, exc, phrase, *blamed in PACKED_CASES:
            p = packed()
            self.assert_rejected(p, arg, exc, phrase, *blamed, **{arg: mutate(p)})

    def test_empty_tensors(self):
        # H = 0 and T = 0. torch may give an empty tensor a NULL data pointer; the
        # message then says so (C reports the NULL first), else it reports the size.
        for p, arg, t, phrase in ((single(), "A_log", torch.zeros(0), "H (heads) in 1..128"),
                                  (packed(), "state_indices", torch.ones(3, 0, dtype=torch.int32),
                                   "T (tokens) in 1..16")):
            self.assert_rejected(p, arg, ValueError, "an empty tensor" if t.data_ptr() == 0 else phrase, **{arg: t})

    def test_host_tensors_are_rejected_by_a_real_call(self):
        _launch._allow_host_tensors = False
        p = single()
        before = storage_bytes(p.kwargs())
        with self.assertRaises(ValueError) as cm:
            p.call(kdajit)
        self.assertTrue(str(cm.exception).startswith("x: expected a CUDA tensor, got device cpu"), str(cm.exception))
        self.assertEqual(storage_bytes(p.kwargs()), before)

    def test_messages_show_the_view_of_reshaped_arguments(self):
        # raw_gate [1, R, H, 128] is passed as [R, H, 128]: a message about it says both.
        p = single()
        bad = torch.zeros(1, 5, 4, 64, dtype=torch.bfloat16)
        with self.assertRaises(ValueError) as cm:
            kdajit.dry_run(kdajit.fused_kda_decode, **p.kwargs(raw_gate=bad))
        self.assertIn("given shape [1, 5, 4, 64]", str(cm.exception))
        self.assertIn("viewed as shape [5, 4, 64]", str(cm.exception))


class OutputAllocation(unittest.TestCase):
    """output=None: the output is allocated only for a call that can be valid."""

    def setUp(self):
        _launch._allow_host_tensors = True

    def tearDown(self):
        _launch._allow_host_tensors = False

    def test_an_expanded_x_is_named_before_any_allocation(self):
        # [2^31 - 1, 1536] with row stride 0: the [1, R, 4, 128] output would take 2 TiB.
        for make, fn in ((single, kdajit.fused_kda_decode), (packed, kdajit.packed_fused_kda_decode)):
            p = make()
            x = p.args["x"][:1].expand(2**31 - 1, -1)
            for path in ("dry_run", "launch"):
                with self.assertRaises(ValueError, msg=f"{p.op} {path}") as cm:
                    if path == "dry_run":
                        kdajit.dry_run(fn, **p.kwargs(x=x, output=None))
                    else:
                        fn(**p.kwargs(x=x, output=None))
                self.assertTrue(str(cm.exception).startswith("x: expected strides"), str(cm.exception))

    def test_a_huge_A_log_is_named_before_any_allocation(self):
        p = single()
        with self.assertRaises(NotImplementedError) as cm:
            kdajit.fused_kda_decode(**p.kwargs(A_log=torch.zeros(1 << 22), output=None))
        self.assertTrue(str(cm.exception).startswith("A_log:"), str(cm.exception))

    def test_a_valid_call_gets_its_output(self):
        p = single()
        kdajit.dry_run(kdajit.fused_kda_decode, **p.kwargs(output=None))


class SelectedKey(unittest.TestCase):
    def test_validation_comes_first(self):
        p = single()
        with self.assertRaises(ValueError) as cm:
            kdajit.selected_key(kdajit.fused_kda_decode, **p.kwargs(x=p.args["x"].float()))
        self.assertTrue(str(cm.exception).startswith("x: expected dtype bf16"), str(cm.exception))
        if not torch.cuda.is_available():
            # Valid arguments: selection needs the stream's device, which host tensors do not have.
            with self.assertRaises(kdajit.KdajitError) as cm:
                kdajit.selected_key(kdajit.packed_fused_kda_decode, **packed().kwargs())
            self.assertEqual(cm.exception.status, 4, str(cm.exception))  # KDAJIT_ERROR_CUDA


def prefill(**kw):
    return kt.make_prefill_problem(4, [5, 0, 3], kinds=["live", "live", "null"], initial=[1, 0, 1], **kw)


def library_has_prefill():
    lib = kdajit._abi.load()
    return hasattr(lib.lib, "kdajit_prefill_v1") or hasattr(lib.lib, "kdajit_prefill")


# fused_kda_prefill: what only Python sees (the arguments' Python types, torch
# dtypes without a kdajit code, devices, the oob_counter tensor), raised before
# the C library is asked: (argument, its value from the problem, a phrase).
PREFILL_PYTHON_CASES = [
    ("x", lambda p: p.args["x"].half(), "expected dtype bf16, got torch.float16"),
    ("conv_weight", lambda p: p.args["conv_weight"].tolist(), "expected a torch.Tensor"),
    ("state", lambda p: p.args["state"].to_sparse(), "expected a strided (dense) tensor"),
    ("has_initial_state", lambda p: [1, 0, 1], "expected a torch.Tensor"),
    ("has_initial_state", lambda p: torch.ones(3, dtype=torch.int64), "expected dtype int32, got torch.int64"),
    ("query_start_loc", lambda p: torch.zeros(4, dtype=torch.int32, device="meta"), "expected a tensor on cpu"),
    ("out", lambda p: p.args["out"].double(), "expected dtype bf16, got torch.float64"),
    ("gate", lambda p: "linear", "expected 'bounded' or 'softplus'"),
    ("gate", lambda p: None, "expected 'bounded' or 'softplus'"),
    ("max_seq_len", lambda p: -1, "expected an int >= 0"),
    ("max_seq_len", lambda p: 2.5, "expected an int >= 0"),
    ("max_seq_len", lambda p: True, "expected an int >= 0"),
    ("oob_counter", lambda p: torch.zeros(1, dtype=torch.int64), "expected an int32 tensor of at least one element"),
    ("oob_counter", lambda p: torch.zeros(0, dtype=torch.int32), "expected an int32 tensor of at least one element"),
    ("oob_counter", lambda p: 7, "expected None or a strided int32 torch.Tensor"),
    ("oob_counter", lambda p: torch.zeros(1, dtype=torch.int32, device="meta"), "expected a tensor on cpu"),
    ("lower_bound", lambda p: "-5", "representable as f32"),
    ("norm_eps", lambda p: 1e39, "representable as f32"),
]

# What the C library validates (kdajit_validate_prefill_args): each names the
# argument (state_indices defines N: the other [N] / [N+1] tensors are blamed).
PREFILL_C_CASES = [
    ("x", lambda p: p.args["x"].float(), "expected"),
    ("has_initial_state", lambda p: torch.ones(4, dtype=torch.int32), "expected"),
    ("query_start_loc", lambda p: torch.zeros(3, dtype=torch.int32), "expected"),
    ("conv_state", lambda p: bad_conv(p, taps=19), "expected"),
    ("raw_gate", lambda p: p.args["raw_gate"][..., :4, :, :], "expected"),  # 4 of the T_total rows
    ("lower_bound", lambda p: 0.0, "expected"),
    ("norm_eps", lambda p: -1.0, "expected"),
]


class PrefillViolations(unittest.TestCase):
    def setUp(self):
        _launch._allow_host_tensors = True

    def tearDown(self):
        _launch._allow_host_tensors = False

    def assert_rejected(self, p, arg, phrase, paths=("dry_run", "launch"), **override):
        kwargs = p.kwargs(**override)
        before = storage_bytes(kwargs)
        for path in paths:
            with self.assertRaises(ValueError, msg=f"{arg} ({phrase}) via {path}") as cm:
                if path == "dry_run":
                    kdajit.dry_run(kdajit.fused_kda_prefill, **kwargs)
                else:
                    kdajit.fused_kda_prefill(**kwargs)
            msg = str(cm.exception)
            self.assertTrue(msg.startswith(f"{arg}:") or msg.startswith(f"{arg} ("),
                            f"{arg} via {path}: the message should name {arg} first: {msg}")
            self.assertIn(phrase, msg, f"{arg} via {path}")
            self.assertEqual(storage_bytes(kwargs), before, f"{arg} via {path}: a tensor was written")

    def test_python_side_violations(self):
        for arg, value, phrase in PREFILL_PYTHON_CASES:
            p = prefill()
            self.assert_rejected(p, arg, phrase, **{arg: value(p)})

    def test_python_side_violations_with_the_output_allocated(self):
        for arg, value, phrase in PREFILL_PYTHON_CASES:
            if arg in ("x", "out"):
                continue
            p = prefill()
            self.assert_rejected(p, arg, phrase, **{arg: value(p), "out": None})

    def test_scalars_are_checked_before_the_output_is_allocated(self):
        p = prefill()
        allocated = []
        new_output = _launch.new_output
        _launch.new_output = lambda *a: allocated.append(a) or new_output(*a)
        try:
            for arg, value in (("gate", "linear"), ("max_seq_len", -1), ("oob_counter", 7), ("norm_eps", "x")):
                with self.assertRaises(ValueError, msg=arg):
                    kdajit.fused_kda_prefill(**p.kwargs(**{arg: value, "out": None}))
        finally:
            _launch.new_output = new_output
        self.assertEqual(allocated, [])

    def test_library_violations(self):
        if not library_has_prefill():
            self.skipTest("libkdajit.so has no kdajit_prefill (built without the prefill op)")
        p = prefill()
        kdajit.dry_run(kdajit.fused_kda_prefill, **p.kwargs())  # the base problem is valid
        kdajit.dry_run(kdajit.fused_kda_prefill, **p.kwargs(has_initial_state=None, gate="softplus"))
        for arg, value, phrase in PREFILL_C_CASES:
            p = prefill()
            self.assert_rejected(p, arg, phrase, **{arg: value(p)})

    def test_an_expanded_x_is_named_before_any_allocation(self):
        if not library_has_prefill():
            self.skipTest("libkdajit.so has no kdajit_prefill (built without the prefill op)")
        p = prefill()
        x = p.args["x"][:1].expand(2**31 - 1, -1)
        with self.assertRaises(ValueError) as cm:
            kdajit.fused_kda_prefill(**p.kwargs(x=x, out=None))
        self.assertTrue(str(cm.exception).startswith("x:"), str(cm.exception))

    def test_selected_key_validates_through_the_library_first(self):
        # kdajit_selected_prefill_key validates before it asks a device for its SM count.
        if not library_has_prefill():
            self.skipTest("libkdajit.so has no kdajit_prefill (built without the prefill op)")
        with self.assertRaises(ValueError) as cm:
            kdajit.selected_key(kdajit.fused_kda_prefill, **prefill().kwargs(max_seq_len=-1))
        self.assertTrue(str(cm.exception).startswith("max_seq_len:"), str(cm.exception))


class SupportAgreesWithValidation(unittest.TestCase):
    def test_unsupported_heads_and_tokens(self):
        self.assertFalse(kdajit.supported(129, arch="sm_90"))
        self.assertFalse(kdajit.supported(4, op="packed", tokens=17, arch="sm_90"))
        self.assertTrue(kdajit.supported(4, op="packed", tokens=16, arch="sm_90"))


if __name__ == "__main__":
    unittest.main()
