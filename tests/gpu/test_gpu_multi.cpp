// Several GPUs in one process: calls alternating between devices from several
// threads, a CUDA graph captured on device 1 and replayed, each device's routes
// from its own SM count, one module load per (device, key), and results equal
// to the f64 reference on every device. The binary exits 77 below two GPUs.
#include <cuda.h>
#include <cuda_runtime.h>

#include <memory>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gpu_harness.hpp"
#include "kdajit/kernel_key.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/runtime/api/runtime_impl.hpp"
#include "kdajit/runtime/call/select.hpp"
#include "kdajit/runtime/call/validate.hpp"
#include "kdajit/runtime/device/driver_api.hpp"

using namespace kdajit;
using kdajit::ref::Problem;
using kdajit::ref::ProblemSpec;
using kdajit::test::DeviceProblem;

namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// What the selector should see of device `d`, read through the CUDA runtime
// (not through kdajit).
DeviceTraits traits_of(int d) {
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, d) == cudaSuccess);
  auto arch = arch_for_compute_capability(prop.major, prop.minor);
  REQUIRE(arch.ok());
  return {*arch, prop.multiProcessorCount};
}

std::unique_ptr<Runtime::Impl> make_runtime(RuntimeOptions opts = {}) {
  opts.use_tuning = false;  // the built-in bands: what the SM count decides
  auto rt = Runtime::Impl::create(opts);
  if (!rt) FAIL("Runtime::Impl::create: " << rt.error().message);
  return std::move(rt).value();
}

Problem make(const ProblemSpec& spec) {
  auto p = Problem::make(spec);
  if (!p) FAIL("Problem::make: " << p.error().message);
  return std::move(p).value();
}

KernelKey family(Op op, int heads, StateDtype state, int t, Arch arch) {
  return {op, heads, state, ConvLayout::sd, t, Gate::bounded, Route::rowcta, arch};
}

// A problem with its device copy on device `d` and a stream there.
struct OnDevice {
  int device = 0;
  Problem expected, got;
  std::unique_ptr<DeviceProblem> dev;
  cudaStream_t stream = nullptr;

  OnDevice(int d, const ProblemSpec& spec) : device(d), expected(make(spec)), got(expected) {
    KDAJIT_CUDA_CHECK(cudaSetDevice(d));
    dev = std::make_unique<DeviceProblem>(got);
    KDAJIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~OnDevice() {
    cudaSetDevice(device);
    dev.reset();
    if (stream) cudaStreamDestroy(stream);
  }
  Status run(Runtime::Impl& rt) {
    return rt.decode(got.op() == KDAJIT_OP_SINGLE ? Op::single : Op::packed, dev->args(),
                     reinterpret_cast<kdajit_stream_t>(stream));
  }
  void check() {
    KDAJIT_CUDA_CHECK(cudaSetDevice(device));
    dev->download(got);
    REQUIRE(expected.run_reference().ok());
    auto rep = ref::compare(expected, got);
    INFO("device " << device << ": " << rep.summary());
    INFO(rep.message);
    CHECK(rep.pass);
  }
};

// Two shapes per op whose selected keys differ (a split route and rowcta or
// stream on an H200-class part), so each device loads several keys.
std::vector<ProblemSpec> specs_for(Arch arch, uint64_t seed) {
  std::vector<ProblemSpec> out;
  for (int64_t rows : {2, 40}) {
    ProblemSpec s = ref::default_spec(family(Op::single, 8, StateDtype::bf16, 1, arch), seed++);
    s.rows = rows;
    out.push_back(s);
  }
  for (int t : {2, 4}) out.push_back(ref::default_spec(family(Op::packed, 8, StateDtype::f32, t, arch), seed++));
  return out;
}

}  // namespace

TEST_CASE("calls alternate between devices from several threads; one module load per (device, key)", "[gpu][multi]") {
  const int devices = device_count();
  REQUIRE(devices >= 2);
  auto rt = make_runtime();
  constexpr int kThreads = 4;
  // Each thread owns its problems (the calls write their state), one set per device.
  std::vector<std::vector<std::unique_ptr<OnDevice>>> work(kThreads);
  std::set<std::pair<int, std::string>> keys;  // (device, key) the calls select
  for (int t = 0; t < kThreads; ++t)
    for (int d = 0; d < devices; ++d)
      for (const auto& spec : specs_for(traits_of(d).arch, 100 * t + 10 * d))
        work[t].push_back(std::make_unique<OnDevice>(d, spec));
  // The launching threads never set a current device: each call follows its stream.
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      // Device 0, 1, ..., 0, 1, ...: the problems were made device by device.
      const size_t per_device = work[t].size() / devices;
      for (size_t i = 0; i < per_device && errors[t].empty(); ++i)
        for (int d = 0; d < devices; ++d)
          if (Status s = work[t][d * per_device + i]->run(*rt); !s) errors[t] = s.error().message;
    });
  for (auto& th : threads) th.join();
  for (const auto& e : errors) CHECK(e.empty());
  for (auto& per_thread : work)
    for (auto& w : per_thread) {
      KDAJIT_CUDA_CHECK(cudaSetDevice(w->device));
      auto key = rt->selected_key(w->got.op() == KDAJIT_OP_SINGLE ? Op::single : Op::packed, w->dev->args(),
                                  reinterpret_cast<kdajit_stream_t>(w->stream));
      REQUIRE(key.ok());
      keys.insert({w->device, key_name(*key)});
      w->check();
    }
  // Every device loaded each of its keys once, whatever the threads did.
  CHECK(rt->registry->module_loads() == keys.size());
  const DriverApi& api = *driver().value();
  for (int d = 0; d < devices; ++d) {
    CUdevice dev = 0;
    CUcontext primary = nullptr;
    REQUIRE(api.cuDeviceGet(&dev, d) == CUDA_SUCCESS);
    REQUIRE(api.cuDevicePrimaryCtxRetain(&primary, dev) == CUDA_SUCCESS);
    size_t on_device = 0;
    for (const auto& k : keys) on_device += k.first == d ? 1 : 0;
    CHECK(rt->registry->kernels_in(primary) == on_device);
    api.cuDevicePrimaryCtxRelease(dev);
  }
}

TEST_CASE("each device's route comes from its own SM count", "[gpu][multi]") {
  const int devices = device_count();
  REQUIRE(devices >= 2);
  auto rt = make_runtime();
  for (int d = 0; d < devices; ++d) {
    const DeviceTraits traits = traits_of(d);
    INFO("device " << d << ": " << to_string(traits.arch) << ", " << traits.sm_count << " SMs");
    for (int64_t rows : {1, 3, 9, 17, 34, 64}) {
      ProblemSpec s = ref::default_spec(family(Op::single, 8, StateDtype::bf16, 1, traits.arch), 7000 + rows);
      s.rows = rows;
      OnDevice w(d, s);
      // The current device is another one: the stream decides.
      KDAJIT_CUDA_CHECK(cudaSetDevice((d + 1) % devices));
      auto call = validate_decode(Op::single, w.dev->args());
      REQUIRE(call.ok());
      const KernelKey want = key_for(call->shape, builtin_route(call->shape, traits), traits.arch);
      auto got = rt->selected_key(Op::single, w.dev->args(), reinterpret_cast<kdajit_stream_t>(w.stream));
      INFO("rows " << rows);
      REQUIRE(got.ok());
      CHECK(key_name(*got) == key_name(want));
    }
  }
}

TEST_CASE("a CUDA graph captured on device 1 replays there with new data", "[gpu][multi]") {
  REQUIRE(device_count() >= 2);
  auto rt = make_runtime();
  const Arch arch = traits_of(1).arch;
  for (Op op : {Op::single, Op::packed}) {
    ProblemSpec s = ref::default_spec(family(op, 16, StateDtype::bf16, op == Op::single ? 1 : 4, arch), 4242);
    if (op == Op::single) s.rows = 20;
    OnDevice w(1, s);
    // Load the kernel outside the capture (a compile during a capture is refused).
    REQUIRE(w.run(*rt).ok());
    KDAJIT_CUDA_CHECK(cudaStreamSynchronize(w.stream));
    w.dev->upload(w.got);
    cudaGraph_t graph = nullptr;
    KDAJIT_CUDA_CHECK(cudaStreamBeginCapture(w.stream, cudaStreamCaptureModeGlobal));
    Status captured = w.run(*rt);
    KDAJIT_CUDA_CHECK(cudaStreamEndCapture(w.stream, &graph));
    INFO((captured ? std::string() : captured.error().message));
    REQUIRE(captured.ok());
    cudaGraphExec_t exec = nullptr;
    KDAJIT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    // Replays, each on fresh data of the same shapes.
    for (uint64_t seed : {4242u, 4343u}) {
      s.seed = seed;
      Problem fresh = make(s);
      w.expected = fresh;
      w.got = fresh;
      KDAJIT_CUDA_CHECK(cudaSetDevice(1));
      w.dev->upload(w.got);
      KDAJIT_CUDA_CHECK(cudaGraphLaunch(exec, w.stream));
      w.check();
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

TEST_CASE("a runtime pinned to device 1 launches there whatever the current device", "[gpu][multi]") {
  REQUIRE(device_count() >= 2);
  RuntimeOptions opts;
  opts.device = 1;
  auto rt = make_runtime(opts);
  for (const auto& spec : specs_for(traits_of(1).arch, 900)) {
    OnDevice w(1, spec);
    KDAJIT_CUDA_CHECK(cudaSetDevice(0));
    Status s = w.run(*rt);
    INFO((s ? std::string() : s.error().message));
    REQUIRE(s.ok());
    w.check();
  }
}

TEST_CASE("with no current context and several GPUs, -1 names no device", "[gpu][multi]") {
  const int devices = device_count();
  REQUIRE(devices >= 2);
  std::set<Arch> archs;
  for (int d = 0; d < devices; ++d) archs.insert(traits_of(d).arch);
  // A new thread has no current context until it makes one.
  std::string error;
  bool shared_arch_ok = false;
  std::thread([&] {
    const DriverApi& api = *driver().value();
    CUcontext ctx = nullptr;
    api.cuCtxGetCurrent(&ctx);
    if (ctx) {
      error = "the new thread has a current context";
      return;
    }
    auto dev = device_for(api, -1);
    error = dev ? std::string("device_for(-1) picked a device") : dev.error().message;
    // The arch is still known when every GPU has the same one.
    auto arch = local_arch(-1);
    shared_arch_ok = archs.size() == 1 ? (arch.ok() && *arch == *archs.begin()) : !arch.ok();
  }).join();
  CHECK(error.find("no context is current") != std::string::npos);
  CHECK(error.find("device ordinal in 0..") != std::string::npos);
  CHECK(shared_arch_ok);
}
