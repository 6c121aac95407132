// Loaded kernels per CUDA context: (context, key) -> CUfunction. find() is the
// launch path's lookup under a shared lock; a miss goes to load(): the build
// step (memory, disk, compile) and cuModuleLoadData, once per key and context.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>

#include "kdajit/error.hpp"
#include "kdajit/kernel_key.hpp"

namespace kdajit {

class KernelCache;

struct LoadedKernel {
  CUfunction function = nullptr;
  // The kernel the route launches first (route twopass: pre_entry_name), or null.
  CUfunction pre_function = nullptr;
  // The kernel the route launches last (route twopass, prefill op: post_entry_name), or null.
  CUfunction post_function = nullptr;
};

// What load() found, since the registry was made.
struct RegistryStats {
  uint64_t serving_compiles = 0;       // cache misses a call compiled (NVRTC in front of a launch)
  double serving_compile_ms = 0;       // their total wall time
  uint64_t disk_loads = 0;             // kernels loaded from a disk layer
  // Kernels already in the process's cache (another context, a prewarm, the
  // same program held for another key).
  uint64_t memory_loads = 0;
};

class KernelRegistry {
 public:
  explicit KernelRegistry(std::shared_ptr<KernelCache> cache);
  ~KernelRegistry();

  // The kernel of `key` when it is loaded in `ctx` already.
  std::optional<LoadedKernel> find(CUcontext ctx, const KernelKey& key) const;

  // Loads (building if allow_build) and remembers the kernel for `ctx`; the
  // caller makes `ctx` current. allow_build = false turns a cache miss into a
  // "pre-warm KEY" error (used while a stream is capturing).
  Result<LoadedKernel> load(CUcontext ctx, const KernelKey& key, bool allow_build);

  KernelCache& cache() { return *cache_; }

  RegistryStats stats() const;
  // Kernels loaded by this registry, over every context: one module load per
  // (context, key), however many threads and devices call.
  size_t module_loads() const;
  // The kernels loaded in `ctx`.
  size_t kernels_in(CUcontext ctx) const;

 private:
  using Kernels = std::unordered_map<KernelKey, LoadedKernel, KernelKeyHash>;
  std::shared_ptr<KernelCache> cache_;
  mutable std::shared_mutex mu_;
  std::unordered_map<CUcontext, Kernels> contexts_;  // contexts are never removed
  std::mutex load_mu_;  // serialises module loads (rare) so each key loads once per context
  std::atomic<uint64_t> serving_compiles_{0}, serving_compile_us_{0}, disk_loads_{0}, memory_loads_{0};
};

}  // namespace kdajit
