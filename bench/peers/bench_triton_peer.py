#!/usr/bin/env python3
"""Peer benchmark: kdajit's fused single-token KDA decode against the same op as
three Triton kernels (conv update -> recurrent delta rule -> gated RMSNorm), the
way a serving engine runs KDA decode on Hopper. Both run in this process on the
same torch tensors; kdajit through the repository's Python package (python/kdajit,
kdajit.fused_kda_decode over the library given by --lib). bench/peers/README.md says
what is measured and how to read it.

Over 500 lines: the driver of a comparison outside the library (options, the
Triton tile search, timing, checks, JSON and table; measure_pair and run_grid,
the parts that bench_triton_packed.py shares); the kernels and the problem generator are in
triton_kda.py and kda_problem.py. Split it when it grows.

Exit codes: 0 all measured and every check passed; 1 a check failed or a
configuration could not be measured; 2 usage or environment error (no torch,
Triton, CUDA or libkdajit); 3 the time limit cut the run short (partial results).
"""
import argparse
import dataclasses
import datetime
import faulthandler
import importlib
import json
import math
import os
import platform
import re
import statistics
import struct
import sys
import time
import traceback

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# The kdajit package of this repository (python/kdajit), ahead of any installed copy.
PACKAGE_ROOT = os.path.normpath(os.path.join(HERE, os.pardir, os.pardir, "python"))
sys.path.insert(1, PACKAGE_ROOT)

# The kdajit package, imported by load_kdajit() (it needs torch, and KDAJIT_LIBRARY set first).
kdajit = None

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TIME_LIMIT = 0, 1, 2, 3
D = 128

# Tolerances, relative L2. Against the float64 reference: docs/CONTRACT.md §8. Between
# kdajit and Triton: both carry their own rounding, hence about twice the spec's.
REF_OUTPUT_TOL = 1e-2
REF_STATE_TOL = {"f32": 1e-3, "bf16": 6e-3}
PEER_OUTPUT_TOL = 2e-2
PEER_STATE_TOL = 1e-2

# ~25 ms at the H200's ~2 GHz: the stream is held this long while the host queues
# a batch of replays, so no host gap ever lands inside a timed event pair.
GATE_CYCLES = 50_000_000

# Where every tensor lives; a module constant so that a CPU dry run of the control
# flow (with the GPU calls stubbed) can point it elsewhere.
DEVICE = "cuda"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def int_list(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got '{text}'")
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def state_list(text):
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in ("f32", "bf16")]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"expected a comma list of f32 and bf16, got '{text}'")
    return values


def peer_arguments(description, *, heads, grid, host_calls, seed, time_limit, watchdog, abi_only_help):
    """The options both peer benchmarks take, in their --help order; grid(ap) adds
    the op's own grid options after --heads. check_peer_arguments() checks them."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--lib", default="build-device/runtime/libkdajit.so", help="path of libkdajit.so")
    ap.add_argument("--reference-lib", default=os.environ.get("KDAJIT_REFERENCE_LIB"),
                    help="path of libkdajit_reference_shim.so, the float64 reference of the reference check "
                         "(default: KDAJIT_REFERENCE_LIB)")
    ap.add_argument("--json", default=None, help="write every number here (rewritten after each configuration)")
    ap.add_argument("--heads", type=int_list, default=heads, help="H values")
    grid(ap)
    ap.add_argument("--state", type=state_list, default=["f32", "bf16"], help="state dtypes")
    ap.add_argument("--reps", type=int, default=50, help="timed graph replays per implementation and configuration")
    ap.add_argument("--tune-reps", type=int, default=10, help="replays per Triton tile variant when picking one")
    ap.add_argument("--host-calls", type=int, default=host_calls, help="eager calls of the host-cost loop")
    ap.add_argument("--flush-mib", type=int, default=256, help="L2 flush buffer zeroed before every replay")
    ap.add_argument("--copy-mib", type=int, default=2048, help="size of the D2D copy that sets the roofline")
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    ap.add_argument("--cache-dir", default=None, help="kdajit kernel cache (default: KDAJIT_CACHE_DIR, ~/.cache/kdajit)")
    ap.add_argument("--time-limit", type=float, default=time_limit,
                    help="seconds after which no further configuration starts (exit 3)")
    ap.add_argument("--watchdog", type=float, default=watchdog,
                    help="seconds after which the process dumps its stack and exits (a hung GPU)")
    ap.add_argument("--abi-only", action="store_true", help=abi_only_help)
    return ap


def check_peer_arguments(ap, args):
    """The checks of peer_arguments()' options (ap.error names the option and the expected value)."""
    for name in ("reps", "tune_reps", "host_calls", "flush_mib", "copy_mib"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected >= 1, got {getattr(args, name)}")
    for h in args.heads:
        if not 1 <= h <= 128:
            ap.error(f"--heads: expected values in 1..128, got {h}")


def check_range(ap, name, values, lo, hi):
    for v in values:
        if not lo <= v <= hi:
            ap.error(f"--{name}: expected values in {lo}..{hi}, got {v}")


def parse_args(argv):
    ap = peer_arguments(
        __doc__.split("\n\n")[0], heads=[8, 16, 32, 64],
        grid=lambda ap: ap.add_argument("--rows", type=int_list, default=[1, 8, 32, 128, 512], help="R values"),
        host_calls=200, seed=20261130, time_limit=200.0, watchdog=235.0,
        abi_only_help="check that the kdajit package loads --lib and maps a call on CPU tensors "
                      "(kdajit.dry_run, no GPU) and exit")
    args = ap.parse_args(argv)
    check_peer_arguments(ap, args)
    check_range(ap, "rows", args.rows, 1, 65536)
    return args


# --- kdajit ----------------------------------------------------------------------


class SetupError(Exception):
    """The environment cannot run the benchmark (exit 2)."""


def load_reference(path):
    """Loads the float64 reference library (libkdajit_reference_shim.so) at `path`
    for the reference check; RuntimeError saying what is expected when it cannot."""
    from kda_problem import kda_testing

    kt = kda_testing()
    if path:
        os.environ[kt.REFERENCE_LIB_ENV] = os.path.abspath(path)
    kt.reference_lib()


def load_kdajit(lib_path):
    """Imports the repository's kdajit package with KDAJIT_LIBRARY = lib_path and
    loads the library (the package checks its ABI version and its struct layout
    against the library's init functions); raises SetupError when the package
    loaded any other library. Returns (path, origin) of the loaded library."""
    global kdajit
    want = os.path.abspath(lib_path)
    given = os.environ.get("KDAJIT_LIBRARY")
    if given and os.path.realpath(given) != os.path.realpath(want):
        log(f"note: KDAJIT_LIBRARY={given} replaced by --lib {lib_path}")
    os.environ["KDAJIT_LIBRARY"] = want
    try:
        import kdajit as package
    except ImportError as e:
        raise SetupError(f"cannot import the kdajit package from {PACKAGE_ROOT}: {e}") from e
    kdajit = package
    try:
        path, origin = kdajit.library_path()
    except kdajit.KdajitError as e:
        raise SetupError(str(e)) from e
    if origin != "KDAJIT_LIBRARY" or os.path.realpath(path) != os.path.realpath(want):
        raise SetupError(f"the kdajit package at {os.path.dirname(kdajit.__file__)} loaded {path} ({origin}), "
                         f"not --lib {lib_path}")
    return path, origin


def kd_inputs(p, mode="unique_or_null"):
    """fused_kda_decode's arguments (FlashInfer's order) over Problem p's tensors."""
    args = (p.x, p.conv_weight, p.conv_state, p.raw_gate, p.raw_beta, p.A_log, p.dt_bias, p.state_indices,
            p.state, p.output_gate, p.norm_weight, None if p.gate_softplus else p.lower_bound, p.norm_eps)
    return args, {"output": p.output, "state_indices_mode": mode}


def kd_decode(p):
    """One kdajit call on p's tensors, on torch's current stream (what an engine calls)."""
    args, kwargs = kd_inputs(p)
    kdajit.fused_kda_decode(*args, **kwargs)


def kd_selected_key(p):
    args, kwargs = kd_inputs(p)
    return kdajit.selected_key(kdajit.fused_kda_decode, *args, **kwargs)


def abi_selftest():
    """kdajit.dry_run over host tensors built by the same code as the GPU problems:
    the package maps the call (kdajit_decode_args_t bytes, then kdajit_validate_args
    in the library) without a GPU. The bytes are read back field by field, and a
    wrong argument must be rejected naming that argument."""
    import torch

    from kda_problem import make_problem
    from kdajit import _abi  # the package's mirror of the C structs, to read the bytes back

    codes = {torch.float32: _abi.DTYPE_F32, torch.bfloat16: _abi.DTYPE_BF16, torch.int32: _abi.DTYPE_INT32}
    fields = ("x", "conv_weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias", "state_indices",
              "state", "output_gate", "norm_weight", "output")

    def fail(msg):
        raise kdajit.KdajitError(f"ABI self-test: {msg}")

    for dtype in (torch.float32, torch.bfloat16):
        p = make_problem(2, 3, dtype, "cpu", seed=7, null_rows=1, oob_rows=1, row_pad=64)
        args, kwargs = kd_inputs(p)
        try:
            raw = kdajit.dry_run(kdajit.fused_kda_decode, *args, **kwargs)
        except (ValueError, NotImplementedError) as e:
            fail(f"kdajit.dry_run rejected the {dtype} host problem: {type(e).__name__}: {e}")
        got = _abi.DecodeArgs.from_buffer_copy(raw)
        # The problem's tensors are in the contract's own shapes: each view is the tensor as it is.
        for name in fields:
            t, v = getattr(p, name), getattr(got, name)
            seen = (v.data, v.dtype, v.ndim, tuple(v.shape[:v.ndim]), tuple(v.strides[:v.ndim]))
            want = (t.data_ptr(), codes[t.dtype], t.dim(), tuple(t.shape), tuple(t.stride()))
            if seen != want:
                fail(f"{name} ({dtype}): the package passed (data, dtype, ndim, shape, strides) {seen}, "
                     f"expected {want}")
        for name in ("query_start_loc", "num_accepted_tokens"):
            v = getattr(got, name)
            if v.data or v.ndim:
                fail(f"{name}: expected an empty view for the single op, got data {v.data} ndim {v.ndim}")
        scalars = (got.gate, got.lower_bound, got.norm_eps, got.state_indices_mode, got.oob_counter)
        want = (_abi.GATE_BOUNDED, p.lower_bound, ctypes_f32(p.norm_eps), _abi.INDICES_UNIQUE_OR_NULL, None)
        if scalars != want:
            fail(f"(gate, lower_bound, norm_eps, state_indices_mode, oob_counter) {scalars}, expected {want}")

        # A wrong value in one argument must be caught, and blamed on that argument:
        # the library really reads the fields where the package puts them.
        R, qkv = p.x.shape
        x_stride2 = torch.zeros(R, 2 * qkv, dtype=p.x.dtype)[:, ::2]
        x_stride2.copy_(p.x)
        for arg, change in (("x", {"x": x_stride2}),
                            ("weight", {"conv_weight": p.conv_weight[:, :3]}),
                            ("state", {"state": p.state[:, :, :64]}),
                            ("norm_eps", {"norm_eps": -1.0}),
                            ("output", {"output": p.output.float()})):
            bad_args, bad_kwargs = kd_inputs(dataclasses.replace(p, **change))
            try:
                kdajit.dry_run(kdajit.fused_kda_decode, *bad_args, **bad_kwargs)
            except (ValueError, NotImplementedError) as e:
                msg = str(e)
                if re.match(r"[A-Za-z_]+", msg).group() != arg:
                    fail(f"a bad {arg} was rejected as '{msg}', expected an error naming {arg}")
            else:
                fail(f"a bad {arg} passed kdajit.dry_run")
    return "ok"


def ctypes_f32(v):
    """v rounded to f32, as the struct field holds it."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


# --- Measurement helpers ----------------------------------------------------------


def summary(values):
    v = sorted(values)
    n = len(v)
    if n == 0:
        return {"n": 0}

    def q(f):
        return v[min(n - 1, int(f * (n - 1) + 0.5))]

    return {"n": n, "median": statistics.median(v), "min": v[0], "p10": q(0.1), "p90": q(0.9),
            "max": v[-1], "mean": statistics.fmean(v)}


class Timer:
    """Graph replays timed with CUDA events, each after an L2 flush."""

    def __init__(self, torch, flush_mib):
        self.torch = torch
        self.flush = torch.empty(flush_mib << 20, dtype=torch.uint8, device=DEVICE)
        self.gated = hasattr(torch.cuda, "_sleep")

    def capture(self, fn):
        torch = self.torch
        fn()  # one eager call first: nothing (compiles, lazy loads) may happen during capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        # thread_local: a stray unsafe call of this thread fails the capture loudly.
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            fn()
        torch.cuda.synchronize()
        return g

    def replays(self, graph, reps):
        """Microseconds of each replay; the flush stays outside the event pair."""
        torch = self.torch
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        torch.cuda.synchronize()
        if self.gated:
            torch.cuda._sleep(GATE_CYCLES)
        for i in range(reps):
            self.flush.zero_()
            starts[i].record()
            graph.replay()
            ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]


def host_cost(torch, fn, calls):
    """Eager calls back to back: loop wall time per call (the table's number) and the
    median of the per-call host times (robust if a full launch queue blocks a call)."""
    torch.cuda.synchronize()
    per_call = []
    t0 = time.perf_counter()
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        per_call.append((time.perf_counter() - t) * 1e6)
    loop = time.perf_counter() - t0
    torch.cuda.synchronize()
    total = time.perf_counter() - t0
    return {"calls": calls, "loop_us_per_call": loop * 1e6 / calls,
            "per_call_us": summary(per_call), "loop_and_sync_us_per_call": total * 1e6 / calls}


def copy_bandwidth(torch, mib, reps=10):
    """Device-to-device copy, read + write bytes counted: the roofline, in GB/s."""
    n = mib << 20
    src = torch.ones(n, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    del src, dst
    torch.cuda.empty_cache()
    us = summary(times)
    return 2 * n / (us["median"] * 1e-6) / 1e9, us


def bytes_per_call(heads, rows, state):
    b = 4 if state == "f32" else 2
    return rows * heads * (2 * D * D * b + 4608 + 1538)  # docs/CONTRACT.md §7


# --- Checks --------------------------------------------------------------------


def same_bytes(torch, a, b):
    """Bitwise equality of two tensors' logical contents (torch.equal would let -0 == 0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def fresh_copy(p):
    """p with its own copies of the mutable tensors (state, conv_state, poisoned output)."""
    from kda_problem import clone_strided

    return p.with_fresh_state(clone_strided(p.state), clone_strided(p.conv_state), clone_strided(p.output))


def untouched_slots(torch, p):
    s = p.state_indices.long()
    live = s[(s > 0) & (s < p.slots)]
    keep = torch.ones(p.slots, dtype=torch.bool, device=p.state.device)
    keep[live] = False
    return torch.nonzero(keep).flatten()


def check_against_reference(torch, before, after, ref, state_name):
    """One implementation's result of `before` against the float64 reference."""
    from kda_problem import rel_l2

    ref_out, ref_state, ref_conv = ref
    out = after.output.cpu()
    idx = before.state_indices.cpu().long()
    live_rows = (idx > 0) & (idx < before.slots)
    slots = idx[live_rows]
    other = untouched_slots(torch, before.to("cpu"))
    r = {
        "output_rel_l2": rel_l2(out, ref_out),
        "output_elementwise_ok": bool(torch.isclose(out.double(), ref_out.double(), rtol=3e-2, atol=2e-2).all()),
        "dead_rows_zero": bool((out[~live_rows] == 0).all()),
        "state_rel_l2": rel_l2(after.state.cpu()[slots], ref_state[slots]),
        "untouched_slots_intact": same_bytes(torch, after.state.cpu()[other], before.state.cpu()[other]),
        "conv_state_exact": same_bytes(torch, after.conv_state.cpu(), ref_conv),
    }
    r["ok"] = (r["output_rel_l2"] <= REF_OUTPUT_TOL and r["output_elementwise_ok"] and r["dead_rows_zero"]
               and r["state_rel_l2"] <= REF_STATE_TOL[state_name] and r["untouched_slots_intact"]
               and r["conv_state_exact"])
    return r


def reference_check(torch, seed):
    """H = 2, 3 live rows + 1 null + 1 out-of-range row, padded row strides,
    shuffled slots: kdajit and every Triton tile variant against float64."""
    import triton_kda
    from kda_problem import make_problem, reference

    results = []
    for state_name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        p = make_problem(2, 3, dtype, DEVICE, seed=seed, null_rows=1, oob_rows=1, row_pad=64)
        ref = reference(p)
        impls = [("kdajit", None)] + [(f"triton bv{bv} w{w}", (bv, w)) for bv, w in triton_kda.RECURRENT_VARIANTS]
        for name, variant in impls:
            q = fresh_copy(p)
            entry = {"impl": name, "state": state_name}
            try:
                if variant is None:
                    kd_decode(q)
                else:
                    act, o = triton_kda.make_scratch(q)
                    triton_kda.check_layout(q, act, o)
                    triton_kda.decode(q, act, o, variant)
                torch.cuda.synchronize()
                entry.update(check_against_reference(torch, p, q, ref, state_name))
            except Exception as e:  # noqa: BLE001  (reported, then the next implementation)
                entry.update({"ok": False, "error": f"{type(e).__name__}: {e}"})
            results.append(entry)
            errs = (f"output {entry['output_rel_l2']:.2e}  state {entry['state_rel_l2']:.2e}  "
                    f"conv exact {entry['conv_state_exact']}  dead rows zero {entry['dead_rows_zero']}  "
                    f"untouched {entry['untouched_slots_intact']}" if "error" not in entry else entry["error"])
            log(f"  reference {state_name:4s} {name:16s} {'ok  ' if entry['ok'] else 'FAIL'}  {errs}")
    return results


def peer_check(torch, p0, run_kdajit, run_triton):
    """kdajit and Triton from identical copies of the same inputs, compared with each
    other (kdajit is the one checked against float64 in its own test suite)."""
    from kda_problem import clone_strided, rel_l2

    kd, tr = fresh_copy(p0), fresh_copy(p0)
    run_kdajit(kd)
    run_triton(tr)
    torch.cuda.synchronize()
    slots = p0.state_indices.long()  # every row live in the benchmark problems
    expected_conv = clone_strided(p0.conv_state)
    old = p0.conv_state[slots]
    expected_conv[slots] = torch.stack([old[:, :, 1], old[:, :, 2], p0.x], dim=2)
    other = untouched_slots(torch, p0)
    s0 = p0.state[slots].double()
    kd_state, tr_state = kd.state[slots], tr.state[slots]
    r = {
        "output_rel_l2": rel_l2(tr.output, kd.output),
        "outputs_finite": bool(torch.isfinite(kd.output).all() and torch.isfinite(tr.output).all()),
        "state_rel_l2": rel_l2(tr_state, kd_state),
        "state_change_rel_l2": rel_l2(tr_state.double() - s0, kd_state.double() - s0),
        "conv_state_exact": same_bytes(torch, kd.conv_state, expected_conv)
        and same_bytes(torch, tr.conv_state, expected_conv),
        "untouched_slots_intact": same_bytes(torch, kd.state[other], p0.state[other])
        and same_bytes(torch, tr.state[other], p0.state[other]),
    }
    r["ok"] = (r["output_rel_l2"] <= PEER_OUTPUT_TOL and r["outputs_finite"] and r["state_rel_l2"] <= PEER_STATE_TOL
               and r["conv_state_exact"] and r["untouched_slots_intact"])
    del kd, tr, expected_conv, old, s0, kd_state, tr_state
    return r


# --- One configuration ------------------------------------------------------------


def attempt(rec, key, fn):
    """Runs fn; on an exception records it under rec[key] and returns None."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001  (recorded; the other implementation still runs)
        rec.setdefault(key, {})
        rec[key]["status"] = "failed"
        rec[key]["error"] = f"{type(e).__name__}: {e}"
        log(f"    {key} failed: {rec[key]['error']}")
        log("".join(traceback.format_exception(e)[-3:]).rstrip())
        return None


def measure_pair(torch, timer, rec, opts, roof_gbps, *, kd_call, kd_key, variants, triton_run, check):
    """What both peer benchmarks measure of one configuration, into rec (its
    "bytes_per_call" set): kdajit (kd_key(): the key it selects; the first call,
    which compiles or loads from the disk cache; graph replays; host cost), then
    Triton (every (BV, num_warps) of `variants` compiled, captured and timed
    briefly, the fastest timed fully), then check(variant) -> the check's dict,
    which runs the timed variant on fresh copies of the pristine inputs, and the
    speedup. kd_call() and triton_run(variant) are one call on the working
    problem. A failing part is recorded (attempt()) and the others still run."""
    nbytes = rec["bytes_per_call"]

    def finish(entry, us):
        entry["device_us"] = summary(us)
        entry["gbps"] = nbytes / (entry["device_us"]["median"] * 1e3)
        entry["pct_of_copy_bandwidth"] = 100.0 * entry["gbps"] / roof_gbps

    def run_kdajit():
        e = rec["kdajit"] = {"status": "running"}
        e["key"] = kd_key()  # validation and route selection only
        t = time.perf_counter()
        kd_call()
        torch.cuda.synchronize()
        e["first_call_ms"] = (time.perf_counter() - t) * 1e3
        g = timer.capture(kd_call)
        finish(e, timer.replays(g, opts.reps))
        e["host"] = host_cost(torch, kd_call, opts.host_calls)
        e["status"] = "ok"
        del g

    def run_triton():
        e = rec["triton"] = {"status": "running", "variants": []}
        best = None
        for bv, w in variants:
            t = time.perf_counter()
            triton_run((bv, w))
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - t) * 1e3
            g = timer.capture(lambda: triton_run((bv, w)))
            med = statistics.median(timer.replays(g, opts.tune_reps))
            e["variants"].append({"bv": bv, "num_warps": w, "median_us": med, "first_call_ms": first_ms})
            if best is None or med < best[0]:
                best = (med, (bv, w), g)
            else:
                del g
        _, variant, g = best
        e["variant"] = {"bv": variant[0], "num_warps": variant[1]}
        finish(e, timer.replays(g, opts.reps))
        del g, best
        e["host"] = host_cost(torch, lambda: triton_run(variant), opts.host_calls)
        e["status"] = "ok"
        return variant

    attempt(rec, "kdajit", run_kdajit)
    variant = attempt(rec, "triton", run_triton)
    if rec["kdajit"]["status"] == "ok" and variant is not None:
        def run_check():
            rec["check"] = check(variant)
            rec["check"]["status"] = "ok" if rec["check"]["ok"] else "mismatch"

        attempt(rec, "check", run_check)
    if rec["kdajit"]["status"] == "ok" and rec["triton"]["status"] == "ok":
        rec["speedup"] = rec["triton"]["device_us"]["median"] / rec["kdajit"]["device_us"]["median"]


def measure_config(torch, timer, heads, rows, state_name, seed, opts, roof_gbps):
    import triton_kda
    from kda_problem import make_problem

    dtype = torch.float32 if state_name == "f32" else torch.bfloat16
    nbytes = bytes_per_call(heads, rows, state_name)
    rec = {"heads": heads, "rows": rows, "state": state_name, "seed": seed,
           "bytes_per_call": nbytes, "floor_us": nbytes / (roof_gbps * 1e3),
           "kdajit": {"status": "skipped"}, "triton": {"status": "skipped"}, "check": {"status": "skipped"}}
    t_start = time.perf_counter()
    p0 = make_problem(heads, rows, dtype, DEVICE, seed=seed)  # pristine: only copies are ever run
    rec["slots"] = p0.slots
    work = fresh_copy(p0)  # warm-up, tuning and timing mutate this one
    act, o = triton_kda.make_scratch(work)
    triton_kda.check_layout(work, act, o)

    def check(variant):
        def tr_run(q):
            triton_kda.decode(q, act, o, variant)

        return peer_check(torch, p0, kd_decode, tr_run)

    measure_pair(torch, timer, rec, opts, roof_gbps, kd_call=lambda: kd_decode(work),
                 kd_key=lambda: kd_selected_key(work), variants=triton_kda.RECURRENT_VARIANTS,
                 triton_run=lambda variant: triton_kda.decode(work, act, o, variant), check=check)
    rec["seconds"] = time.perf_counter() - t_start
    del p0, work, act, o
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return rec


# --- Output ------------------------------------------------------------------------


def fmt(v, spec, suffix=""):
    """A number formatted, or "-" when missing or not finite."""
    return format(v, spec) + suffix if isinstance(v, (int, float)) and math.isfinite(v) else "-"


# (title, width) of the table's columns, in order.
COLUMNS = (("H", 3), ("R", 4), ("state", 5), ("kdajit us", 9), ("triton us", 9), ("speedup", 7),
           ("kd %roof", 8), ("tr %roof", 8), ("kd host us", 10), ("tr host us", 10), ("tr tile", 8), ("check", 8))


def measurement_cells(c):
    """A configuration's table cells after its grid columns (both peer benchmarks):
    device times, speedup, % of the roofline, host cost, Triton tile, check."""
    kd, tr, chk = c["kdajit"], c["triton"], c["check"]
    dev_kd, dev_tr = (e.get("device_us", {}).get("median") for e in (kd, tr))
    host_kd, host_tr = (e.get("host", {}).get("loop_us_per_call") for e in (kd, tr))
    tile = f"bv{tr['variant']['bv']} w{tr['variant']['num_warps']}" if "variant" in tr else "-"
    check = {"ok": "ok", "mismatch": "MISMATCH", "failed": "FAILED"}.get(chk.get("status"), str(chk.get("status")))
    return [fmt(dev_kd, ".2f"), fmt(dev_tr, ".2f"), fmt(c.get("speedup"), ".2f", "x"),
            fmt(kd.get("pct_of_copy_bandwidth"), ".1f", "%"), fmt(tr.get("pct_of_copy_bandwidth"), ".1f", "%"),
            fmt(host_kd, ".1f"), fmt(host_tr, ".1f"), tile, check]


def table(configs):
    lines = [" ".join(t.rjust(w) for t, w in COLUMNS)]
    lines.append("-" * len(lines[0]))
    for c in configs:
        cells = [str(c["heads"]), str(c["rows"]), c["state"]] + measurement_cells(c)
        lines.append(" ".join(text.rjust(w) for text, (_, w) in zip(cells, COLUMNS)))
    return "\n".join(lines)


def write_json(path, doc):
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, allow_nan=True)
    os.replace(tmp, path)  # a reader never sees half a file


# --- Main --------------------------------------------------------------------------


def run_grid(args, *, schema, kernels, selftest_title, selftest, doc_fields, tolerances, reference_title,
             reference_check, configs, label, record_fields, skipped_fields, measure, op_title, table):
    """The driver of a peer benchmark, this file's and bench_triton_packed.py's: setup
    checks, the JSON document, the roofline, the reference check, the grid, the table.
    Returns the exit code. What the two benchmarks differ in comes as arguments:

    schema, doc_fields, tolerances: the document's "schema", its fields after
        "settings" (in order), its "tolerances";
    kernels: the name of the Triton kernels' module (imported before any GPU work);
    selftest_title, selftest(torch): the ABI self-test's log line and the test (a
        string; raises kdajit.KdajitError);
    reference_title, reference_check(torch, seed): the reference check's log line
        and the check (a list of entries with "impl" and "ok");
    configs: the grid, tuples, passed as measure(torch, timer, *config, seed, args,
        roof_gbps) -> the configuration's record;
    label(config, padded): a configuration as the log names it ("H=8 R=1 f32");
    record_fields(config), skipped_fields(config): its leading fields in the record
        of a configuration that could not be measured, and in the "skipped" list;
    op_title, table(records): the op as the table's title line names it; the table."""
    t_start = time.perf_counter()
    faulthandler.dump_traceback_later(args.watchdog, exit=True)

    try:
        import torch
    except ImportError as e:
        log(f"error: torch is needed: {e}")
        return EXIT_USAGE
    try:
        lib_path, origin = load_kdajit(args.lib)
    except SetupError as e:
        log(f"error: {e}")
        return EXIT_USAGE
    log(f"kdajit {kdajit.version()} from {lib_path} ({origin}) through the package at "
        f"{os.path.dirname(kdajit.__file__)}; its ABI version and struct layout match the library")
    try:
        log(f"{selftest_title}: {selftest(torch)}")
    except kdajit.KdajitError as e:
        log(f"error: {e}")
        return EXIT_FAILED
    if args.abi_only:
        return EXIT_OK
    try:
        load_reference(args.reference_lib)
    except RuntimeError as e:
        log(f"error: --reference-lib: {e}")
        return EXIT_USAGE

    try:
        import triton

        importlib.import_module(kernels)  # compiles nothing yet; fails early on a Triton API mismatch
    except Exception as e:  # noqa: BLE001
        log(f"error: Triton is needed: {type(e).__name__}: {e}")
        return EXIT_USAGE
    if not torch.cuda.is_available():
        log("error: no CUDA device visible to torch")
        return EXIT_USAGE
    if args.device >= torch.cuda.device_count():
        log(f"error: --device: expected 0..{torch.cuda.device_count() - 1}, got {args.device}")
        return EXIT_USAGE
    torch.cuda.set_device(args.device)
    torch.empty(1, device="cuda")  # creates the context kdajit finds through the stream

    props = torch.cuda.get_device_properties(args.device)
    doc = {
        "schema": schema,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "status": "running",
        "gpu": {"name": props.name, "capability": f"{props.major}.{props.minor}",
                "sms": props.multi_processor_count, "memory_gib": props.total_memory / 2**30},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "torch_cuda": torch.version.cuda, "triton": triton.__version__, "kdajit": kdajit.version()},
        "kdajit_library": lib_path,
        "settings": {k: v for k, v in vars(args).items()},
        **doc_fields,
        "tolerances": tolerances,
        "configs": [],
    }
    log(f"GPU {props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs); "
        f"torch {torch.__version__}, triton {triton.__version__}")

    try:
        # The process runtime, which every kdajit op call uses.
        kdajit.configure(cache_dir=args.cache_dir)
        kdajit.runtime()
    except (kdajit.KdajitError, ValueError) as e:
        log(f"error: kdajit runtime: {e}")
        return EXIT_USAGE

    exit_code = EXIT_OK
    try:
        roof_gbps, copy_us = copy_bandwidth(torch, args.copy_mib)
        doc["copy_bandwidth_gbps"], doc["copy_us"] = roof_gbps, copy_us
        log(f"copy roofline: {roof_gbps:.0f} GB/s ({args.copy_mib} MiB D2D, read + write counted)")
        timer = Timer(torch, args.flush_mib)
        doc["stream_gate"] = timer.gated
        if not timer.gated:
            log("warning: torch.cuda._sleep is missing: replays are queued ungated (host gaps may be timed)")

        log(reference_title)
        doc["reference_check"] = reference_check(torch, args.seed)
        triton_ref_ok = all(r["ok"] for r in doc["reference_check"] if r["impl"].startswith("triton"))
        kdajit_ref_ok = all(r["ok"] for r in doc["reference_check"] if r["impl"] == "kdajit")
        doc["triton_matches_reference"], doc["kdajit_matches_reference"] = triton_ref_ok, kdajit_ref_ok
        if not (triton_ref_ok and kdajit_ref_ok):
            exit_code = EXIT_FAILED
            log("WARNING: an implementation fails the float64 reference; its timings are still taken but "
                "marked (triton_matches_reference / kdajit_matches_reference in the JSON)")
        write_json(args.json, doc)

        for i, config in enumerate(configs):
            if time.perf_counter() - t_start > args.time_limit:
                log(f"time limit {args.time_limit:.0f} s reached: {len(configs) - i} configurations skipped")
                doc["skipped"] = [skipped_fields(c) for c in configs[i:]]
                exit_code = EXIT_TIME_LIMIT
                break
            try:
                rec = measure(torch, timer, *config, args.seed + 1 + i, args, roof_gbps)
            except Exception as e:  # noqa: BLE001  (e.g. out of memory building the problem)
                log(f"  {label(config, False)}: {type(e).__name__}: {e}")
                rec = {**record_fields(config), "seconds": 0.0, "error": f"{type(e).__name__}: {e}",
                       "kdajit": {"status": "failed"}, "triton": {"status": "failed"}, "check": {"status": "failed"}}
                torch.cuda.empty_cache()
            doc["configs"].append(rec)
            kd, tr, chk = rec["kdajit"], rec["triton"], rec["check"]
            log(f"  {label(config, True)}  kdajit {fmt(kd.get('device_us', {}).get('median'), '.2f')} us  "
                f"triton {fmt(tr.get('device_us', {}).get('median'), '.2f')} us  "
                f"check {chk.get('status')}"
                + (f" (output {chk['output_rel_l2']:.1e}, state {chk['state_rel_l2']:.1e}, "
                   f"conv exact {chk['conv_state_exact']})" if "output_rel_l2" in chk else "")
                + f"  [{rec['seconds']:.1f} s]")
            if any(rec[k].get("status") != "ok" for k in ("kdajit", "triton", "check")) and exit_code == EXIT_OK:
                exit_code = EXIT_FAILED
            write_json(args.json, doc)
            # A sticky CUDA error (e.g. an illegal address) poisons every later call: stop here.
            try:
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                log(f"error: the CUDA context is unusable after {label(config, False)}: {e}")
                doc["status"] = "cuda_context_lost"
                write_json(args.json, doc)
                return EXIT_FAILED
    finally:
        kdajit.runtime().close()  # the process runtime: nothing calls kdajit after this

    doc["status"] = {EXIT_OK: "ok", EXIT_FAILED: "failed", EXIT_TIME_LIMIT: "time_limit"}[exit_code]
    doc["total_seconds"] = time.perf_counter() - t_start
    write_json(args.json, doc)
    print(f"\nkdajit vs Triton (3 kernels), {op_title}, {props.name}; "
          f"device us = median of {args.reps} graph replays after an L2 flush; "
          f"%roof of {roof_gbps:.0f} GB/s copy; host us = eager call loop / {args.host_calls}; "
          f"speedup = triton us / kdajit us")
    if not doc.get("triton_matches_reference", True):
        print("NOTE: the Triton path FAILED the float64 reference check: its times are of a wrong kernel")
    print(table(doc["configs"]))
    print(f"status {doc['status']}, {doc['total_seconds']:.0f} s" + (f", JSON {args.json}" if args.json else ""))
    return exit_code


def config_label(config, padded):
    h, r, s = config
    return f"H={h:<3} R={r:<4} {s:4s}" if padded else f"H={h} R={r} {s}"


def config_fields(config):
    h, r, s = config
    return {"heads": h, "rows": r, "state": s}


def main(argv):
    args = parse_args(argv)
    return run_grid(
        args, schema="kdajit-peer-triton/1", kernels="triton_kda",
        selftest_title="ABI self-test (kdajit.dry_run on host tensors, kdajit_validate_args)",
        selftest=lambda torch: abi_selftest(), doc_fields={},
        tolerances={"reference_output": REF_OUTPUT_TOL, "reference_state": REF_STATE_TOL,
                    "peer_output": PEER_OUTPUT_TOL, "peer_state": PEER_STATE_TOL},
        reference_title="reference check (float64, H=2, 3 live + 1 null + 1 out-of-range row, padded rows):",
        reference_check=reference_check,
        configs=[(h, r, s) for h in args.heads for s in args.state for r in args.rows],
        label=config_label, record_fields=config_fields, skipped_fields=config_fields,
        measure=measure_config, op_title="single-token KDA decode", table=table)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
