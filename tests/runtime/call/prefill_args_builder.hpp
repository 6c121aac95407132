// Builds well-formed prefill arguments (docs/CONTRACT.md §10) for a
// configuration, for the validation and C ABI tests, placed like
// decode_args_builder.hpp's (addresses that are never dereferenced, or a host arena).
#pragma once

#include "decode_args_builder.hpp"

namespace kdajit::test {

struct PrefillConfig {
  int heads = 2;  // H
  StateDtype state = StateDtype::f32;
  ConvLayout conv = ConvLayout::sd;
  Gate gate = Gate::bounded;
  int64_t total = 200;  // T_total
  int64_t seqs = 3;     // N
  int64_t slots = 5;    // S
  int64_t taps = 3;     // K of conv_state
  bool has_initial_state = true;  // false: the empty view (ndim 0)
  int64_t row_pad = 8;
  int64_t conv_pad = 4;
  int64_t state_pad = 8;
};

inline kdajit_prefill_args_t build_prefill_args(const PrefillConfig& c, uintptr_t base, size_t* bytes_used = nullptr) {
  constexpr int64_t D = kHeadDim;
  const int64_t H = c.heads, R = c.total, S = c.slots, N = c.seqs, K = c.taps;
  const int64_t hidden = H * D, qkv = 3 * hidden;
  const kdajit_dtype_t bf16 = KDAJIT_DTYPE_BF16, f32 = KDAJIT_DTYPE_F32, i32 = KDAJIT_DTYPE_INT32;
  const kdajit_dtype_t st = c.state == StateDtype::f32 ? f32 : bf16;

  Placer p(base);
  kdajit_prefill_args_t a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.x = place(p, bf16, {R, qkv}, {qkv + c.row_pad, 1});
  a.conv_weight = place(p, f32, {3, 4, hidden}, {4 * hidden, hidden, 1});
  const int64_t conv_slot = qkv * K + c.conv_pad;
  a.conv_state = c.conv == ConvLayout::sd ? place(p, bf16, {S, qkv, K}, {conv_slot, 1, qkv})
                                          : place(p, bf16, {S, qkv, K}, {conv_slot, K, 1});
  a.raw_gate = place(p, bf16, {R, H, D}, {hidden + c.row_pad, D, 1});
  a.raw_beta = place(p, bf16, {R, H}, {H + c.row_pad, 1});
  a.A_log = place(p, f32, {H}, {1});
  a.dt_bias = place(p, f32, {hidden}, {1});
  a.state_indices = place(p, i32, {N}, {1});
  if (c.has_initial_state) a.has_initial_state = place(p, i32, {N}, {1});
  a.state = place(p, st, {S, H, D, D}, {H * D * D + c.state_pad, D * D, D, 1});
  a.output_gate = place(p, bf16, {R, H, D}, {hidden + c.row_pad, D, 1});
  a.norm_weight = place(p, f32, {D}, {1});
  a.output = place(p, bf16, {R, H, D}, {hidden + c.row_pad, D, 1});
  a.query_start_loc = place(p, i32, {N + 1}, {1});
  a.gate = c.gate == Gate::bounded ? KDAJIT_GATE_BOUNDED : KDAJIT_GATE_SOFTPLUS;
  a.lower_bound = -5.0f;
  a.norm_eps = 1e-6f;
  a.max_seq_len = 0;
  a.oob_counter = nullptr;
  if (bytes_used) *bytes_used = p.used();
  return a;
}

}  // namespace kdajit::test
