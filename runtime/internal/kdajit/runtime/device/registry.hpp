// Loaded kernels per CUDA context. The launch hot path is resolve(): under one
// shared lock it finds the context's device traits, lets the selector pick the
// route, and finds the loaded kernel of the resulting key. A miss goes to
// load(): the build step (memory, disk, compile) and cuModuleLoadData.
#pragma once

#include <cuda.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "kdajit/error.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/runtime/call/select.hpp"
#include "kdajit/runtime/tune/tune_table.hpp"

namespace kdajit {

class KernelCache;

struct LoadedKernel {
  CUfunction function = nullptr;
};

// What resolve() found: the key selection chose, and the kernel when it is
// loaded in the context already.
struct Resolved {
  KernelKey key;
  std::optional<LoadedKernel> kernel;
  DeviceTraits device;  // the context's device (the launch grid of some routes depends on its SM count)
};

struct RegistryOptions {
  std::optional<Arch> arch;            // RuntimeOptions::arch, else KDAJIT_ARCH; else the device's
  std::optional<Route> forced_route;   // RuntimeOptions::route
  bool use_tuning = true;              // read a `kdajit tune` table for each device
};

// What load() found, since the registry was made.
struct RegistryStats {
  uint64_t serving_compiles = 0;       // cache misses a call compiled (NVRTC in front of a launch)
  double serving_compile_ms = 0;       // their total wall time
  uint64_t disk_loads = 0;             // kernels loaded from a disk layer
  uint64_t memory_loads = 0;           // kernels already in the process's cache (another context, a prewarm)
};

class KernelRegistry {
 public:
  KernelRegistry(std::shared_ptr<KernelCache> cache, RegistryOptions options);
  ~KernelRegistry();

  // Selection and lookup for a call in `ctx`. The first call in a context reads
  // its device (arch, SM count, tune table) once.
  Result<Resolved> resolve(CUcontext ctx, const CallShape& call);

  // Loads (building if allow_build) and remembers the kernel for `ctx`; the
  // caller makes `ctx` current. allow_build = false turns a cache miss into a
  // "pre-warm KEY" error (used while a stream is capturing).
  Result<LoadedKernel> load(CUcontext ctx, const KernelKey& key, bool allow_build);

  KernelCache& cache() { return *cache_; }

  RegistryStats stats() const;

 private:
  struct PerContext {
    DeviceTraits device;
    std::optional<TuneTable> tuned;
    std::unordered_map<KernelKey, LoadedKernel, KernelKeyHash> kernels;
  };
  Result<PerContext*> add_context(CUcontext ctx);

  std::shared_ptr<KernelCache> cache_;
  RegistryOptions options_;
  mutable std::shared_mutex mu_;
  // Node-based: a PerContext never moves once inserted, and contexts are never removed.
  std::unordered_map<CUcontext, std::unique_ptr<PerContext>> contexts_;
  std::mutex load_mu_;  // serialises module loads (rare) so each key loads once per context
  std::atomic<uint64_t> serving_compiles_{0}, serving_compile_us_{0}, disk_loads_{0}, memory_loads_{0};
};

}  // namespace kdajit
