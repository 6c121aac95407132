// Loaded kernels per CUDA context: (context, key) -> CUfunction. The lookup is
// the launch hot path (a shared lock and two hash probes); a miss goes to the
// kernel cache (memory, disk, then compile) and loads the module.
#pragma once

#include <cuda.h>

#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "kdajit/error.hpp"
#include "kdajit/kernel_key.hpp"

namespace kdajit {

class KernelCache;

struct LoadedKernel {
  CUfunction function = nullptr;
  int threads = 0;
  int cluster = 1;  // RouteConfig::cluster
};

class KernelRegistry {
 public:
  KernelRegistry(std::shared_ptr<KernelCache> cache, std::optional<Arch> arch_override);
  ~KernelRegistry();

  // The arch kernels are built for in `ctx` (the override, else the device's).
  Result<Arch> arch_for(CUcontext ctx);

  // The loaded kernel, or nullopt when it is not loaded in `ctx` yet.
  std::optional<LoadedKernel> find(CUcontext ctx, const KernelKey& key) const;

  // Loads (building if allow_build) and remembers the kernel for `ctx`; the
  // caller makes `ctx` current. allow_build = false turns a cache miss into a
  // "pre-warm KEY" error (used while a stream is capturing).
  Result<LoadedKernel> load(CUcontext ctx, const KernelKey& key, bool allow_build);

 private:
  struct PerContext {
    std::optional<Arch> arch;
    std::unordered_map<KernelKey, LoadedKernel, KernelKeyHash> kernels;
  };
  std::shared_ptr<KernelCache> cache_;
  std::optional<Arch> arch_override_;
  mutable std::shared_mutex mu_;
  std::unordered_map<CUcontext, PerContext> contexts_;
  std::mutex load_mu_;  // serialises module loads (rare) so each key loads once per context
};

// The cubin of `key` through the process's kernel cache (memory, disk, compile).
// Shared by the runtime and the CLI; logs one line per compile.
struct CubinRef {
  std::shared_ptr<const std::string> cubin;
  std::string entry;  // kernel function name
};
// allow_build = false: a miss is Error{capture} "pre-warm KEY".
Result<CubinRef> obtain_cubin(KernelCache* cache, const KernelKey& key, bool allow_build);

// The process's kernel cache at `root` (empty: the environment's default).
Result<std::shared_ptr<KernelCache>> open_kernel_cache(const std::string& root);

}  // namespace kdajit
