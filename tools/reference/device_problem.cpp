#include "kdajit/device_problem.hpp"

#include <fmt/format.h>

#include "kdajit/runtime/device/driver_api.hpp"

namespace kdajit::ref {

namespace {

// The driver with a current context: the caller's, else the only GPU's primary
// one (device_for: on a machine of several GPUs the caller makes one current).
Result<const DriverApi*> driver_with_context() {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  CUcontext ctx = nullptr;
  KDAJIT_TRY(cu_check(*api, api->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent"));
  if (!ctx) {
    KDAJIT_TRY_ASSIGN(CUdevice dev, device_for(*api, -1));
    KDAJIT_TRY(cu_check(*api, api->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"));
    KDAJIT_TRY(cu_check(*api, api->cuCtxSetCurrent(ctx), "cuCtxSetCurrent"));
  }
  return api;
}

}  // namespace

size_t DeviceProblem::device_bytes(Problem& p) {
  size_t n = 0;
  for (const auto& b : p.buffers()) n += b.bytes->size();
  return n;
}

Result<std::unique_ptr<DeviceProblem>> DeviceProblem::upload(Problem& p) {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver_with_context());
  std::unique_ptr<DeviceProblem> dp(new DeviceProblem());
  dp->args_ = p.args();  // views and scalars; data pointers replaced below
  for (const auto& b : p.buffers()) {
    CUdeviceptr d = 0;
    KDAJIT_TRY(cu_check(*api, api->cuMemAlloc(&d, b.bytes->size()),
                        fmt::format("cuMemAlloc({} bytes for {})", b.bytes->size(), b.name)));
    dp->buffers_.push_back({b.tensor, d, b.bytes->size(), b.written});  // freed by the destructor on a later failure
    (dp->args_.*b.view).data = reinterpret_cast<void*>(d);
    dp->bytes_ += b.bytes->size();
  }
  KDAJIT_TRY(dp->reupload(p));
  return dp;
}

DeviceProblem::~DeviceProblem() {
  auto api = driver();
  if (!api) return;
  for (const auto& b : buffers_) (*api)->cuMemFree(b.ptr);
}

Status DeviceProblem::reupload(Problem& p) {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  for (const auto& b : buffers_) {
    const auto& bytes = p.bytes(b.tensor);
    if (bytes.size() != b.size)
      return Error(ErrorCode::internal, fmt::format("reupload: {} has {} bytes, the device copy {}",
                                                    tensor_name(b.tensor), bytes.size(), b.size));
    KDAJIT_TRY(cu_check(*api, api->cuMemcpyHtoD(b.ptr, bytes.data(), b.size),
                        fmt::format("cuMemcpyHtoD({})", tensor_name(b.tensor))));
  }
  // A copy from pageable memory may return before its DMA has landed, and a
  // kernel on a non-blocking stream does not order with the legacy stream
  // the copies ran on: without this wait a launch can run first, and its
  // outputs be overwritten by the late poison (seen once in 661 GPU test
  // cases with 16 test processes on one GPU).
  KDAJIT_TRY(cu_check(*api, api->cuCtxSynchronize(), "upload (cuCtxSynchronize)"));
  // The call's scalars come from the problem too.
  const auto a = p.args();
  args_.norm_eps = a.norm_eps;
  args_.lower_bound = a.lower_bound;
  args_.gate = a.gate;
  args_.state_indices_mode = a.state_indices_mode;
  return {};
}

Status DeviceProblem::download(Problem& p) const {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  // Kernels on non-blocking streams do not order with these copies: wait first.
  KDAJIT_TRY(cu_check(*api, api->cuCtxSynchronize(), "kernel execution (cuCtxSynchronize)"));
  for (const auto& b : buffers_)
    if (b.written)
      KDAJIT_TRY(cu_check(*api, api->cuMemcpyDtoH(p.bytes(b.tensor).data(), b.ptr, b.size),
                          fmt::format("cuMemcpyDtoH({})", tensor_name(b.tensor))));
  return {};
}

}  // namespace kdajit::ref
