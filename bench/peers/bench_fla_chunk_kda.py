"""FLA's Triton chunk_kda (the prefill peer) timed bare on the issue's prefill shapes.

The peer package is built from a clone of fla-org/flash-linear-attention at the
pinned commit by ../shared/peers/fla_chunk_kda/make.sh into an ignored folder
(.peers/fla); pass the folder that holds fla/ with --fla. Every call is the
varlen form an engine makes: packed q, k, v, g, beta of all prompts, cu_seqlens
(device and host copies, one tensor reused across calls so FLA's index cache
hits), an fp32 initial state per sequence, the final state returned, the gate,
beta sigmoid and q/k L2 norm in the kernels (lower_bound -5, safe_gate).

Per cell: warm-up calls (the first one autotunes), then --iters calls each
timed with CUDA events after a 256 MiB memset that flushes the L2; the median.
Also the copy bandwidth of the GPU (a 2 GiB device-to-device copy, read plus
write bytes), and per cell the op's minimum bytes over it (docs/DESIGN.md
"Prefill": 1,538 bytes per token and head plus the state read and written once
per sequence and head), so that the table shows how far the peer is from the
memory floor. Prints a table; --json writes every number.

    python3 bench/peers/bench_fla_chunk_kda.py --fla .peers --json /tmp/fla.json
"""
import argparse
import json
import os
import statistics
import sys
import time

D = 128
BYTES_PER_TOKEN_HEAD = 1538  # x 768, gate 256, beta 2, output gate 256, output 256 (bf16)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fla", required=True, help="the folder that holds the built fla/ package (e.g. .peers)")
    p.add_argument("--heads", default="16,32,64", help="H values, comma-separated (default 16,32,64)")
    p.add_argument("--shapes", default="8x2048,4x8192,1x16384,mix64",
                   help="NxL (N prompts of L tokens) or mixN (N prompts of 100-2000 tokens, seed 0)")
    p.add_argument("--iters", type=int, default=20, help="timed calls per cell (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per cell; the first autotunes (default 3)")
    p.add_argument("--json", help="write every number to this file")
    a = p.parse_args(argv)
    try:
        a.heads = [int(h) for h in a.heads.split(",")]
    except ValueError:
        p.error(f"--heads: expected comma-separated integers, got {a.heads!r}")
    if any(h < 1 for h in a.heads):
        p.error(f"--heads: expected values >= 1, got {a.heads}")
    if a.iters < 3:
        p.error(f"--iters: expected at least 3, got {a.iters}")
    return a


def lengths_of(shape):
    """The prompt lengths of a shape name: '8x2048' or 'mix64'."""
    if shape.startswith("mix"):
        import random
        n = int(shape[3:])
        rng = random.Random(0)
        return [rng.randint(100, 2000) for _ in range(n)]
    n, length = shape.split("x")
    return [int(length)] * int(n)


def load_fla(folder):
    """chunk_kda from the built package, and only from it (a second fla would merge into it)."""
    if not os.path.isfile(os.path.join(folder, "fla", "UPSTREAM_COMMIT")):
        sys.exit(f"--fla: expected a folder holding fla/ built by make.sh (fla/UPSTREAM_COMMIT), got {folder!r}")
    os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"
    sys.path.insert(0, os.path.abspath(folder))
    from fla.ops.kda import chunk_kda
    root = os.path.abspath(os.path.join(folder, "fla"))
    for name, mod in sys.modules.items():
        f = getattr(mod, "__file__", None)
        if name.split(".")[0] == "fla" and f and not os.path.abspath(f).startswith(root):
            sys.exit(f"fla: module {name} comes from {f}, not from {root}")
    with open(os.path.join(folder, "fla", "UPSTREAM_COMMIT")) as f:
        return chunk_kda, f.read().strip()


def copy_bandwidth(torch):
    n = 1 << 30  # bytes per buffer: 2 GiB moved per copy (read + write)
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    del a, b
    return 2 * n / statistics.median(times)


def make_call(torch, chunk_kda, lengths, heads):
    gen = torch.Generator(device="cuda").manual_seed(sum(lengths) + heads)
    total, n = sum(lengths), len(lengths)

    def rnd(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dtype)

    q, k, v = rnd(1, total, heads, D), rnd(1, total, heads, D), rnd(1, total, heads, D)
    g, beta = rnd(1, total, heads, D), rnd(1, total, heads)
    A_log = rnd(heads, dtype=torch.float32, scale=0.5)
    dt_bias = rnd(heads * D, dtype=torch.float32, scale=0.1)
    h0 = rnd(n, heads, D, D, dtype=torch.float32, scale=0.1)
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    cu_cpu = torch.tensor(offsets, dtype=torch.int32)
    cu = cu_cpu.to("cuda")

    def call():
        return varlen_call(chunk_kda, q, k, v, g, beta, h0, A_log, dt_bias, cu, cu_cpu)
    return call


def varlen_call(chunk_kda, q, k, v, g, beta, h0, A_log, dt_bias, cu, cu_cpu):
    """The call an engine makes: packed [1, T, H, 128] q, k, v (before the L2
    norm) and raw gate, raw beta [1, T, H], fp32 h0 [N, H, K, V]; returns (o,
    final state [N, H, K, V] fp32)."""
    return chunk_kda(q, k, v, g, beta, scale=D ** -0.5, initial_state=h0, output_final_state=True,
                     use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                     lower_bound=-5.0, safe_gate=True, use_beta_sigmoid_in_kernel=True, cu_seqlens=cu,
                     cu_seqlens_cpu=cu_cpu)


def time_call(torch, call, iters, warmup):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    t0 = time.time()
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    times = []
    for i in range(iters):
        flush.fill_(i & 0xff)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        call()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times), min(times), max(times), warm_s


def main(argv=None):
    a = parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench_fla_chunk_kda: no CUDA GPU; skipped")
        return 77
    chunk_kda, commit = load_fla(a.fla)
    bw = copy_bandwidth(torch)
    rows = []
    print(f"# FLA chunk_kda @ {commit[:12]} on {torch.cuda.get_device_name()}, copy bandwidth {bw / 1e9:.0f} GB/s")
    print("| H | shape | tokens | chunk_kda us (min-max) | M tokens/s | memory floor us | peer / floor |")
    print("|---|---|---|---|---|---|---|")
    for shape in a.shapes.split(","):
        lengths = lengths_of(shape)
        for h in a.heads:
            call = make_call(torch, chunk_kda, lengths, h)
            med, lo, hi, warm_s = time_call(torch, call, a.iters, a.warmup)
            total = sum(lengths)
            floor_bytes = total * h * BYTES_PER_TOKEN_HEAD + 2 * len(lengths) * h * D * D * 4
            floor_us = floor_bytes / bw * 1e6
            rows.append({"heads": h, "shape": shape, "sequences": len(lengths), "tokens": total, "us": med,
                         "us_min": lo, "us_max": hi, "warmup_s": warm_s, "floor_bytes": floor_bytes,
                         "floor_us": floor_us})
            print(f"| {h} | {shape} | {total} | {med:.0f} ({lo:.0f}-{hi:.0f}) | {total / med:.1f} | {floor_us:.0f} | "
                  f"{med / floor_us:.1f} |", flush=True)
            del call
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"peer": "fla chunk_kda", "commit": commit, "gpu": torch.cuda.get_device_name(),
                       "copy_bandwidth_bytes_per_s": bw, "iters": a.iters, "cells": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
