"""Test support for the Python package: random KDA decode and prefill problems laid out the
way engines pass them (FlashInfer's and vLLM's shapes, padded strides, SD/DS
conv layouts, shuffled slots, null and out-of-range rows), the project's float64
reference (the C++ one, through libkdajit_reference_shim.so: docs/CONTRACT.md
§2-§4 and the prefill op, rounding points 1-4), and the docs/CONTRACT.md §8 checks. Torch; the
reference also needs the kdajit package and $KDAJIT_REFERENCE_LIB.
"""
import os
import tempfile
import unittest

import torch

D = 128
W = 4

SOURCE_DIR = os.environ.get("KDAJIT_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


# --- Layout helpers -------------------------------------------------------------

def padded_rows(rows, n, pad, dtype, device):
    """[rows, n] with row stride n + pad: engines slice wider buffers."""
    return torch.empty(rows, n + pad, dtype=dtype, device=device)[:, :n]


def rhd(rows, heads, pad, device, form="RHD"):
    """A [R, H, 128] bf16 row tensor (row stride H*128 + pad) in one of the
    accepted forms: RHD, 1RHD, RHxD ([R, H*128]) or 1RHxD ([1, R, H*128]).
    Returns (tensor as passed, its canonical [R, H, 128] view)."""
    base = padded_rows(rows, heads * D, pad, torch.bfloat16, device)
    canon = base.unflatten(1, (heads, D)) if hasattr(base, "unflatten") else base.view(rows, heads, D)
    if canon.stride() != (heads * D + pad, D, 1):
        canon = base.as_strided((rows, heads, D), (heads * D + pad, D, 1))
    given = {"RHD": canon, "1RHD": canon.unsqueeze(0), "RHxD": base, "1RHxD": base.unsqueeze(0)}[form]
    return given, canon


def conv_pool(slots, qkv, taps, layout, slot_pad, device):
    """conv_state [S, qkv, K] bf16: SD strides (slot, 1, qkv) or DS (slot, K, 1)."""
    slot = qkv * taps + slot_pad
    strides = (slot, 1, qkv) if layout == "sd" else (slot, taps, 1)
    return torch.empty_strided((slots, qkv, taps), strides, dtype=torch.bfloat16, device=device)


def state_pool(slots, heads, dtype, slot_pad, device):
    """state [S, H, 128, 128] with slot stride H*128*128 + slot_pad."""
    return torch.empty_strided((slots, heads, D, D), (heads * D * D + slot_pad, D * D, D, 1), dtype=dtype,
                               device=device)


def copy_strided(t):
    """A copy with the same strides (clone() would drop the padding of a view)."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


# --- Problems -------------------------------------------------------------------

class Problem:
    """The arguments of one call (`args`: the tensors as the op takes them, by name),
    their canonical views (`views`), the op ("single", "packed" or "prefill") and
    the scalars (lower_bound None: the softplus gate)."""

    def __init__(self, op, args, views, lower_bound, norm_eps, mode="unique_or_null"):
        self.op, self.args, self.views = op, args, views
        self.lower_bound, self.norm_eps, self.mode = lower_bound, norm_eps, mode

    @property
    def heads(self):
        return self.views["A_log"].numel()

    def kwargs(self, **override):
        kw = dict(self.args)
        if self.op == "prefill":
            kw["gate"] = "softplus" if self.lower_bound is None else "bounded"
            kw["lower_bound"] = -5.0 if self.lower_bound is None else self.lower_bound
        else:
            kw["lower_bound"] = self.lower_bound
        kw["norm_eps"] = self.norm_eps
        if self.op == "single":
            kw["state_indices_mode"] = self.mode
        kw.update(override)
        return kw

    def call(self, kdajit, **override):
        fn = {"single": kdajit.fused_kda_decode, "packed": kdajit.packed_fused_kda_decode,
              "prefill": kdajit.fused_kda_prefill}[self.op]
        return fn(**self.kwargs(**override))

    def mutables(self):
        return {k: self.args[k] for k in ("conv_state", "state", "output", "out") if self.args.get(k) is not None}


def _fill(gen, t, scale=1.0, shift=0.0):
    src = torch.randn(t.shape, generator=gen, dtype=torch.float32) * scale + shift
    t.copy_(src.to(t.dtype))
    return t


def make_problem(op="single", heads=4, rows=5, *, tokens=1, seqs=None, slots=None, state_dtype=torch.float32,
                 conv="sd", gate="bounded", device="cpu", seed=0, null_rows=0, oob_rows=0, row_pad=16,
                 slot_pad=0, forms=None, norm_eps=1e-5, lower_bound=-5.0, mode="unique_or_null", lengths=None,
                 accepted=None, output=True):
    """A random problem (docs/CONTRACT.md §8 distributions). op "packed": `seqs`
    sequences of `lengths` (default: tokens each) rows in order; `accepted`
    num_accepted_tokens (default random in 1..T). forms: the accepted torch
    forms per argument (see the helpers), default FlashInfer's."""
    forms = dict(forms or {})
    gen = torch.Generator().manual_seed(seed)
    H, hidden = heads, heads * D
    qkv = 3 * hidden
    T = tokens if op == "packed" else 1
    K = T + W - 2
    if op == "packed":
        seqs = seqs or rows
        lengths = list(lengths) if lengths is not None else [T] * seqs
        rows = max(sum(max(v, 0) for v in lengths), 1)
    live_slots_needed = (seqs * T) if op == "packed" else rows
    S = slots or live_slots_needed + 3
    cpu = "cpu"

    views = {}
    x = padded_rows(rows, qkv, row_pad, torch.bfloat16, cpu)
    _fill(gen, x)
    views["x"] = x
    weight = torch.empty(3, W, hidden)
    _fill(gen, weight, 0.5)
    views["weight"] = weight
    cs = conv_pool(S, qkv, K, conv, slot_pad * 4, cpu)  # multiples of 4 elements keep slots 8-byte aligned
    _fill(gen, cs)
    views["conv_state"] = cs
    g_given, g = rhd(rows, H, row_pad, cpu, forms.get("raw_gate", "1RHD"))
    _fill(gen, g)
    views["raw_gate"] = g
    beta_base = padded_rows(rows, H, row_pad, torch.bfloat16, cpu)
    _fill(gen, beta_base)
    views["raw_beta"] = beta_base
    A_log = torch.empty(H)
    _fill(gen, A_log, 0.5)
    views["A_log"] = A_log
    dt_bias = torch.empty(hidden)
    _fill(gen, dt_bias, 0.1)
    views["dt_bias"] = dt_bias
    st = state_pool(S, H, state_dtype, slot_pad * 4, cpu)
    _fill(gen, st, 0.1)
    views["state"] = st
    og_given, og = rhd(rows, H, row_pad, cpu, forms.get("output_gate", "RHD"))
    _fill(gen, og)
    views["output_gate"] = og
    norm_weight = torch.empty(D)
    _fill(gen, norm_weight, 0.1, 1.0)
    views["norm_weight"] = norm_weight

    perm = (torch.randperm(S - 1, generator=gen) + 1).to(torch.int32)  # shuffled live slots 1..S-1
    if op == "single":
        if mode == "repeated_positive":
            si = perm[torch.randint(0, max(1, min(3, S - 1)), (rows,), generator=gen)]
        else:
            si = perm[:rows].clone()
            if mode == "unique_or_null":
                for i in range(min(null_rows, rows)):
                    si[(3 * i + 1) % rows] = 0 if i % 2 == 0 else -1
                for i in range(min(oob_rows, rows)):
                    si[(5 * i + 2) % rows] = S + i * 7
        views["state_indices"] = si.contiguous()
    else:
        si = perm[:seqs * T].view(seqs, T).clone()
        for i in range(min(null_rows, seqs)):
            si[(3 * i + 1) % seqs, 0] = 0
        for i in range(min(oob_rows, seqs)):
            si[(5 * i + 2) % seqs, T - 1] = S + i
        views["state_indices"] = si.contiguous()
        qsl = [0]
        for L in lengths:
            qsl.append(qsl[-1] + max(L, 0))
        views["query_start_loc"] = torch.tensor(qsl, dtype=torch.int32)
        if accepted is None:
            accepted = torch.randint(1, T + 1, (seqs,), generator=gen).tolist()
        views["num_accepted_tokens"] = torch.tensor(accepted, dtype=torch.int32)

    if output:
        out_given, out = rhd(rows, H, row_pad, cpu, forms.get("output", "1RHD"))
        out.fill_(float("nan"))  # poisoned: every element that must be written is
        views["output"] = out
    given = dict(views)
    given["raw_gate"] = g_given
    given["output_gate"] = og_given
    if output:
        given["output"] = out_given
    else:
        given["output"] = None
    given["x"] = {"R": x, "1R": x.unsqueeze(0)}[forms.get("x", "R")]
    given["raw_beta"] = {"RH": beta_base, "1RH": beta_base.unsqueeze(0)}[forms.get("raw_beta", "1RH")]
    given["A_log"] = {"H": A_log, "11H1": A_log.view(1, 1, H, 1), "H1": A_log.view(H, 1)}[forms.get("A_log", "H")]
    given["dt_bias"] = {"HD": dt_bias, "H,D": dt_bias.view(H, D)}[forms.get("dt_bias", "HD")]
    given["norm_weight"] = {"D": norm_weight, "1D": norm_weight.view(1, D)}[forms.get("norm_weight", "D")]
    if op == "single":
        given["state_indices"] = {"R": views["state_indices"],
                                  "1R": views["state_indices"].view(1, rows)}[forms.get("state_indices", "R")]

    lb = None if gate == "softplus" else lower_bound
    p = Problem(op, given, views, lb, norm_eps, mode)
    if device != "cpu":
        p = to_device(p, device)
    return p


def make_prefill_problem(heads=4, lengths=(5, 3), *, kinds=None, initial=None, taps=3, rows_after=0, qsl=None,
                         rows=None, slots=None, device="cpu", seed=0, norm_eps=1e-6, **kw):
    """A random prefill problem (docs/CONTRACT.md §8 distributions): sequences of
    `lengths` rows in order from row 0, then rows_after rows no sequence owns; or
    query_start_loc `qsl` as given over `rows` rows (malformed ranges). kinds:
    per sequence "live" (default), "null" (slot 0 or -1) or "oob" (slot >= S);
    initial: the has_initial_state values (None: the argument is None); taps: K
    of conv_state. The tensors are a single-op problem's of T_total rows
    (make_problem's keyword arguments: state_dtype, conv, gate, row_pad,
    slot_pad, forms, output, ...), under the prefill op's names (conv_weight, out)."""
    n = len(lengths)
    kinds = list(kinds or ["live"] * n)
    if qsl is None:
        qsl = [0]
        for length in lengths:
            qsl.append(qsl[-1] + length)
        rows = qsl[-1] + rows_after
    S = slots or kinds.count("live") + 3
    # The single op's slots are replaced below; repeated_positive draws them for any R and S.
    base = make_problem("single", heads, rows, slots=S, seed=seed, norm_eps=norm_eps, mode="repeated_positive", **kw)
    args, views = dict(base.args), dict(base.views)
    gen = torch.Generator().manual_seed(seed + 7919)
    if taps != 3:
        old = views["conv_state"]
        layout = "ds" if old.stride(2) == 1 else "sd"
        pad = old.stride(0) - old.shape[1] * old.shape[2]
        cs = conv_pool(S, old.shape[1], taps, layout, pad, "cpu")
        _fill(gen, cs)
        args["conv_state"] = views["conv_state"] = cs
    perm = (torch.randperm(S - 1, generator=gen) + 1).tolist()
    slot_values, nulls, oobs = [], 0, 0
    for k in kinds:
        if k == "live":
            slot_values.append(perm.pop(0))
        elif k == "null":
            slot_values.append((0, -1)[nulls % 2])
            nulls += 1
        else:
            slot_values.append(S + oobs)
            oobs += 1
    views["state_indices"] = args["state_indices"] = torch.tensor(slot_values, dtype=torch.int32)
    views["query_start_loc"] = args["query_start_loc"] = torch.tensor(qsl, dtype=torch.int32)
    views["has_initial_state"] = args["has_initial_state"] = (
        None if initial is None else torch.tensor(initial, dtype=torch.int32))
    for d in (args, views):
        d["conv_weight"] = d.pop("weight")
        d["out"] = d.pop("output", None)
    p = Problem("prefill", args, views, base.lower_bound, base.norm_eps)
    if device != "cpu":
        p = to_device(p, device)
    return p


def _storage_bytes(t):
    """The whole storage behind t as a flat uint8 tensor on t's device."""
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage().untyped()
    nbytes = st.nbytes()
    u8 = torch.empty(0, dtype=torch.uint8, device=t.device)
    u8.set_(st, 0, (nbytes,), (1,))
    return u8


def _storage_key(t):
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage().untyped()
    return st.data_ptr()


def to_device(p, device):
    """The same problem on `device`: each storage copied once, byte for byte, so
    every stride, offset and the aliasing between tensors (a view and its base,
    conv and state slots interleaved in one page pool) are preserved."""
    moved = {}

    def move(t):
        if t is None:
            return None
        key = _storage_key(t)
        if key not in moved:
            moved[key] = _storage_bytes(t).to(device)
        flat = moved[key].view(t.dtype)
        return flat.as_strided(t.shape, t.stride(), t.storage_offset())

    args = {k: move(v) for k, v in p.args.items()}
    views = {k: move(v) for k, v in p.views.items()}
    return Problem(p.op, args, views, p.lower_bound, p.norm_eps, p.mode)


# --- The float64 reference (docs/CONTRACT.md §2-§4) ------------------------------------
# The project's one reference is the C++ one (tools/reference/reference.cpp); Python
# runs it through libkdajit_reference_shim.so on host tensors, mapped to
# kdajit_decode_args_t by the kdajit package exactly as a call would be.

REFERENCE_LIB_ENV = "KDAJIT_REFERENCE_LIB"
_reference_fn = None
_reference_prefill_fn = None


def fake_launch(op, reference, validate=True):
    """For KDAJIT_TEST_FAKE_DEVICE=1: the Python launch of `op` ("prefill" or
    "chunk") runs the library's validation of the args bytes (as the op's C
    entry point runs it; validate=False where the library lacks the op), then
    `reference` on the same bytes in place of the kernel; host tensors are
    accepted."""
    from kdajit import _launch
    name, entry_points, field_to_arg, launcher = {
        "prefill": ("fused_kda_prefill", "prefill_entry_points", _launch._PREFILL_FIELD_TO_ARG, "_launch_prefill"),
        "chunk": ("chunk_kda", "chunk_entry_points", _launch._CHUNK_FIELD_TO_ARG, "_launch_chunk"),
    }[op]

    def launch(args, mapping):
        if validate:
            _launch._validate_op(entry_points, name, args, mapping, field_to_arg)
        reference(args)

    _launch._allow_host_tensors = True
    setattr(_launch, launcher, launch)


def gpu_test_device(fake, cache_prefix):
    """The device a GPU test module runs on and its kernel cache: "cpu" with the
    fake device (the module has put the reference in the launcher's place), else
    "cuda" (unittest.SkipTest where torch sees no CUDA device: the harness
    reports it as skipped, 77). The process runtime gets a fresh cache directory
    (every run compiles the keys it needs); keep the returned directory alive."""
    import kdajit
    if not fake and not torch.cuda.is_available():
        raise unittest.SkipTest("torch sees no CUDA device")
    cache = tempfile.TemporaryDirectory(prefix=cache_prefix)
    kdajit.configure(cache_dir=cache.name)
    return ("cpu" if fake else "cuda"), cache


def sync_device(fake):
    """Waits for the GPU's work (nothing to wait for with the fake device)."""
    if not fake:
        torch.cuda.synchronize()


def run_on_side_stream_and_check(tc, p, what):
    """p's call on a new CUDA stream that first waits for the current one, then
    the checks of check(); returns the output."""
    import kdajit
    before = snapshot(p)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = p.call(kdajit)
    s.synchronize()
    check(tc, p, before, out, what)
    return out


def reference_lib():
    """kdajit_reference_decode(op, args, message, size) of the shim library whose
    path is in $KDAJIT_REFERENCE_LIB (CMake target kdajit_reference_shim)."""
    global _reference_fn, _reference_prefill_fn
    if _reference_fn is None:
        import ctypes

        path = os.environ.get(REFERENCE_LIB_ENV)
        if not path:
            raise RuntimeError(f"{REFERENCE_LIB_ENV}: expected the path of libkdajit_reference_shim.so (the CMake "
                               "target kdajit_reference_shim, built as build/tools/reference/"
                               "libkdajit_reference_shim.so), got nothing")
        if not os.path.isfile(path):
            raise RuntimeError(f"{REFERENCE_LIB_ENV}: expected the path of libkdajit_reference_shim.so, got {path!r} "
                               "(no such file: build the target kdajit_reference_shim)")
        shim = ctypes.CDLL(path)
        fn = shim.kdajit_reference_decode
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        prefill = shim.kdajit_reference_prefill
        prefill.restype = ctypes.c_int
        prefill.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        _reference_fn, _reference_prefill_fn = fn, prefill
    return _reference_fn


def run_reference(op_index, args):
    """Runs the C++ reference on kdajit_decode_args_t bytes (host pointers), in place;
    op_index 0 single, 1 packed (kdajit_op_t). Raises the package's error for a failure."""
    import ctypes

    from kdajit import _abi

    msg = ctypes.create_string_buffer(512)
    status = reference_lib()(op_index, args, msg, len(msg))
    if status:
        raise _abi.error_for(status, msg.value.decode())


def run_prefill_reference(args):
    """Runs the C++ reference on kdajit_prefill_args_t bytes (host pointers), in place."""
    import ctypes

    from kdajit import _abi

    reference_lib()
    msg = ctypes.create_string_buffer(512)
    status = _reference_prefill_fn(args, msg, len(msg))
    if status:
        raise _abi.error_for(status, msg.value.decode())


def prefill_reference_call(**kwargs):
    """The C++ reference of one kdajit.fused_kda_prefill call with these arguments
    (host tensors, as the op takes them; out given): conv_state, state and out
    are updated in place. The arguments are mapped by the package (no library
    validation: the reference validates its own)."""
    from kdajit import _launch

    kw = {"has_initial_state": None, "gate": "bounded", "lower_bound": -5.0, "norm_eps": 1e-6, "max_seq_len": 0,
          "oob_counter": None, **kwargs}
    _, args = _launch.prefill_args(**kw)
    run_prefill_reference(args)


def reference_call(op, **kwargs):
    """The C++ reference of one call of `op` ("single" or "packed") with the op's
    arguments (host tensors, as kdajit.fused_kda_decode / packed_fused_kda_decode
    take them): conv_state, state and output are updated in place."""
    import kdajit
    from kdajit import _abi

    fn = kdajit.fused_kda_decode if op == "single" else kdajit.packed_fused_kda_decode
    run_reference(_abi.enum("op")[op], kdajit.dry_run(fn, **kwargs))


def reference(p):
    """The expected (output [R, H, D] bf16, conv_state, state) after the call, on the
    CPU, from the problem's tensors before the call (p.views, any device): the C++
    reference run on copies of the canonical views."""
    work = snapshot(p)
    v = work.views
    out = "out" if p.op == "prefill" else "output"
    if v.get(out) is None:
        rows = v["x"].shape[0]
        v[out] = torch.zeros(rows, p.heads, D, dtype=torch.bfloat16)
    kwargs = Problem(p.op, v, v, p.lower_bound, p.norm_eps, p.mode).kwargs()
    if p.op == "prefill":
        prefill_reference_call(**kwargs)
    else:
        reference_call(p.op, **kwargs)
    return v[out].reshape(-1, p.heads, D), v["conv_state"], v["state"]


def rel_l2(got, want):
    got, want = got.to(torch.float64), want.to(torch.float64)
    den = torch.linalg.norm(want).item() if hasattr(torch, "linalg") else want.norm().item()
    num = (got - want).norm().item()
    return num / den if den > 0 else num


def bits(t):
    """t reinterpreted as integers of its element size (bytewise, NaN-safe comparisons)."""
    return t.view({2: torch.int16, 4: torch.int32, 1: torch.uint8}[t.element_size()])


def check(tc, p, before, got_output, what=""):
    """The docs/CONTRACT.md §8 checks of one call (single, packed or prefill): tc a
    unittest.TestCase, p the problem after the call, before a snapshot() of it
    from before the call, got_output the output the op returned."""
    want_out, want_conv, want_state = reference(before)
    pre = f"{what}: " if what else ""
    got = got_output.detach().cpu().reshape(want_out.shape)
    tc.assertFalse(bool(torch.isnan(got.float()).any()), f"{pre}output: an element was not written")
    err = rel_l2(got, want_out)
    tc.assertLessEqual(err, 1e-2, f"{pre}output: relative L2 error {err:.3g} > 1e-2")
    close = torch.isclose(got.float(), want_out.float(), rtol=3e-2, atol=2e-2)
    tc.assertTrue(bool(close.all()), f"{pre}output: {int((~close).sum())} elements outside rtol 3e-2 / atol 2e-2")
    # Rows the reference writes as zeros (no live row or sequence) are exactly zero.
    zero_rows = (want_out.float() == 0).flatten(1).all(1)
    nonzero = (got.float()[zero_rows] != 0).flatten(1).any(1)
    tc.assertFalse(bool(nonzero.any()), f"{pre}output: rows {zero_rows.nonzero().flatten()[nonzero].tolist()} "
                   "must be zero")
    got_conv = p.views["conv_state"].cpu()
    tc.assertTrue(torch.equal(bits(got_conv), bits(want_conv)), f"{pre}conv_state: expected exact equality")
    got_state = p.views["state"].cpu()
    old_state = before.views["state"]
    # The prefill's chunked recurrence: its own state limits (docs/DESIGN.md "Prefill").
    if p.op == "prefill":
        tol = 2e-3 if got_state.dtype == torch.float32 else 8e-3
    else:
        tol = 1e-3 if got_state.dtype == torch.float32 else 6e-3
    err = rel_l2(got_state, want_state)
    tc.assertLessEqual(err, tol, f"{pre}state: relative L2 error {err:.3g} > {tol}")
    change = want_state.to(torch.float64) - old_state.to(torch.float64)
    if bool((change != 0).any()):
        err = rel_l2(got_state.to(torch.float64) - old_state.to(torch.float64), change)
        tc.assertLessEqual(err, 1e-2, f"{pre}state change: relative L2 error {err:.3g} > 1e-2")
    # Slots the reference leaves alone must be untouched, bytewise.
    for s in range(old_state.shape[0]):
        if torch.equal(bits(want_state[s]), bits(old_state[s])):
            tc.assertTrue(torch.equal(bits(got_state[s]), bits(old_state[s])), f"{pre}state slot {s}: expected untouched")


def snapshot(p):
    """A deep copy of the problem (every tensor copied with its strides), for the reference."""
    args = {k: (copy_strided(v.cpu()) if v is not None else None) for k, v in p.args.items()}
    views = {k: (copy_strided(v.cpu()) if v is not None else None) for k, v in p.views.items()}
    return Problem(p.op, args, views, p.lower_bound, p.norm_eps, p.mode)



# --- The chunk op (kdajit.chunk_kda, FLA's chunk_kda) ----------------------------------
# Its float64 reference is the token-by-token recurrence of FLA's naive_recurrent_kda
# with kdajit's gates (docs/CONTRACT.md §2 step 4), written here in torch.

def chunk_reference(q, k, v, g, beta, A_log, dt_bias, cu_seqlens, *, initial_state=None, lower_bound=None,
                    scale=None, qk_l2norm=True, beta_sigmoid=True, state_v_first=False):
    """(o [T_total, H, 128] f64, final state [N, H, 128, 128] f64) of the chunk op,
    token by token in float64, on the CPU. q, k, v, g [T_total, H, 128], beta
    [T_total, H] (any float dtype, any device); A_log [H], dt_bias H*128 values
    or None; cu_seqlens the N+1 row offsets (a list or tensor, well-formed);
    initial_state None (zero) or [N, H, 128, 128], [n, h, k, v] or, with
    state_v_first, [n, h, v, k]; the final state comes back in the same layout.
    Per token and head, with S [K, V]: q, k / sqrt(sum x^2 + 1e-6) (qk_l2norm),
    S = diag(exp(gate)) S; S += beta k (v - S^T k)^T; o = (scale q)^T S.
    Rows no sequence owns are zeros."""
    f64 = torch.float64
    q, k, v, g = (t.detach().cpu().to(f64) for t in (q, k, v, g))
    beta = beta.detach().cpu().to(f64)
    rows, heads = q.shape[0], q.shape[1]
    a = torch.exp(A_log.detach().cpu().to(f64).reshape(heads, 1))
    x = g + (0 if dt_bias is None else dt_bias.detach().cpu().to(f64).reshape(heads, D))
    if lower_bound is None:
        gate = -a * torch.nn.functional.softplus(x)  # softplus(x) = x for x > 20, as the kernels
    else:
        gate = lower_bound * torch.sigmoid(a * x)
    decay = torch.exp(gate)
    if qk_l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    b = torch.sigmoid(beta) if beta_sigmoid else beta
    scale = D ** -0.5 if scale is None else scale
    cu = [int(c) for c in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
    seqs = len(cu) - 1
    o = torch.zeros(rows, heads, D, dtype=f64)
    final = torch.zeros(seqs, heads, D, D, dtype=f64)
    for n in range(seqs):
        if initial_state is None:
            s = torch.zeros(heads, D, D, dtype=f64)
        else:
            s = initial_state[n].detach().cpu().to(f64)
            s = s.transpose(-1, -2).clone() if state_v_first else s.clone()  # [h, k, v]
        for t in range(cu[n], cu[n + 1]):
            s = decay[t].unsqueeze(-1) * s
            err = v[t] - torch.einsum("hk,hkv->hv", k[t], s)
            s = s + b[t].reshape(heads, 1, 1) * k[t].unsqueeze(-1) * err.unsqueeze(-2)
            o[t] = torch.einsum("hk,hkv->hv", scale * q[t], s)
        final[n] = s.transpose(-1, -2) if state_v_first else s
    return o, final


def make_chunk_problem(heads=4, lengths=(5, 3), *, batch=None, form="varlen", cu_dtype=torch.int64,
                       state_dtype=torch.float32, initial=True, gate="bounded", g_dtype=torch.bfloat16,
                       beta_dtype=torch.bfloat16, dt_bias=True, slow_decay=False, seed=0, device="cpu"):
    """Random chunk_kda arguments (a dict of keyword arguments; docs/CONTRACT.md §8
    distributions). form "varlen": [1, T_total, H, 128] with cu_seqlens of
    `lengths` (cu_dtype); "batch": [batch, L, H, 128] without cu_seqlens, L =
    lengths[0]; "3d": [T_total, H, 128] with cu_seqlens. initial: an initial
    state of state_dtype (False: none). The flags are the engine's (all in the
    kernel, lower_bound -5 for the bounded gate, None for softplus).
    slow_decay: A_log and dt_bias that put the per-token log decay near -1e-3
    (the §8 draws decay by about e^-2 a token, so that nothing of a state
    outlives a chunk): the state carried from chunk to chunk then shows in o."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    if form == "batch":
        lengths = [lengths[0]] * batch
        lead = (batch, lengths[0])
    else:
        lead = (1, sum(lengths)) if form == "varlen" else (sum(lengths),)
    seqs = len(lengths)
    kw = dict(q=rnd(*lead, heads, D), k=rnd(*lead, heads, D), v=rnd(*lead, heads, D),
              g=rnd(*lead, heads, D, dtype=g_dtype), beta=rnd(*lead, heads, dtype=beta_dtype),
              A_log=rnd(heads, dtype=torch.float32, scale=0.5),
              dt_bias=rnd(heads * D, dtype=torch.float32, scale=0.1) if dt_bias or slow_decay else None,
              initial_state=rnd(seqs, heads, D, D, dtype=state_dtype, scale=0.1) if initial else None,
              output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
              use_beta_sigmoid_in_kernel=True, lower_bound=-5.0 if gate == "bounded" else None)
    if slow_decay:
        # bounded: -5 sigmoid(e^1 (g - 3)) ~ -5 sigmoid(-8); softplus: -e^-4 softplus(g - 3) ~ -1e-3.
        kw["A_log"] += 1.0 if gate == "bounded" else -4.0
        kw["dt_bias"] -= 3.0
    if form != "batch":
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        kw["cu_seqlens"] = torch.tensor(offsets, dtype=cu_dtype)
    if device != "cpu":
        kw = {name: (t.to(device) if isinstance(t, torch.Tensor) else t) for name, t in kw.items()}
    return kw


def chunk_reference_of(kw):
    """chunk_reference of chunk_kda keyword arguments (as make_chunk_problem
    gives them, any form): (o shaped like q, final state), float64 on the CPU."""
    q = kw["q"]
    heads = q.shape[-2]
    rows = q.numel() // (heads * D)
    cu = kw.get("cu_seqlens")
    if cu is None:
        batch, length = (q.shape[0], q.shape[1]) if q.dim() == 4 else (1, q.shape[0])
        cu = [i * length for i in range(batch + 1)]
    flat = {name: kw[name].reshape(rows, heads, D) for name in ("q", "k", "v", "g")}
    o, final = chunk_reference(
        flat["q"], flat["k"], flat["v"], flat["g"], kw["beta"].reshape(rows, heads), kw["A_log"], kw.get("dt_bias"),
        cu, initial_state=kw.get("initial_state"), lower_bound=kw.get("lower_bound"), scale=kw.get("scale"),
        qk_l2norm=kw.get("use_qk_l2norm_in_kernel", False), beta_sigmoid=kw.get("use_beta_sigmoid_in_kernel", False),
        state_v_first=kw.get("state_v_first", False))
    return o.reshape(q.shape), final


def _host_view(t):
    """A torch view of one kdajit_tensor_t of host memory (data, dtype, shape, strides)."""
    import ctypes

    dtype = {0: torch.float32, 1: torch.bfloat16, 2: torch.int32}[t.dtype]
    shape, strides = list(t.shape)[:t.ndim], list(t.strides)[:t.ndim]
    span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    size = torch.empty(0, dtype=dtype).element_size()
    flat = torch.frombuffer((ctypes.c_char * (span * size)).from_address(t.data), dtype=dtype)
    return flat.as_strided(shape, strides)


def run_chunk_args_reference(args):
    """The f64 chunk reference on kdajit_chunk_args_t bytes of host tensors, in
    place: it reads every input through the struct's views and flags, and writes
    output (bf16) and, when set, final_state (its dtype). The tests' stand-in
    for the kernel where there is no GPU: what it computes from the bytes is
    what a launch would be asked for."""
    from kdajit import _abi

    a = _abi.ChunkArgs.from_buffer_copy(args)
    views = {name: (_host_view(getattr(a, name)) if getattr(a, name).data else None)
             for name in _abi.CHUNK_TENSOR_FIELDS}
    o, final = chunk_reference(
        views["q"], views["k"], views["v"], views["g"], views["beta"], views["A_log"], views["dt_bias"],
        views["cu_seqlens"], initial_state=views["initial_state"],
        lower_bound=None if a.gate == _abi.GATE_SOFTPLUS else a.lower_bound, scale=a.scale,
        qk_l2norm=bool(a.qk_l2norm), beta_sigmoid=bool(a.beta_sigmoid), state_v_first=bool(a.state_v_first))
    views["output"].copy_(o.to(torch.bfloat16))
    if views["final_state"] is not None:
        views["final_state"].copy_(final.to(views["final_state"].dtype))


def check_chunk(tc, kw, got_o, got_final, what=""):
    """The chunk op's result against chunk_reference_of(kw) (kw: the arguments from
    before the call): output §8 (rel L2 <= 1e-2, atol 2e-2 + rtol 3e-2), final state
    §10.6 (rel L2 <= 2e-3 f32, 8e-3 bf16). Returns (output error, state error)."""
    want_o, want_final = chunk_reference_of(kw)
    pre = f"{what}: " if what else ""
    tc.assertEqual(got_o.numel(), want_o.numel(), f"{pre}o: {got_o.numel()} elements, expected q's")
    got = got_o.detach().cpu().reshape(want_o.shape)  # o as allocated (q's shape) or any given form
    tc.assertEqual(got.dtype, torch.bfloat16, f"{pre}o: dtype")
    tc.assertTrue(bool(torch.isfinite(got.float()).all()), f"{pre}o: not finite")
    o_err = rel_l2(got, want_o)
    tc.assertLessEqual(o_err, 1e-2, f"{pre}o: relative L2 error {o_err:.3g} > 1e-2")
    close = torch.isclose(got.double(), want_o, rtol=3e-2, atol=2e-2)
    tc.assertTrue(bool(close.all()), f"{pre}o: {int((~close).sum())} elements outside rtol 3e-2 / atol 2e-2")
    s_err = None
    if got_final is not None:
        tol = 2e-3 if got_final.dtype == torch.float32 else 8e-3
        s_err = rel_l2(got_final.detach().cpu(), want_final)
        tc.assertLessEqual(s_err, tol, f"{pre}final state: relative L2 error {s_err:.3g} > {tol}")
    return o_err, s_err
