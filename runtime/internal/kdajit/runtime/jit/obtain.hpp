// The build step's one entry point: the cubin of a key through a kernel cache
// (memory, then disk, then generate + NVRTC + publish). The runtime, the CLI
// (prewarm, verify, explain) and the benchmarks all go through here.
#pragma once

#include <memory>
#include <string>

#include "kdajit/cache.hpp"
#include "kdajit/runtime/jit/compile.hpp"

namespace kdajit {

// What obtain() looks up for a key: every build input and their hash.
struct BuildPlan {
  BuildInputs inputs;
  std::string hash;  // current_build_hash() of the inputs
};
Result<BuildPlan> plan_build(const KernelKey& key);

// The key's entry and where it came from. allow_build = false turns a miss into
// Error{capture} "pre-warm KEY" (used while a stream is capturing). A process
// that already holds the entry gets it without generating the source. A build
// whose hash this process already holds (another key's entry: the same
// program) or is compiling makes the entry from that cubin, no second compile.
Result<CacheLookup> obtain(KernelCache& cache, const KernelKey& key, bool allow_build);

// Whether that obtain() ran NVRTC: built, and not from the cubin of another key
// with the same build inputs (the same program, e.g. another prefill head count).
bool compiled_now(const CacheLookup& found);

// The process's kernel cache at `root` (empty: the environment's default).
Result<std::shared_ptr<KernelCache>> open_kernel_cache(const std::string& root);

}  // namespace kdajit
