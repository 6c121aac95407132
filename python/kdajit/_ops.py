"""The public decode ops, FlashInfer's signatures, and their torch custom ops.

Eager calls go straight to the ctypes path (_launch): a torch custom op costs
dispatcher time on every call and buys nothing there; a CUDA graph captures
the launch on the current stream either way. Under torch.compile (and any
tracing with fake or functional tensors) the calls go through the custom ops
`torch.ops.kdajit.fused_kda_decode` / `packed_fused_kda_decode`, which mutate
conv_state, state and output and have fake implementations, so the graph
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

    # Calls go through the op overload packets (what torch.compile traces best).
    _fused_op = torch.ops.kdajit.fused_kda_decode
    _packed_op = torch.ops.kdajit.packed_fused_kda_decode
else:
    _fused_op = _packed_op = None


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


def _bound(op, args, kwargs):
    import inspect

    name = getattr(op, "__name__", op)
    if name not in ("fused_kda_decode", "packed_fused_kda_decode"):
        raise ValueError(f"op: expected fused_kda_decode or packed_fused_kda_decode, got {op!r}")
    fn = fused_kda_decode if name == "fused_kda_decode" else packed_fused_kda_decode
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    a = dict(bound.arguments)
    impl = _launch.single_impl if name == "fused_kda_decode" else _launch.packed_impl
    if a["output"] is None:
        a["output"] = _launch.new_output(a["x"], a["A_log"], lambda stand_in: impl(**{**a, "output": stand_in},
                                                                                    dry=True))
    return impl, a


def dry_run(op, *args, **kwargs):
    """What a call of `op` (fused_kda_decode / packed_fused_kda_decode, or its name)
    with these arguments would pass to the C library: the kdajit_decode_args_t
    bytes, after the same mapping and kdajit_validate_args, without launching.
    Tensors may live on the CPU (their addresses are only checked, never read)."""
    impl, a = _bound(op, args, kwargs)
    return impl(**a, dry=True)


def selected_key(op, *args, **kwargs):
    """The kernel key name a call of `op` with these arguments would launch on the
    current stream (validation and route selection; nothing compiled or launched):
    what to pre-warm for exactly this call."""
    impl, a = _bound(op, args, kwargs)
    return impl(**a, dry="key")
