// Host-side validation of a decode call (docs/CONTRACT.md §6), before any launch.
#pragma once

#include "kda_params.h"
#include "kdajit/error.hpp"
#include "kdajit/kdajit.h"
#include "kdajit/routes.hpp"

namespace kdajit {

// Everything a launch needs, derived once from the arguments: the call's shape
// (the key's family, the mode, the sizes: the selector's input and the grid's)
// and the kernel parameter block with every pointer and stride filled.
struct ValidatedCall {
  CallShape shape;
  KdaParams params{};  // params.num_slots is S
};

// Every rule of docs/CONTRACT.md §6. Reads no device memory and writes nothing.
// Errors name the argument, the expected and the given value, e.g.
// "conv_state: expected dtype bf16, got f32". Enum fields are read through their
// integer value, so a C caller's out-of-range value is an error, not undefined.
Result<ValidatedCall> validate_decode(Op op, const kdajit_decode_args_t& args);

// Every rule of docs/CONTRACT.md §10 (the prefill op), the same way: the
// decode rules with R = T_total rows, plus state_indices [N], query_start_loc
// [N+1], has_initial_state (empty or [N]), conv_state's K in 3..18 and
// max_seq_len >= 0. The shape's max_seq_len is the hint clamped to T_total (0: T_total).
Result<ValidatedCall> validate_prefill(const kdajit_prefill_args_t& args);

// Every rule of docs/CONTRACT.md §11 (the chunk op), the same way: q, k, v, g,
// output [T_total, H, 128], beta [T_total, H], A_log, dt_bias (or empty),
// initial and final states [N, H, 128, 128] (or empty) of one dtype and
// layout, cu_seqlens [N+1], gate and lower_bound, scale > 0, the three flags
// 0 or 1 and max_seq_len >= 0.
Result<ValidatedCall> validate_chunk(const kdajit_chunk_args_t& args);

// The integer value of a C enum field, read without assuming it is in range.
template <class E>
int32_t enum_value(const E& e) {
  static_assert(sizeof(E) == sizeof(int32_t), "C enums of the ABI are 32-bit");
  int32_t v;
  __builtin_memcpy(&v, &e, sizeof v);
  return v;
}

}  // namespace kdajit
