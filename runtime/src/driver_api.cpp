#include "kdajit/runtime/driver_api.hpp"

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
                  bind(lib, a.cuFuncGetAttribute, "cuFuncGetAttribute") &&
                  bind(lib, a.cuLaunchKernelEx, "cuLaunchKernelEx") &&
                  bind(lib, a.cuStreamIsCapturing, "cuStreamIsCapturing") &&
                  bind(lib, a.cuStreamGetCtx, "cuStreamGetCtx") && bind(lib, a.cuMemAlloc, "cuMemAlloc_v2") &&
                  bind(lib, a.cuMemFree, "cuMemFree_v2") && bind(lib, a.cuMemcpyHtoD, "cuMemcpyHtoD_v2") &&
                  bind(lib, a.cuMemcpyDtoH, "cuMemcpyDtoH_v2") && bind(lib, a.cuCtxSynchronize, "cuCtxSynchronize");
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

Result<Arch> local_arch(int device) {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  CUdevice dev = 0;
  if (device < 0) {
    CUcontext ctx = nullptr;
    if (api->cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx) {
      if (CUresult r = api->cuCtxGetDevice(&dev); r != CUDA_SUCCESS) return cuda_error(*api, r, "cuCtxGetDevice");
    } else if (CUresult r = api->cuDeviceGet(&dev, 0); r != CUDA_SUCCESS) {
      return cuda_error(*api, r, "cuDeviceGet(0)");
    }
  } else if (CUresult r = api->cuDeviceGet(&dev, device); r != CUDA_SUCCESS) {
    return cuda_error(*api, r, fmt::format("cuDeviceGet({})", device));
  }
  int major = 0, minor = 0;
  if (CUresult r = api->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev); r != CUDA_SUCCESS)
    return cuda_error(*api, r, "cuDeviceGetAttribute");
  if (CUresult r = api->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev); r != CUDA_SUCCESS)
    return cuda_error(*api, r, "cuDeviceGetAttribute");
  return arch_for_compute_capability(major, minor);
}

Status check_cubin_loads(std::string_view cubin, std::string_view entry) {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  CUcontext ctx = nullptr;
  api->cuCtxGetCurrent(&ctx);
  CUdevice dev = 0;
  bool retained = false;
  if (!ctx) {
    if (CUresult r = api->cuDeviceGet(&dev, 0); r != CUDA_SUCCESS) return cuda_error(*api, r, "cuDeviceGet(0)");
    if (CUresult r = api->cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS)
      return cuda_error(*api, r, "cuDevicePrimaryCtxRetain");
    retained = true;
  }
  api->cuCtxPushCurrent(ctx);
  // cuModuleLoadData needs the image to outlive the call only; copy for alignment.
  std::string image(cubin);
  CUmodule mod = nullptr;
  Status st;
  if (CUresult r = api->cuModuleLoadData(&mod, image.data()); r != CUDA_SUCCESS) {
    st = cuda_error(*api, r, "cuModuleLoadData");
  } else {
    CUfunction fn = nullptr;
    if (CUresult r2 = api->cuModuleGetFunction(&fn, mod, std::string(entry).c_str()); r2 != CUDA_SUCCESS)
      st = cuda_error(*api, r2, fmt::format("cuModuleGetFunction({})", entry));
    api->cuModuleUnload(mod);
  }
  CUcontext popped = nullptr;
  api->cuCtxPopCurrent(&popped);
  if (retained) api->cuDevicePrimaryCtxRelease(dev);
  return st;
}

}  // namespace kdajit
