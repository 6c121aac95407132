#include "kdajit/runtime/kernels.hpp"

#include <mutex>

#include <fmt/format.h>

#include "kdajit/generator.hpp"
#include "kdajit/log.hpp"
#include "kdajit/runtime/compiler.hpp"
#include "kdajit/runtime/driver_api.hpp"

namespace kdajit {

KernelRegistry::KernelRegistry(std::shared_ptr<KernelCache> cache, std::optional<Arch> arch_override)
    : cache_(std::move(cache)), arch_override_(arch_override) {}

// Modules stay loaded for the life of their context: unloading at exit could
// race with the driver's own teardown.
KernelRegistry::~KernelRegistry() = default;

Result<Arch> KernelRegistry::arch_for(CUcontext ctx) {
  {
    std::shared_lock lock(mu_);
    auto it = contexts_.find(ctx);
    if (it != contexts_.end() && it->second.arch) return *it->second.arch;
  }
  Arch arch{};
  if (arch_override_) {
    arch = *arch_override_;
  } else {
    KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
    CUdevice dev = 0;
    api->cuCtxPushCurrent(ctx);
    CUresult r = api->cuCtxGetDevice(&dev);
    CUcontext popped = nullptr;
    api->cuCtxPopCurrent(&popped);
    if (r != CUDA_SUCCESS) return cuda_error(*api, r, "cuCtxGetDevice");
    int major = 0, minor = 0;
    api->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    api->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    KDAJIT_TRY_ASSIGN(arch, arch_for_compute_capability(major, minor));
  }
  std::unique_lock lock(mu_);
  contexts_[ctx].arch = arch;
  return arch;
}

std::optional<LoadedKernel> KernelRegistry::find(CUcontext ctx, const KernelKey& key) const {
  std::shared_lock lock(mu_);
  auto it = contexts_.find(ctx);
  if (it == contexts_.end()) return std::nullopt;
  auto k = it->second.kernels.find(key);
  if (k == it->second.kernels.end()) return std::nullopt;
  return k->second;
}

Result<LoadedKernel> KernelRegistry::load(CUcontext ctx, const KernelKey& key, bool allow_build) {
  std::lock_guard load_lock(load_mu_);
  if (auto hit = find(ctx, key)) return *hit;  // another thread loaded it meanwhile
  KDAJIT_TRY_ASSIGN(CubinRef ref, obtain_cubin(cache_.get(), key, allow_build));
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  CUmodule mod = nullptr;
  if (CUresult r = api->cuModuleLoadData(&mod, ref.cubin->data()); r != CUDA_SUCCESS)
    return cuda_error(*api, r, fmt::format("cuModuleLoadData({})", key_name(key)));
  LoadedKernel k;
  if (CUresult r = api->cuModuleGetFunction(&k.function, mod, ref.entry.c_str()); r != CUDA_SUCCESS) {
    api->cuModuleUnload(mod);
    return cuda_error(*api, r, fmt::format("cuModuleGetFunction({}, {})", key_name(key), ref.entry));
  }
  const RouteConfig rc = route_config(key);
  k.threads = rc.threads;
  k.cluster = rc.cluster;
  std::unique_lock lock(mu_);
  contexts_[ctx].kernels.emplace(key, k);
  return k;
}

}  // namespace kdajit
