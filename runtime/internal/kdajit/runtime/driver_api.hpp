// The CUDA driver API, loaded with dlopen("libcuda.so.1") on first use, so that
// binaries run (generate, compile, cache) on machines without a GPU driver.
#pragma once

#include <string>
#include <string_view>

#include <cuda.h>

#include "kdajit/error.hpp"
#include "kdajit/kernel_key.hpp"

namespace kdajit {

struct DriverApi {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetAttribute)(int*, CUdevice_attribute, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncGetAttribute)(int*, CUfunction_attribute, CUfunction);
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus*);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*);
  // Memory, for tools (selfcheck, verify --load); never on the launch path.
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*cuCtxSynchronize)();
};

// The loaded driver (cuInit done), or an error saying why there is none.
Result<const DriverApi*> driver();

// True when the driver loads and at least one device exists. Never fails.
bool gpu_available();

// Turns a CUresult into an Error{cuda} naming the call.
Error cuda_error(const DriverApi& api, CUresult r, std::string_view what);

// Loads a cubin into the current (or device 0's primary) context and unloads it:
// for `kdajit verify --load`.
Status check_cubin_loads(std::string_view cubin, std::string_view entry);

}  // namespace kdajit

namespace kdajit {

// The arch kdajit targets on a device: ordinal >= 0, or -1 for the device of
// the current context (device 0 when there is none).
Result<Arch> local_arch(int device = -1);

}  // namespace kdajit
