#include "kdajit/runtime/device/registry.hpp"

#include <chrono>

#include <fmt/format.h>

#include "kdajit/cache.hpp"
#include "kdajit/log.hpp"
#include "kdajit/runtime/jit/obtain.hpp"
#include "kdajit/runtime/tune/tune.hpp"
#include "kdajit/runtime/device/driver_api.hpp"

namespace kdajit {

KernelRegistry::KernelRegistry(std::shared_ptr<KernelCache> cache, RegistryOptions options)
    : cache_(std::move(cache)), options_(options) {}

// Modules stay loaded for the life of their context: unloading at exit could
// race with the driver's own teardown.
KernelRegistry::~KernelRegistry() = default;

Result<KernelRegistry::PerContext*> KernelRegistry::add_context(CUcontext ctx) {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  CUdevice dev = 0;
  KDAJIT_TRY(cu_check(*api, api->cuCtxPushCurrent(ctx), "cuCtxPushCurrent"));
  const CUresult r = api->cuCtxGetDevice(&dev);
  CUcontext popped = nullptr;
  api->cuCtxPopCurrent(&popped);
  KDAJIT_TRY(cu_check(*api, r, "cuCtxGetDevice"));
  auto pc = std::make_unique<PerContext>();
  KDAJIT_TRY_ASSIGN(pc->device, device_traits(*api, dev, options_.arch));
  // Only a table that is there costs loading NVRTC (its version is part of the
  // identity the table is checked against); a cache hit needs no NVRTC otherwise.
  if (options_.use_tuning && !options_.forced_route &&
      TuneTable::present(cache_->root(), tune_identity(*api, dev, pc->device.arch, /*with_nvrtc=*/false))) {
    auto t = TuneTable::load(cache_->root(), tune_identity(*api, dev, pc->device.arch));
    if (!t) log_warning("{}; using the built-in route bands", t.error().message);
    else if (*t) pc->tuned = std::move(**t);
  }
  std::unique_lock lock(mu_);
  auto [it, inserted] = contexts_.emplace(ctx, std::move(pc));
  return it->second.get();
}

Result<Resolved> KernelRegistry::resolve(CUcontext ctx, const CallShape& call) {
  {
    std::shared_lock lock(mu_);
    auto it = contexts_.find(ctx);
    if (it != contexts_.end()) {
      const PerContext& pc = *it->second;
      RoutePolicy policy{options_.forced_route, pc.tuned ? &*pc.tuned : nullptr};
      KDAJIT_TRY_ASSIGN(Route route, select_route(call, pc.device, policy));
      Resolved out{key_for(call, route, pc.device.arch), std::nullopt, pc.device};
      if (auto k = pc.kernels.find(out.key); k != pc.kernels.end()) out.kernel = k->second;
      return out;
    }
  }
  KDAJIT_TRY(add_context(ctx));  // once per context, then the hot path above
  return resolve(ctx, call);
}

Result<LoadedKernel> KernelRegistry::load(CUcontext ctx, const KernelKey& key, bool allow_build) {
  std::lock_guard load_lock(load_mu_);
  PerContext* pc = nullptr;
  {
    std::shared_lock lock(mu_);
    auto it = contexts_.find(ctx);
    if (it == contexts_.end()) return Error(ErrorCode::internal, "registry: load() before resolve() for this context");
    pc = it->second.get();
    if (auto k = pc->kernels.find(key); k != pc->kernels.end()) return k->second;  // loaded meanwhile
  }
  const auto t0 = std::chrono::steady_clock::now();
  KDAJIT_TRY_ASSIGN(CacheLookup found, obtain(*cache_, key, allow_build));
  if (found.source == CacheSource::built) {
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
    memory_loads_.fetch_add(1, std::memory_order_relaxed);
  }
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  CUmodule mod = nullptr;
  KDAJIT_TRY(cu_check(*api, api->cuModuleLoadData(&mod, found.entry->cubin.data()),
                      fmt::format("cuModuleLoadData({})", key_name(key))));
  LoadedKernel k;
  const std::string entry(entry_name(key.op));
  if (Status s = cu_check(*api, api->cuModuleGetFunction(&k.function, mod, entry.c_str()),
                          fmt::format("cuModuleGetFunction({}, {})", key_name(key), entry));
      !s) {
    api->cuModuleUnload(mod);
    return std::move(s).error();
  }
  // Routes with shared-memory stages opt in to their dynamic shared memory
  // (above 48 KiB a launch fails without it).
  if (const uint32_t smem = route_spec(key.route).dynamic_smem_bytes(key); smem > 0) {
    if (Status s = cu_check(*api,
                            api->cuFuncSetAttribute(k.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                    static_cast<int>(smem)),
                            fmt::format("cuFuncSetAttribute({}, max dynamic shared memory {} bytes)", key_name(key), smem));
        !s) {
      api->cuModuleUnload(mod);
      return std::move(s).error();
    }
  }
  std::unique_lock lock(mu_);
  pc->kernels.emplace(key, k);
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
