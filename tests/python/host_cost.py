#!/usr/bin/env python3
"""Host cost of one eager kdajit call from Python (the target: <= 15 us median).

    python3 tests/python/host_cost.py            # on a CUDA machine: real launches
    python3 tests/python/host_cost.py --cpu      # anywhere: host tensors, the launch replaced
                                                 # by kdajit_validate_args (a C call of the same shape)

For each configuration (FlashInfer-shaped arguments: raw_gate [1, R, H, 128],
raw_beta [1, R, H], A_log [H], output given) it prints the median, p10 and p90
of back-to-back calls of:
  call    kdajit.fused_kda_decode / packed_fused_kda_decode, everything included (a repeated
          layout: through kdajit._hotpath, the C++ cache-hit path, when it is in use);
  python path  the same call with kdajit._hotpath set aside (the pure-Python path);
  its python   that path with the C call stubbed out (mapping lookup, struct.pack, stream);
  c       the bare C entry point on the same argument bytes (validation, lookup, launch);
  probe   a fixed pure-Python loop (no torch, no kdajit; about 2 us on the CI machine):
          how fast the machine ran the interpreter while that configuration was
          measured.
The configurations are measured in interleaved rounds (--rounds, each a block of
calls of every stage of every configuration), so a slowdown of the host for a
while (another process, an SMT sibling, the clock) shows in every configuration and
in the probe, not only in whichever configuration happened to run then (before
rounds the packed op ran last, and could take the whole of such a slowdown).
Needs PYTHONPATH=python and KDAJIT_LIBRARY (or the installed package).
tests/python/diag_host_cost.py breaks the python column down by stage.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kda_testing as kt  # noqa: E402

import kdajit  # noqa: E402
from kdajit import _launch  # noqa: E402


def timed(fn, calls, sync, warm=50):
    """Per-call wall times in us; the device is drained every 100 calls (outside the
    timed region) so that a full launch queue never blocks a timed call."""
    for _ in range(warm):
        fn()
    sync()
    out = []
    for i in range(calls):
        if i % 100 == 99:
            sync()
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    sync()
    return out


def probe():
    """A fixed amount of pure interpreter work (a few us): the machine's speed."""
    s = 0
    for i in range(150):
        s += i
    return s


def summary(ts):
    ts = sorted(ts)
    return {"median": statistics.median(ts), "p10": ts[len(ts) // 10], "p90": ts[9 * len(ts) // 10]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="host tensors; validate_args stands in for the launch")
    ap.add_argument("--calls", type=int, default=5000, help="timed calls per stage and configuration")
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds the calls are split into")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu for the host-side estimate", file=sys.stderr)
        return 77
    device = "cpu" if args.cpu else "cuda"
    c = _launch._c or _launch._bind()
    sync = (lambda: None) if args.cpu else torch.cuda.synchronize
    real_launch = _launch._launch
    captured = {}

    if args.cpu:
        def stand_in(fn_index, op, packed, mapping):  # the C call a launch makes, minus the GPU
            c[2](fn_index, packed)
        _launch._allow_host_tensors = True
        _launch._launch = stand_in
        # Host tensors get a device check on every call (get_device() cannot tell
        # host devices apart); CUDA calls do not: leave it out of the estimate.
        _launch._check_torch_side = lambda spec, tensors: None

    def capture_args(fn_index, op, packed, mapping):
        captured["args"] = packed
        captured["stream"] = 0 if mapping.device < 0 else _launch._raw_stream(mapping.device)

    configs = [("single", 8, 1), ("single", 32, 32), ("single", 64, 256), ("packed", 32, 8)]
    print(f"kdajit {kdajit.version()} ({kdajit.library_path()[1]}), torch {torch.__version__}, "
          f"{'host tensors, validate_args for the launch' if args.cpu else torch.cuda.get_device_name()}")
    hot_info = kdajit.hotpath_info()
    print(f"kdajit._hotpath: {'on' if hot_info['enabled'] else 'off'} ({hot_info['reason']})")
    handle = _launch._handle()
    cases = []
    for op, heads, n in configs:
        if op == "single":
            p = kt.make_problem("single", heads, n, device=device, seed=1)
        else:
            p = kt.make_problem("packed", heads, tokens=4, seqs=n, device=device, seed=1)
        kw = p.kwargs()
        fn = kdajit.fused_kda_decode if op == "single" else kdajit.packed_fused_kda_decode
        launch = _launch._launch
        _launch._launch = capture_args
        fn(**kw)  # the bytes (and stream) this call passes, for the bare C call
        _launch._launch = launch
        packed, stream = captured["args"], captured["stream"]
        if args.cpu:
            code = 0 if op == "single" else 1
            bare = (lambda entry, code, packed: lambda: entry(code, packed))(c[2], code, packed)
        else:
            bare = (lambda entry, packed, stream: lambda: entry(handle, packed, stream))(
                c[0 if op == "single" else 1], packed, stream)
        cases.append({"op": op, "heads": heads, "n": n, "fn": (lambda fn, kw: lambda: fn(**kw))(fn, kw),
                      "bare": bare, "times": {"call": [], "call_py": [], "python": [], "c": [], "probe": []}})
    per_round = max(1, args.calls // args.rounds)
    for r in range(args.rounds):
        warm = 50 if r == 0 else 10
        for case in cases:
            t = case["times"]
            t["call"] += timed(case["fn"], per_round, sync, warm)  # through kdajit._hotpath when it is in use
            # The pure-Python path (kdajit._hotpath set aside): the whole call, then
            # its Python side alone (the C entry point stubbed).
            hot = _launch._hot
            _launch._hot = None
            t["call_py"] += timed(case["fn"], per_round, sync, warm)
            launch = _launch._launch
            _launch._launch = capture_args
            t["python"] += timed(case["fn"], per_round, sync, warm)
            _launch._launch = launch
            _launch._hot = hot
            t["c"] += timed(case["bare"], per_round, sync, warm)
            t["probe"] += timed(probe, per_round, sync, warm)
    rows = []
    print(f"{'op':7s} {'H':>3s} {'R/N':>4s} | {'call us':>21s} | {'python path us':>21s} | {'its python us':>21s} | "
          f"{'c us':>7s} | {'probe us':>19s}")
    for case in cases:
        t = case["times"]
        row = {"op": case["op"], "heads": case["heads"], "n": case["n"], "call": summary(t["call"]),
               "call_python_path": summary(t["call_py"]), "python": summary(t["python"]), "c": summary(t["c"]),
               "probe": summary(t["probe"])}
        rows.append(row)
        s, cp, py, cc, pr = row["call"], row["call_python_path"], row["python"], row["c"], row["probe"]
        print(f"{row['op']:7s} {row['heads']:3d} {row['n']:4d} | {s['median']:6.2f} ({s['p10']:5.2f}-{s['p90']:6.2f}) | "
              f"{cp['median']:6.2f} ({cp['p10']:5.2f}-{cp['p90']:6.2f}) | "
              f"{py['median']:6.2f} ({py['p10']:5.2f}-{py['p90']:6.2f}) | {cc['median']:7.2f} | "
              f"{pr['median']:5.2f} ({pr['p10']:5.2f}-{pr['p90']:5.2f})")
    probes = [r["probe"]["median"] for r in rows]
    print(f"probe: median {statistics.median(probes):.2f} us over the configurations "
          f"(min {min(probes):.2f}, max {max(probes):.2f}); {args.rounds} interleaved rounds of {per_round} calls")
    _launch._launch = real_launch
    _launch._allow_host_tensors = False
    worst = max(r["call"]["median"] for r in rows)
    worst_py = max(r["call_python_path"]["median"] for r in rows)
    print(f"host cost: worst median {worst:.2f} us per eager call (target <= 15 us"
          f"{', estimate: no launch' if args.cpu else ''}; kdajit._hotpath {'on' if hot_info['enabled'] else 'off'}); "
          f"pure-Python path {worst_py:.2f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": args.cpu, "torch": torch.__version__, "hotpath": hot_info, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
