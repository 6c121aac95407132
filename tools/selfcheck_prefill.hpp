// `kdajit selfcheck` for the chunked ops' keys: a few sequences of random
// lengths on fresh random data (docs/CONTRACT.md §8), run on the device through
// the runtime and checked against the f64 reference (ref::prefill, §10's
// tolerances; ref::chunk, §11's).
#pragma once

#include <cstdint>
#include <string>

#include "kdajit/error.hpp"
#include "kdajit/kernel_key.hpp"
#include "kdajit/runtime/api/runtime_impl.hpp"

namespace kdajit::cli {

struct PrefillCheck {
  bool pass = false;
  double output_rel_l2 = 0, state_rel_l2 = 0;
  std::string message;  // the first failure; "" when pass
};

// The sequence lengths of one check: 0, one under a chunk, one over, and a
// random one; the first sequence starts from zero state (has_initial_state 0).
std::vector<int> prefill_check_lengths(uint64_t seed);

// Runs `key` (its route forced by `rt`) on a prefill problem drawn from `seed`.
Result<PrefillCheck> check_prefill(Runtime::Impl& rt, const KernelKey& key, uint64_t seed);
// The same for a chunk key: the same lengths, FLA's state layout, both states
// given (ref::ChunkProblem).
Result<PrefillCheck> check_chunk(Runtime::Impl& rt, const KernelKey& key, uint64_t seed);

}  // namespace kdajit::cli
