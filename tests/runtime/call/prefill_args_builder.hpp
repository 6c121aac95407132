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
  const int64_t N = c.seqs;
  const kdajit_dtype_t i32 = KDAJIT_DTYPE_INT32;
  Placer p(base);
  kdajit_prefill_args_t a =
      place_shared_args<kdajit_prefill_args_t>(c, p, c.total, c.taps, [&](kdajit_prefill_args_t& args) {
        args.state_indices = place(p, i32, {N}, {1});
        if (c.has_initial_state) args.has_initial_state = place(p, i32, {N}, {1});
      });
  a.query_start_loc = place(p, i32, {N + 1}, {1});
  a.max_seq_len = 0;
  if (bytes_used) *bytes_used = p.used();
  return a;
}

using HostPrefill = HostPlacedCall<PrefillConfig, kdajit_prefill_args_t, build_prefill_args>;

}  // namespace kdajit::test
