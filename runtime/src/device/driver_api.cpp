#include "kdajit/runtime/device/driver_api.hpp"

#include <dlfcn.h>

#include <mutex>

#include <fmt/format.h>

namespace kdajit {

namespace {

struct Loaded {
  DriverApi api{};
  std::optional<Error> error;
};

template <class Fn>
bool bind(void* lib, Fn& fn, const char* symbol) {
  fn = reinterpret_cast<Fn>(dlsym(lib, symbol));
  return fn != nullptr;
}

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
  const bool ok = bind(lib, a.cuInit, "cuInit") && bind(lib, a.cuGetErrorName, "cuGetErrorName") &&
                  bind(lib, a.cuGetErrorString, "cuGetErrorString") &&
                  bind(lib, a.cuDeviceGetCount, "cuDeviceGetCount") && bind(lib, a.cuDeviceGet, "cuDeviceGet") &&
                  bind(lib, a.cuDeviceGetAttribute, "cuDeviceGetAttribute") &&
                  bind(lib, a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
                  bind(lib, a.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2") &&
                  bind(lib, a.cuCtxGetCurrent, "cuCtxGetCurrent") && bind(lib, a.cuCtxSetCurrent, "cuCtxSetCurrent") &&
                  bind(lib, a.cuCtxPushCurrent, "cuCtxPushCurrent_v2") &&
                  bind(lib, a.cuCtxPopCurrent, "cuCtxPopCurrent_v2") && bind(lib, a.cuCtxGetDevice, "cuCtxGetDevice") &&
                  bind(lib, a.cuModuleLoadData, "cuModuleLoadData") && bind(lib, a.cuModuleUnload, "cuModuleUnload") &&
                  bind(lib, a.cuModuleGetFunction, "cuModuleGetFunction") &&
                  bind(lib, a.cuDeviceGetName, "cuDeviceGetName") &&
                  bind(lib, a.cuDriverGetVersion, "cuDriverGetVersion") &&
                  bind(lib, a.cuLaunchKernelEx, "cuLaunchKernelEx") &&
                  bind(lib, a.cuStreamIsCapturing, "cuStreamIsCapturing") &&
                  bind(lib, a.cuStreamGetCtx, "cuStreamGetCtx") && bind(lib, a.cuMemAlloc, "cuMemAlloc_v2") &&
                  bind(lib, a.cuMemFree, "cuMemFree_v2") && bind(lib, a.cuMemcpyHtoD, "cuMemcpyHtoD_v2") &&
                  bind(lib, a.cuMemcpyDtoH, "cuMemcpyDtoH_v2") && bind(lib, a.cuCtxSynchronize, "cuCtxSynchronize");
  // Optional entry points (timing tools); a missing one stays null.
  bind(lib, a.cuStreamCreate, "cuStreamCreate");
  bind(lib, a.cuStreamDestroy, "cuStreamDestroy_v2");
  bind(lib, a.cuStreamSynchronize, "cuStreamSynchronize");
  bind(lib, a.cuEventCreate, "cuEventCreate");
  bind(lib, a.cuEventDestroy, "cuEventDestroy_v2");
  bind(lib, a.cuEventRecord, "cuEventRecord");
  bind(lib, a.cuEventSynchronize, "cuEventSynchronize");
  if (!bind(lib, a.cuEventElapsedTime, "cuEventElapsedTime_v2")) bind(lib, a.cuEventElapsedTime, "cuEventElapsedTime");
  bind(lib, a.cuMemsetD32, "cuMemsetD32_v2");
  bind(lib, a.cuMemsetD32Async, "cuMemsetD32Async");
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
  KDAJIT_TRY_ASSIGN(CUdevice dev, device_for(*api, device));
  KDAJIT_TRY_ASSIGN(DeviceTraits t, device_traits(*api, dev, std::nullopt));
  return t.arch;
}

Status check_cubin_loads(std::string_view cubin, std::string_view entry) {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  CUcontext ctx = nullptr;
  api->cuCtxGetCurrent(&ctx);
  CUdevice dev = 0;
  bool retained = false;
  if (!ctx) {
    KDAJIT_TRY(cu_check(*api, api->cuDeviceGet(&dev, 0), "cuDeviceGet(0)"));
    KDAJIT_TRY(cu_check(*api, api->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"));
    retained = true;
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
  if (retained) api->cuDevicePrimaryCtxRelease(dev);
  return st;
}

}  // namespace kdajit
