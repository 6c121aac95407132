#include <fmt/format.h>

#include "kdajit/chunk_problem.hpp"
#include "kdajit/runtime/device/driver_api.hpp"

namespace kdajit::ref {

Result<std::unique_ptr<DeviceChunk>> DeviceChunk::upload(ChunkProblem& p) {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  CUcontext ctx = nullptr;
  KDAJIT_TRY(cu_check(*api, api->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent"));
  if (!ctx) {  // the only GPU's primary context (device_for: several GPUs need a current one)
    KDAJIT_TRY_ASSIGN(CUdevice dev, device_for(*api, -1));
    KDAJIT_TRY(cu_check(*api, api->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"));
    KDAJIT_TRY(cu_check(*api, api->cuCtxSetCurrent(ctx), "cuCtxSetCurrent"));
  }
  std::unique_ptr<DeviceChunk> d(new DeviceChunk());
  d->args_ = p.args;
  for (auto& [t, field] : p.tensors()) {
    if (t->empty()) {
      d->buffers_.push_back({0, 0});
      continue;
    }
    CUdeviceptr ptr = 0;
    KDAJIT_TRY(cu_check(*api, api->cuMemAlloc(&ptr, t->bytes.size()), fmt::format("cuMemAlloc({} bytes)", t->bytes.size())));
    d->buffers_.push_back({ptr, t->bytes.size()});  // freed by the destructor on a later failure
    KDAJIT_TRY(cu_check(*api, api->cuMemcpyHtoD(ptr, t->bytes.data(), t->bytes.size()), "cuMemcpyHtoD"));
    (d->args_.*field).data = reinterpret_cast<void*>(ptr);
  }
  if (p.spec.in_place) d->args_.final_state = d->args_.initial_state;
  // A copy from pageable memory may return before its DMA has landed, and the
  // call runs on a non-blocking stream that does not order with these copies:
  // without this wait the kernel can read stale inputs or have its outputs
  // overwritten by the late poison (device_problem.cpp has the same wait).
  KDAJIT_TRY(cu_check(*api, api->cuCtxSynchronize(), "upload (cuCtxSynchronize)"));
  return d;
}

DeviceChunk::~DeviceChunk() {
  auto api = driver();
  if (!api) return;
  for (const auto& [ptr, size] : buffers_)
    if (ptr) (*api)->cuMemFree(ptr);
}

Status DeviceChunk::download(ChunkProblem& p) const {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  KDAJIT_TRY(cu_check(*api, api->cuCtxSynchronize(), "cuCtxSynchronize"));
  auto tensors = p.tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    HostTensor* t = tensors[i].first;
    const bool written = t == &p.output || t == &p.final_state || (p.spec.in_place && t == &p.initial);
    if (!written || t->empty()) continue;
    KDAJIT_TRY(cu_check(*api, api->cuMemcpyDtoH(t->bytes.data(), buffers_[i].first, t->bytes.size()), "cuMemcpyDtoH"));
  }
  return {};
}

}  // namespace kdajit::ref
