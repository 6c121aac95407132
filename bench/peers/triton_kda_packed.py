"""The packed (speculative draft-verify) KDA decode (docs/CONTRACT.md §4) as three
Triton kernels, the way a serving engine runs the spec-decode verify step on
Hopper today:

1. conv_update_kernel: per (sequence, block of channels), the causal conv1d over
   the sequence's L packed tokens with the history taps a-1 .. a+1 of its K = T+2
   tap conv_state (a = num_accepted_tokens, clamped into 1..T), SiLU; writes the
   q/k/v activations (bf16: rounding point 1) to a global buffer and rewrites the
   slot's taps as §4 says (0 <- old a, 1 <- old a+1, 2 .. L+1 <- the raw x of
   the L tokens, the rest untouched). Its programs of channel block 0 also write
   a per-row flag (1: the row belongs to a live sequence) for kernel 3.
2. recurrent_kernel: per (sequence, head, block of BV value rows), the gated
   delta rule over the sequence's L tokens: the state tile is read once from the
   source slot state_indices[n, a-1], kept in registers (f32, unrounded) across
   the tokens, and after token t stored to state_indices[n, t] when that slot
   is valid (rounding point 2 for bf16 state); o (bf16: rounding point 3) goes
   to a global buffer.
3. gated_rmsnorm_kernel: RMSNorm of o with the output gate; rows the flag does
   not mark live are written as zeros.

Layouts as docs/CONTRACT.md §1 (state [S, H, V, K], k fastest; conv_state with
any strides, SD in the benchmark; free row strides). Sequence rules as §4: a
sequence is live when 0 < L <= T, its rows lie in [0, R) and both its conv slot
state_indices[n, 0] and its source slot are valid (1 <= s < S); every other
sequence, every row below query_start_loc[0] and every row from
query_start_loc[N] on gives zeros and touches no state. Invalid checkpoint
slots are skipped. Live sequences must not share a written slot (§4).
Written from the contract's math; no engine code.
"""
import torch
import triton
import triton.language as tl

# The tile variants, block sizes and the math of one token are the single op's
# (triton_kda.py): the packed kernels differ in what they loop over and where
# they read the slots, not in the arithmetic. RECURRENT_VARIANTS: the benchmark
# times every (BV, num_warps) per configuration and keeps the fastest.
from triton_kda import (D, RECURRENT_VARIANTS, CONV_BLOCK, CONV_WARPS, NORM_HEADS, NORM_WARPS,  # noqa: F401
                        load_conv_weights, conv_silu, l2norm_qk, gate_decay, delta_rule_step,
                        gated_rmsnorm_rows, check_tensors)

FLAG_BLOCK = 128                  # rows per store of the row-flag loops

# do_not_specialize: sizes and strides that vary over the benchmark grid (or may
# be 1); Triton's value specialization would otherwise recompile for each.


@triton.jit
def _sequence(qsl_ptr, nat_ptr, idx_ptr, n, num_rows, num_slots, tokens):
    # Sequence n's row range, clamped accepted count, conv slot and liveness (§4).
    n64 = n.to(tl.int64)
    qs = tl.load(qsl_ptr + n64)
    qe = tl.load(qsl_ptr + n64 + 1)
    length = qe - qs
    a = tl.load(nat_ptr + n64)
    a = tl.where(a < 1, 1, a)
    a = tl.where(a > tokens, tokens, a)
    cs = tl.load(idx_ptr + n64 * tokens)
    src = tl.load(idx_ptr + n64 * tokens + (a - 1))
    well_formed = (length >= 0) & (length <= tokens) & (qs >= 0) & (qe <= num_rows)
    live = well_formed & (length > 0) & (cs > 0) & (cs < num_slots) & (src > 0) & (src < num_slots)
    return qs, qe, length, a, cs, live


@triton.jit(do_not_specialize=["num_rows", "num_seqs", "num_slots", "tokens"])
def conv_update_kernel(x_ptr, x_row_stride, weight_ptr,
                       conv_ptr, conv_slot_stride, conv_chan_stride, conv_tap_stride,
                       qsl_ptr, nat_ptr, idx_ptr, act_ptr, act_row_stride, flag_ptr,
                       num_rows, num_seqs, num_slots, tokens, qkv, hidden,
                       BLOCK: tl.constexpr, FB: tl.constexpr):
    n = tl.program_id(0)
    blk = tl.program_id(1)
    qs, qe, length, a, cs, live = _sequence(qsl_ptr, nat_ptr, idx_ptr, n, num_rows, num_slots, tokens)

    # Row flags for kernel 3, written by the programs of channel block 0: this
    # sequence's rows inside [0, R) get its liveness; sequence 0 zeroes the rows
    # below qsl[0], sequence N-1 those from qsl[N] on.
    if blk == 0:
        flag = live.to(tl.int32)
        lo = tl.where(qs > 0, qs, 0)
        hi = tl.where(qe < num_rows, qe, num_rows)
        # (Distinct names per loop: no loop variable is live into a later if.)
        for f0 in range(lo, hi, FB):
            fr = f0 + tl.arange(0, FB)
            tl.store(flag_ptr + fr, tl.zeros([FB], dtype=tl.int32) + flag, mask=fr < hi)
        if n == 0:
            below = tl.where(qs < num_rows, qs, num_rows)
            for b0 in range(0, below, FB):
                br = b0 + tl.arange(0, FB)
                tl.store(flag_ptr + br, tl.zeros([FB], dtype=tl.int32), mask=br < below)
        if n == num_seqs - 1:
            tail = tl.where(qe > 0, qe, 0)
            for e0 in range(tail, num_rows, FB):
                er = e0 + tl.arange(0, FB)
                tl.store(flag_ptr + er, tl.zeros([FB], dtype=tl.int32), mask=er < num_rows)

    c = blk * BLOCK + tl.arange(0, BLOCK)
    in_row = c < qkv
    keep = in_row & live
    # A dead sequence points at slot 0 (valid memory) and reads and writes nothing.
    slot = tl.where(live, cs, 0).to(tl.int64)
    hist = conv_ptr + slot * conv_slot_stride + c.to(tl.int64) * conv_chan_stride
    t0 = a - 1  # the history: taps a-1, a, a+1
    h0 = tl.load(hist + t0 * conv_tap_stride, mask=keep, other=0.0)
    h1 = tl.load(hist + (t0 + 1) * conv_tap_stride, mask=keep, other=0.0)
    h2 = tl.load(hist + (t0 + 2) * conv_tap_stride, mask=keep, other=0.0)
    old_a = h1
    old_a1 = h2

    w0, w1, w2, w3 = load_conv_weights(weight_ptr, c, hidden, in_row)

    for t in range(0, tl.where(live, length, 0)):
        row = (qs + t).to(tl.int64)
        x_raw = tl.load(x_ptr + row * x_row_stride + c, mask=keep, other=0.0)
        m = conv_silu(w0, w1, w2, w3, h0, h1, h2, x_raw)
        tl.store(act_ptr + row * act_row_stride + c, m.to(act_ptr.dtype.element_ty), mask=keep)
        # Tap 2 + t gets the raw x (bf16, bit-exact); the three history taps were read above.
        tl.store(hist + (2 + t) * conv_tap_stride, x_raw, mask=keep)
        h0 = h1
        h1 = h2
        h2 = x_raw
    tl.store(hist, old_a, mask=keep)
    tl.store(hist + conv_tap_stride, old_a1, mask=keep)


@triton.jit(do_not_specialize=["num_rows", "num_slots", "heads", "tokens", "beta_row_stride"])
def recurrent_kernel(act_ptr, act_row_stride, gate_ptr, gate_row_stride, beta_ptr, beta_row_stride,
                     a_log_ptr, dt_bias_ptr, qsl_ptr, nat_ptr, idx_ptr, state_ptr, state_slot_stride,
                     o_ptr, o_row_stride, num_rows, num_slots, heads, tokens, lower_bound,
                     D: tl.constexpr, BV: tl.constexpr, SOFTPLUS: tl.constexpr):
    # One program per (sequence, head) and block of BV value rows; the whole k extent
    # (128) is one tile row. The [BV, 128] tile is read once and lives in registers
    # over the sequence's tokens.
    pid = tl.program_id(0)
    n = pid // heads
    h = pid % heads
    qs, qe, length, a, cs, live = _sequence(qsl_ptr, nat_ptr, idx_ptr, n, num_rows, num_slots, tokens)
    n64 = n.to(tl.int64)
    src = tl.load(idx_ptr + n64 * tokens + (a - 1))
    src = tl.where(live, src, 0).to(tl.int64)

    vv = tl.program_id(1) * BV + tl.arange(0, BV)
    kk = tl.arange(0, D)
    hidden = heads * D
    tile_off = h * (D * D) + vv[:, None] * D + kk[None, :]
    full = (vv < D)[:, None] & (kk < D)[None, :]
    s = tl.load(state_ptr + src * state_slot_stride + tile_off, mask=full & live, other=0.0).to(tl.float32)

    dtb = tl.load(dt_bias_ptr + h * D + kk)
    A = tl.exp(tl.load(a_log_ptr + h))
    for t in range(0, tl.where(live, length, 0)):
        row = (qs + t).to(tl.int64)
        act = act_ptr + row * act_row_stride + h * D
        q = tl.load(act + kk).to(tl.float32)
        k = tl.load(act + hidden + kk).to(tl.float32)
        v = tl.load(act + 2 * hidden + vv).to(tl.float32)
        q, k = l2norm_qk(q, k)
        g = tl.load(gate_ptr + row * gate_row_stride + h * D + kk).to(tl.float32) + dtb
        decay = gate_decay(g, A, lower_bound, SOFTPLUS)
        beta = tl.sigmoid(tl.load(beta_ptr + row * beta_row_stride + h).to(tl.float32))
        s, o = delta_rule_step(s, q, k, v, decay, beta)
        tl.store(o_ptr + row * o_row_stride + h * D + vv, o.to(o_ptr.dtype.element_ty))

        # The checkpoint of token t, when its slot is valid (the carry stays f32).
        ck = tl.load(idx_ptr + n64 * tokens + t)
        ck_ok = (ck > 0) & (ck < num_slots)
        ck = tl.where(ck_ok, ck, 0).to(tl.int64)
        tl.store(state_ptr + ck * state_slot_stride + tile_off, s.to(state_ptr.dtype.element_ty),
                 mask=full & ck_ok)


@triton.jit(do_not_specialize=["heads"])
def gated_rmsnorm_kernel(o_ptr, o_row_stride, og_ptr, og_row_stride, w_ptr, out_ptr, out_row_stride,
                         flag_ptr, heads, eps,
                         D: tl.constexpr, BH: tl.constexpr):
    row = tl.program_id(0)
    hh = tl.program_id(1) * BH + tl.arange(0, BH)
    vv = tl.arange(0, D)
    live = tl.load(flag_ptr + row) != 0
    row64 = row.to(tl.int64)
    mask = (hh < heads)[:, None] & (vv < D)[None, :]
    off = hh[:, None] * D + vv[None, :]

    # A dead row's o was never written this call: read nothing, write zeros.
    ob = tl.load(o_ptr + row64 * o_row_stride + off, mask=mask & live, other=0.0).to(tl.float32)
    og = tl.load(og_ptr + row64 * og_row_stride + off, mask=mask & live, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + vv)
    y = gated_rmsnorm_rows(ob, og, w, eps, D)
    # Dead rows are zeros even with eps = 0 (where rsqrt(0) * 0 would be NaN).
    y = tl.where(live, y, 0.0)
    tl.store(out_ptr + row64 * out_row_stride + off, y.to(out_ptr.dtype.element_ty), mask=mask)


# --- Host side ---------------------------------------------------------------------


def _sizes(v):
    """(R, H, S, N, T) of a problem's canonical views (tests/python/kda_testing.py names)."""
    N, T = v["state_indices"].shape
    return v["x"].shape[0], v["A_log"].numel(), v["state"].shape[0], N, T


def check_layout(p, scratch):
    """The inner layouts the kernels assume (row strides, the slot strides and the
    conv_state strides are free). p.views: the canonical tensors of the call."""
    v = p.views
    R, H, S, N, T = _sizes(v)
    qkv = 3 * H * D
    act, o, flags = scratch
    checks = [
        ("x", v["x"], torch.bfloat16, (R, qkv), [None, 1]),
        ("weight", v["weight"], torch.float32, (3, 4, H * D), [4 * H * D, H * D, 1]),
        ("conv_state", v["conv_state"], torch.bfloat16, (S, qkv, T + 2), [None, None, None]),
        ("raw_gate", v["raw_gate"], torch.bfloat16, (R, H, D), [None, D, 1]),
        ("raw_beta", v["raw_beta"], torch.bfloat16, (R, H), [None, 1]),
        ("A_log", v["A_log"], torch.float32, (H,), [1]),
        ("dt_bias", v["dt_bias"], torch.float32, (H * D,), [1]),
        ("state_indices", v["state_indices"], torch.int32, (N, T), [T, 1]),
        ("state", v["state"], v["state"].dtype, (S, H, D, D), [None, D * D, D, 1]),
        ("output_gate", v["output_gate"], torch.bfloat16, (R, H, D), [None, D, 1]),
        ("norm_weight", v["norm_weight"], torch.float32, (D,), [1]),
        ("output", v["output"], torch.bfloat16, (R, H, D), [None, D, 1]),
        ("query_start_loc", v["query_start_loc"], torch.int32, (N + 1,), [1]),
        ("num_accepted_tokens", v["num_accepted_tokens"], torch.int32, (N,), [1]),
        ("act (scratch)", act, torch.bfloat16, (R, qkv), [None, 1]),
        ("o (scratch)", o, torch.bfloat16, (R, H, D), [None, D, 1]),
        ("row flags (scratch)", flags, torch.int32, (R,), [1]),
    ]
    check_tensors(checks, v["state"])
    if not 1 <= H <= 128 or not 1 <= T <= 16:
        raise ValueError(f"heads {H} / tokens {T}: expected 1..128 / 1..16")


def make_scratch(p):
    """The intermediates between the kernels, allocated once (not per call):
    act [R, 3*H*128] bf16, o [R, H, 128] bf16, row flags [R] int32."""
    v = p.views
    R, H = v["x"].shape[0], v["A_log"].numel()
    dev = v["x"].device
    act = torch.empty(R, 3 * H * D, dtype=torch.bfloat16, device=dev)
    o = torch.empty(R, H, D, dtype=torch.bfloat16, device=dev)
    flags = torch.empty(R, dtype=torch.int32, device=dev)
    return act, o, flags


def decode(p, scratch, variant=RECURRENT_VARIANTS[1]):
    """One packed decode step: three launches on the current stream, no allocation.
    p: the problem (p.views: the canonical tensors; p.lower_bound None = softplus
    gate; p.norm_eps); scratch: make_scratch(p); variant: (BV, num_warps)."""
    bv, warps = variant
    v = p.views
    act, o, flags = scratch
    x, cs, st, idx = v["x"], v["conv_state"], v["state"], v["state_indices"]
    qsl, nat = v["query_start_loc"], v["num_accepted_tokens"]
    gate, beta, og, out = v["raw_gate"], v["raw_beta"], v["output_gate"], v["output"]
    R, H, S, N, T = _sizes(v)
    hidden = H * D
    softplus = p.lower_bound is None
    lower_bound = 0.0 if softplus else float(p.lower_bound)
    conv_update_kernel[(N, triton.cdiv(3 * hidden, CONV_BLOCK))](
        x, x.stride(0), v["weight"],
        cs, cs.stride(0), cs.stride(1), cs.stride(2),
        qsl, nat, idx, act, act.stride(0), flags,
        R, N, S, T, 3 * hidden, hidden,
        BLOCK=CONV_BLOCK, FB=FLAG_BLOCK, num_warps=CONV_WARPS)
    recurrent_kernel[(N * H, D // bv)](
        act, act.stride(0), gate, gate.stride(0), beta, beta.stride(0),
        v["A_log"], v["dt_bias"], qsl, nat, idx, st, st.stride(0),
        o, o.stride(0), R, S, H, T, lower_bound,
        D=D, BV=bv, SOFTPLUS=softplus, num_warps=warps)
    gated_rmsnorm_kernel[(R, triton.cdiv(H, NORM_HEADS))](
        o, o.stride(0), og, og.stride(0), v["norm_weight"], out, out.stride(0),
        flags, H, float(p.norm_eps),
        D=D, BH=NORM_HEADS, num_warps=NORM_WARPS)
