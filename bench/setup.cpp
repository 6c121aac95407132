#include "setup.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "compile_kernels.hpp"
#include "report.hpp"

namespace kdajit::bench {

Status open_device(int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return Error(ErrorCode::unsupported, fmt::format("no CUDA device (cudaGetDeviceCount: {})",
                                                     e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)));
  if (device < 0 || device >= count)
    return Error(ErrorCode::unsupported, fmt::format("--device: expected 0..{}, got {}", count - 1, device));
  if (cudaError_t r = cudaSetDevice(device); r != cudaSuccess)
    return Error(ErrorCode::unsupported, fmt::format("no usable CUDA device (cudaSetDevice: {})", cudaGetErrorString(r)));
  if (cudaError_t r = cudaFree(nullptr); r != cudaSuccess)  // creates the primary context the runtime launches into
    return Error(ErrorCode::unsupported,
                 fmt::format("no usable CUDA device (context creation: {})", cudaGetErrorString(r)));
  return {};
}

Status describe_device(Bench& b) {
  const int dev = b.opt.device;
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, dev));
  int sms = 0, l2 = 0, driver = 0, runtime = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  BENCH_CUDA(cudaDriverGetVersion(&driver));
  BENCH_CUDA(cudaRuntimeGetVersion(&runtime));
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess) bus[0] = 0;
  b.sms = sms;
  b.smem_per_sm = static_cast<int>(prop.sharedMemPerMultiprocessor);
  b.arch = arch_of(prop.major, prop.minor);
  b.gpu = nlohmann::json{{"name", prop.name},
                         {"device", dev},
                         {"pci_bus_id", bus},
                         {"compute_capability", fmt::format("{}.{}", prop.major, prop.minor)},
                         {"sms", sms},
                         {"l2_bytes", l2},
                         {"memory_bytes", prop.totalGlobalMem},
                         {"cuda_driver_version", fmt::format("{}.{}", driver / 1000, driver % 1000 / 10)},
                         {"cuda_runtime_version", fmt::format("{}.{}", runtime / 1000, runtime % 1000 / 10)},
                         {"nvidia_driver", first_line_of("/proc/driver/nvidia/version")}};
  // The flush must exceed the L2 several times over.
  const size_t flush = std::max(static_cast<size_t>(b.opt.flush_mib) << 20, 4 * static_cast<size_t>(l2));
  KDAJIT_TRY(b.flush.allocate(flush));
  return {};
}

Status measure_baselines(Bench& b) {
  const size_t bytes = static_cast<size_t>(b.opt.copy_mib) << 20;
  DeviceBuffer src, dst;
  KDAJIT_TRY(src.allocate(bytes));
  KDAJIT_TRY(dst.allocate(bytes));
  BENCH_CUDA(cudaMemsetAsync(src.get(), 1, bytes, b.stream));
  BENCH_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, b.stream));  // warm-up
  KDAJIT_TRY(wait_stream(b.stream, b.opt.gpu_timeout_s, "copy warm-up"));
  int timeouts = 0;
  KDAJIT_TRY_ASSIGN(
      std::vector<double> us,
      time_on_stream(
          b.stream, b.events, b.opt.copy_reps, b.opt.gpu_timeout_s, b.timing.gating, &timeouts,
          [](int) { return Status{}; },
          [&](int) {
            return cuda_status(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, b.stream),
                               "cudaMemcpyAsync(D2D)");
          }));
  if (timeouts > 0) b.timing.gating = false;
  b.copy_us = summarize(us);
  if (b.copy_us.median <= 0) return Error(ErrorCode::cuda, "copy bandwidth: a zero median time");
  b.copy_gbps = 2.0 * static_cast<double>(bytes) / (b.copy_us.median * 1e-6) / 1e9;
  KDAJIT_TRY_ASSIGN(HostLoop memset, host_loop(b.opt.host_calls, b.stream, b.opt.gpu_timeout_s, [&] {
                      return cuda_status(cudaMemsetAsync(b.flush.get(), 0, 4, b.stream), "cudaMemsetAsync(4 bytes)");
                    }));
  b.memset_host_us = memset.per_call;
  return {};
}

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "kdajit_bench: %s\n", msg.c_str());
  return kExitUsage;
}

Result<BenchCubins> compile_while_prewarming(Bench& b, const std::function<Result<BenchCubins>()>& compile,
                                             const std::function<std::vector<std::string>()>& keys) {
  Result<BenchCubins> cubins = Error(ErrorCode::internal, "not compiled");
  std::thread nvrtc([&] { cubins = compile(); });
  const std::vector<std::string> to_build = keys();
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  b.prewarm = prewarm(*b.main, to_build, b.opt.jobs > 0 ? b.opt.jobs : std::max(1, hw - 1));
  nvrtc.join();
  fmt::print(stderr, "kdajit_bench: prewarm: {} kdajit keys in {:.1f} s ({} failed)\n", b.prewarm.keys,
             b.prewarm.seconds, b.prewarm.failed);
  for (const auto& e : b.prewarm.errors) fmt::print(stderr, "kdajit_bench: prewarm: {}\n", e);
  return cubins;
}

Status set_up_run(Bench& b, int event_pairs, const std::function<Status()>& prepare) {
  KDAJIT_TRY(describe_device(b));
  KDAJIT_TRY(bench_driver());
  BENCH_CUDA(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
  KDAJIT_TRY(b.events.create(event_pairs));
  b.timing = TimingContext{b.stream, &b.events, &b.flush, b.opt.iters, b.opt.gpu_timeout_s, true, 0};
  KDAJIT_TRY(create_runtimes(b));
  KDAJIT_TRY(prepare());
  return measure_baselines(b);
}

std::string routes_timed_text(const std::vector<std::string>& routes) {
  return routes.empty() ? std::string("selector only") : fmt::format("{}", fmt::join(routes, ", "));
}

int finish_list(double estimated_seconds, size_t bad_args) {
  fmt::print("estimated GPU time on an H200: {:.0f} s (plus setup: prewarm compiles, NVRTC)\n", estimated_seconds);
  if (bad_args > 0) fmt::print("{} cells with invalid arguments\n", bad_args);
  return bad_args > 0 ? kExitFailed : kExitOk;
}

int run_guarded(const Options& o, const std::function<int(Bench&)>& run) {
  int rc = kExitFailed;
  {
    // The hard limit leaves room for the table, the JSON and a slow last wait.
    Watchdog watchdog(o.time_limit_s + o.gpu_timeout_s + 30);
    Bench b;
    b.opt = o;
    rc = run(b);
    if (gpu_hung()) {
      // Nothing more to wait for: a hung GPU would block teardown.
      std::fflush(nullptr);
      std::_Exit(rc);
    }
  }
  return rc;
}

}  // namespace kdajit::bench
