#include "kdajit/runtime/device/driver_api.hpp"

#include <dlfcn.h>

#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kdajit/dl_symbol.hpp"

namespace kdajit {

namespace {

struct Loaded {
  DriverApi api{};
  std::optional<Error> error;
};

Loaded load() {
  Loaded out;
  // Never dlclose: the driver stays for the life of the process.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    out.error = Error(ErrorCode::cuda, "CUDA driver: libcuda.so.1 could not be loaded (no NVIDIA driver on this machine?)");
    return out;
  }
  DriverApi& a = out.api;
  // Versioned names: the ones cuda.h maps the plain names to for this toolkit.
  const bool ok = bind_symbol(lib, a.cuInit, "cuInit") && bind_symbol(lib, a.cuGetErrorName, "cuGetErrorName") &&
                  bind_symbol(lib, a.cuGetErrorString, "cuGetErrorString") &&
                  bind_symbol(lib, a.cuDeviceGetCount, "cuDeviceGetCount") && bind_symbol(lib, a.cuDeviceGet, "cuDeviceGet") &&
                  bind_symbol(lib, a.cuDeviceGetAttribute, "cuDeviceGetAttribute") &&
                  bind_symbol(lib, a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
                  bind_symbol(lib, a.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2") &&
                  bind_symbol(lib, a.cuCtxGetCurrent, "cuCtxGetCurrent") && bind_symbol(lib, a.cuCtxSetCurrent, "cuCtxSetCurrent") &&
                  bind_symbol(lib, a.cuCtxPushCurrent, "cuCtxPushCurrent_v2") &&
                  bind_symbol(lib, a.cuCtxPopCurrent, "cuCtxPopCurrent_v2") && bind_symbol(lib, a.cuCtxGetDevice, "cuCtxGetDevice") &&
                  bind_symbol(lib, a.cuModuleLoadData, "cuModuleLoadData") && bind_symbol(lib, a.cuModuleUnload, "cuModuleUnload") &&
                  bind_symbol(lib, a.cuModuleGetFunction, "cuModuleGetFunction") &&
                  bind_symbol(lib, a.cuFuncSetAttribute, "cuFuncSetAttribute") &&
                  bind_symbol(lib, a.cuFuncGetAttribute, "cuFuncGetAttribute") &&
                  bind_symbol(lib, a.cuOccupancyMaxActiveBlocksPerMultiprocessor,
                              "cuOccupancyMaxActiveBlocksPerMultiprocessor") &&
                  bind_symbol(lib, a.cuDeviceGetName, "cuDeviceGetName") &&
                  bind_symbol(lib, a.cuDriverGetVersion, "cuDriverGetVersion") &&
                  bind_symbol(lib, a.cuLaunchKernelEx, "cuLaunchKernelEx") &&
                  bind_symbol(lib, a.cuStreamIsCapturing, "cuStreamIsCapturing") &&
                  bind_symbol(lib, a.cuStreamGetCtx, "cuStreamGetCtx") && bind_symbol(lib, a.cuMemAlloc, "cuMemAlloc_v2") &&
                  bind_symbol(lib, a.cuMemFree, "cuMemFree_v2") && bind_symbol(lib, a.cuMemcpyHtoD, "cuMemcpyHtoD_v2") &&
                  bind_symbol(lib, a.cuMemcpyDtoH, "cuMemcpyDtoH_v2") && bind_symbol(lib, a.cuCtxSynchronize, "cuCtxSynchronize");
  // Optional entry points (timing tools); a missing one stays null.
  bind_symbol(lib, a.cuStreamCreate, "cuStreamCreate");
  bind_symbol(lib, a.cuStreamDestroy, "cuStreamDestroy_v2");
  bind_symbol(lib, a.cuStreamSynchronize, "cuStreamSynchronize");
  bind_symbol(lib, a.cuEventCreate, "cuEventCreate");
  bind_symbol(lib, a.cuEventDestroy, "cuEventDestroy_v2");
  bind_symbol(lib, a.cuEventRecord, "cuEventRecord");
  bind_symbol(lib, a.cuEventSynchronize, "cuEventSynchronize");
  if (!bind_symbol(lib, a.cuEventElapsedTime, "cuEventElapsedTime_v2")) bind_symbol(lib, a.cuEventElapsedTime, "cuEventElapsedTime");
  bind_symbol(lib, a.cuMemsetD32, "cuMemsetD32_v2");
  bind_symbol(lib, a.cuMemsetD32Async, "cuMemsetD32Async");
  bind_symbol(lib, a.cuGraphKernelNodeGetParams, "cuGraphKernelNodeGetParams_v2");
  if (!ok) {
    out.error = Error(ErrorCode::cuda, "CUDA driver: libcuda.so.1 lacks a required entry point (driver older than CUDA 12?)");
    return out;
  }
  if (CUresult r = a.cuInit(0); r != CUDA_SUCCESS) out.error = cuda_error(a, r, "cuInit");
  return out;
}

}  // namespace

Error cuda_error(const DriverApi& api, CUresult r, std::string_view what) {
  const char* name = nullptr;
  const char* desc = nullptr;
  if (api.cuGetErrorName) api.cuGetErrorName(r, &name);
  if (api.cuGetErrorString) api.cuGetErrorString(r, &desc);
  return Error(ErrorCode::cuda, fmt::format("CUDA driver: {} failed: {} ({})", what, name ? name : "?", desc ? desc : "?"));
}

Result<const DriverApi*> driver() {
  static const Loaded loaded = load();
  if (loaded.error) return *loaded.error;
  return &loaded.api;
}

bool gpu_available() {
  auto d = driver();
  if (!d) return false;
  int n = 0;
  return (*d)->cuDeviceGetCount(&n) == CUDA_SUCCESS && n > 0;
}

Result<int> device_count(const DriverApi& api) {
  int n = 0;
  KDAJIT_TRY(cu_check(api, api.cuDeviceGetCount(&n), "cuDeviceGetCount"));
  return n;
}

Result<int> checked_device_ordinal(int device, std::string_view argument) {
  auto api = driver();
  int n = 0;
  if (api) {
    auto count = device_count(**api);
    if (count) n = *count;
  }
  if (n == 0) return Error(ErrorCode::cuda, fmt::format("{}: no CUDA GPU on this machine", argument));
  if (device < 0 || device >= n)
    return invalid_argument(fmt::format("{}: expected a device ordinal in 0..{} (this machine has {} GPU{}), got {}",
                                        argument, n - 1, n, n == 1 ? "" : "s", device));
  return device;
}

Result<CUdevice> device_for(const DriverApi& api, int device) {
  CUdevice dev = 0;
  if (device >= 0) {
    KDAJIT_TRY(cu_check(api, api.cuDeviceGet(&dev, device), fmt::format("cuDeviceGet({})", device)));
    return dev;
  }
  CUcontext ctx = nullptr;
  if (api.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx) {
    KDAJIT_TRY(cu_check(api, api.cuCtxGetDevice(&dev), "cuCtxGetDevice"));
    return dev;
  }
  // No context: the only GPU is the device meant; among several, none is.
  KDAJIT_TRY_ASSIGN(int n, device_count(api));
  if (n == 0) return Error(ErrorCode::cuda, "CUDA driver: no CUDA GPU on this machine");
  if (n > 1)
    return invalid_argument(fmt::format(
        "device: -1 means the device of the current CUDA context, and no context is current on this machine of {} "
        "GPUs; make one current (cudaSetDevice) or name a device ordinal in 0..{}",
        n, n - 1));
  KDAJIT_TRY(cu_check(api, api.cuDeviceGet(&dev, 0), "cuDeviceGet(0)"));
  return dev;
}

Result<DeviceTraits> device_traits(const DriverApi& api, CUdevice dev, std::optional<Arch> arch_override) {
  DeviceTraits t;
  int major = 0, minor = 0;
  KDAJIT_TRY(cu_check(api, api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                      "cuDeviceGetAttribute(compute capability)"));
  KDAJIT_TRY(cu_check(api, api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                      "cuDeviceGetAttribute(compute capability)"));
  KDAJIT_TRY(cu_check(api, api.cuDeviceGetAttribute(&t.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                      "cuDeviceGetAttribute(multiprocessor count)"));
  if (arch_override) {
    t.arch = *arch_override;
  } else {
    KDAJIT_TRY_ASSIGN(t.arch, arch_for_compute_capability(major, minor));
  }
  return t;
}

Result<Arch> local_arch(int device) {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  CUcontext ctx = nullptr;
  const bool current = api->cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx;
  if (device >= 0 || current) {
    KDAJIT_TRY_ASSIGN(CUdevice dev, device_for(*api, device));
    KDAJIT_TRY_ASSIGN(DeviceTraits t, device_traits(*api, dev, std::nullopt));
    return t.arch;
  }
  // No device named and no context: the arch every GPU shares (a node of one kind).
  KDAJIT_TRY_ASSIGN(int n, device_count(*api));
  if (n == 0) return Error(ErrorCode::cuda, "CUDA driver: no CUDA GPU on this machine");
  std::vector<Arch> archs;
  std::vector<std::string> seen;
  for (int i = 0; i < n; ++i) {
    KDAJIT_TRY_ASSIGN(CUdevice dev, device_for(*api, i));
    KDAJIT_TRY_ASSIGN(DeviceTraits t, device_traits(*api, dev, std::nullopt));
    archs.push_back(t.arch);
    seen.push_back(fmt::format("{}: {}", i, to_string(t.arch)));
  }
  for (Arch a : archs)
    if (a != archs.front())
      return invalid_argument(fmt::format(
          "device: the GPUs of this machine have different archs ({}); name a device ordinal or an arch",
          fmt::join(seen, ", ")));
  return archs.front();
}

Status check_cubin_loads(std::string_view cubin, std::string_view entry, int device) {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  CUcontext ctx = nullptr;
  if (device < 0) api->cuCtxGetCurrent(&ctx);
  std::optional<PrimaryContextHold> held;
  if (!ctx) {
    KDAJIT_TRY_ASSIGN(PrimaryContextHold h, PrimaryContextHold::retain(device));
    ctx = h.context();
    held.emplace(std::move(h));
  }
  Status st = cu_check(*api, api->cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
  if (st) {
    // cuModuleLoadData needs the image to outlive the call only; copy for alignment.
    std::string image(cubin);
    CUmodule mod = nullptr;
    st = cu_check(*api, api->cuModuleLoadData(&mod, image.data()), "cuModuleLoadData");
    if (st) {
      CUfunction fn = nullptr;
      st = cu_check(*api, api->cuModuleGetFunction(&fn, mod, std::string(entry).c_str()),
                    fmt::format("cuModuleGetFunction({})", entry));
      api->cuModuleUnload(mod);
    }
    CUcontext popped = nullptr;
    api->cuCtxPopCurrent(&popped);
  }
  return st;
}

Result<PrimaryContextHold> PrimaryContextHold::retain(int device) {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  KDAJIT_TRY_ASSIGN(CUdevice dev, device_for(*api, device));
  CUcontext ctx = nullptr;
  KDAJIT_TRY(cu_check(*api, api->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"));
  return PrimaryContextHold(api, dev, ctx);
}

PrimaryContextHold::~PrimaryContextHold() {
  if (api_) api_->cuDevicePrimaryCtxRelease(dev_);
}

}  // namespace kdajit
