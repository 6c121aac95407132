#include "kdajit/runtime/device/registry.hpp"

#include <chrono>

#include <fmt/format.h>

#include "kdajit/cache.hpp"
#include "kdajit/log.hpp"
#include "kdajit/runtime/jit/obtain.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/runtime/device/driver_api.hpp"

namespace kdajit {

KernelRegistry::KernelRegistry(std::shared_ptr<KernelCache> cache) : cache_(std::move(cache)) {}

// Modules stay loaded for the life of their context: unloading at exit could
// race with the driver's own teardown.
KernelRegistry::~KernelRegistry() = default;

std::optional<LoadedKernel> KernelRegistry::find(CUcontext ctx, const KernelKey& key) const {
  std::shared_lock lock(mu_);
  auto it = contexts_.find(ctx);
  if (it == contexts_.end()) return std::nullopt;
  auto k = it->second.find(key);
  if (k == it->second.end()) return std::nullopt;
  return k->second;
}

size_t KernelRegistry::kernels_in(CUcontext ctx) const {
  std::shared_lock lock(mu_);
  auto it = contexts_.find(ctx);
  return it == contexts_.end() ? 0 : it->second.size();
}

size_t KernelRegistry::module_loads() const {
  std::shared_lock lock(mu_);
  size_t n = 0;
  for (const auto& [ctx, kernels] : contexts_) n += kernels.size();
  return n;
}

Result<LoadedKernel> KernelRegistry::load(CUcontext ctx, const KernelKey& key, bool allow_build) {
  std::lock_guard load_lock(load_mu_);
  if (auto k = find(ctx, key)) return *k;  // loaded meanwhile
  const auto t0 = std::chrono::steady_clock::now();
  KDAJIT_TRY_ASSIGN(CacheLookup found, obtain(*cache_, key, allow_build));
  if (compiled_now(found)) {
    // NVRTC ran in front of a launch: said once per key (the kernel stays
    // loaded), at warning level, so that a missing pre-warm is visible.
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    serving_compiles_.fetch_add(1, std::memory_order_relaxed);
    serving_compile_us_.fetch_add(static_cast<uint64_t>(ms * 1000), std::memory_order_relaxed);
    log_warning("compiled {} at serving time in {:.0f} ms: it was not in the cache; pre-warm it (`kdajit prewarm`, "
                "Runtime::prewarm_async) to keep NVRTC out of the request path",
                key_name(key), ms);
  } else if (found.source == CacheSource::disk) {
    disk_loads_.fetch_add(1, std::memory_order_relaxed);
  } else {
    // From memory: the key's entry, or (built) one made from the cubin of a
    // program this process holds for another key.
    memory_loads_.fetch_add(1, std::memory_order_relaxed);
  }
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  CUmodule mod = nullptr;
  KDAJIT_TRY(cu_check(*api, api->cuModuleLoadData(&mod, found.entry->cubin.data()),
                      fmt::format("cuModuleLoadData({})", key_name(key))));
  LoadedKernel k;
  const RouteSpec& route = route_spec(key.route);
  // The key's kernel, and the ones its route launches first and last (route twopass).
  const bool has_pre = route.pre_grid != nullptr && chunked(key.op);
  const bool has_post = route.post_grid != nullptr && !post_entry_name(key.op).empty();
  for (CUfunction* f : {&k.function, &k.pre_function, &k.post_function}) {
    if ((f == &k.pre_function && !has_pre) || (f == &k.post_function && !has_post)) continue;
    const std::string entry(f == &k.function       ? entry_name(key.op)
                            : f == &k.pre_function ? pre_entry_name(key.op)
                                                   : post_entry_name(key.op));
    if (Status s = cu_check(*api, api->cuModuleGetFunction(f, mod, entry.c_str()),
                            fmt::format("cuModuleGetFunction({}, {})", key_name(key), entry));
        !s) {
      api->cuModuleUnload(mod);
      return std::move(s).error();
    }
    // Routes with shared-memory stages, and every prefill key (the chunk's
    // buffers, kPrefillSmemBytes; route twopass's intra-chunk kernel
    // kTwopassIntraSmemBytes), opt in to their dynamic shared memory (above
    // 48 KiB a launch fails without it).
    const uint32_t smem =
        f == &k.pre_function ? route.pre_dynamic_smem_bytes(key) : f == &k.function ? route.dynamic_smem_bytes(key) : 0;
    if (smem > 0) {
      if (Status s = cu_check(*api,
                              api->cuFuncSetAttribute(*f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                      static_cast<int>(smem)),
                              fmt::format("cuFuncSetAttribute({}, {}, max dynamic shared memory {} bytes)",
                                          key_name(key), entry, smem));
          !s) {
        api->cuModuleUnload(mod);
        return std::move(s).error();
      }
    }
  }
  std::unique_lock lock(mu_);
  contexts_[ctx].emplace(key, k);
  return k;
}

RegistryStats KernelRegistry::stats() const {
  RegistryStats s;
  s.serving_compiles = serving_compiles_.load(std::memory_order_relaxed);
  s.serving_compile_ms = static_cast<double>(serving_compile_us_.load(std::memory_order_relaxed)) / 1000;
  s.disk_loads = disk_loads_.load(std::memory_order_relaxed);
  s.memory_loads = memory_loads_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace kdajit
