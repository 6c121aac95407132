#!/usr/bin/env python3
"""Where the host time of one eager kdajit call goes, stage by stage, for both ops
(the key, the data pointers, the lookup, the pack, the stream, the C call), both
ops interleaved with a fixed pure-Python probe, and the same problems as host
tensors: what separates the two ops' host cost, and the host's own drift.

    PYTHONPATH=python KDAJIT_LIBRARY=build-device/runtime/libkdajit.so \\
        python3 tests/python/diag_host_cost.py            # CUDA tensors, real launches
    ... diag_host_cost.py --cpu                           # host tensors anywhere (validate_args for the launch)

Per op (host_cost.py's configurations: single H=32 R=32, packed H=32 N=8 T=4), the
median / p10 / p25 / p75 / p90 in us of back-to-back calls of each stage:
  call          the public function, everything (what host_cost.py reports)
  python        the same with the C entry point stubbed
  python-gc-off the same with the garbage collector off
  impl          _launch.single_impl / packed_impl called directly (stubbed): python - impl
                is the public wrapper (output check, custom-op test, argument passing)
  is_compiling  torch.compiler.is_compiling (the wrapper calls it on every call)
  key           the mapping cache key: shape, stride(), dtype, get_device() of every tensor
  data_ptrs     data_ptr() of every tensor
  last_key      comparing a fresh (equal) key with the last call's: what a call with
                the last call's layout does instead of a dict lookup
  dict_get      the cache dict's get with a fresh (equal) key (hash + compare): what a
                call with another layout than the last does
  pack          struct.pack of the args bytes
  handle        the process runtime's handle
  stream        torch's current raw stream of the device
  cur_device    torch's current device (read on the legacy default stream)
  c_launch      the bare C entry point on the same bytes (with --cpu: not run)
  c_validate    kdajit_validate_args on the same bytes
then: the per-tensor cost (ns) of each attribute read, a histogram of the python
stage, the python stage of both ops interleaved in blocks, each block followed by a block of
host_cost.py's probe (imported from it; pure interpreter work: is the packed path slow, or the machine
while it ran?), the python stages on host copies of the same tensors
(CUDA tensors vs host tensors, same process), and a one-line summary last.
Exits 0 (77 without CUDA and without --cpu).
"""
import argparse
import gc
import json
import os
import statistics
import sys
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(HERE, "..", "..", "python"))  # the package, when PYTHONPATH does not name it

import torch  # noqa: E402

import kda_testing as kt  # noqa: E402
from host_cost import probe, timed  # noqa: E402  (the same timing loop and machine probe)
import kdajit  # noqa: E402
from kdajit import _abi, _ops, _launch  # noqa: E402

SINGLE_NAMES = ("x", "weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias", "state_indices", "state",
                "output_gate", "norm_weight", "output")
PACKED_NAMES = SINGLE_NAMES + ("query_start_loc", "num_accepted_tokens")
SCALARS = {"single": ("lower_bound", "norm_eps", "output", "state_indices_mode"),
           "packed": ("lower_bound", "norm_eps", "output", "query_start_loc", "num_accepted_tokens")}
IMPL_ORDER = {
    "single": ("x", "weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias", "state_indices", "state",
               "output_gate", "norm_weight", "lower_bound", "norm_eps", "output", "state_indices_mode"),
    "packed": ("x", "weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias", "state_indices", "state",
               "output_gate", "norm_weight", "lower_bound", "norm_eps", "output", "query_start_loc",
               "num_accepted_tokens"),
}


def stats(ts):
    ts = sorted(ts)
    n = len(ts)
    return {"median": statistics.median(ts), "p10": ts[n // 10], "p25": ts[n // 4], "p75": ts[3 * n // 4],
            "p90": ts[9 * n // 10]}


def histogram(ts, width=1.0):
    """'lo-hi us: share' for the 1-us bins that hold at least 2% of the calls."""
    bins = {}
    for t in ts:
        b = int(t // width)
        bins[b] = bins.get(b, 0) + 1
    return ", ".join(f"{b * width:g}-{(b + 1) * width:g}: {100 * c / len(ts):.0f}%"
                     for b, c in sorted(bins.items()) if c >= 0.02 * len(ts))


def generated(names, per_tensor):
    """A function of the tensors that evaluates per_tensor(name) for every tensor in
    one tuple expression, as the op's code does (no loop, no list)."""
    src = f"def f({', '.join(names)}):\n    return ({', '.join(per_tensor(n) for n in names)},)\n"
    ns = {}
    exec(src, ns)  # noqa: S102 (test code, fixed text)
    return ns["f"]


class Op:
    """One configuration: its problem, the public call, the impl call, the stages' inputs."""

    def __init__(self, op, device):
        self.op = op
        if op == "single":
            self.p = kt.make_problem("single", 32, 32, device=device, seed=1)
            self.fn = kdajit.fused_kda_decode
            self.impl = _launch.single_impl
            self.cache = _launch._cache_single
            self.names = SINGLE_NAMES
            self.code = _abi.OP_SINGLE
        else:
            self.p = kt.make_problem("packed", 32, tokens=4, seqs=8, device=device, seed=1)
            self.fn = kdajit.packed_fused_kda_decode
            self.impl = _launch.packed_impl
            self.cache = _launch._cache_packed
            self.names = PACKED_NAMES
            self.code = _abi.OP_PACKED
        self.kw = self.p.kwargs()
        self.impl_args = tuple(self.kw[k] for k in IMPL_ORDER[op])
        self.tensors = tuple(self.kw[n] for n in self.names)
        self.key_fn = generated(self.names, lambda n: f"{n}.shape, {n}.stride(), {n}.dtype, {n}.get_device()")
        self.ptr_fn = generated(self.names, lambda n: f"{n}.data_ptr()")

    def pack_args(self):
        """The arguments of _launch._pack for this call, rebuilt from the cached mapping."""
        m = self.cache[self.key_fn(*self.tensors)]
        ptrs = list(self.ptr_fn(*self.tensors)) + [0] * (len(_abi.TENSOR_FIELDS) - len(self.names))
        args = [_launch._ARGS_SIZE]
        for ptr, chunk in zip(ptrs, m.chunks):
            args += [ptr, chunk]
        lb, eps = self.kw["lower_bound"], self.kw["norm_eps"]
        mode = _abi.enum("indices_mode")[self.kw["state_indices_mode"]] if self.op == "single" else 0
        args += [_abi.GATE_SOFTPLUS if lb is None else _abi.GATE_BOUNDED, 0.0 if lb is None else lb, eps, mode, 0]
        return args, m


def stage_times(o, calls, sync, cpu, c, stub):
    """{stage: [us...]} for one op; stub is the stand-in for _launch._launch."""
    res = {}
    real_launch = _launch._launch
    if not cpu:
        res["call"] = timed(lambda: o.fn(**o.kw), calls, sync)
    else:
        _launch._launch = lambda fn_index, op, args, mapping: c[2](fn_index, args)
        res["call"] = timed(lambda: o.fn(**o.kw), calls, sync)
    captured = {}

    def capture(fn_index, op, args, mapping):
        captured["args"], captured["mapping"] = args, mapping

    _launch._launch = capture
    o.fn(**o.kw)
    _launch._launch = stub
    fn, kw, impl, impl_args = o.fn, o.kw, o.impl, o.impl_args
    res["python"] = timed(lambda: fn(**kw), calls, sync)
    gc.disable()
    try:
        res["python-gc-off"] = timed(lambda: fn(**kw), calls, sync)
    finally:
        gc.enable()
    res["impl"] = timed(lambda: impl(*impl_args), calls, sync)
    _launch._launch = real_launch
    res["is_compiling"] = timed(_ops._is_compiling, calls, sync)
    key_fn, ptr_fn, tensors = o.key_fn, o.ptr_fn, o.tensors
    res["key"] = timed(lambda: key_fn(*tensors), calls, sync)
    res["data_ptrs"] = timed(lambda: ptr_fn(*tensors), calls, sync)
    last = key_fn(*tensors)
    keys = iter([key_fn(*tensors) for _ in range(calls + 60)])
    res["last_key"] = timed(lambda: next(keys) != last, calls, sync)
    keys = iter([key_fn(*tensors) for _ in range(calls + 60)])
    get = o.cache.get
    res["dict_get"] = timed(lambda: get(next(keys)), calls, sync)
    args, m = o.pack_args()
    if _launch._pack(*args) != captured["args"]:
        print(f"note: {o.op}: the rebuilt pack arguments differ from the call's bytes", file=sys.stderr)
    pack = _launch._pack
    res["pack"] = timed(lambda: pack(*args), calls, sync)
    res["handle"] = timed(_launch._handle, calls, sync)
    if not cpu:
        dev = m.device
        rs, cd = _launch._raw_stream, _launch._current_device
        res["stream"] = timed(lambda: rs(dev), calls, sync)
        res["cur_device"] = timed(cd, calls, sync)
        entry, handle, stream, packed = c[o.code], _launch._handle(), rs(dev), captured["args"]
        res["c_launch"] = timed(lambda: entry(handle, packed, stream), calls, sync)
    code, packed = o.code, captured["args"]
    validate = c[2]
    res["c_validate"] = timed(lambda: validate(code, packed), calls, sync)
    return res


def attribute_costs(o, number=20000):
    """{tensor name: {attribute: ns}}."""
    out = {}
    for n, t in zip(o.names, o.tensors):
        row = {}
        for attr, stmt in (("shape", "t.shape"), ("stride", "t.stride()"), ("dtype", "t.dtype"),
                           ("get_device", "t.get_device()"), ("data_ptr", "t.data_ptr()")):
            row[attr] = min(timeit.repeat(stmt, globals={"t": t}, number=number, repeat=3)) / number * 1e9
        out[n] = row
    return out


def interleaved(ops, calls, sync, stub, block=100):
    """The python stage of the ops, and the probe after each, in alternating blocks:
    {op: [us...], op + " probe": [us...]}."""
    real = _launch._launch
    _launch._launch = stub
    out = {}
    try:
        for _ in range(max(1, calls // block)):
            for o in ops:
                fn, kw = o.fn, o.kw
                out.setdefault(o.op, []).extend(timed(lambda: fn(**kw), block, sync, warm=5))
                out.setdefault(o.op + " probe", []).extend(timed(probe, block, sync, warm=5))
    finally:
        _launch._launch = real
    return out


def fmt(s):
    return (f"{s['median']:7.2f}  ({s['p10']:6.2f} {s['p25']:6.2f} | {s['p75']:6.2f} {s['p90']:6.2f})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="host tensors; validate_args stands in for the launch")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--json", help="also write the raw statistics to this file")
    args = ap.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("diag_host_cost: no CUDA device: run with --cpu for the host-side breakdown")
        return 77
    c = _launch._c or _launch._bind()
    # The stages below take the pure-Python path apart: kdajit._hotpath (the C++
    # cache-hit path, which host_cost.py's call column goes through) is set aside.
    hot_info = kdajit.hotpath_info()
    _launch._hot = None
    sync = (lambda: None) if args.cpu else torch.cuda.synchronize
    device = "cpu" if args.cpu else "cuda"
    real_check = _launch._check_torch_side
    if args.cpu:
        _launch._allow_host_tensors = True
        # Host tensors get a device check on every call (get_device() is -1 for every
        # host device); CUDA calls do not: left out, as host_cost.py --cpu does.
        _launch._check_torch_side = lambda spec, tensors: None

    def stub(fn_index, op, packed, mapping):  # what host_cost.py's python column runs instead of the C call
        if mapping.device >= 0:
            _launch._raw_stream(mapping.device)

    print(f"kdajit {kdajit.version()} ({kdajit.library_path()[1]}), torch {torch.__version__}, Python "
          f"{sys.version.split()[0]}, {'host tensors' if args.cpu else torch.cuda.get_device_name()}, "
          f"gc thresholds {gc.get_threshold()}, {len(os.sched_getaffinity(0))} CPUs allowed, load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"kdajit._hotpath {'on' if hot_info['enabled'] else 'off'} ({hot_info['reason']}); set aside here: every "
          "stage is the pure-Python path's")
    ops = [Op("single", device), Op("packed", device)]
    if not args.cpu:
        print(f"current stream of cuda:{torch.cuda.current_device()}: "
              f"{'the legacy default stream (raw 0)' if _launch._raw_stream(torch.cuda.current_device()) == 0 else 'a non-default stream'}")
    results = {}
    for o in ops:
        results[o.op] = {k: stats(v) for k, v in stage_times(o, args.calls, sync, args.cpu, c, stub).items()}
    stages = list(results["single"].keys())
    print(f"\n{'stage':14s} | {'single: median (p10 p25 | p75 p90) us':44s} | {'packed: median (p10 p25 | p75 p90) us':44s}"
          f" | packed - single")
    for st in stages:
        s, pk = results["single"].get(st), results["packed"].get(st)
        if s is None or pk is None:
            continue
        print(f"{st:14s} | {fmt(s):44s} | {fmt(pk):44s} | {pk['median'] - s['median']:+7.2f}")

    print("\nper-tensor attribute cost, ns (min of 3 x 20000):")
    attr = {o.op: attribute_costs(o) for o in ops}
    print(f"{'tensor':20s} " + " ".join(f"{a:>10s}" for a in ("shape", "stride", "dtype", "get_device", "data_ptr"))
          + "   (single | packed)")
    for n in PACKED_NAMES:
        cells = []
        for a in ("shape", "stride", "dtype", "get_device", "data_ptr"):
            sv = attr["single"].get(n, {}).get(a)
            pv = attr["packed"][n][a]
            cells.append(f"{('-' if sv is None else f'{sv:.0f}'):>4s}|{pv:<5.0f}")
        print(f"{n:20s} " + " ".join(f"{c:>10s}" for c in cells))

    print("\npython stage, histogram of the calls (us: share):")
    hist = {}
    for o in ops:
        real = _launch._launch
        _launch._launch = stub
        ts = timed(lambda: o.fn(**o.kw), args.calls, sync)
        _launch._launch = real
        hist[o.op] = histogram(ts)
        print(f"  {o.op:6s}: {hist[o.op]}")
        ts = timed(probe, args.calls, sync)
        hist[o.op + " probe"] = histogram(ts, 0.25)
        print(f"  {o.op + ' probe':13s} (right after, 0.25-us bins): {hist[o.op + ' probe']}")

    inter = {k: stats(v) for k, v in interleaved(ops, args.calls, sync, stub).items()}
    print("\npython stage, the ops interleaved in blocks of 100 calls, each followed by 100 probe calls:")
    for k, s in inter.items():
        print(f"  {k:13s}: {fmt(s)}")

    host = {}
    if not args.cpu:
        # The same problems as host tensors, same process: does the python side
        # depend on the tensors being CUDA tensors?
        _launch._allow_host_tensors = True
        _launch._check_torch_side = lambda spec, tensors: None
        try:
            for op in ("single", "packed"):
                o = Op(op, "cpu")
                real = _launch._launch
                _launch._launch = stub
                try:
                    host[op] = {"python": stats(timed(lambda: o.fn(**o.kw), args.calls, sync)),
                                "key": stats(timed(lambda: o.key_fn(*o.tensors), args.calls, sync)),
                                "data_ptrs": stats(timed(lambda: o.ptr_fn(*o.tensors), args.calls, sync))}
                finally:
                    _launch._launch = real
        finally:
            _launch._allow_host_tensors = False
            _launch._check_torch_side = real_check
        print("\nthe same problems as host tensors (python stage, key, data_ptrs):")
        for op, r in host.items():
            print(f"  {op:6s}: python {fmt(r['python'])}; key {r['key']['median']:.2f}; "
                  f"data_ptrs {r['data_ptrs']['median']:.2f}")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": args.cpu, "torch": torch.__version__, "python": sys.version, "stages": results,
                       "attributes_ns": attr, "histogram": hist, "interleaved": inter, "host_tensors": host}, f,
                      indent=2)

    s, pk = results["single"], results["packed"]
    d = {st: pk[st]["median"] - s[st]["median"] for st in ("python", "impl", "key", "data_ptrs", "last_key", "pack")}
    parts = " ".join(f"{k} {v:+.2f}" for k, v in d.items() if k not in ("python", "impl"))
    explained = d["key"] + d["data_ptrs"] + d["last_key"] + d["pack"]
    line = (f"diag_host_cost: call single {s['call']['median']:.2f} packed {pk['call']['median']:.2f} us; "
            f"python packed - single {d['python']:+.2f} us (median; p10 {pk['python']['p10'] - s['python']['p10']:+.2f}), "
            f"of which {parts}, unexplained {d['impl'] - explained:+.2f}, wrapper "
            f"{(pk['python']['median'] - pk['impl']['median']) - (s['python']['median'] - s['impl']['median']):+.2f}; "
            f"interleaved packed - single {inter['packed']['median'] - inter['single']['median']:+.2f} "
            f"(probe {inter['single probe']['median']:.2f} | {inter['packed probe']['median']:.2f})")
    if host:
        line += f"; host tensors packed - single {host['packed']['python']['median'] - host['single']['python']['median']:+.2f}"
    line += f"; load average {os.getloadavg()[0]:.2f}"
    print("\n" + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
