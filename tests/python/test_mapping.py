"""Argument mapping: for every torch shape and stride the ops accept, the exact
kdajit_decode_args_t bytes a call passes to libkdajit.so (kdajit.dry_run: the
same mapping and cache as a launch, then kdajit_validate_args instead of the
launch), compared with a struct built field by field from the canonical views."""
import ctypes
import itertools
import os
import subprocess
import sys
import unittest

import torch
from kda_testing import D, conv_pool, make_problem, padded_rows, state_pool

import kdajit
from kdajit import _abi, _launch

_CODES = {torch.float32: _abi.DTYPE_F32, torch.bfloat16: _abi.DTYPE_BF16, torch.int32: _abi.DTYPE_INT32}
_FIELD = {"weight": "conv_weight"}


def expected_args(p, output=None):
    """kdajit_decode_args_t built with ctypes from the problem's canonical views
    (what the contract says each argument is), independent of the package's packer."""
    a = _abi.DecodeArgs()
    ctypes.memset(ctypes.byref(a), 0, ctypes.sizeof(a))
    a.struct_size = ctypes.sizeof(a)
    names = ["x", "weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias", "state_indices", "state",
             "output_gate", "norm_weight", "output"]
    if p.op == "packed":
        names += ["query_start_loc", "num_accepted_tokens"]
    for name in names:
        v = p.views[name] if not (name == "output" and output is not None) else output
        t = getattr(a, _FIELD.get(name, name))
        t.data = v.data_ptr()
        t.dtype = _CODES[v.dtype]
        t.ndim = v.dim()
        for i, (n, s) in enumerate(zip(v.shape, v.stride())):
            t.shape[i] = n
            t.strides[i] = s
    a.gate = _abi.GATE_SOFTPLUS if p.lower_bound is None else _abi.GATE_BOUNDED
    a.lower_bound = 0.0 if p.lower_bound is None else p.lower_bound
    a.norm_eps = p.norm_eps
    a.state_indices_mode = _abi.enum("indices_mode")[p.mode] if p.op == "single" else 0
    return bytes(a)


def size_one_strides_cleared(raw):
    """The args bytes with the strides of size-1 dims zeroed: the contract gives
    those dims any stride (torch does too), so they are not part of the mapping."""
    a = _abi.DecodeArgs.from_buffer_copy(raw)
    for name in _abi.TENSOR_FIELDS:
        t = getattr(a, name)
        for i in range(t.ndim):
            if t.shape[i] == 1:
                t.strides[i] = 0
    return bytes(a)


def diff(got, want):
    """The first field whose bytes differ, for a readable failure."""
    g, w = _abi.DecodeArgs.from_buffer_copy(got), _abi.DecodeArgs.from_buffer_copy(want)
    for name in _abi.TENSOR_FIELDS:
        tg, tw = getattr(g, name), getattr(w, name)
        if bytes(tg) != bytes(tw):
            return (f"{name}: got data {tg.data:#x} dtype {tg.dtype} ndim {tg.ndim} shape {list(tg.shape)} "
                    f"strides {list(tg.strides)}; want data {tw.data:#x} dtype {tw.dtype} ndim {tw.ndim} "
                    f"shape {list(tw.shape)} strides {list(tw.strides)}")
    return "scalars: " + str([(n, getattr(g, n), getattr(w, n)) for n, _ in _abi.SCALAR_FIELDS])


HOT_ORDER = ("x", "weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias", "state_indices", "state",
             "output_gate", "norm_weight", "output")


def hotpath():
    """The loaded kdajit._hotpath module, or None (not built for this torch)."""
    _launch.hotpath_info()
    return _launch._hot_module


def hot_args(p, kw):
    """kdajit._hotpath.pack's arguments for a call with keyword arguments kw."""
    names = HOT_ORDER + (("query_start_loc", "num_accepted_tokens") if p.op == "packed" else ())
    mode = _abi.enum("indices_mode").get(kw.get("state_indices_mode", "unique_or_null"), -1) if p.op == "single" else 0
    return (0 if p.op == "single" else 1, kw["lower_bound"], kw["norm_eps"], mode) + tuple(kw[n] for n in names)


class Mapping(unittest.TestCase):
    def assert_maps(self, p, what):
        fn = kdajit.fused_kda_decode if p.op == "single" else kdajit.packed_fused_kda_decode
        kw = p.kwargs()
        got = kdajit.dry_run(fn, **kw)
        want = expected_args(p)
        self.assertEqual(len(got), ctypes.sizeof(_abi.DecodeArgs))
        self.assertTrue(size_one_strides_cleared(got) == size_one_strides_cleared(want), f"{what}: {diff(got, want)}")
        hot = hotpath()
        if hot is not None:
            # The C++ cache-hit path passes exactly these bytes: for a layout it
            # remembers already (a hit with this call's pointers and scalars), and
            # after being handed the Python path's bytes of this call.
            hargs = hot_args(p, kw)
            before = hot.pack(*hargs)
            if before is not None:
                self.assertTrue(before == got, f"{what}, _hotpath hit: {diff(before, got)}")
            self.assertTrue(hot.remember(hargs[0], got, *hargs[4:]))
            after = hot.pack(*hargs)
            self.assertIsNotNone(after, what)
            self.assertTrue(after == got, f"{what}, _hotpath: {diff(after, got)}")
        return got

    # --- single op: each argument in each accepted form, on a base problem ---

    def test_single_forms(self):
        forms = {
            "x": ["R", "1R"],
            "raw_gate": ["RHD", "1RHD", "RHxD", "1RHxD"],
            "output_gate": ["RHD", "1RHD", "RHxD", "1RHxD"],
            "output": ["RHD", "1RHD", "RHxD", "1RHxD"],
            "raw_beta": ["RH", "1RH"],
            "A_log": ["H", "11H1", "H1"],
            "dt_bias": ["HD", "H,D"],
            "norm_weight": ["D", "1D"],
            "state_indices": ["R", "1R"],
        }
        for arg, choices in forms.items():
            for form in choices:
                for heads, rows in ((1, 1), (3, 5), (64, 2)):
                    p = make_problem("single", heads, rows, forms={arg: form}, seed=rows)
                    self.assert_maps(p, f"{arg} as {form} (H={heads}, R={rows})")

    def test_single_layouts_dtypes_and_scalars(self):
        cases = itertools.product((torch.float32, torch.bfloat16), ("sd", "ds"), (0, 16), (0, 8),
                                  ("bounded", "softplus"))
        for i, (dtype, conv, row_pad, slot_pad, gate) in enumerate(cases):
            p = make_problem("single", 2, 4, state_dtype=dtype, conv=conv, row_pad=row_pad, slot_pad=slot_pad,
                             gate=gate, seed=i, null_rows=1, oob_rows=1)
            self.assert_maps(p, f"state {dtype}, conv {conv}, row pad {row_pad}, slot pad {slot_pad}, {gate}")
        for mode in ("unique_or_null", "positive_unique", "repeated_positive"):
            p = make_problem("single", 2, 3, mode=mode)
            self.assert_maps(p, f"mode {mode}")
        for lb, eps in ((-5.0, 1e-5), (-0.5, 1e-6), (-1e30, 0.0), (None, 3.0)):
            p = make_problem("single", 2, 3, gate="softplus" if lb is None else "bounded")
            p.lower_bound, p.norm_eps = lb, eps
            self.assert_maps(p, f"lower_bound {lb}, norm_eps {eps}")

    def test_size_one_dims_take_any_stride(self):
        # R = 1 and H = 1: torch gives those dims arbitrary strides; the contract ignores them.
        p = make_problem("single", 1, 1)
        odd = p.args["raw_gate"].as_strided((1, 1, 1, D), (7, 5, 3, 1))
        p.args["raw_gate"] = odd
        p.views["raw_gate"] = odd.as_strided((1, 1, D), (5, 3, 1))
        self.assert_maps(p, "raw_gate [1, 1, 1, 128] with odd size-1 strides")

    def test_page_pool_interleaving_conv_and_state_slots(self):
        # FlashInfer's and vLLM's hybrid cache: one page per slot holding the conv
        # history then the state (one byte buffer, two strided views).
        H, R, S = 2, 3, 6
        qkv, K = 3 * H * D, 3
        for state_dtype in (torch.float32, torch.bfloat16):
            esize = torch.empty((), dtype=state_dtype).element_size()
            conv_bytes = qkv * K * 2
            page = conv_bytes + H * D * D * esize
            pool = torch.zeros(S * page, dtype=torch.uint8)
            conv = pool.view(torch.bfloat16).as_strided((S, qkv, K), (page // 2, 1, qkv))
            state = pool.view(state_dtype).as_strided((S, H, D, D), (page // esize, D * D, D, 1),
                                                      conv_bytes // esize)
            p = make_problem("single", H, R, slots=S, state_dtype=state_dtype)
            for d in (p.args, p.views):
                d["conv_state"], d["state"] = conv, state
            self.assert_maps(p, f"page pool ({state_dtype})")

    def test_output_none_is_allocated_as_flashinfer_does(self):
        p = make_problem("single", 3, 4, output=False)
        got = kdajit.dry_run(kdajit.fused_kda_decode, **p.kwargs())
        a = _abi.DecodeArgs.from_buffer_copy(got)
        self.assertEqual((a.output.dtype, a.output.ndim, list(a.output.shape)[:3], list(a.output.strides)[:3]),
                         (_abi.DTYPE_BF16, 3, [4, 3, D], [3 * D, D, 1]))
        self.assertNotEqual(a.output.data, 0)

    def test_ops_return_the_output_they_were_given_or_allocated(self):
        launched = []
        launch = _launch._launch
        _launch._launch = lambda fn_index, op, args, mapping: launched.append((fn_index, op, args))
        try:
            p = make_problem("single", 2, 3)
            self.assertIs(p.call(kdajit), p.args["output"])
            q = make_problem("packed", 2, tokens=2, seqs=2)
            self.assertIs(q.call(kdajit), q.args["output"])
            p = make_problem("single", 2, 3, output=False)
            out = p.call(kdajit)
            self.assertEqual((tuple(out.shape), out.dtype), ((1, 3, 2, D), torch.bfloat16))
            # The launch got the same bytes as the dry run, pointing at that tensor.
            self.assertEqual(_abi.DecodeArgs.from_buffer_copy(launched[-1][2]).output.data, out.data_ptr())
            self.assertEqual([(i, op) for i, op, _ in launched],
                             [(0, "fused_kda_decode"), (1, "packed_fused_kda_decode"), (0, "fused_kda_decode")])
        finally:
            _launch._launch = launch

    # --- packed op ------------------------------------------------------------

    def test_packed_tokens_layouts_and_forms(self):
        for i, (T, conv, dtype) in enumerate(itertools.product((1, 2, 4, 16), ("sd", "ds"),
                                                               (torch.float32, torch.bfloat16))):
            p = make_problem("packed", 2, tokens=T, seqs=3, conv=conv, state_dtype=dtype, seed=i,
                             lengths=[T, max(T - 1, 0), 1])
            self.assert_maps(p, f"packed T={T} conv {conv} state {dtype}")
        for arg, form in (("raw_gate", "RHxD"), ("x", "1R"), ("output", "RHD"), ("raw_beta", "RH"),
                          ("A_log", "11H1"), ("output_gate", "1RHD")):
            p = make_problem("packed", 3, tokens=3, seqs=2, forms={arg: form})
            self.assert_maps(p, f"packed {arg} as {form}")

    # --- the mapping cache ------------------------------------------------------

    def test_cache_hit_gives_the_new_tensors_pointers(self):
        _launch._clear_caches()
        p1 = make_problem("single", 3, 4, seed=1)
        p2 = make_problem("single", 3, 4, seed=2)  # same shapes and strides, other storage
        self.assert_maps(p1, "first call (miss)")
        self.assertEqual(len(_launch._cache_single), 1)
        self.assert_maps(p2, "same layout (hit)")
        self.assertEqual(len(_launch._cache_single), 1)
        p3 = make_problem("single", 3, 4, seed=3, row_pad=32)  # other strides: another entry
        self.assert_maps(p3, "other strides (miss)")
        self.assertEqual(len(_launch._cache_single), 2)
        p4 = make_problem("single", 3, 4, seed=3, state_dtype=torch.bfloat16)  # other dtype: another entry
        self.assert_maps(p4, "other state dtype (miss)")
        self.assertEqual(len(_launch._cache_single), 3)

    def test_cache_is_bounded(self):
        _launch._clear_caches()
        limit = _launch._CACHE_LIMIT
        try:
            _launch._CACHE_LIMIT = 3
            for rows in range(1, 8):
                self.assert_maps(make_problem("single", 1, rows), f"R={rows}")
                self.assertLessEqual(len(_launch._cache_single), 3)
            for seqs in range(1, 8):
                self.assert_maps(make_problem("packed", 1, tokens=2, seqs=seqs), f"N={seqs}")
                self.assertLessEqual(len(_launch._cache_packed), 3)
        finally:
            _launch._CACHE_LIMIT = limit

    def test_last_layout_and_the_dict_agree(self):
        # Each op remembers its last call's (key, mapping) and compares the next key
        # with it before the dict: repeated, alternating and returning layouts, other
        # dtypes of the same shapes, and a dict emptied under it all map exactly.
        for op in ("single", "packed"):
            _launch._clear_caches()
            cache = _launch._cache_single if op == "single" else _launch._cache_packed

            def problem(seed, **kw):
                if op == "single":
                    return make_problem("single", 3, 4, seed=seed, **kw)
                return make_problem("packed", 3, tokens=2, seqs=3, seed=seed, **kw)

            def last():
                return _launch._last_single if op == "single" else _launch._last_packed

            a1, a2, b = problem(1), problem(2), problem(3, row_pad=32)
            self.assert_maps(a1, f"{op}: A (miss)")
            m_a = last()[1]
            self.assert_maps(a2, f"{op}: A again, other storage (the last layout)")
            self.assertIs(last()[1], m_a)
            self.assertEqual(len(cache), 1)
            self.assert_maps(b, f"{op}: B (miss)")
            m_b = last()[1]
            self.assertIsNot(m_b, m_a)
            self.assert_maps(a1, f"{op}: A after B (the dict)")
            self.assertIs(last()[1], m_a)
            self.assertEqual(len(cache), 2)
            self.assert_maps(problem(4, state_dtype=torch.bfloat16), f"{op}: A's shapes, bf16 state (miss)")
            self.assertEqual(len(cache), 3)
            cache.clear()  # what reaching _CACHE_LIMIT does
            self.assert_maps(problem(5, state_dtype=torch.bfloat16), f"{op}: the last layout, dict empty")
            self.assert_maps(a2, f"{op}: A, dict emptied")
            self.assertEqual(len(cache), 1)

    def test_the_last_layout_still_checks_every_call(self):
        # A repeated layout skips the mapping, not the checks. Each violation below
        # has the last call's key (same shapes, strides, dtypes, get_device()), so it
        # meets the remembered mapping: the scalars, the C library's validation of the
        # bytes (a state slot off its 16-byte alignment) and the device check of host
        # tensors (meta and cpu both give get_device() -1) still reject it.
        for op in ("single", "packed"):
            p = make_problem("single", 2, 3) if op == "single" else make_problem("packed", 2, tokens=2, seqs=2)
            fn = kdajit.fused_kda_decode if op == "single" else kdajit.packed_fused_kda_decode
            st = p.args["state"]
            self.assertTrue(st.is_contiguous())
            misaligned = torch.zeros(st.numel() + 4).as_strided(st.shape, st.stride(), 1)
            meta = torch.empty(p.args["dt_bias"].shape, device="meta")
            for name, value, want in (("lower_bound", 0.5, "lower_bound: expected a finite value < 0"),
                                      ("state", misaligned, "state: "),
                                      ("dt_bias", meta, "dt_bias: expected a tensor on cpu")):
                self.assert_maps(p, f"{op}: before {name}")
                with self.assertRaises(ValueError, msg=f"{op}: {name}") as cm:
                    kdajit.dry_run(fn, **p.kwargs(**{name: value}))
                self.assertTrue(str(cm.exception).startswith(want), f"{op}: {cm.exception}")
                if name == "state":
                    self.assertIn("aligned to 16 bytes", str(cm.exception))
            self.assert_maps(p, f"{op}: again")


@unittest.skipIf(hotpath() is None, f"kdajit._hotpath not in use: {_launch.hotpath_info()['reason']}")
class Hotpath(unittest.TestCase):
    """kdajit._hotpath declines (-1 / None) whatever the Python path must see."""

    def setUp(self):
        self.hot = hotpath()
        self.hot.clear()
        self.p = make_problem("single", 2, 3, seed=7)
        self.kw = self.p.kwargs()
        self.args = kdajit.dry_run(kdajit.fused_kda_decode, **self.kw)
        self.h = hot_args(self.p, self.kw)
        self.assertTrue(self.hot.remember(0, self.args, *self.h[4:]))

    def test_hit_with_other_scalars(self):
        for lb, eps, mode in ((None, 1e-6, "positive_unique"), (-1.0, 0.5, "repeated_positive"), (-5, 1, "unique_or_null")):
            kw = dict(self.kw, lower_bound=lb, norm_eps=eps, state_indices_mode=mode)
            want = kdajit.dry_run(kdajit.fused_kda_decode, **kw)
            got = self.hot.pack(*hot_args(self.p, kw))
            self.assertTrue(got == want, f"{lb}, {eps}, {mode}: {diff(got, want)}")

    def test_declines(self):
        h = list(self.h)
        cases = {
            "a layout it was not given": (4 + HOT_ORDER.index("state"), self.kw["state"].transpose(2, 3)),
            "an argument that is not a tensor": (5, 3.0),
            "a lower_bound f32 cannot hold": (1, 1e39),
            "a norm_eps that is not a number": (2, "1e-5"),
            "an unknown state_indices_mode": (3, -1),
            "a mode that is not an int": (3, None),
        }
        for what, (i, value) in cases.items():
            args = list(h)
            args[i] = value
            self.assertIsNone(self.hot.pack(*args), what)
        self.assertIsNone(self.hot.pack(*h[:-1]), "a tensor short")
        self.assertIsNone(self.hot.pack(1, *h[1:]), "the packed op's count with the single op's tensors")
        # Host tensors are never launched from here: the Python path rejects them.
        before = self.hot.stats()
        self.assertEqual(self.hot.launch(0, _launch._handle(), *h[1:]), -1)
        after = self.hot.stats()
        self.assertEqual(after["declined"], before["declined"] + 1)
        self.assertEqual(after["single"], before["single"])

    def test_remember_checks_its_arguments(self):
        with self.assertRaises(ValueError):
            self.hot.remember(0, self.args[:-1], *self.h[4:])
        with self.assertRaises(TypeError):
            self.hot.remember(0, self.args, *self.h[5:])
        with self.assertRaises(ValueError):
            self.hot.remember(2, self.args, *self.h[4:])
        self.assertFalse(self.hot.remember(0, self.args, *(self.h[4:-1] + ("not a tensor",))))

    def test_clear_forgets(self):
        self.assertIsNotNone(self.hot.pack(*self.h))
        _launch._clear_caches()
        self.assertIsNone(self.hot.pack(*self.h))

    def test_off_by_environment_and_other_torch(self):
        lib = _abi.load()
        mod, info = _launch._load_hotpath(lib)
        self.assertIsNotNone(mod, info)
        version = torch.__version__
        try:
            torch.__version__ = version + "+other"
            mod, info = _launch._load_hotpath(lib)
        finally:
            torch.__version__ = version
        self.assertIsNone(mod)
        self.assertIn("running torch " + version + "+other", info["reason"])
        env = dict(os.environ, KDAJIT_PYTHON_HOTPATH="0")
        out = subprocess.run([sys.executable, "-c", "import kdajit; print(kdajit.hotpath_info())"], env=env,
                             capture_output=True, text=True, check=True).stdout
        self.assertIn("'enabled': False", out)
        self.assertIn("KDAJIT_PYTHON_HOTPATH=0", out)
        # A malformed value is an error naming the variable, at the first call.
        env["KDAJIT_PYTHON_HOTPATH"] = "yes"
        r = subprocess.run([sys.executable, "-c", "import kdajit; kdajit.hotpath_info()"], env=env,
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("KDAJIT_PYTHON_HOTPATH: expected 0 or 1, got 'yes'", r.stderr)


class Helpers(unittest.TestCase):
    def test_builders_make_the_contract_layouts(self):
        # Guards the test helpers themselves: the canonical views are what docs/CONTRACT.md §1 says.
        c = conv_pool(4, 3 * 128, 3, "sd", 8, "cpu")
        self.assertEqual(c.stride(), (3 * 3 * 128 + 8, 1, 3 * 128))
        c = conv_pool(4, 3 * 128, 3, "ds", 0, "cpu")
        self.assertEqual(c.stride(), (3 * 3 * 128, 3, 1))
        s = state_pool(4, 2, torch.bfloat16, 8, "cpu")
        self.assertEqual(s.stride(), (2 * D * D + 8, D * D, D, 1))
        x = padded_rows(3, 10, 6, torch.bfloat16, "cpu")
        self.assertEqual((tuple(x.shape), x.stride()), ((3, 10), (16, 1)))


if __name__ == "__main__":
    unittest.main()
