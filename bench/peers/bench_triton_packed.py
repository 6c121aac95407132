#!/usr/bin/env python3
"""Peer benchmark, packed op: kdajit's fused packed (draft-verify) KDA decode against
the same op as three Triton kernels (conv update over the packed tokens ->
recurrent delta rule with per-token state checkpoints -> gated RMSNorm), the way a
serving engine runs the speculative-decode verify step on Hopper. Both run in this
process on the same torch tensors; kdajit through the repository's Python package
(python/kdajit, kdajit.packed_fused_kda_decode over the library given by --lib).
bench/peers/README.md says what is measured and how to read it.

The measurement helpers (Timer, copy_bandwidth, host_cost, summary, load_kdajit,
write_json, ...), the measurement of one configuration (measure_pair: kdajit,
the Triton tile search, the check, the speedup) and the driver (run_grid:
setup, JSON, reference check, the grid, the table) are bench_triton_peer.py's,
imported from it; the kernels are in triton_kda_packed.py; problems and the
float64 reference of the reference check are tests/python/kda_testing.py's
(imported by path). Only the grid's large problems are built here, on the
device.

Exit codes: 0 all measured and every check passed; 1 a check failed or a
configuration could not be measured; 2 usage or environment error (no torch,
Triton, CUDA or libkdajit); 3 the time limit cut the run short (partial results).
"""
import math
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_triton_peer as peer  # noqa: E402  (puts python/ on sys.path too; imports no torch)

D = 128
W = 4
log = peer.log

# Tolerances, relative L2. Against the float64 reference: docs/CONTRACT.md §8. Between
# kdajit and Triton: both carry their own rounding, hence about twice the spec's.
REF_OUTPUT_TOL = 1e-2
REF_STATE_TOL = {"f32": 1e-3, "bf16": 6e-3}
REF_STATE_CHANGE_TOL = 1e-2
PEER_OUTPUT_TOL = 2e-2
PEER_STATE_TOL = 1e-2

# The reference-check problem (docs/CONTRACT.md §4's kinds of sequence), H = 2, T = 4.
# Per sequence: its length before the edits of make_reference_problem, and
# num_accepted_tokens (0 and 9 are clamped to 1 and 4).
REF_HEADS, REF_TOKENS = 2, 4
REF_LENGTHS = (4, 3, 4, 4, 2, 0, 4, 1, 4, 4)
REF_ACCEPTED = (2, 3, 0, 3, 4, 2, 1, 9, 4, 2)

def kda_testing():
    """tests/python/kda_testing.py (imported by path by kda_problem)."""
    import kda_problem

    return kda_problem.kda_testing()


def grid_arguments(ap):
    ap.add_argument("--seqs", type=peer.int_list, default=[1, 8, 32, 128], help="N values (sequences)")
    ap.add_argument("--tokens", type=peer.int_list, default=[2, 4], help="T values (tokens per sequence, L = T)")


def parse_args(argv):
    ap = peer.peer_arguments(
        __doc__.split("\n\n")[0], heads=[16, 64], grid=grid_arguments, host_calls=100, seed=20261201,
        time_limit=150.0, watchdog=200.0,
        abi_only_help="map the reference-check problems through kdajit.dry_run on host tensors "
                      "(the package's mapping and kdajit_validate_args, no GPU, no Triton) and exit")
    args = ap.parse_args(argv)
    peer.check_peer_arguments(ap, args)
    peer.check_range(ap, "seqs", args.seqs, 1, 65536)
    peer.check_range(ap, "tokens", args.tokens, 1, 16)
    return args


# --- Problems ---------------------------------------------------------------------


def make_grid_problem(torch, heads, seqs, tokens, state_dtype, device, seed, lower_bound=-5.0, norm_eps=1e-5):
    """A benchmark problem built on `device` (docs/CONTRACT.md §8 distributions): N
    sequences of L = T tokens in order, num_accepted_tokens random in 1..T, a distinct
    valid slot for every (n, t) in shuffled order, S = N*T + 3 (the null slot and two
    spares), SD conv layout, no row padding, the output poisoned (NaN). Returns a
    kda_testing.Problem whose args are its canonical views."""
    kt = kda_testing()
    H, hidden = heads, heads * D
    qkv, N, T = 3 * hidden, seqs, tokens
    K, R = T + W - 2, N * T
    S = N * T + 3
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def randn(*shape, scale=1.0, shift=0.0):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale + shift

    def rows(*shape, dtype=torch.bfloat16):
        return randn(*shape).to(dtype)

    # SD: taps slow, channels contiguous: an [S, K, qkv] buffer seen as [S, qkv, K].
    conv_state = torch.empty(S, K, qkv, dtype=torch.bfloat16, device=device).transpose(1, 2)
    conv_state.copy_(randn(S, qkv, K))
    state = randn(S, H, D, D, scale=0.1).to(state_dtype)
    slots = torch.randperm(S - 1, generator=gen, device=device)[:N * T] + 1
    output = torch.empty(R, H, D, dtype=torch.bfloat16, device=device)
    output.fill_(float("nan"))
    views = {
        "x": rows(R, qkv),
        "weight": randn(3, W, hidden, scale=0.5),
        "conv_state": conv_state,
        "raw_gate": rows(R, H, D),
        "raw_beta": rows(R, H),
        "A_log": randn(H, scale=0.5),
        "dt_bias": randn(hidden, scale=0.1),
        "state_indices": slots.to(torch.int32).view(N, T).contiguous(),
        "state": state,
        "output_gate": rows(R, H, D),
        "norm_weight": randn(D, scale=0.1, shift=1.0),
        "output": output,
        "query_start_loc": torch.arange(0, R + 1, T, dtype=torch.int32, device=device),
        "num_accepted_tokens": torch.randint(1, T + 1, (N,), generator=gen, device=device).to(torch.int32),
    }
    return kt.Problem("packed", views, views, lower_bound, norm_eps)


def make_reference_problem(torch, state_dtype, seed, device):
    """The reference-check problem: H = 2, T = 4, ten sequences that cover docs/CONTRACT.md
    §4's cases, padded row strides, shuffled slots. Built on the CPU by
    kda_testing.make_problem, edited, then copied to `device` (strides kept)."""
    kt = kda_testing()
    p = kt.make_problem("packed", REF_HEADS, tokens=REF_TOKENS, seqs=len(REF_LENGTHS), lengths=list(REF_LENGTHS),
                        accepted=list(REF_ACCEPTED), state_dtype=state_dtype, device="cpu", seed=seed, row_pad=16)
    v = p.views
    S = v["state"].shape[0]
    si, qsl = v["state_indices"], v["query_start_loc"]  # edited in place: args holds the same tensors
    qsl[0] = 1             # row 0 lies below qsl[0] (zeros); seq 0: L = 3, a = 2
    si[1, 0] = 0           # seq 1: null conv slot: not live, zero rows
    #                        seq 2: a = 0, clamped to 1: src is the conv slot
    si[3, 2] = S + 5       # seq 3: a = 3, out-of-range source slot: not live
    si[4, 1] = -1          # seq 4: L = 2, a = 4: src = si[4, 3] (past L); checkpoint 1 null: skipped
    #                        seq 5: empty (L = 0)
    si[6, 1] = 0           # seq 6: L = 4, a = 1: checkpoints 1 (null) and 2 (out of range) skipped
    si[6, 2] = S + 1
    #                        seq 7: L = 1, a = 9, clamped to 4: src = si[7, 3] (past L)
    #                        seq 8: L = 4, a = 4: src = its own last checkpoint slot (read first)
    qsl[-1] -= 2           # seq 9: L = 2, a = 2; its last two rows lie past qsl[N] (zeros)
    return kt.to_device(p, device) if device != "cpu" else p


def packed_plan(p):
    """What docs/CONTRACT.md §4 makes the call do, from p's metadata: per sequence
    (n, qs, L, a, cs, src) when live; the computed rows; the written state slots
    with the source slot each checkpoint evolved from; the conv slots."""
    v = p.views
    qsl = v["query_start_loc"].tolist()
    nat = v["num_accepted_tokens"].tolist()
    si = v["state_indices"].tolist()
    R, S = v["x"].shape[0], v["state"].shape[0]
    N, T = len(si), len(si[0])
    live, computed, written = [], [False] * R, {}
    for n in range(N):
        qs, qe = qsl[n], qsl[n + 1]
        L = qe - qs
        a = min(max(nat[n], 1), T)
        cs, src = si[n][0], si[n][a - 1]
        if not (0 < L <= T and qs >= 0 and qe <= R and 0 < cs < S and 0 < src < S):
            continue
        live.append((n, qs, L, a, cs, src))
        for t in range(L):
            computed[qs + t] = True
            if 0 < si[n][t] < S:
                written[si[n][t]] = src
    ws = sorted(written)
    return {"live": live, "computed_rows": computed, "written_slots": ws, "sources": [written[s] for s in ws],
            "untouched_slots": [s for s in range(S) if s not in written],
            "conv_slots": sorted({q[4] for q in live})}


def expected_conv_state(torch, p, plan):
    """conv_state after the call (docs/CONTRACT.md §4): per live sequence, taps 0, 1 <- old
    taps a, a+1; taps 2 .. L+1 <- the raw x of its L tokens; everything else as it was."""
    kt = kda_testing()
    v = p.views
    old, x = v["conv_state"], v["x"]
    conv = kt.copy_strided(old)
    for _, qs, L, a, cs, _ in plan["live"]:
        conv[cs, :, 0] = old[cs, :, a]
        conv[cs, :, 1] = old[cs, :, a + 1]
        conv[cs, :, 2:2 + L] = x[qs:qs + L].transpose(0, 1)
    return conv


def fresh_copy(p):
    """p with its own copies of the mutable tensors (conv_state, state, poisoned output)."""
    kt = kda_testing()
    views = dict(p.views)
    for name in ("conv_state", "state", "output"):
        views[name] = kt.copy_strided(p.views[name])
    return kt.Problem("packed", views, views, p.lower_bound, p.norm_eps, p.mode)


def bytes_per_call(heads, seqs, tokens, state):
    """docs/CONTRACT.md §7, packed op, L = T, every checkpoint valid."""
    b = 4 if state == "f32" else 2
    L = tokens
    return seqs * heads * (D * D * b * (1 + L) + 2304 + 768 * (2 + L) + 1538 * L)


# --- kdajit -------------------------------------------------------------------------


def kd_kwargs(p):
    """packed_fused_kda_decode's arguments (FlashInfer's names) over p's canonical views."""
    kw = dict(p.views)
    kw["lower_bound"] = p.lower_bound
    kw["norm_eps"] = p.norm_eps
    return kw


def kd_decode(p):
    """One kdajit call on p's tensors, on torch's current stream (what an engine calls)."""
    peer.kdajit.packed_fused_kda_decode(**kd_kwargs(p))


def kd_selected_key(p):
    return peer.kdajit.selected_key(peer.kdajit.packed_fused_kda_decode, **kd_kwargs(p))


def abi_selftest(torch):
    """The reference-check problems (host tensors) through kdajit.dry_run: the package's
    mapping and kdajit_validate_args accept them and report the packed key."""
    kdajit = peer.kdajit
    keys = []
    for dtype in (torch.float32, torch.bfloat16):
        p = make_reference_problem(torch, dtype, 7, "cpu")
        try:
            kdajit.dry_run(kdajit.packed_fused_kda_decode, **kd_kwargs(p))
        except (ValueError, NotImplementedError) as e:
            raise kdajit.KdajitError(f"kdajit.dry_run rejected the {dtype} packed host problem: "
                                     f"{type(e).__name__}: {e}") from e
        keys.append(str(dtype))
    return "ok (" + ", ".join(keys) + ")"


# --- Checks -------------------------------------------------------------------------


def state_change_rel(torch, got, want, base):
    """L2(got - want) / L2(want - base): the error against the size of the update."""
    g, w, b = got.double(), want.double(), base.double()
    den = torch.linalg.vector_norm(w - b).item()
    num = torch.linalg.vector_norm(g - w).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def check_against_reference(torch, before, after, ref, plan, state_name):
    """One implementation's result of `before` (a CPU snapshot) against the float64 reference."""
    kt = kda_testing()
    ref_out, ref_conv, ref_state = ref
    out = after.views["output"].cpu()
    rows = torch.tensor(plan["computed_rows"], dtype=torch.bool)
    ws = torch.tensor(plan["written_slots"], dtype=torch.long)
    src = torch.tensor(plan["sources"], dtype=torch.long)
    keep = torch.tensor(plan["untouched_slots"], dtype=torch.long)
    state, old = after.views["state"].cpu(), before.views["state"]
    got, want = out[rows].double(), ref_out[rows].double()
    r = {
        "output_rel_l2": kt.rel_l2(got, want),
        "output_elementwise_ok": bool(torch.isfinite(got).all()
                                      and torch.isclose(got, want, rtol=3e-2, atol=2e-2).all()),
        "zero_rows_zero": bool((out[~rows] == 0).all()),
        "state_rel_l2": kt.rel_l2(state[ws], ref_state[ws]),
        "state_change_rel_l2": state_change_rel(torch, state[ws], ref_state[ws], old[src]),
        "untouched_slots_intact": peer.same_bytes(torch, state[keep], old[keep]),
        "conv_state_exact": peer.same_bytes(torch, after.views["conv_state"].cpu(), ref_conv),
    }
    r["ok"] = (r["output_rel_l2"] <= REF_OUTPUT_TOL and r["output_elementwise_ok"] and r["zero_rows_zero"]
               and r["state_rel_l2"] <= REF_STATE_TOL[state_name]
               and r["state_change_rel_l2"] <= REF_STATE_CHANGE_TOL
               and r["untouched_slots_intact"] and r["conv_state_exact"])
    return r


def reference_check(torch, seed, device, run_kdajit=True):
    """kdajit and every Triton tile variant against float64 on the reference problem
    (docs/CONTRACT.md §4's kinds of sequence), f32 and bf16 state."""
    import triton_kda_packed as tk

    kt = kda_testing()
    results = []
    for state_name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        p = make_reference_problem(torch, dtype, seed, device)
        before = kt.snapshot(p)
        plan = packed_plan(before)
        ref = kt.reference(before)
        impls = ([("kdajit", None)] if run_kdajit else []) + \
            [(f"triton bv{bv} w{w}", (bv, w)) for bv, w in tk.RECURRENT_VARIANTS]
        for name, variant in impls:
            q = fresh_copy(p)
            entry = {"impl": name, "state": state_name}
            try:
                if variant is None:
                    kd_decode(q)
                else:
                    scratch = tk.make_scratch(q)
                    tk.check_layout(q, scratch)
                    tk.decode(q, scratch, variant)
                if device != "cpu":
                    torch.cuda.synchronize()
                entry.update(check_against_reference(torch, before, q, ref, plan, state_name))
            except Exception as e:  # noqa: BLE001  (reported, then the next implementation)
                entry.update({"ok": False, "error": f"{type(e).__name__}: {e}"})
            results.append(entry)
            errs = (f"output {entry['output_rel_l2']:.2e}  state {entry['state_rel_l2']:.2e}  "
                    f"change {entry['state_change_rel_l2']:.2e}  conv exact {entry['conv_state_exact']}  "
                    f"zero rows {entry['zero_rows_zero']}  untouched {entry['untouched_slots_intact']}"
                    if "error" not in entry else entry["error"])
            log(f"  reference {state_name:4s} {name:16s} {'ok  ' if entry['ok'] else 'FAIL'}  {errs}")
    return results


def peer_check(torch, p0, plan, expected_conv, run_kdajit, run_triton):
    """kdajit and Triton from identical copies of the same inputs, compared with each
    other (each is checked against float64 in the reference check)."""
    kt = kda_testing()
    kd, tr = fresh_copy(p0), fresh_copy(p0)
    run_kdajit(kd)
    run_triton(tr)
    torch.cuda.synchronize()
    dev = p0.views["state"].device
    rows = torch.tensor(plan["computed_rows"], dtype=torch.bool, device=dev)
    ws = torch.tensor(plan["written_slots"], dtype=torch.long, device=dev)
    src = torch.tensor(plan["sources"], dtype=torch.long, device=dev)
    keep = torch.tensor(plan["untouched_slots"], dtype=torch.long, device=dev)
    kd_out, tr_out = kd.views["output"], tr.views["output"]
    kd_state, tr_state = kd.views["state"][ws], tr.views["state"][ws]
    old = p0.views["state"]
    r = {
        "output_rel_l2": kt.rel_l2(tr_out[rows], kd_out[rows]),
        "outputs_finite": bool(torch.isfinite(kd_out[rows]).all() and torch.isfinite(tr_out[rows]).all()),
        "zero_rows_zero": bool((kd_out[~rows] == 0).all() and (tr_out[~rows] == 0).all()),
        "state_rel_l2": kt.rel_l2(tr_state, kd_state),
        "state_change_rel_l2": state_change_rel(torch, tr_state, kd_state, old[src]),
        "checkpoint_slots": len(plan["written_slots"]),
        "conv_state_exact": peer.same_bytes(torch, kd.views["conv_state"], expected_conv)
        and peer.same_bytes(torch, tr.views["conv_state"], expected_conv),
        "untouched_slots_intact": peer.same_bytes(torch, kd.views["state"][keep], old[keep])
        and peer.same_bytes(torch, tr.views["state"][keep], old[keep]),
    }
    r["ok"] = (r["output_rel_l2"] <= PEER_OUTPUT_TOL and r["outputs_finite"] and r["zero_rows_zero"]
               and r["state_rel_l2"] <= PEER_STATE_TOL and r["conv_state_exact"] and r["untouched_slots_intact"])
    del kd, tr, kd_state, tr_state
    return r


# --- One configuration ----------------------------------------------------------------


def measure_config(torch, timer, heads, seqs, tokens, state_name, seed, opts, roof_gbps):
    import triton_kda_packed as tk

    dtype = torch.float32 if state_name == "f32" else torch.bfloat16
    nbytes = bytes_per_call(heads, seqs, tokens, state_name)
    rec = {"heads": heads, "seqs": seqs, "tokens": tokens, "rows": seqs * tokens, "state": state_name,
           "seed": seed, "bytes_per_call": nbytes, "floor_us": nbytes / (roof_gbps * 1e3),
           "kdajit": {"status": "skipped"}, "triton": {"status": "skipped"}, "check": {"status": "skipped"}}
    t_start = time.perf_counter()
    p0 = make_grid_problem(torch, heads, seqs, tokens, dtype, peer.DEVICE, seed)  # pristine: only copies run
    rec["slots"] = p0.views["state"].shape[0]
    rec["num_accepted_tokens"] = p0.views["num_accepted_tokens"].tolist()
    work = fresh_copy(p0)  # warm-up, tuning and timing mutate this one
    scratch = tk.make_scratch(work)
    tk.check_layout(work, scratch)

    def check(variant):
        plan = packed_plan(p0)
        expected = expected_conv_state(torch, p0, plan)

        def tr_run(q):
            tk.decode(q, tk.make_scratch(q), variant)

        return peer_check(torch, p0, plan, expected, kd_decode, tr_run)

    peer.measure_pair(torch, timer, rec, opts, roof_gbps, kd_call=lambda: kd_decode(work),
                      kd_key=lambda: kd_selected_key(work), variants=tk.RECURRENT_VARIANTS,
                      triton_run=lambda variant: tk.decode(work, scratch, variant), check=check)
    rec["seconds"] = time.perf_counter() - t_start
    del p0, work, scratch
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return rec


# --- Output ------------------------------------------------------------------------

fmt = peer.fmt

# (title, width) of the table's columns, in order; the kdajit key follows, unpadded.
COLUMNS = (("H", 3), ("N", 4), ("T", 2), ("state", 5), ("kdajit us", 9), ("triton us", 9), ("speedup", 7),
           ("kd %roof", 8), ("tr %roof", 8), ("kd host us", 10), ("tr host us", 10), ("tr tile", 8),
           ("check", 8))


def table(configs):
    head = " ".join(t.rjust(w) for t, w in COLUMNS)
    lines = [head + "  kdajit key", "-" * (len(head) + 13)]
    for c in configs:
        cells = [str(c["heads"]), str(c["seqs"]), str(c["tokens"]), c["state"]] + peer.measurement_cells(c)
        lines.append(" ".join(text.rjust(w) for text, (_, w) in zip(cells, COLUMNS)) + "  " + c["kdajit"].get("key", "-"))
    return "\n".join(lines)


# --- Main --------------------------------------------------------------------------


def config_label(config, padded):
    h, n, t, s = config
    return f"H={h:<3} N={n:<4} T={t:<2} {s:4s}" if padded else f"H={h} N={n} T={t} {s}"


def record_fields(config):
    h, n, t, s = config
    return {"heads": h, "seqs": n, "tokens": t, "rows": n * t, "state": s}


def skipped_fields(config):
    h, n, t, s = config
    return {"heads": h, "seqs": n, "tokens": t, "state": s}


def main(argv):
    args = parse_args(argv)
    return peer.run_grid(
        args, schema="kdajit-peer-triton-packed/1", kernels="triton_kda_packed",
        selftest_title="packed ABI self-test (kdajit.dry_run of the reference problems on host tensors)",
        selftest=abi_selftest,
        doc_fields={"problem": {"lengths": "L = T for every sequence", "num_accepted_tokens": "random in 1..T",
                                "slots": "a distinct valid slot per (n, t), shuffled; S = N*T + 3",
                                "conv_layout": "sd", "gate": "bounded", "lower_bound": -5.0, "norm_eps": 1e-5}},
        tolerances={"reference_output": REF_OUTPUT_TOL, "reference_state": REF_STATE_TOL,
                    "reference_state_change": REF_STATE_CHANGE_TOL,
                    "peer_output": PEER_OUTPUT_TOL, "peer_state": PEER_STATE_TOL},
        reference_title=f"reference check (float64, H={REF_HEADS}, T={REF_TOKENS}, {len(REF_LENGTHS)} sequences: "
                        f"short, empty, null conv slot, out-of-range source, invalid checkpoints, clamped accepted "
                        f"counts, rows below qsl[0] and past qsl[N], padded rows):",
        reference_check=lambda torch, seed: reference_check(torch, seed, peer.DEVICE),
        configs=[(h, n, t, s) for h in args.heads for s in args.state for t in args.tokens for n in args.seqs],
        label=config_label, record_fields=record_fields, skipped_fields=skipped_fields,
        measure=measure_config, op_title="packed KDA decode (draft verify, L = T)", table=table)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
