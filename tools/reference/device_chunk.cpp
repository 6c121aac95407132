#include <fmt/format.h>

#include "kdajit/chunk_problem.hpp"
#include "kdajit/routes.hpp"
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
  // Route twopass's workspace, 0xFF bytes (units that hold no chunk) until a call writes it.
  const int64_t ws = twopass_workspace_bytes(p.N, p.R, p.H);
  if (ws > 0) {
    CUdeviceptr ptr = 0;
    KDAJIT_TRY(cu_check(*api, api->cuMemAlloc(&ptr, static_cast<size_t>(ws)), fmt::format("cuMemAlloc({} bytes)", ws)));
    d->workspace_ = {ptr, static_cast<size_t>(ws)};
    if (api->cuMemsetD32) {
      KDAJIT_TRY(cu_check(*api, api->cuMemsetD32(ptr, 0xFFFFFFFFu, static_cast<size_t>(ws) / 4), "cuMemsetD32"));
    } else {
      const std::vector<unsigned char> poison(static_cast<size_t>(ws), 0xFF);
      KDAJIT_TRY(cu_check(*api, api->cuMemcpyHtoD(ptr, poison.data(), poison.size()), "cuMemcpyHtoD"));
    }
    d->args_.workspace = reinterpret_cast<void*>(ptr);
    d->args_.workspace_bytes = ws;
  }
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
  if (workspace_.first) (*api)->cuMemFree(workspace_.first);
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
