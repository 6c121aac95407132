// The CUDA driver API, loaded with dlopen("libcuda.so.1") on first use, so that
// binaries run (generate, compile, cache) on machines without a GPU driver.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <cuda.h>

#include "kdajit/error.hpp"
#include "kdajit/routes.hpp"

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
  CUresult (*cuFuncSetAttribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*cuFuncGetAttribute)(int*, CUfunction_attribute, CUfunction);
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus*);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*);
  // Memory, for tools (selfcheck, verify --load); never on the launch path.
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*cuCtxSynchronize)();
  // Streams, events and memsets, for timing tools (`kdajit tune`). Optional: null
  // when this driver lacks them (timing_available() says whether all are there).
  CUresult (*cuStreamCreate)(CUstream*, unsigned int);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuEventCreate)(CUevent*, unsigned int);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*cuMemsetD32)(CUdeviceptr, unsigned int, size_t);
  CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
  // Reads a captured kernel node back (kdajit_bench's bare launch). Optional:
  // null when this driver lacks it.
  CUresult (*cuGraphKernelNodeGetParams)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*);

  bool timing_available() const {
    return cuStreamCreate && cuStreamDestroy && cuStreamSynchronize && cuEventCreate && cuEventDestroy &&
           cuEventRecord && cuEventSynchronize && cuEventElapsedTime && cuMemsetD32 && cuMemsetD32Async;
  }
};

// The loaded driver (cuInit done), or an error saying why there is none.
Result<const DriverApi*> driver();

// True when the driver loads and at least one device exists. Never fails.
bool gpu_available();

// Turns a CUresult into an Error{cuda} naming the call.
Error cuda_error(const DriverApi& api, CUresult r, std::string_view what);
// The one check for driver results: ok, or cuda_error() naming `what`.
inline Status cu_check(const DriverApi& api, CUresult r, std::string_view what) {
  if (r == CUDA_SUCCESS) return {};
  return cuda_error(api, r, what);
}

// Loads a cubin into a context and unloads it, for `kdajit verify --load`: the
// primary context of `device` (an ordinal), or for -1 the current context (the
// only GPU's primary one when none is current, as device_for says).
Status check_cubin_loads(std::string_view cubin, std::string_view entry, int device = -1);

// One reference to a device's primary context for the holder's lifetime. The
// driver destroys a primary context at its last release, so a loop of
// check_cubin_loads() on a device that nothing else holds would create and
// destroy a context per cubin (tens of ms each); holding one across the loop
// makes every call's retain and release a count. Move-only; releases once.
class PrimaryContextHold {
 public:
  // Retains `device`'s (an ordinal, or -1 as device_for says) primary context.
  static Result<PrimaryContextHold> retain(int device);
  PrimaryContextHold(PrimaryContextHold&& o) noexcept : api_(o.api_), dev_(o.dev_), ctx_(o.ctx_) { o.api_ = nullptr; }
  PrimaryContextHold& operator=(PrimaryContextHold&&) = delete;
  PrimaryContextHold(const PrimaryContextHold&) = delete;
  ~PrimaryContextHold();
  CUdevice device() const { return dev_; }
  CUcontext context() const { return ctx_; }

 private:
  PrimaryContextHold(const DriverApi* api, CUdevice dev, CUcontext ctx) : api_(api), dev_(dev), ctx_(ctx) {}
  const DriverApi* api_;
  CUdevice dev_;
  CUcontext ctx_;
};

// What the selector knows of a device (arch, SM count), read once per context
// by the registry. The arch is `arch_override` when set.
Result<DeviceTraits> device_traits(const DriverApi& api, CUdevice dev, std::optional<Arch> arch_override);

// The arch kdajit targets on a device: an ordinal, or -1 for the current
// context's device, and with no context the arch all GPUs share (an error
// naming each GPU's arch when they differ).
Result<Arch> local_arch(int device = -1);

// The device of ordinal >= 0, or -1 for the device of the current context. With
// no current context -1 is the only GPU; on a machine of several it is an
// invalid_argument error asking for an ordinal: never device 0 by accident.
Result<CUdevice> device_for(const DriverApi& api, int device);

// The number of CUDA devices the driver sees.
Result<int> device_count(const DriverApi& api);

// `device` when it is an ordinal of this machine's GPUs. Else an error naming
// `argument`: Error{cuda} "no CUDA GPU on this machine" when there is none (any
// index), invalid_argument with the valid range otherwise.
Result<int> checked_device_ordinal(int device, std::string_view argument);

}  // namespace kdajit
