#include <atomic>
#include <cstring>

#include <fmt/format.h>

#include "kdajit/log.hpp"
#include "kdajit/runtime/api/runtime_impl.hpp"
#include "kdajit/runtime/call/select.hpp"
#include "kdajit/runtime/device/driver_api.hpp"
#include "kdajit/runtime/device/launch.hpp"
#include "kdajit/runtime/jit/obtain.hpp"
#include "kdajit/runtime/tune/tune.hpp"

namespace kdajit {

namespace {

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

// The last call of this thread, and how it launched. Validation is a pure
// function of the args struct, and for one runtime and context so is the launch
// (route, kernel, grid, block, shared memory, attributes: the registry and the
// selector's inputs never change for a context once read). A thread that passes
// the same bytes again (an engine's persistent buffers, step after step) reuses
// both instead of re-checking ~14 tensors and resolving the kernel.
struct LastCall {
  bool valid = false;
  Op op = Op::single;
  kdajit_decode_args_t args;
  ValidatedCall call;
  // The launch, once one succeeded for these args: whose runtime, which context.
  uint64_t runtime = 0;  // Runtime::Impl::id; 0: none
  CUcontext ctx = nullptr;
  KernelKey key;
  CUfunction function = nullptr;
  PreparedLaunch launch;
};

LastCall& last_call() {
  thread_local LastCall last;
  return last;
}

Result<ValidatedCall*> validate_cached(Op op, const kdajit_decode_args_t& args) {
  LastCall& last = last_call();
  if (last.valid && last.op == op && std::memcmp(&last.args, &args, sizeof args) == 0) return &last.call;
  last.valid = false;
  last.runtime = 0;
  KDAJIT_TRY_ASSIGN(last.call, validate_decode(op, args));
  last.valid = true;
  last.op = op;
  std::memcpy(&last.args, &args, sizeof args);
  return &last.call;
}

std::atomic<uint64_t> next_runtime_id{1};

}  // namespace

Outcome to_outcome(const Status& s) {
  if (s) return {};
  const Error& e = s.error();
  return {static_cast<kdajit_status_t>(e.code), e.message, e.detail};
}

Result<std::unique_ptr<Runtime::Impl>> Runtime::Impl::create(const RuntimeOptions& options) {
  const int32_t level = enum_value(options.log_level);
  if (level != KDAJIT_LOG_DEFAULT) {
    if (level < KDAJIT_LOG_QUIET || level > KDAJIT_LOG_DEBUG)
      return invalid_argument(fmt::format(
          "options.log_level: expected -1 (default), 0 (quiet), 1 (info) or 2 (debug), got {}", level));
    set_log_level(static_cast<LogLevel>(level));
  }
  KDAJIT_TRY_ASSIGN(Environment env, read_environment());
  auto impl = std::make_unique<Impl>();
  if (!options.arch.empty()) {
    auto arch = parse_arch(options.arch);
    if (!arch) return invalid_argument("options.arch: " + arch.error().message);
    impl->arch = *arch;
  } else if (env.arch) {
    impl->arch = *env.arch;
  }
  if (!options.route.empty()) {
    auto route = parse_field<Route>(options.route);
    if (!route) return invalid_argument("options.route: " + route.error().message);
    impl->forced_route = *route;
  }
  impl->use_tuning = options.use_tuning;
  impl->id = next_runtime_id.fetch_add(1);
  impl->pdl = options.pdl;
  // The rule KDAJIT_CACHE_DIR follows: a directory or a ':'-separated list, no empty element.
  if (!options.cache_dir.empty()) KDAJIT_TRY(split_cache_layers(options.cache_dir, "options.cache_dir"));
  KDAJIT_TRY_ASSIGN(impl->cache, open_kernel_cache(options.cache_dir));
  impl->registry = std::make_unique<KernelRegistry>(impl->cache);
  impl->background = std::make_unique<BackgroundPrewarm>(*impl->cache);
  if (options.device >= 0) {
    KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
    int count = 0;
    KDAJIT_TRY(cu_check(*api, api->cuDeviceGetCount(&count), "cuDeviceGetCount"));
    if (options.device >= count)
      return invalid_argument(fmt::format("options.device: expected -1 or a device ordinal in 0..{}, got {}", count - 1,
                                          options.device));
    KDAJIT_TRY(cu_check(*api, api->cuDeviceGet(&impl->fixed_device, options.device), "cuDeviceGet"));
    KDAJIT_TRY(cu_check(*api, api->cuDevicePrimaryCtxRetain(&impl->fixed_ctx, impl->fixed_device),
                        "cuDevicePrimaryCtxRetain"));
  }
  return impl;
}

Runtime::Impl::~Impl() {
  if (fixed_ctx) {
    if (auto api = driver()) (*api)->cuDevicePrimaryCtxRelease(fixed_device);
  }
}

Result<CUcontext> Runtime::Impl::context_for(kdajit_stream_t stream) const {
  if (fixed_ctx) return fixed_ctx;
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  // The stream's context: launches go where the stream lives, also with several GPUs.
  CUcontext ctx = nullptr;
  if (api->cuStreamGetCtx(reinterpret_cast<CUstream>(stream), &ctx) != CUDA_SUCCESS || !ctx)
    return Error(ErrorCode::cuda,
                 "stream: expected a stream of a live CUDA context (or a current context for the null stream); "
                 "cuStreamGetCtx failed; create a context (e.g. cudaSetDevice) or set options.device");
  return ctx;
}

Result<const Runtime::Impl::ContextRoutes*> Runtime::Impl::routes_of(CUcontext ctx) {
  {
    std::shared_lock lock(contexts_mu_);
    if (auto it = contexts_.find(ctx); it != contexts_.end()) return it->second.get();
  }
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  CUdevice dev = 0;
  KDAJIT_TRY(cu_check(*api, api->cuCtxPushCurrent(ctx), "cuCtxPushCurrent"));
  const CUresult r = api->cuCtxGetDevice(&dev);
  CUcontext popped = nullptr;
  api->cuCtxPopCurrent(&popped);
  KDAJIT_TRY(cu_check(*api, r, "cuCtxGetDevice"));
  auto cr = std::make_unique<ContextRoutes>();
  KDAJIT_TRY_ASSIGN(cr->device, device_traits(*api, dev, arch));
  // Only a table that is there costs loading NVRTC (its version is part of the
  // identity the table is checked against); a cache hit needs no NVRTC otherwise.
  if (use_tuning && !forced_route &&
      TuneTable::present(cache->root(), tune_identity(*api, dev, cr->device.arch, /*with_nvrtc=*/false))) {
    auto t = TuneTable::load(cache->root(), tune_identity(*api, dev, cr->device.arch));
    if (!t) log_warning("{}; using the built-in route bands", t.error().message);
    else if (*t) cr->tuned = std::move(**t);
  }
  std::unique_lock lock(contexts_mu_);
  auto [it, inserted] = contexts_.emplace(ctx, std::move(cr));
  return it->second.get();
}

Result<Runtime::Impl::Resolved> Runtime::Impl::resolve(CUcontext ctx, const CallShape& call) {
  KDAJIT_TRY_ASSIGN(const ContextRoutes* cr, routes_of(ctx));
  RoutePolicy policy{forced_route, std::nullopt};
  if (cr->tuned) policy.tuned = cr->tuned->route_for(call);
  KDAJIT_TRY_ASSIGN(Route route, select_route(call, cr->device, policy));
  Resolved out{key_for(call, route, cr->device.arch), std::nullopt, cr->device};
  out.kernel = registry->find(ctx, out.key);
  return out;
}

Result<KernelKey> Runtime::Impl::selected_key(Op op, const kdajit_decode_args_t& args, kdajit_stream_t stream) {
  KDAJIT_TRY_ASSIGN(ValidatedCall call, validate_decode(op, args));
  KDAJIT_TRY_ASSIGN(CUcontext ctx, context_for(stream));
  KDAJIT_TRY_ASSIGN(Resolved r, resolve(ctx, call.shape));
  return r.key;
}

Result<KernelKey> Runtime::Impl::selected_prefill_key(const kdajit_prefill_args_t& args, kdajit_stream_t stream) {
  KDAJIT_TRY_ASSIGN(ValidatedCall call, validate_prefill(args));
  KDAJIT_TRY_ASSIGN(CUcontext ctx, context_for(stream));
  KDAJIT_TRY_ASSIGN(Resolved r, resolve(ctx, call.shape));
  return r.key;
}

Result<KernelKey> Runtime::Impl::selected_chunk_key(const kdajit_chunk_args_t& args, kdajit_stream_t stream) {
  KDAJIT_TRY_ASSIGN(ValidatedCall call, validate_chunk(args));
  KDAJIT_TRY_ASSIGN(CUcontext ctx, context_for(stream));
  KDAJIT_TRY_ASSIGN(Resolved r, resolve(ctx, call.shape));
  return r.key;
}

Status Runtime::Impl::launch_validated(const ValidatedCall& call, kdajit_stream_t stream) {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  KDAJIT_TRY_ASSIGN(CUcontext ctx, context_for(stream));
  auto cu_stream = reinterpret_cast<CUstream>(stream);
  ScopedContext scoped(api, ctx);
  KDAJIT_TRY_ASSIGN(Resolved r, resolve(ctx, call.shape));
  if (!r.kernel) {
    // A compile would break a capture: only cached kernels may load now.
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    KDAJIT_TRY(cu_check(*api, api->cuStreamIsCapturing(cu_stream, &capture), "cuStreamIsCapturing"));
    KDAJIT_TRY_ASSIGN(r.kernel, registry->load(ctx, r.key, /*allow_build=*/capture == CU_STREAM_CAPTURE_STATUS_NONE));
  }
  // The launch shape is the route's row of the table applied to the call.
  const LaunchPlan plan = launch_plan(r.key, call.shape, r.device);
  // Route twopass's other kernels: the same block as the key's, no cluster.
  auto launch_other = [&](CUfunction f, LaunchGrid grid, uint32_t dynamic_smem_bytes) {
    LaunchPlan other = plan;
    other.grid = grid;
    other.cluster_y = 1;
    other.dynamic_smem_bytes = dynamic_smem_bytes;
    return launch(*api, f, prepare_launch(other, pdl), cu_stream, call.params, r.key);
  };
  // Its intra-chunk kernel first, with its own shared memory.
  if (plan.has_pre()) KDAJIT_TRY(launch_other(r.kernel->pre_function, plan.pre_grid, plan.pre_dynamic_smem_bytes));
  KDAJIT_TRY(launch(*api, r.kernel->function, prepare_launch(plan, pdl), cu_stream, call.params, r.key));
  // The prefill op's norm kernel last, with no dynamic shared memory.
  if (plan.has_post()) KDAJIT_TRY(launch_other(r.kernel->post_function, plan.post_grid, 0));
  return {};
}

Status Runtime::Impl::prefill(const kdajit_prefill_args_t& args, kdajit_stream_t stream) {
  KDAJIT_TRY_ASSIGN(const ValidatedCall call, validate_prefill(args));
  return launch_validated(call, stream);
}

Status Runtime::Impl::chunk(const kdajit_chunk_args_t& args, kdajit_stream_t stream) {
  KDAJIT_TRY_ASSIGN(const ValidatedCall call, validate_chunk(args));
  return launch_validated(call, stream);
}

Result<bool> Runtime::Impl::prewarm(const KernelKey& key) {
  KDAJIT_TRY_ASSIGN(CacheLookup found, obtain(*cache, key, /*allow_build=*/true));
  return compiled_now(found);
}

Status Runtime::Impl::decode(Op op, const kdajit_decode_args_t& args, kdajit_stream_t stream) {
  KDAJIT_TRY_ASSIGN(ValidatedCall* call, validate_cached(op, args));
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  KDAJIT_TRY_ASSIGN(CUcontext ctx, context_for(stream));
  auto cu_stream = reinterpret_cast<CUstream>(stream);
  LastCall& last = last_call();
  ScopedContext scoped(api, ctx);
  if (last.runtime != id || last.ctx != ctx) {
    last.runtime = 0;
    KDAJIT_TRY_ASSIGN(Resolved r, resolve(ctx, call->shape));
    if (!r.kernel) {
      // A compile would break a capture: only cached kernels may load now.
      CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
      KDAJIT_TRY(cu_check(*api, api->cuStreamIsCapturing(cu_stream, &capture), "cuStreamIsCapturing"));
      KDAJIT_TRY_ASSIGN(r.kernel,
                        registry->load(ctx, r.key, /*allow_build=*/capture == CU_STREAM_CAPTURE_STATUS_NONE));
    }
    // The launch shape is the route's row of the table applied to the call.
    last.launch = prepare_launch(launch_plan(r.key, call->shape, r.device), pdl);
    last.key = r.key;
    last.function = r.kernel->function;
    last.ctx = ctx;
    last.runtime = id;
  }
  if (Status s = launch(*api, last.function, last.launch, cu_stream, call->params, last.key); !s) {
    last.runtime = 0;  // resolved again next time
    return s;
  }
  return {};
}

}  // namespace kdajit
