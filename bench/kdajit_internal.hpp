// The only place the bench uses kdajit's internal (non-public) names, from the
// static kdajit_runtime_core library: compiling kernels into the disk cache ahead
// of the run (in parallel, so no compile is serialised inside the timed loop) and
// the key the selector picks, for a kdajit without Runtime::prewarm and
// Runtime::selected_key (kdajit_api.hpp prefers those). The internals are used
// only where their old headers exist; elsewhere these functions say "unsupported".
#pragma once

#include <string>
#include <vector>

#include "kdajit/kdajit.hpp"

namespace kdajit::bench {

struct PrewarmResult {
  size_t keys = 0, failed = 0;
  double seconds = 0;
  std::vector<std::string> errors;  // "key: message"
};

// Builds (or finds) every key in the kernel cache at cache_dir ("" = kdajit's
// default), `jobs` compiles at a time. Never fails as a whole: a key that does
// not build is listed and its first decode call will report the error.
PrewarmResult prewarm_keys(const std::string& cache_dir, const std::vector<std::string>& key_names, int jobs,
                           bool verbose);

// An Outcome from a code and a message, whatever other fields Outcome has.
inline Outcome make_outcome(kdajit_status_t code, std::string message) {
  Outcome o;
  o.code = code;
  o.message = std::move(message);
  return o;
}

// validate + route selection for `device`'s arch, as the runtime's launch path does it.
Outcome internal_selected_key(kdajit_op_t op, const DecodeArgs& args, int device, std::string* key);

}  // namespace kdajit::bench
