// Host-side validation of a decode call (spec section 6), before any launch.
#pragma once

#include "kda_params.h"
#include "kdajit/error.hpp"
#include "kdajit/kdajit.h"
#include "kdajit/kernel_key.hpp"

namespace kdajit {

// What validation derives from the arguments: the key fields (minus route and
// arch, which the selector adds), the sizes, and the kernel parameter block.
struct ValidatedCall {
  Op op = Op::single;
  int heads = 0;                 // H, from A_log.shape[0]
  int tokens = 1;                // T: 1 for single, state_indices.shape[1] for packed
  StateDtype state = StateDtype::f32;
  ConvLayout conv = ConvLayout::sd;  // from conv_state's strides
  Gate gate = Gate::bounded;
  kdajit_indices_mode_t mode = KDAJIT_INDICES_UNIQUE_OR_NULL;
  int64_t rows = 0;              // R
  int64_t num_seqs = 0;          // N (packed; 0 for single)
  int64_t num_slots = 0;         // S
  KdaParams params{};            // every pointer and stride filled
};

// Every rule of spec section 6. Reads no device memory and writes nothing.
// Errors name the argument, the expected and the given value, e.g.
// "conv_state: expected dtype bf16, got f32".
Result<ValidatedCall> validate_decode(Op op, const kdajit_decode_args_t& args);

// The static support query: accepted iff a valid call with this configuration
// would be served (validate_decode + a route + an arch this build targets).
Status query_support(const kdajit_config_t& config);

// The kernel key a validated call runs with on `arch` (route chosen by the selector).
KernelKey key_for_call(const ValidatedCall& call, Arch arch);

// Whether this build can compile for `arch`: the linked NVRTC lists its compute
// capability. Error{unsupported} naming the arch and NVRTC's list otherwise.
Status check_arch_target(Arch arch);

}  // namespace kdajit
