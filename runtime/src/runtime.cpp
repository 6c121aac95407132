#include <algorithm>

#include <fmt/format.h>

#include "kdajit/generator.hpp"
#include "kdajit/log.hpp"
#include "kdajit/runtime/driver_api.hpp"
#include "kdajit/runtime/runtime_impl.hpp"

namespace kdajit {

namespace {

// Grid y is limited to 65535.
constexpr int64_t kMaxGridY = 65535;

// Pushes ctx for the scope when it is not already current.
class ScopedContext {
 public:
  ScopedContext(const DriverApi* api, CUcontext ctx) : api_(api) {
    CUcontext cur = nullptr;
    api_->cuCtxGetCurrent(&cur);
    if (cur != ctx) pushed_ = api_->cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
  }
  ~ScopedContext() {
    if (pushed_) {
      CUcontext popped = nullptr;
      api_->cuCtxPopCurrent(&popped);
    }
  }

 private:
  const DriverApi* api_;
  bool pushed_ = false;
};

}  // namespace

Outcome to_outcome(const Status& s) {
  if (s) return {};
  const Error& e = s.error();
  std::string msg = e.message;
  if (!e.detail.empty()) msg += "\n" + e.detail;
  return {static_cast<kdajit_status_t>(e.code), std::move(msg)};
}

Result<std::unique_ptr<Runtime::Impl>> Runtime::Impl::create(const RuntimeOptions& options) {
  if (options.log_level != KDAJIT_LOG_DEFAULT) {
    if (options.log_level < KDAJIT_LOG_QUIET || options.log_level > KDAJIT_LOG_DEBUG)
      return invalid_argument(fmt::format("options.log_level: expected -1 (default), 0 (quiet), 1 (info) or 2 (debug), got {}",
                                          static_cast<int>(options.log_level)));
    set_log_level(static_cast<LogLevel>(options.log_level));
  }
  std::optional<Arch> arch;
  if (!options.arch.empty()) {
    KDAJIT_TRY_ASSIGN(arch, parse_arch(options.arch));
  }
  auto impl = std::make_unique<Impl>();
  KDAJIT_TRY_ASSIGN(impl->cache, open_kernel_cache(options.cache_dir));
  impl->registry = std::make_unique<KernelRegistry>(impl->cache, arch);
  if (options.device >= 0) {
    KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
    int count = 0;
    api->cuDeviceGetCount(&count);
    if (options.device >= count)
      return invalid_argument(fmt::format("options.device: expected -1 or a device ordinal in 0..{}, got {}", count - 1,
                                          options.device));
    if (CUresult r = api->cuDeviceGet(&impl->fixed_device, options.device); r != CUDA_SUCCESS)
      return cuda_error(*api, r, "cuDeviceGet");
    if (CUresult r = api->cuDevicePrimaryCtxRetain(&impl->fixed_ctx, impl->fixed_device); r != CUDA_SUCCESS)
      return cuda_error(*api, r, "cuDevicePrimaryCtxRetain");
  }
  return impl;
}

Runtime::Impl::~Impl() {
  if (fixed_ctx) {
    if (auto api = driver()) (*api)->cuDevicePrimaryCtxRelease(fixed_device);
  }
}

Status Runtime::Impl::decode(Op op, const kdajit_decode_args_t& args, kdajit_stream_t stream) {
  KDAJIT_TRY_ASSIGN(ValidatedCall call, validate_decode(op, args));
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  auto cu_stream = reinterpret_cast<CUstream>(stream);

  CUcontext ctx = fixed_ctx;
  if (!ctx) {
    // The stream's context: launches go where the stream lives, also with several GPUs.
    if (CUresult r = api->cuStreamGetCtx(cu_stream, &ctx); r != CUDA_SUCCESS || !ctx)
      return Error(ErrorCode::cuda,
                   "stream: expected a stream of a live CUDA context (or a current context for the null stream); "
                   "cuStreamGetCtx failed — create a context (e.g. cudaSetDevice) or set options.device");
  }
  KDAJIT_TRY_ASSIGN(Arch arch, registry->arch_for(ctx));
  const KernelKey key = key_for_call(call, arch);

  ScopedContext scoped(api, ctx);
  std::optional<LoadedKernel> kernel = registry->find(ctx, key);
  if (!kernel) {
    // A compile would break a capture: only cached kernels may load now.
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    api->cuStreamIsCapturing(cu_stream, &capture);
    const bool capturing = capture != CU_STREAM_CAPTURE_STATUS_NONE;
    KDAJIT_TRY_ASSIGN(kernel, registry->load(ctx, key, /*allow_build=*/!capturing));
  }

  CUlaunchConfig cfg{};
  cfg.blockDimX = static_cast<unsigned>(kernel->threads);
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.gridDimX = static_cast<unsigned>(call.heads);
  cfg.gridDimZ = 1;
  if (op == Op::single) {
    // The kernel loops over rows with a gridDim.y stride. repeated_positive: one
    // CTA per head walks the rows in order (sequential-safe).
    const int64_t gy = call.mode == KDAJIT_INDICES_REPEATED_POSITIVE ? 1 : call.rows;
    cfg.gridDimY = static_cast<unsigned>(std::min(gy, kMaxGridY));
  } else {
    // One CTA per (item, head), items = max(N, R); grid z carries the overflow of y.
    const int64_t items = std::max(call.num_seqs, call.rows);
    cfg.gridDimY = static_cast<unsigned>(std::min(items, kMaxGridY));
    cfg.gridDimZ = static_cast<unsigned>((items + cfg.gridDimY - 1) / cfg.gridDimY);
  }
  cfg.sharedMemBytes = 0;
  cfg.hStream = cu_stream;
  // Cluster routes (a value split across CTAs) launch with the cluster attribute.
  CUlaunchAttribute attr{};
  if (kernel->cluster > 1) {
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = 1;
    attr.value.clusterDim.y = static_cast<unsigned>(kernel->cluster);
    attr.value.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  } else {
    cfg.attrs = nullptr;
    cfg.numAttrs = 0;
  }
  void* params[] = {&call.params};
  if (CUresult r = api->cuLaunchKernelEx(&cfg, kernel->function, params, nullptr); r != CUDA_SUCCESS)
    return cuda_error(*api, r, fmt::format("cuLaunchKernelEx({})", key_name(key)));
  return {};
}

}  // namespace kdajit
