#include "kdajit/runtime/tune/tune.hpp"

#include <algorithm>
#include <memory>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "kdajit/cache.hpp"
#include "kdajit/env.hpp"
#include "kdajit/kdajit.hpp"
#include "kdajit/kdajit_version.h"
#include "kdajit/runtime/call/validate.hpp"
#include "kdajit/runtime/device/driver_api.hpp"
#include "kdajit/runtime/device/launch.hpp"
#include "kdajit/runtime/device/registry.hpp"
#include "kdajit/runtime/jit/nvrtc_api.hpp"
#include "kdajit/runtime/jit/obtain.hpp"

namespace kdajit {

namespace {

constexpr int64_t kD = kHeadDim;
constexpr size_t kFlushBytes = size_t{256} << 20;

// Device memory freed on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(const DriverApi& api, size_t bytes) : api_(api) {
    if (bytes && api.cuMemAlloc(&ptr_, bytes) != CUDA_SUCCESS) ptr_ = 0;
    bytes_ = ptr_ ? bytes : 0;
  }
  ~DeviceBuffer() {
    if (ptr_) api_.cuMemFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  CUdeviceptr ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  const DriverApi& api_;
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

kdajit_tensor_t view(CUdeviceptr p, kdajit_dtype_t dtype, std::initializer_list<int64_t> shape) {
  return dense_tensor_view(reinterpret_cast<void*>(p), dtype, shape);
}

// The buffers of one family at its largest batch, and the call arguments for
// any smaller one (a prefix of the rows; the pools stay whole).
class FamilyBuffers {
 public:
  static Result<std::unique_ptr<FamilyBuffers>> make(const DriverApi& api, const KernelKey& f, int64_t max_rows) {
    auto b = std::unique_ptr<FamilyBuffers>(new FamilyBuffers(api, f, max_rows));
    KDAJIT_TRY(b->allocate());
    return b;
  }

  // Arguments for `rows` rows (single) or sequences of T rows (packed).
  kdajit_decode_args_t args(int64_t rows) const {
    const int64_t H = f_.heads, T = f_.tokens, hidden = H * kD, qkv = 3 * hidden, K = T + kConvWidth - 2;
    const bool packed = f_.op == Op::packed;
    const int64_t R = packed ? rows * T : rows;
    kdajit_decode_args_t a{};
    a.lower_bound = -5.0f;
    a.norm_eps = 1e-6f;
    a.gate = f_.gate == Gate::bounded ? KDAJIT_GATE_BOUNDED : KDAJIT_GATE_SOFTPLUS;
    a.state_indices_mode = KDAJIT_INDICES_UNIQUE_OR_NULL;
    a.x = view(x_->ptr(), KDAJIT_DTYPE_BF16, {R, qkv});
    a.conv_weight = view(weight_->ptr(), KDAJIT_DTYPE_F32, {3, kConvWidth, hidden});
    a.conv_state = view(conv_->ptr(), KDAJIT_DTYPE_BF16, {slots_, qkv, K});
    if (f_.conv == ConvLayout::sd) {  // strides (slot, 1, qkv)
      a.conv_state.strides[1] = 1;
      a.conv_state.strides[2] = qkv;
    }
    a.raw_gate = view(gate_->ptr(), KDAJIT_DTYPE_BF16, {R, H, kD});
    a.raw_beta = view(beta_->ptr(), KDAJIT_DTYPE_BF16, {R, H});
    a.A_log = view(alog_->ptr(), KDAJIT_DTYPE_F32, {H});
    a.dt_bias = view(bias_->ptr(), KDAJIT_DTYPE_F32, {hidden});
    a.state_indices = packed ? view(slots_buf_->ptr(), KDAJIT_DTYPE_INT32, {rows, T})
                             : view(slots_buf_->ptr(), KDAJIT_DTYPE_INT32, {rows});
    a.state = view(state_->ptr(), f_.state == StateDtype::f32 ? KDAJIT_DTYPE_F32 : KDAJIT_DTYPE_BF16,
                   {slots_, H, kD, kD});
    a.output_gate = view(ogate_->ptr(), KDAJIT_DTYPE_BF16, {R, H, kD});
    a.norm_weight = view(norm_->ptr(), KDAJIT_DTYPE_F32, {kD});
    a.output = view(out_->ptr(), KDAJIT_DTYPE_BF16, {R, H, kD});
    if (packed) {
      a.query_start_loc = view(qsl_->ptr(), KDAJIT_DTYPE_INT32, {rows + 1});
      a.num_accepted_tokens = view(accepted_->ptr(), KDAJIT_DTYPE_INT32, {rows});
    }
    return a;
  }

 private:
  FamilyBuffers(const DriverApi& api, const KernelKey& f, int64_t max_rows) : api_(api), f_(f), max_rows_(max_rows) {}

  Status allocate() {
    const int64_t H = f_.heads, T = f_.tokens, hidden = H * kD, qkv = 3 * hidden, K = T + kConvWidth - 2;
    const bool packed = f_.op == Op::packed;
    const int64_t R = packed ? max_rows_ * T : max_rows_;
    slots_ = (packed ? max_rows_ * T : max_rows_) + 1;  // every row / checkpoint its own slot, plus the null slot
    const int64_t sb = f_.state == StateDtype::f32 ? 4 : 2;
    auto alloc = [&](std::unique_ptr<DeviceBuffer>& b, int64_t bytes, const char* what) -> Status {
      b = std::make_unique<DeviceBuffer>(api_, static_cast<size_t>(bytes));
      if (!b->ptr())
        return Error(ErrorCode::cuda, fmt::format("tune: cuMemAlloc of {} bytes for {} failed", bytes, what));
      // A non-zero pattern (bf16 pairs of 0.0078; as f32 also about 0.0078): never time on zeros.
      return cu_check(api_, api_.cuMemsetD32(b->ptr(), 0x3c003c00u, static_cast<size_t>(bytes) / 4), "cuMemsetD32");
    };
    KDAJIT_TRY(alloc(x_, R * qkv * 2, "x"));
    KDAJIT_TRY(alloc(weight_, 3 * kConvWidth * hidden * 4, "conv_weight"));
    KDAJIT_TRY(alloc(conv_, slots_ * qkv * K * 2, "conv_state"));
    KDAJIT_TRY(alloc(gate_, R * hidden * 2, "raw_gate"));
    KDAJIT_TRY(alloc(beta_, (R * H * 2 + 3) / 4 * 4, "raw_beta"));
    KDAJIT_TRY(alloc(alog_, H * 4, "A_log"));
    KDAJIT_TRY(alloc(bias_, hidden * 4, "dt_bias"));
    KDAJIT_TRY(alloc(state_, slots_ * H * kD * kD * sb, "state"));
    KDAJIT_TRY(alloc(ogate_, R * hidden * 2, "output_gate"));
    KDAJIT_TRY(alloc(norm_, kD * 4, "norm_weight"));
    KDAJIT_TRY(alloc(out_, R * hidden * 2, "output"));
    // Distinct live slots, scattered over the pool like an engine's.
    std::vector<int32_t> slots(static_cast<size_t>(slots_ - 1));
    std::iota(slots.begin(), slots.end(), 1);
    for (size_t i = 1; i < slots.size(); ++i) std::swap(slots[i], slots[(i * 2654435761u) % (i + 1)]);
    KDAJIT_TRY(alloc(slots_buf_, static_cast<int64_t>(slots.size()) * 4, "state_indices"));
    KDAJIT_TRY(cu_check(api_, api_.cuMemcpyHtoD(slots_buf_->ptr(), slots.data(), slots.size() * 4), "cuMemcpyHtoD"));
    if (packed) {
      std::vector<int32_t> qsl(static_cast<size_t>(max_rows_ + 1)), acc(static_cast<size_t>(max_rows_));
      for (int64_t n = 0; n <= max_rows_; ++n) qsl[static_cast<size_t>(n)] = static_cast<int32_t>(n * T);
      for (int64_t n = 0; n < max_rows_; ++n) acc[static_cast<size_t>(n)] = static_cast<int32_t>(1 + n % T);
      KDAJIT_TRY(alloc(qsl_, static_cast<int64_t>(qsl.size()) * 4, "query_start_loc"));
      KDAJIT_TRY(alloc(accepted_, static_cast<int64_t>(acc.size()) * 4, "num_accepted_tokens"));
      KDAJIT_TRY(cu_check(api_, api_.cuMemcpyHtoD(qsl_->ptr(), qsl.data(), qsl.size() * 4), "cuMemcpyHtoD"));
      KDAJIT_TRY(cu_check(api_, api_.cuMemcpyHtoD(accepted_->ptr(), acc.data(), acc.size() * 4), "cuMemcpyHtoD"));
    }
    // The memsets and the pageable copies ran on the legacy stream and may not
    // have landed; the timed launches go to a stream that does not wait for it.
    return cu_check(api_, api_.cuCtxSynchronize(), "cuCtxSynchronize");
  }

  const DriverApi& api_;
  KernelKey f_;
  int64_t max_rows_ = 0, slots_ = 0;
  std::unique_ptr<DeviceBuffer> x_, weight_, conv_, gate_, beta_, alog_, bias_, slots_buf_, state_, ogate_, norm_, out_,
      qsl_, accepted_;
};

}  // namespace

TuneIdentity tune_identity(const DriverApi& api, CUdevice dev, Arch arch, bool with_nvrtc) {
  TuneIdentity id;
  char name[256] = {};
  if (api.cuDeviceGetName(name, sizeof name - 1, dev) == CUDA_SUCCESS) id.gpu_name = name;
  api.cuDeviceGetAttribute(&id.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  api.cuDriverGetVersion(&id.driver_version);
  if (with_nvrtc)
    if (auto nv = nvrtc()) id.nvrtc_version = (*nv)->version;
  id.kdajit_version = KDAJIT_VERSION_STRING;
  id.arch = arch;
  return id;
}

Result<TuneReport> tune_routes(const TuneOptions& o) {
  if (o.reps < 3) return invalid_argument(fmt::format("reps: expected at least 3, got {}", o.reps));
  if (o.rows.empty()) return invalid_argument("rows: expected at least one batch size");
  for (int64_t r : o.rows)
    if (r < 1 || r > 65536) return invalid_argument(fmt::format("rows: expected batch sizes in 1..65536, got {}", r));
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  if (!api->timing_available())
    return Error(ErrorCode::unsupported, "tune: this CUDA driver lacks the stream/event entry points timing needs");
  KDAJIT_TRY_ASSIGN(const PrimaryContextHold held, PrimaryContextHold::retain(o.device));  // released on return
  const CUdevice dev = held.device();
  const CUcontext ctx = held.context();
  KDAJIT_TRY(cu_check(*api, api->cuCtxSetCurrent(ctx), "cuCtxSetCurrent"));
  KDAJIT_TRY_ASSIGN(Environment env, read_environment());
  KDAJIT_TRY_ASSIGN(DeviceTraits device, device_traits(*api, dev, env.arch));

  // Every route's kernel is launched directly (validation, the registry, the
  // route's launch plan): the tune never reads the table it is about to replace.
  KDAJIT_TRY_ASSIGN(std::shared_ptr<KernelCache> cache, open_kernel_cache(o.cache_dir));
  KernelRegistry registry(cache);
  TuneReport report;
  report.table = TuneTable(tune_identity(*api, dev, device.arch));

  CUstream stream = nullptr;
  KDAJIT_TRY(cu_check(*api, api->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
  CUevent start = nullptr, stop = nullptr;
  KDAJIT_TRY(cu_check(*api, api->cuEventCreate(&start, CU_EVENT_DEFAULT), "cuEventCreate"));
  KDAJIT_TRY(cu_check(*api, api->cuEventCreate(&stop, CU_EVENT_DEFAULT), "cuEventCreate"));
  struct Cleanup {
    const DriverApi* api;
    CUstream s;
    CUevent a, b;
    ~Cleanup() {
      api->cuEventDestroy(a);
      api->cuEventDestroy(b);
      api->cuStreamDestroy(s);
    }
  } cleanup{api, stream, start, stop};
  DeviceBuffer flush(*api, kFlushBytes);
  if (!flush.ptr()) return Error(ErrorCode::cuda, "tune: cuMemAlloc of the 256 MiB L2 flush buffer failed");

  std::set<KernelKey> done;
  const int64_t max_rows = *std::max_element(o.rows.begin(), o.rows.end());
  for (const KernelKey& k : o.families) {
    // Decode families only: a prefill call's route depends on its prompt
    // lengths, which the rows axis does not vary (the selector's prefill band).
    if (chunked(k.op)) continue;
    KernelKey family = TuneTable::family_of(k);
    family.arch = device.arch;
    if (!done.insert(family).second) continue;
    CallShape probe;
    probe.family = family;
    probe.rows = 1;
    probe.num_seqs = family.op == Op::packed ? 1 : 0;
    std::vector<Route> routes;
    for (const RouteSpec& r : route_table())
      if (r.serves(family.op) && r.eligible(probe, device)) routes.push_back(r.route);
    if (routes.size() < 2) {
      ++report.skipped_families;
      continue;
    }
    KDAJIT_TRY_ASSIGN(auto buffers, FamilyBuffers::make(*api, family, max_rows));
    for (int64_t rows : o.rows) {
      const kdajit_decode_args_t args = buffers->args(rows);
      KDAJIT_TRY_ASSIGN(const ValidatedCall call, validate_decode(family.op, args));
      Route best = routes.front();
      double best_us = 0;
      std::string line = fmt::format("{} rows {}:", key_name(family), rows);
      for (Route route : routes) {
        const KernelKey key = key_for(call.shape, route, device.arch);
        KDAJIT_TRY_ASSIGN(const LoadedKernel kernel, registry.load(ctx, key, /*allow_build=*/true));
        const PreparedLaunch prepared = prepare_launch(launch_plan(key, call.shape, device), /*pdl=*/false);
        auto run = [&] { return launch(*api, kernel.function, prepared, stream, call.params, key); };
        // Warm-up: the first launches settle clocks and caches.
        for (int w = 0; w < 2; ++w) KDAJIT_TRY(run());
        std::vector<double> us;
        for (int i = 0; i < o.reps; ++i) {
          KDAJIT_TRY(cu_check(*api, api->cuMemsetD32Async(flush.ptr(), static_cast<unsigned>(i), kFlushBytes / 4, stream),
                              "cuMemsetD32Async"));
          KDAJIT_TRY(cu_check(*api, api->cuEventRecord(start, stream), "cuEventRecord"));
          KDAJIT_TRY(run());
          KDAJIT_TRY(cu_check(*api, api->cuEventRecord(stop, stream), "cuEventRecord"));
          KDAJIT_TRY(cu_check(*api, api->cuEventSynchronize(stop), "cuEventSynchronize (the decode kernel)"));
          float ms = 0;
          KDAJIT_TRY(cu_check(*api, api->cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime"));
          us.push_back(ms * 1e3);
        }
        std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
        const double median = us[us.size() / 2];
        report.measurements.push_back({key_for(probe, route, device.arch), rows, median});
        line += fmt::format(" {} {:.2f} us", to_string(route), median);
        if (route == routes.front() || median < best_us) {
          best = route;
          best_us = median;
        }
      }
      report.table.add(family, TuneTable::Band{rows, best, best_us});
      if (o.progress) o.progress(fmt::format("{} -> {}", line, to_string(best)));
    }
  }
  const std::string root = cache->root();
  KDAJIT_TRY(report.table.save(root));
  report.path = TuneTable::path_for(root, report.table.identity());
  return report;
}

}  // namespace kdajit
