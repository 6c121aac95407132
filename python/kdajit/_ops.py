"""The public ops (the decode ops in FlashInfer's signatures, the prefill op)
and their torch custom ops.

Eager calls go straight to the ctypes path (_launch): a torch custom op costs
dispatcher time on every call and buys nothing there; a CUDA graph captures
the launch on the current stream either way. Under torch.compile (and any
tracing with fake or functional tensors) the calls go through the custom ops
`torch.ops.kdajit.fused_kda_decode` / `packed_fused_kda_decode` /
`fused_kda_prefill`, which mutate conv_state, state and the output (the
prefill op also its oob_counter) and have fake implementations, so the graph
keeps them as opaque in-place kernels. torch < 2.4 has no
torch.library.custom_op: there the functions are plain (eager only).
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
                             mutates_args=("conv_state", "state", "output", "oob_counter"))
    def _prefill_def(x: torch.Tensor, conv_weight: torch.Tensor, conv_state: torch.Tensor, raw_gate: torch.Tensor,
                     raw_beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, state_indices: torch.Tensor,
                     state: torch.Tensor, output_gate: torch.Tensor, norm_weight: torch.Tensor,
                     query_start_loc: torch.Tensor, has_initial_state: Optional[torch.Tensor], gate: str,
                     lower_bound: float, norm_eps: float, max_seq_len: int, output: torch.Tensor,
                     oob_counter: Optional[torch.Tensor]) -> None:
        _launch.prefill_impl(x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                             output_gate, norm_weight, query_start_loc, has_initial_state, gate, lower_bound,
                             norm_eps, max_seq_len, output, oob_counter)

    @_prefill_def.register_fake
    def _prefill_fake(x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                      output_gate, norm_weight, query_start_loc, has_initial_state, gate, lower_bound, norm_eps,
                      max_seq_len, output, oob_counter):
        return None

    # Calls go through the op overload packets (what torch.compile traces best).
    _fused_op = torch.ops.kdajit.fused_kda_decode
    _packed_op = torch.ops.kdajit.packed_fused_kda_decode
    _prefill_op = torch.ops.kdajit.fused_kda_prefill
else:
    _fused_op = _packed_op = _prefill_op = None


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
                      lower_bound=-5.0, norm_eps=1e-6, max_seq_len=0, out=None, oob_counter=None):
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
            oob_counter, dry=True))
    if traced:
        _prefill_op(x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                    output_gate, norm_weight, query_start_loc, has_initial_state, gate, lower_bound, norm_eps,
                    max_seq_len, out, oob_counter)
    else:
        _launch.prefill_impl(x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                             output_gate, norm_weight, query_start_loc, has_initial_state, gate, lower_bound,
                             norm_eps, max_seq_len, out, oob_counter)
    return out


def _bound(op, args, kwargs):
    import inspect

    name = getattr(op, "__name__", op)
    ops = {"fused_kda_decode": (fused_kda_decode, _launch.single_impl, "output"),
           "packed_fused_kda_decode": (packed_fused_kda_decode, _launch.packed_impl, "output"),
           "fused_kda_prefill": (fused_kda_prefill, _launch.prefill_impl, "out")}
    if not isinstance(name, str) or name not in ops:
        raise ValueError(f"op: expected fused_kda_decode, packed_fused_kda_decode or fused_kda_prefill, got {op!r}")
    fn, impl, out = ops[name]
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    a = dict(bound.arguments)
    if a[out] is None:
        a[out] = _launch.new_output(a["x"], a["A_log"], lambda stand_in: impl(**{**a, out: stand_in}, dry=True))
    return impl, a


def dry_run(op, *args, **kwargs):
    """What a call of `op` (fused_kda_decode / packed_fused_kda_decode /
    fused_kda_prefill, or its name) with these arguments would pass to the C
    library: the kdajit_decode_args_t (kdajit_prefill_args_t) bytes, after the
    same mapping and kdajit_validate_args (kdajit_validate_prefill_args), without launching.
    Tensors may live on the CPU (their addresses are only checked, never read)."""
    impl, a = _bound(op, args, kwargs)
    return impl(**a, dry=True)


def selected_key(op, *args, **kwargs):
    """The kernel key name a call of `op` with these arguments would launch on the
    current stream (validation and route selection; nothing compiled or launched):
    what to pre-warm for exactly this call. The decode ops only: the C ABI has
    no key query for the prefill op."""
    if getattr(op, "__name__", op) == "fused_kda_prefill":
        raise ValueError("op: expected fused_kda_decode or packed_fused_kda_decode (the C ABI has no key query "
                         "for fused_kda_prefill)")
    impl, a = _bound(op, args, kwargs)
    return impl(**a, dry="key")
