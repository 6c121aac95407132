"""The single-token KDA decode (docs/CONTRACT.md §2) as three Triton kernels, the way a
serving engine composes it on Hopper today:

1. conv_update_kernel: causal conv1d update + SiLU; shifts conv_state; writes the
   q/k/v activations (bf16: rounding point 1) to a global buffer.
2. recurrent_kernel: l2norm of q and k, gate, beta, delta-rule state update, o;
   writes o (bf16: rounding point 3) to a global buffer.
3. gated_rmsnorm_kernel: RMSNorm of o with the output gate; writes output.

Layouts follow docs/CONTRACT.md §1 (state [S, H, V, K], k fastest; conv_state with any
strides, SD in the benchmark). Rows whose slot is not in 1..S-1 produce zeros and
touch no state (docs/CONTRACT.md §3). Slots of live rows must be distinct.
"""
import torch
import triton
import triton.language as tl

D = 128

# (BV, num_warps) of the recurrent kernel: v rows per program. A small BV gives a
# small batch more programs to fill the GPU; a large BV amortizes the q/k/gate loads. The benchmark times
# them all per configuration and keeps the fastest, so Triton gets its best tile.
RECURRENT_VARIANTS = ((4, 1), (8, 1), (16, 2), (32, 4))
CONV_BLOCK, CONV_WARPS = 1024, 4  # 8 channels per thread: 16-byte bf16 accesses
NORM_HEADS, NORM_WARPS = 4, 4     # heads per program of the norm kernel

# do_not_specialize: the slot count, head count and beta's row stride vary over the
# benchmark grid; Triton's divisibility specialization would recompile for each.


# --- The math of one token, shared with triton_kda_packed.py (inlined by Triton) ---


@triton.jit
def load_conv_weights(weight_ptr, c, hidden, mask):
    # weight[j, w, hd] with c = j*hidden + hd lives at c + 3*j*hidden + w*hidden.
    w_ptr = weight_ptr + c + (c // hidden) * (3 * hidden)
    w0 = tl.load(w_ptr, mask=mask, other=0.0)
    w1 = tl.load(w_ptr + hidden, mask=mask, other=0.0)
    w2 = tl.load(w_ptr + 2 * hidden, mask=mask, other=0.0)
    w3 = tl.load(w_ptr + 3 * hidden, mask=mask, other=0.0)
    return w0, w1, w2, w3


@triton.jit
def conv_silu(w0, w1, w2, w3, h0, h1, h2, x):
    # The 4-tap causal conv over the history h0..h2 and x, then SiLU, in f32.
    a = w0 * h0.to(tl.float32) + w1 * h1.to(tl.float32) + w2 * h2.to(tl.float32) + w3 * x.to(tl.float32)
    return a * tl.sigmoid(a)


@triton.jit
def l2norm_qk(q, k):
    # 0.0883... = 128 ** -0.5 (a literal: Triton kernels see only constexpr globals).
    q = q * (tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * 0.08838834764831845)
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    return q, k


@triton.jit
def gate_decay(g, A, lower_bound, SOFTPLUS: tl.constexpr):
    # g: raw gate + dt_bias (f32); A = exp(A_log[h]). exp of the per-channel log decay.
    if SOFTPLUS:
        gv = -A * tl.where(g > 20.0, g, tl.log(1.0 + tl.exp(g)))
    else:
        gv = lower_bound * tl.sigmoid(A * g)
    return tl.exp(gv)


@triton.jit
def delta_rule_step(s, q, k, v, decay, beta):
    # One token on a [BV, 128] f32 state tile: decay, u = S k, S += beta (v - u) k^T, o = S q.
    s = s * decay[None, :]
    u = tl.sum(s * k[None, :], axis=1)
    s = s + (beta * (v - u))[:, None] * k[None, :]
    return s, tl.sum(s * q[None, :], axis=1)


@triton.jit
def gated_rmsnorm_rows(ob, og, w, eps, D: tl.constexpr):
    # [BH, 128] f32 rows of o, their output gate and the norm weight.
    inv_rms = tl.rsqrt(tl.sum(ob * ob, axis=1) / D + eps)
    return ob * inv_rms[:, None] * w[None, :] * tl.sigmoid(og)


# --- The three kernels of the single-token op ---


@triton.jit(do_not_specialize=["num_slots"])
def conv_update_kernel(x_ptr, x_row_stride, weight_ptr,
                       conv_ptr, conv_slot_stride, conv_chan_stride, conv_tap_stride,
                       idx_ptr, act_ptr, act_row_stride, num_slots, qkv, hidden,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = c < qkv
    slot = tl.load(idx_ptr + row)
    live = (slot > 0) & (slot < num_slots)
    # A dead row reads slot 0 (always valid memory) and writes no history.
    slot = tl.where(live, slot, 0).to(tl.int64)
    keep = in_row & live

    x_raw = tl.load(x_ptr + row.to(tl.int64) * x_row_stride + c, mask=in_row, other=0.0)
    hist = conv_ptr + slot * conv_slot_stride + c * conv_chan_stride
    h0 = tl.load(hist, mask=keep, other=0.0)
    h1 = tl.load(hist + conv_tap_stride, mask=keep, other=0.0)
    h2 = tl.load(hist + 2 * conv_tap_stride, mask=keep, other=0.0)

    w0, w1, w2, w3 = load_conv_weights(weight_ptr, c, hidden, in_row)
    m = conv_silu(w0, w1, w2, w3, h0, h1, h2, x_raw)
    tl.store(act_ptr + row.to(tl.int64) * act_row_stride + c, m.to(act_ptr.dtype.element_ty), mask=in_row)

    # The history moves one tap; x goes in as raw bf16, bit-exact.
    tl.store(hist, h1, mask=keep)
    tl.store(hist + conv_tap_stride, h2, mask=keep)
    tl.store(hist + 2 * conv_tap_stride, x_raw, mask=keep)


@triton.jit(do_not_specialize=["num_slots", "heads", "beta_row_stride"])
def recurrent_kernel(act_ptr, act_row_stride, gate_ptr, gate_row_stride, beta_ptr, beta_row_stride,
                     a_log_ptr, dt_bias_ptr, idx_ptr, state_ptr, state_slot_stride,
                     o_ptr, o_row_stride, num_slots, heads, lower_bound,
                     D: tl.constexpr, BV: tl.constexpr, SOFTPLUS: tl.constexpr):
    # One program per (row, head) and block of BV value rows; the whole k extent
    # (128) is one tile row, so each program reads its [BV, 128] state tile once.
    rh = tl.program_id(0)
    row = rh // heads
    h = rh % heads
    vv = tl.program_id(1) * BV + tl.arange(0, BV)
    kk = tl.arange(0, D)
    slot = tl.load(idx_ptr + row)
    live = (slot > 0) & (slot < num_slots)
    slot = tl.where(live, slot, 0).to(tl.int64)
    row64 = row.to(tl.int64)
    hidden = heads * D

    act = act_ptr + row64 * act_row_stride + h * D
    q = tl.load(act + kk).to(tl.float32)
    k = tl.load(act + hidden + kk).to(tl.float32)
    v = tl.load(act + 2 * hidden + vv).to(tl.float32)
    q, k = l2norm_qk(q, k)
    g = tl.load(gate_ptr + row64 * gate_row_stride + h * D + kk).to(tl.float32) + tl.load(dt_bias_ptr + h * D + kk)
    decay = gate_decay(g, tl.exp(tl.load(a_log_ptr + h)), lower_bound, SOFTPLUS)
    beta = tl.sigmoid(tl.load(beta_ptr + row64 * beta_row_stride + h).to(tl.float32))

    tile = state_ptr + slot * state_slot_stride + h * (D * D) + vv[:, None] * D + kk[None, :]
    tile_mask = ((vv < D) & live)[:, None] & (kk < D)[None, :]
    s, o = delta_rule_step(tl.load(tile, mask=tile_mask, other=0.0).to(tl.float32), q, k, v, decay, beta)
    tl.store(tile, s.to(state_ptr.dtype.element_ty), mask=tile_mask)
    o = tl.where(live, o, 0.0)
    tl.store(o_ptr + row64 * o_row_stride + h * D + vv, o.to(o_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["num_slots", "heads"])
def gated_rmsnorm_kernel(o_ptr, o_row_stride, og_ptr, og_row_stride, w_ptr, out_ptr, out_row_stride,
                         idx_ptr, num_slots, heads, eps,
                         D: tl.constexpr, BH: tl.constexpr):
    row = tl.program_id(0)
    hh = tl.program_id(1) * BH + tl.arange(0, BH)
    vv = tl.arange(0, D)
    slot = tl.load(idx_ptr + row)
    live = (slot > 0) & (slot < num_slots)
    row64 = row.to(tl.int64)
    mask = (hh < heads)[:, None] & (vv < D)[None, :]
    off = hh[:, None] * D + vv[None, :]

    ob = tl.load(o_ptr + row64 * o_row_stride + off, mask=mask, other=0.0).to(tl.float32)
    og = tl.load(og_ptr + row64 * og_row_stride + off, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + vv)
    y = gated_rmsnorm_rows(ob, og, w, eps, D)
    # Dead rows are zeros even with eps = 0 (where rsqrt(0) * 0 would be NaN).
    y = tl.where(live, y, 0.0)
    tl.store(out_ptr + row64 * out_row_stride + off, y.to(out_ptr.dtype.element_ty), mask=mask)


def check_layout(p, act, o):
    """The inner layouts the kernels assume (row strides and the slot stride are free)."""
    H, R = p.heads, p.rows
    qkv = 3 * H * D
    checks = [
        ("x", p.x, torch.bfloat16, (R, qkv), [None, 1]),
        ("conv_weight", p.conv_weight, torch.float32, (3, 4, H * D), [4 * H * D, H * D, 1]),
        ("conv_state", p.conv_state, torch.bfloat16, (p.slots, qkv, 3), [None, None, None]),
        ("raw_gate", p.raw_gate, torch.bfloat16, (R, H, D), [None, D, 1]),
        ("raw_beta", p.raw_beta, torch.bfloat16, (R, H), [None, 1]),
        ("A_log", p.A_log, torch.float32, (H,), [1]),
        ("dt_bias", p.dt_bias, torch.float32, (H * D,), [1]),
        ("state_indices", p.state_indices, torch.int32, (R,), [1]),
        ("state", p.state, p.state.dtype, (p.slots, H, D, D), [None, D * D, D, 1]),
        ("output_gate", p.output_gate, torch.bfloat16, (R, H, D), [None, D, 1]),
        ("norm_weight", p.norm_weight, torch.float32, (D,), [1]),
        ("output", p.output, torch.bfloat16, (R, H, D), [None, D, 1]),
        ("act (scratch)", act, torch.bfloat16, (R, qkv), [None, 1]),
        ("o (scratch)", o, torch.bfloat16, (R, H, D), [None, D, 1]),
    ]
    check_tensors(checks, p.state)


def check_tensors(checks, state):
    """checks: (name, tensor, dtype, shape, strides; None = free); state: f32 or bf16.
    Raises ValueError naming the first tensor that differs (shared with triton_kda_packed.py)."""
    for name, t, dtype, shape, strides in checks:
        if t.dtype != dtype or tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected {dtype} {list(shape)}, got {t.dtype} {list(t.shape)}")
        for i, want in enumerate(strides):
            if want is not None and t.shape[i] > 1 and t.stride(i) != want:
                raise ValueError(f"{name}: expected stride {want} in dim {i}, got strides {t.stride()}")
    if state.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"state: expected float32 or bfloat16, got {state.dtype}")


def make_scratch(p):
    """The two intermediates between the kernels, allocated once (not per call)."""
    act = torch.empty(p.rows, 3 * p.heads * D, dtype=torch.bfloat16, device=p.x.device)
    o = torch.empty(p.rows, p.heads, D, dtype=torch.bfloat16, device=p.x.device)
    return act, o


def decode(p, act, o, variant=RECURRENT_VARIANTS[1]):
    """One decode step: three launches on the current stream, no allocation."""
    bv, warps = variant
    R, H, S = p.rows, p.heads, p.slots
    hidden = H * D
    cs = p.conv_state
    conv_update_kernel[(R, triton.cdiv(3 * hidden, CONV_BLOCK))](
        p.x, p.x.stride(0), p.conv_weight,
        cs, cs.stride(0), cs.stride(1), cs.stride(2),
        p.state_indices, act, act.stride(0), S, 3 * hidden, hidden,
        BLOCK=CONV_BLOCK, num_warps=CONV_WARPS)
    recurrent_kernel[(R * H, D // bv)](
        act, act.stride(0), p.raw_gate, p.raw_gate.stride(0), p.raw_beta, p.raw_beta.stride(0),
        p.A_log, p.dt_bias, p.state_indices, p.state, p.state.stride(0),
        o, o.stride(0), S, H, p.lower_bound,
        D=D, BV=bv, SOFTPLUS=p.gate_softplus, num_warps=warps)
    gated_rmsnorm_kernel[(R, triton.cdiv(H, NORM_HEADS))](
        o, o.stride(0), p.output_gate, p.output_gate.stride(0), p.norm_weight,
        p.output, p.output.stride(0), p.state_indices, S, H, p.norm_eps,
        D=D, BH=NORM_HEADS, num_warps=NORM_WARPS)
