#!/usr/bin/env python3
"""Diagnoses test_gpu.py::Compile::test_torch_compile_of_a_module_matches_eager
(conv_as_view=True: conv_state a transposed view of a [S, K, qkv] pool, SD strides)
in one run, and exits 0 with a one-line summary last.

    PYTHONPATH=python KDAJIT_LIBRARY=build-device/runtime/libkdajit.so \\
        python3 tests/python/diag_compile_view.py

It builds the test's Decode modules (test_gpu.Decode) for the test's problem and
inputs, and compares module A (always eager) with module B over three steps:

  shared/eager      the pools as the test built them before c60e385 (the SD view's
                    transpose `.contiguous()`, which is the view itself: A and B
                    share one conv pool), B eager too: the control without compile
  shared/inductor   the same, B compiled (the failing test as it was)
  owned/inductor    each module owns its pools (the test now), B compiled, Inductor
  owned/aot_eager   the same with the aot_eager backend (functionalization, no Inductor)
  ds/inductor       conv_as_view=False (a DS pool passed as is), B compiled

Per step: the max abs difference of output, state and conv pool between A and B,
and what the op itself saw for conv_state, state and output in A's and in B's call
(shape, strides, storage offset, data pointer, and whether that is the module's own
buffer: 'own' = written in place, 'copy' = Inductor/functionalization passed a
clone that is copied back). For the first Inductor call it prints the generated
code's lines around the kdajit call (reinterpret_tensor of the pool or a buffer).

KDAJIT_TEST_FAKE_DEVICE=1 (with KDAJIT_REFERENCE_LIB) runs the same on the CPU with
the C++ reference standing in for the kernels, where torch can compile.
"""
import os
import sys
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(HERE, "..", "..", "python"))  # the package, when PYTHONPATH does not name it

import torch  # noqa: E402

STEPS = 3
WATCHED = ("conv_state", "state", "output")


def summary_and_exit(line):
    print(line)
    return 0


class Recorder:
    """Wraps kdajit._launch.single_impl (which the eager path and the custom op's real
    implementation both call) and records what each call got."""

    def __init__(self, ops):
        self.ops = ops
        self.real = ops.single_impl
        self.calls = []
        self.role = None

    def __enter__(self):
        real, calls = self.real, self.calls

        def recording(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                      output_gate, norm_weight, lower_bound, norm_eps, output, state_indices_mode, dry=False):
            seen = {}
            for name, t in (("conv_state", conv_state), ("state", state), ("output", output)):
                seen[name] = (tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.data_ptr(),
                              _storage_ptr(t))
            calls.append((self.role, seen))
            return real(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                        output_gate, norm_weight, lower_bound, norm_eps, output, state_indices_mode, dry)

        self.ops.single_impl = recording
        return self

    def __exit__(self, *exc):
        self.ops.single_impl = self.real
        return False

    def take(self, role):
        got = [seen for r, seen in self.calls if r == role]
        self.calls[:] = [c for c in self.calls if c[0] != role]
        return got


def _storage_ptr(t):
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return st.data_ptr()


def describe(seen, module, name):
    shape, stride, offset, ptr, storage = seen
    own = {"conv_state": module.conv_pool, "state": module.state}.get(name)
    where = ""
    if own is not None:
        where = " own" if storage == _storage_ptr(own) else " COPY"
    return f"{name} {list(shape)} strides {stride} offset {offset} ptr {ptr:#x}{where}"


def max_abs(a, b):
    d = (a.float() - b.float()).abs()
    d = torch.nan_to_num(d, nan=float("inf"))
    return d.max().item() if d.numel() else 0.0


def run_scenario(tg, kt, rec, name, conv_as_view, shared, backend):
    """Returns (mismatch: bool, lines, facts dict)."""
    import kdajit  # noqa: F401

    lines = [f"--- {name}: conv_as_view={conv_as_view}, pools {'shared' if shared else 'owned'}, "
             f"B {'eager' if backend is None else 'compiled (' + backend + ')'}"]
    if backend is not None:
        from torch import _dynamo
        _dynamo.reset()
    p = tg.gpu_problem("single", 8, 5, seed=7000, conv="sd" if conv_as_view else "ds", null_rows=1)
    a, b = tg.Decode(p, conv_as_view).to(tg.DEV), tg.Decode(p, conv_as_view).to(tg.DEV)
    if shared:  # the construction the test had before c60e385
        for m in (a, b):
            m.conv_pool = p.views["conv_state"].transpose(1, 2).contiguous() if conv_as_view else m.conv_pool
    share = _storage_ptr(a.conv_pool) == _storage_ptr(b.conv_pool)
    lines.append(f"A and B share the conv pool storage: {share}; A.conv_state() strides "
                 f"{tuple(a.conv_state().stride())}")
    call_b = b if backend is None else torch.compile(b, fullgraph=True, backend=backend)
    facts = {"mismatch": False, "b_strides_equal": True, "b_copy": False, "share": share}
    for step in range(STEPS):
        q, args = tg.decode_inputs(step)
        rec.role = "A"
        want = a(*args)
        rec.role = "B"
        if backend == "inductor" and step == 0:
            got = first_inductor_call(call_b, args, lines)
        else:
            got = call_b(*args)
        rec.role = None
        tg.sync()
        d_out, d_state, d_conv = max_abs(got, want), max_abs(b.state, a.state), max_abs(b.conv_pool, a.conv_pool)
        same = (torch.equal(kt.bits(got), kt.bits(want)) and torch.equal(kt.bits(b.state), kt.bits(a.state))
                and torch.equal(kt.bits(b.conv_pool), kt.bits(a.conv_pool)))
        facts["mismatch"] |= not same
        lines.append(f"step {step}: max |B - A|: output {d_out:.4g}, state {d_state:.4g}, conv pool {d_conv:.4g}"
                     f"{'' if same else '  MISMATCH'}")
        seen_a, seen_b = rec.take("A"), rec.take("B")
        if len(seen_a) != 1 or len(seen_b) != 1:
            lines.append(f"  op calls seen: A {len(seen_a)}, B {len(seen_b)} (expected 1 each)")
        for sa, sb in zip(seen_a[:1], seen_b[:1]):
            for n in WATCHED:
                lines.append(f"  A: {describe(sa[n], a, n)}")
                lines.append(f"  B: {describe(sb[n], b, n)}")
                if sa[n][:3] != sb[n][:3]:
                    facts["b_strides_equal"] = False
                    lines.append(f"  -> {n}: B's op saw other shape/strides/offset than A's")
                if n != "output" and "COPY" in describe(sb[n], b, n):
                    facts["b_copy"] = True
    return facts, lines


def first_inductor_call(fn, args, lines):
    """The first compiled call, with the generated code's lines around the kdajit call."""
    try:
        from torch._inductor.utils import run_and_get_code
    except ImportError:
        return fn(*args)
    import contextlib

    no_cache = contextlib.nullcontext()
    try:  # a cached graph would bring no code to print
        import torch._inductor.config as iconfig
        no_cache = iconfig.patch({k: v for k, v in (("fx_graph_cache", False), ("force_disable_caches", True))
                                  if hasattr(iconfig, k)})
    except (ImportError, AttributeError):
        pass
    with no_cache:
        got, codes = run_and_get_code(fn, *args)
    if not any("fused_kda_decode" in code for code in codes):
        lines.append(f"  (no generated code with the op captured: {len(codes)} code objects)")
    for code in codes:
        src = code.splitlines()
        hits = [i for i, s in enumerate(src) if "kdajit" in s and "fused_kda_decode" in s]
        for i in hits[:2]:
            lines.append("  inductor code around the op:")
            for s in src[max(0, i - 8):i + 6]:
                lines.append("    | " + s.rstrip()[:200])
    return got


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eager-only", action="store_true", help="only the control without torch.compile (CTest)")
    args = ap.parse_args(argv)
    try:
        import test_gpu as tg
    except unittest.SkipTest as e:
        return summary_and_exit(f"diag_compile_view: skipped: {e}")
    import kda_testing as kt
    import kdajit
    from kdajit import _launch

    print(f"kdajit {kdajit.version()}, torch {torch.__version__}, device "
          f"{'cpu (fake: the C++ reference for the kernels)' if tg.FAKE else torch.cuda.get_device_name()}")
    can_compile = kdajit.HAS_CUSTOM_OPS and hasattr(torch, "compile") and not args.eager_only
    if can_compile:
        info = []
        try:
            from torch._functorch import config as fconfig
            info.append(f"custom_op_default_layout_constraint={fconfig.custom_op_default_layout_constraint}")
        except (ImportError, AttributeError):
            pass
        try:
            from torch._library.utils import get_layout_constraint_tag
            info.append(f"op layout tag={get_layout_constraint_tag(torch.ops.kdajit.fused_kda_decode.default)}")
        except (ImportError, AttributeError):
            pass
        try:
            import torch._inductor.config as iconfig
            info.append(f"enable_auto_functionalized_v2={iconfig.enable_auto_functionalized_v2}")
        except (ImportError, AttributeError):
            pass
        print("torch.compile: " + (", ".join(info) or "(no config facts)"))
    scenarios = [("shared/eager", True, True, None)]
    if can_compile:
        scenarios += [("shared/inductor", True, True, "inductor"), ("owned/inductor", True, False, "inductor"),
                      ("owned/aot_eager", True, False, "aot_eager"), ("ds/inductor", False, False, "inductor")]
    results = {}
    with Recorder(_launch) as rec:
        for name, conv_as_view, shared, backend in scenarios:
            try:
                facts, lines = run_scenario(tg, kt, rec, name, conv_as_view, shared, backend)
                results[name] = facts
            except Exception as e:  # noqa: BLE001 (a diagnostic reports and goes on)
                lines = [f"--- {name}: ERROR {type(e).__name__}: {e}"] + \
                    ["    " + s for s in traceback.format_exc().rstrip().splitlines()[-12:]]
                results[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"}
            print("\n".join(lines))
            sys.stdout.flush()

    def verdict(name):
        r = results.get(name)
        if r is None:
            return "not run"
        if "error" in r:
            return "error (" + r["error"] + ")"
        text = "MISMATCH" if r["mismatch"] else "match"
        if name != "shared/eager" and not r["mismatch"]:
            text += ", B's op saw A's strides" if r["b_strides_equal"] else ", B's op saw OTHER strides"
            text += ", pools copied" if r["b_copy"] else ", pools in place"
        return text

    parts = [f"{n}: {verdict(n)}" for n, *_ in scenarios]
    owned = [results.get(n, {}) for n in ("owned/inductor", "owned/aot_eager", "ds/inductor")]
    if not can_compile:
        cause = ("--eager-only" if args.eager_only else "torch.compile not available here") + \
            " (only the eager control ran)"
    elif results.get("shared/eager", {}).get("mismatch") and all(r and not r.get("mismatch", True) for r in owned):
        cause = "cause: the test's shared conv pool (eager differs from eager too); compiled matches eager with owned pools"
    elif any(r.get("mismatch") or "error" in r for r in owned):
        cause = "compiled differs from eager even with owned pools: see the rows above"
    else:
        cause = "no mismatch reproduced"
    return summary_and_exit("diag_compile_view: " + cause + " | " + "; ".join(parts))


if __name__ == "__main__":
    try:
        rc = main()
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        print(f"diag_compile_view: error before the scenarios ran: {type(e).__name__}: {e}")
        rc = 0
    sys.exit(rc)
