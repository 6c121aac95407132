"""The public ops (the decode ops in FlashInfer's signatures, the prefill op,
FLA's chunk_kda) and their torch custom ops.

Eager calls go straight to the ctypes path (_launch): a torch custom op costs
dispatcher time on every call and buys nothing there; a CUDA graph captures
the launch on the current stream either way. Under torch.compile (and any
tracing with fake or functional tensors) the calls go through the custom ops
`torch.ops.kdajit.fused_kda_decode` / `packed_fused_kda_decode` /
`fused_kda_prefill` / `chunk_kda`, which mutate conv_state, state and the
output (the prefill op also its oob_counter; the chunk op its output and final
state) and have fake implementations, so the graph keeps them as opaque
in-place kernels. torch < 2.4 has no torch.library.custom_op: there the
functions are plain (eager only).
"""
from typing import Optional

import torch

from . import _launch

_Tensor = torch.Tensor

HAS_CUSTOM_OPS = hasattr(torch, "library") and hasattr(torch.library, "custom_op")

if hasattr(torch, "compiler") and hasattr(torch.compiler, "is_compiling"):
    _is_compiling = torch.compiler.is_compiling
elif hasattr(torch, "_dynamo") and hasattr(torch._dynamo, "is_compiling"):  # pragma: no cover
    _is_compiling = torch._dynamo.is_compiling
else:
    def _is_compiling():
        return False


if HAS_CUSTOM_OPS:
    # No `from __future__ import annotations` in this module: custom_op reads the
    # annotations to infer the schema.
    @torch.library.custom_op("kdajit::fused_kda_decode", mutates_args=("conv_state", "state", "output"))
    def _fused_def(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, raw_gate: torch.Tensor,
                  raw_beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, state_indices: torch.Tensor,
                  state: torch.Tensor, output_gate: torch.Tensor, norm_weight: torch.Tensor,
                  lower_bound: Optional[float], norm_eps: float, output: torch.Tensor,
                  state_indices_mode: str) -> None:
        _launch.single_impl(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                         output_gate, norm_weight, lower_bound, norm_eps, output, state_indices_mode)

    @_fused_def.register_fake
    def _fused_fake(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
                    norm_weight, lower_bound, norm_eps, output, state_indices_mode):
        return None

    @torch.library.custom_op("kdajit::packed_fused_kda_decode", mutates_args=("conv_state", "state", "output"))
    def _packed_def(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, raw_gate: torch.Tensor,
                   raw_beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, state_indices: torch.Tensor,
                   state: torch.Tensor, output_gate: torch.Tensor, norm_weight: torch.Tensor,
                   lower_bound: Optional[float], norm_eps: float, output: torch.Tensor,
                   query_start_loc: torch.Tensor, num_accepted_tokens: torch.Tensor) -> None:
        _launch.packed_impl(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                         output_gate, norm_weight, lower_bound, norm_eps, output, query_start_loc,
                         num_accepted_tokens)

    @_packed_def.register_fake
    def _packed_fake(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
                     norm_weight, lower_bound, norm_eps, output, query_start_loc, num_accepted_tokens):
        return None

    # The output is `output` here, as in the decode ops (torch's schemas give
    # an argument named `out` a meaning of their own).
    @torch.library.custom_op("kdajit::fused_kda_prefill",
                             mutates_args=("conv_state", "state", "output", "oob_counter", "workspace"))
    def _prefill_def(x: torch.Tensor, conv_weight: torch.Tensor, conv_state: torch.Tensor, raw_gate: torch.Tensor,
                     raw_beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, state_indices: torch.Tensor,
                     state: torch.Tensor, output_gate: torch.Tensor, norm_weight: torch.Tensor,
                     query_start_loc: torch.Tensor, has_initial_state: Optional[torch.Tensor], gate: str,
                     lower_bound: float, norm_eps: float, max_seq_len: int, output: torch.Tensor,
                     oob_counter: Optional[torch.Tensor], workspace: Optional[torch.Tensor]) -> None:
        _launch.prefill_impl(x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                             output_gate, norm_weight, query_start_loc, has_initial_state, gate, lower_bound,
                             norm_eps, max_seq_len, output, oob_counter, workspace=workspace)

    @_prefill_def.register_fake
    def _prefill_fake(x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                      output_gate, norm_weight, query_start_loc, has_initial_state, gate, lower_bound, norm_eps,
                      max_seq_len, output, oob_counter, workspace):
        return None

    # The chunk op writes output and final_state. An in-place final state (the
    # same tensor as initial_state) is passed once, as final_state with
    # state_in_place True, so that no two arguments of the op alias.
    @torch.library.custom_op("kdajit::chunk_kda", mutates_args=("output", "final_state", "workspace"))
    def _chunk_def(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   A_log: torch.Tensor, dt_bias: Optional[torch.Tensor], initial_state: Optional[torch.Tensor],
                   cu_seqlens: torch.Tensor, gate: str, lower_bound: float, scale: float, qk_l2norm: bool,
                   beta_sigmoid: bool, state_v_first: bool, max_seq_len: int, output: torch.Tensor,
                   final_state: Optional[torch.Tensor], state_in_place: bool,
                   workspace: Optional[torch.Tensor]) -> None:
        _launch.chunk_impl(q, k, v, g, beta, A_log, dt_bias, final_state if state_in_place else initial_state,
                           final_state, output, cu_seqlens, gate, lower_bound, scale, qk_l2norm, beta_sigmoid,
                           state_v_first, max_seq_len, workspace=workspace)

    @_chunk_def.register_fake
    def _chunk_fake(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, gate, lower_bound, scale, qk_l2norm,
                    beta_sigmoid, state_v_first, max_seq_len, output, final_state, state_in_place, workspace):
        return None

    # Calls go through the op overload packets (what torch.compile traces best).
    _fused_op = torch.ops.kdajit.fused_kda_decode
    _packed_op = torch.ops.kdajit.packed_fused_kda_decode
    _prefill_op = torch.ops.kdajit.fused_kda_prefill
    _chunk_op = torch.ops.kdajit.chunk_kda
else:
    _fused_op = _packed_op = _prefill_op = _chunk_op = None


def fused_kda_decode(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
                     norm_weight, lower_bound=-5.0, norm_eps=1e-5, output=None, *,
                     state_indices_mode="unique_or_null"):
    """Fused KDA decode, one token per row: conv + SiLU (conv_state updated),
    the gated delta rule on the slot-indexed state pool, gated RMSNorm.

    FlashInfer's arguments and order (`flashinfer.kda_decode.fused_kda_decode`).
    Shapes (H from A_log, R from x, S slots, strides in elements; the KDA decode
    spec has the full contract):
      x [R, 3*H*128] or [1, R, 3*H*128] bf16; weight [3, 4, H*128] f32;
      conv_state [S, 3*H*128, 3] bf16, SD strides (slot, 1, 3*H*128) or DS (slot, 3, 1);
      raw_gate, output_gate, output [R, H, 128], [1, R, H, 128] or [R, H*128] bf16;
      raw_beta [R, H] or [1, R, H] bf16; A_log H f32 values (e.g. [H] or [1, 1, H, 1]);
      dt_bias H*128 f32; state_indices R int32 (slot <= 0: null row); state [S, H, 128, 128] f32 or bf16;
      norm_weight 128 f32.
    lower_bound: the bounded gate's bound (< 0); None selects the softplus gate.
    state_indices_mode: 'unique_or_null', 'positive_unique' or 'repeated_positive' (docs/CONTRACT.md §3).
    Launches on torch's current stream of x's device. Returns output, allocated
    as [1, R, H, 128] bf16 when None. Contract violations raise ValueError,
    unsupported configurations NotImplementedError, before anything is written.
    """
    traced = _fused_op is not None and (type(x) is not _Tensor or _is_compiling())
    if output is None:
        output = _launch.new_output(x, A_log, None if traced else lambda stand_in: _launch.single_impl(
            x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate, norm_weight,
            lower_bound, norm_eps, stand_in, state_indices_mode, dry=True))
    if traced:
        _fused_op(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
                  norm_weight, lower_bound, norm_eps, output, state_indices_mode)
    else:
        _launch.single_impl(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                         output_gate, norm_weight, lower_bound, norm_eps, output, state_indices_mode)
    return output


def packed_fused_kda_decode(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                            output_gate, norm_weight, lower_bound=-5.0, norm_eps=1e-5, output=None, *,
                            query_start_loc, num_accepted_tokens):
    """Fused KDA decode over packed sequences of up to T tokens (draft verify).

    As fused_kda_decode, except: state_indices [N, T] int32 (per-token state
    checkpoints; column 0 is the conv slot), conv_state [S, 3*H*128, T+2],
    query_start_loc [N+1] int32 (row ranges), num_accepted_tokens [N] int32
    (accepted tokens of the previous window). Returns output ([1, R, H, 128]
    bf16 when None).
    """
    traced = _packed_op is not None and (type(x) is not _Tensor or _is_compiling())
    if output is None:
        output = _launch.new_output(x, A_log, None if traced else lambda stand_in: _launch.packed_impl(
            x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate, norm_weight,
            lower_bound, norm_eps, stand_in, query_start_loc, num_accepted_tokens, dry=True))
    if traced:
        _packed_op(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
                   norm_weight, lower_bound, norm_eps, output, query_start_loc, num_accepted_tokens)
    else:
        _launch.packed_impl(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                         output_gate, norm_weight, lower_bound, norm_eps, output, query_start_loc,
                         num_accepted_tokens)
    return output


def fused_kda_prefill(x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                      output_gate, norm_weight, query_start_loc, *, has_initial_state=None, gate="bounded",
                      lower_bound=-5.0, norm_eps=1e-6, max_seq_len=0, out=None, oob_counter=None, workspace=None):
    """Fused KDA prefill: N prompts of any length (0 allowed) packed in T_total
    rows, each from its state slot. Per sequence and head: the causal conv +
    SiLU (history from the slot's conv state), q/k L2 norm, gate, beta, the
    gated delta rule over the sequence (chunked, 64 tokens a chunk), the final
    state and the last 3 inputs written back to the slot, the gated RMSNorm
    into the output. The decode math token after token (docs/DESIGN.md "Prefill").

    Shapes (H from A_log, S slots, strides in elements; as fused_kda_decode with
    R = T_total rows unless said here):
      x [T_total, 3*H*128] or [1, T_total, 3*H*128] bf16; conv_weight [3, 4, H*128] f32;
      conv_state [S, 3*H*128, K] bf16 with K in 3..18, SD or DS strides (taps 0..2 are the history;
        taps 3.. are left alone); raw_gate, output_gate, out [T_total, H, 128] (or the decode ops'
        other forms) bf16; raw_beta [T_total, H] bf16; A_log H, dt_bias H*128, norm_weight 128 f32;
      state_indices [N] int32: sequence n's slot (<= 0 null, >= S out of range: its rows are zeros,
        nothing is written); state [S, H, 128, 128] f32 or bf16;
      query_start_loc [N+1] int32: sequence n owns rows [qsl[n], qsl[n+1]); rows no sequence owns,
        and those of malformed ranges, are zeros.
    has_initial_state: None (every sequence starts from its slot) or [N] int32, 0: sequence n starts
      from zero state and zero conv history whatever its slot holds.
    gate: 'bounded' (lower_bound < 0) or 'softplus'. max_seq_len: a host-side upper bound of the
    longest sequence for the route choice only (0: T_total); a wrong one costs speed, never
    correctness. oob_counter: None or an int32 device tensor: += 1 per sequence whose slot is >= S.
    workspace: None or a contiguous device tensor of scratch bytes; with at least
    prefill_workspace_bytes(N, T_total, H) of them, 16-byte aligned (torch's allocations are), the
    route for few long prompts (twopass) may run, and may overwrite any of it.
    Launches on torch's current stream of x's device. Returns out, allocated as [1, T_total, H, 128]
    bf16 when None. Contract violations raise ValueError, unsupported configurations
    NotImplementedError, before anything is written.
    """
    traced = _prefill_op is not None and (type(x) is not _Tensor or _is_compiling())
    if out is None:
        if not traced:
            _launch._prefill_scalars(x, gate, lower_bound, norm_eps, max_seq_len, oob_counter)  # before allocating
        out = _launch.new_output(x, A_log, None if traced else lambda stand_in: _launch.prefill_impl(
            x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
            norm_weight, query_start_loc, has_initial_state, gate, lower_bound, norm_eps, max_seq_len, stand_in,
            oob_counter, dry=True, workspace=workspace))
    if traced:
        _prefill_op(x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                    output_gate, norm_weight, query_start_loc, has_initial_state, gate, lower_bound, norm_eps,
                    max_seq_len, out, oob_counter, workspace)
    else:
        _launch.prefill_impl(x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                             output_gate, norm_weight, query_start_loc, has_initial_state, gate, lower_bound,
                             norm_eps, max_seq_len, out, oob_counter, workspace=workspace)
    return out


# --- chunk_kda: FLA's chunk_kda over kdajit_chunk ------------------------------------

D = _launch.D

# FLA chunk_kda keyword arguments that kdajit takes only at the value it serves:
# (name, the value served, what kdajit would need for another).
_FLA_FIXED = (
    ("allow_neg_eigval", False, "beta = 2 * sigmoid(beta) (negative eigenvalues) is not computed by kdajit"),
    ("disable_recompute", False, "kdajit is a forward (inference) op: it keeps no activations for a backward pass"),
    ("return_intermediate_states", False, "kdajit returns no per-chunk states"),
    ("cp_context", None, "context parallelism is not supported by kdajit"),
)
_CU_CACHE_LIMIT = 64
_equal_cu = {}  # (B, T, device) -> int32 [B+1] tensor arange(B+1) * T


def _equal_lengths_cu_seqlens(batch, tokens, device, traced):
    """cu_seqlens of `batch` sequences of `tokens` each: arange(B+1) * T as int32 on
    the device, computed there (no host sync) and kept per (B, T, device), so that
    repeated calls and graph replays allocate nothing. A tensor made while the
    stream captures a graph is not kept: its values exist only in the graph's replays."""
    key = (batch, tokens, device)
    cu = None if traced else _equal_cu.get(key)
    if cu is None:
        cu = torch.arange(batch + 1, dtype=torch.int32, device=device).mul_(tokens)
        if not traced and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            if len(_equal_cu) >= _CU_CACHE_LIMIT:
                _equal_cu.clear()
            _equal_cu[key] = cu
    return cu


def _fla_options(kwargs, state_v_first):
    """FLA's other keyword arguments: (state_v_first, cu_seqlens_cpu). The ones
    kdajit serves at one value only raise NotImplementedError for another;
    names FLA does not know raise TypeError, as Python does."""
    kw = dict(kwargs)
    if "transpose_state_layout" in kw:  # FLA's deprecated name of state_v_first
        value = kw.pop("transpose_state_layout")
        if state_v_first:
            raise ValueError("transpose_state_layout: the deprecated name of state_v_first: pass one of them, "
                             "not both")
        state_v_first = value
    kw.pop("safe_gate", None)  # FLA's choice between two kernels of the same math; kdajit has one
    cu_seqlens_cpu = kw.pop("cu_seqlens_cpu", None)
    for name, served, why in _FLA_FIXED:
        if name in kw:
            value = kw.pop(name)
            if (value is not None) if served is None else bool(value):
                raise NotImplementedError(f"{name}: expected {served!r} (kdajit serves only that), got {value!r}: "
                                          f"{why}")
    if "chunk_size" in kw:
        size = kw.pop("chunk_size")
        if size == 32:
            raise NotImplementedError("chunk_size: expected 64 (kdajit's chunk), got 32")
        if isinstance(size, bool) or size != 64:
            raise ValueError(f"chunk_size: expected 64 (kdajit's chunk), got {size!r}")
    if kw:
        raise TypeError(f"chunk_kda() got an unexpected keyword argument {next(iter(kw))!r}")
    return state_v_first, cu_seqlens_cpu


def _shape(t):
    return "[" + ", ".join(str(n) for n in t.shape) + "]"


def _check_qkv(q, k, v, g, beta):
    """FLA's shape rules for q, k, v, g, beta, and what kdajit does not serve
    (K or V other than 128, GVA, fp16 / f32 q, k, v): (leading dims, H)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if q.dim() not in (3, 4):
        raise ValueError(f"q: expected [B, T, H, 128] or [T, H, 128], got shape {_shape(q)}")
    lead, heads = tuple(q.shape[:-2]), q.shape[-2]
    if q.shape[-1] != D:
        raise NotImplementedError(f"q: expected head dim K = {D} (the only one kdajit has), got K = {q.shape[-1]}")
    if tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"k: expected q's shape {_shape(q)}, got {_shape(k)}")
    if v.dim() != q.dim() or tuple(v.shape[:-2]) != lead:
        raise ValueError(f"v: expected [{', '.join(map(str, lead))}, H, 128] (q's leading dims), got {_shape(v)}")
    if v.shape[-2] != heads:
        raise NotImplementedError(f"v: expected H = {heads} value heads (q's): GVA (HV != H) is not supported, got "
                                  f"HV = {v.shape[-2]}")
    if v.shape[-1] != D:
        raise NotImplementedError(f"v: expected head dim V = {D} (the only one kdajit has), got V = {v.shape[-1]}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype in (torch.float16, torch.float32):
            raise NotImplementedError(f"{name}: expected dtype bf16 (kdajit's q, k, v and o), got {t.dtype}")
    if g.dim() != q.dim() or tuple(g.shape[:-2]) != lead:
        raise ValueError(f"g: expected [{', '.join(map(str, lead))}, H, 128] (q's leading dims), got {_shape(g)}")
    if beta.dim() != q.dim() - 1 or tuple(beta.shape[:-1]) != lead:
        raise ValueError(f"beta: expected [{', '.join(map(str, lead))}, H] (q's leading dims), got {_shape(beta)}")
    return lead, heads


def _chunk_prepare(traced, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                   use_gate_in_kernel, use_beta_sigmoid_in_kernel, A_log, dt_bias, lower_bound, cu_seqlens,
                   state_v_first, out, final_state, max_seq_len, kwargs, workspace=None):
    """chunk_kda's arguments as chunk_impl's (a dict; out and final_state
    allocated where needed, cu_seqlens int32), whether final_state is
    initial_state, and whether the final state is returned. What Python can
    check (FLA's options, shapes, dtypes, the scalars' types) is checked before
    anything is allocated; the library validates the rest before launching."""
    state_v_first, cu_seqlens_cpu = _fla_options(kwargs, state_v_first)
    if not use_gate_in_kernel:
        raise ValueError("use_gate_in_kernel: expected True: kdajit computes the gate in the kernel from the raw "
                         "gate g with A_log and dt_bias (and lower_bound for the bounded gate); the precomputed "
                         "log-decay form of g (use_gate_in_kernel=False) is not offered")
    if A_log is None:
        raise ValueError("A_log: expected the [H] f32 log decay rates, which the gate in the kernel needs (for FLA's "
                         "lower_bound * sigmoid(g + dt_bias) without A_log, pass zeros)")
    lead, heads = _check_qkv(q, k, v, g, beta)
    if not isinstance(output_final_state, (bool, int)) or output_final_state not in (0, 1):
        raise ValueError(f"output_final_state: expected True or False, got {output_final_state!r}")
    output_final_state = bool(output_final_state)
    if initial_state is not None and not isinstance(initial_state, torch.Tensor):
        raise ValueError(f"initial_state: expected None or a torch.Tensor, got {type(initial_state).__name__}")
    if initial_state is not None and initial_state.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"initial_state: expected dtype f32 or bf16, got {initial_state.dtype}")
    if final_state is not None and not output_final_state:
        raise ValueError("final_state: given with output_final_state=False; pass output_final_state=True to have "
                         "the final state written into it")
    if not traced:
        _launch._chunk_scalars("softplus" if lower_bound is None else "bounded",
                               -5.0 if lower_bound is None else lower_bound, D ** -0.5 if scale is None else scale,
                               use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, state_v_first, max_seq_len)
        if q.numel() > 0 and _launch._extent(q) < q.numel():
            raise ValueError(f"q: expected elements that do not overlap (rows of H*128 elements), got shape "
                             f"{_shape(q)} strides ({', '.join(map(str, q.stride()))})")
    if cu_seqlens is None:
        batch, tokens = (lead[0], lead[1]) if len(lead) == 2 else (1, lead[0])
        cu = _equal_lengths_cu_seqlens(batch, tokens, q.device, traced)
        if max_seq_len == 0:
            max_seq_len = tokens
    else:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
            got = _shape(cu_seqlens) if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__
            raise ValueError(f"cu_seqlens: expected None or a [N+1] int32 or int64 tensor (N >= 1), got {got}")
        if len(lead) == 2 and lead[0] != 1:
            raise ValueError(f"q: expected batch size 1 with cu_seqlens (the sequences packed in dim 1, as FLA), "
                             f"got B = {lead[0]}")
        if cu_seqlens.dtype == torch.int64:
            cu = cu_seqlens.to(torch.int32)  # on the device: no host sync
        elif cu_seqlens.dtype == torch.int32:
            cu = cu_seqlens
        else:
            raise ValueError(f"cu_seqlens: expected dtype int32 or int64, got {cu_seqlens.dtype}")
        if (max_seq_len == 0 and not traced and isinstance(cu_seqlens_cpu, torch.Tensor)
                and cu_seqlens_cpu.device.type == "cpu" and cu_seqlens_cpu.dim() == 1 and cu_seqlens_cpu.numel() > 1):
            max_seq_len = max(0, int((cu_seqlens_cpu[1:] - cu_seqlens_cpu[:-1]).max()))  # the hint, from the host copy
    seqs = cu.shape[0] - 1
    if output_final_state and final_state is None:
        dtype = torch.float32 if initial_state is None else initial_state.dtype
        final_state = torch.empty((seqs, heads, D, D), dtype=dtype, device=q.device)
    in_place = final_state is not None and initial_state is not None and (final_state is initial_state or (
        not traced and final_state.data_ptr() == initial_state.data_ptr() and final_state.shape == initial_state.shape
        and final_state.stride() == initial_state.stride() and final_state.dtype == initial_state.dtype))
    if out is None:
        out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    a = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state,
             final_state=final_state, out=out, cu_seqlens=cu, gate="softplus" if lower_bound is None else "bounded",
             lower_bound=-5.0 if lower_bound is None else lower_bound, scale=D ** -0.5 if scale is None else scale,
             qk_l2norm=use_qk_l2norm_in_kernel, beta_sigmoid=use_beta_sigmoid_in_kernel, state_v_first=state_v_first,
             max_seq_len=max_seq_len, workspace=workspace)
    return a, in_place, output_final_state


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, *,
              A_log=None, dt_bias=None, lower_bound=None, cu_seqlens=None, state_v_first=False, out=None,
              final_state=None, max_seq_len=0, workspace=None, **kwargs):
    """FLA's chunk_kda (fla.ops.kda.chunk_kda, forward) on kdajit's kernel: the
    gated delta rule of N sequences, chunked 64 tokens a chunk, from an initial
    state per sequence (or zero). Returns (o, final state or None), as FLA.

    FLA's arguments and meaning, with the gate always in the kernel:
      q, k, v [B, T, H, 128] (B = 1 with cu_seqlens: the sequences packed in dim 1) or
        [T, H, 128], bf16; without cu_seqlens, B sequences of T tokens each;
      g [.., H, 128] bf16 or f32: the raw gate, to which dt_bias is added;
      beta [.., H] bf16 or f32: logits with use_beta_sigmoid_in_kernel, else beta itself;
      A_log [H] f32 (required); dt_bias [H*128] or [H, 128] f32, or None;
      lower_bound None: gate -exp(A_log) * softplus(g + dt_bias); else (< 0)
        lower_bound * sigmoid(exp(A_log) * (g + dt_bias));
      scale: q's scale (None: 128 ** -0.5); use_qk_l2norm_in_kernel: q, k / sqrt(sum x^2 + 1e-6);
      initial_state None or [N, H, 128, 128] f32 or bf16, [n, h, k, v] (FLA's layout) or, with
        state_v_first, [n, h, v, k]; it is only read (unless final_state is it);
      cu_seqlens None or [N+1] int32 or int64 on q's device (an int64 one is converted to int32
        on the device: one small kernel and allocation per call, no host sync; pass int32 to
        avoid it).
    use_gate_in_kernel must be True (ValueError otherwise: kdajit takes the raw gate; FLA's
    precomputed log decay is not offered).
    output_final_state: the state after each sequence's last token goes into final_state,
    allocated [N, H, 128, 128] in initial_state's dtype (f32 without one) unless given; give
    initial_state itself to update it in place. out: o's tensor, allocated like q in bf16
    when None. max_seq_len: a host-side upper bound of the longest sequence for the route
    choice only (0: T without cu_seqlens, else FLA's cu_seqlens_cpu when given, else T_total).
    workspace: None or scratch bytes for the route for few long prompts, as fused_kda_prefill's.
    FLA's other keyword arguments: safe_gate and cu_seqlens_cpu are taken (the first
    changes nothing), transpose_state_layout is state_v_first; allow_neg_eigval,
    disable_recompute, return_intermediate_states, cp_context and chunk_size only at their
    defaults (64 for chunk_size); others raise NotImplementedError (GVA, K or V other than
    128, fp16 / f32 q). Forward only (no autograd).

    Launches on torch's current stream of q's device, without host syncs; allocates only o,
    the final state and the int32 cu_seqlens (see above; without cu_seqlens one per (B, T,
    device), kept), so a CUDA graph captures it. Contract violations raise ValueError,
    unsupported configurations NotImplementedError, before anything is written.
    """
    traced = _chunk_op is not None and (type(q) is not _Tensor or _is_compiling())
    a, in_place, returns_state = _chunk_prepare(
        traced, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
        use_gate_in_kernel, use_beta_sigmoid_in_kernel, A_log, dt_bias, lower_bound, cu_seqlens, state_v_first, out,
        final_state, max_seq_len, kwargs, workspace)
    if traced:
        _chunk_op(a["q"], a["k"], a["v"], a["g"], a["beta"], a["A_log"], a["dt_bias"],
                  None if in_place else a["initial_state"], a["cu_seqlens"], a["gate"], float(a["lower_bound"]),
                  float(a["scale"]),
                  bool(a["qk_l2norm"]), bool(a["beta_sigmoid"]), bool(a["state_v_first"]), a["max_seq_len"],
                  a["out"], a["final_state"], in_place, a["workspace"])
    else:
        _launch.chunk_impl(**a)
    return a["out"], (a["final_state"] if returns_state else None)


def _chunk_dry(args, kwargs, what):
    import inspect

    bound = inspect.signature(chunk_kda).bind(*args, **kwargs)
    bound.apply_defaults()
    b = dict(bound.arguments)
    extra = b.pop("kwargs")
    a, _, _ = _chunk_prepare(False, **b, kwargs=extra)
    return _launch.chunk_impl(**a, dry=what)


def _bound(op, args, kwargs):
    import inspect

    name = getattr(op, "__name__", op)
    ops = {"fused_kda_decode": (fused_kda_decode, _launch.single_impl, "output"),
           "packed_fused_kda_decode": (packed_fused_kda_decode, _launch.packed_impl, "output"),
           "fused_kda_prefill": (fused_kda_prefill, _launch.prefill_impl, "out")}
    if not isinstance(name, str) or name not in ops:
        raise ValueError(f"op: expected fused_kda_decode, packed_fused_kda_decode, fused_kda_prefill or chunk_kda, "
                         f"got {op!r}")
    fn, impl, out = ops[name]
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    a = dict(bound.arguments)
    if a[out] is None:
        a[out] = _launch.new_output(a["x"], a["A_log"], lambda stand_in: impl(**{**a, out: stand_in}, dry=True))
    return impl, a


def dry_run(op, *args, **kwargs):
    """What a call of `op` (fused_kda_decode / packed_fused_kda_decode /
    fused_kda_prefill / chunk_kda, or its name) with these arguments would pass to
    the C library: the kdajit_decode_args_t (kdajit_prefill_args_t,
    kdajit_chunk_args_t) bytes, after the same mapping and kdajit_validate_args
    (kdajit_validate_prefill_args, kdajit_validate_chunk_args), without launching.
    Tensors may live on the CPU (their addresses are only checked, never read)."""
    if getattr(op, "__name__", op) == "chunk_kda":
        return _chunk_dry(args, kwargs, True)
    impl, a = _bound(op, args, kwargs)
    return impl(**a, dry=True)


def selected_key(op, *args, **kwargs):
    """The kernel key name a call of `op` with these arguments would launch on the
    current stream (validation and route selection; nothing compiled or launched):
    what to pre-warm for exactly this call (for the prefill and chunk ops the
    route also depends on max_seq_len, 0: T_total)."""
    if getattr(op, "__name__", op) == "chunk_kda":
        return _chunk_dry(args, kwargs, "key")
    impl, a = _bound(op, args, kwargs)
    return impl(**a, dry="key")
