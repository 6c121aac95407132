// Cache benchmark: per key, a cold compile (generate + NVRTC + publish), a warm
// disk hit (read + verify the entry; on a GPU also cuModuleLoadData), and a
// memory hit (the launch path's registry lookup on a GPU, the cache's map without).
//   kdajit_bench_cache [--keys N] [--json FILE]
#include <chrono>
#include <filesystem>
#include <fstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kdajit/cache.hpp"
#include "kdajit/log.hpp"
#include "kdajit/presets.hpp"
#include "kdajit/runtime/call/select.hpp"
#include "kdajit/runtime/jit/obtain.hpp"
#include "kdajit/runtime/device/driver_api.hpp"
#include "kdajit/runtime/device/registry.hpp"

using namespace kdajit;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <class T>
T must(Result<T> r, const char* what) {
  if (!r) {
    fmt::print(stderr, "{}: {}\n", what, r.error().message);
    std::exit(1);
  }
  return std::move(r).value();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdajit cache benchmark"};
  size_t nkeys = 8;
  std::string json_path, root = (std::filesystem::temp_directory_path() / "kdajit-bench-cache").string();
  app.add_option("--keys", nkeys, "keys of the glm-5.3-flash preset to time")->capture_default_str();
  app.add_option("--root", root, "scratch cache root (cleared first)")->capture_default_str();
  app.add_option("--json", json_path, "write results here");
  CLI11_PARSE(app, argc, argv);
  set_log_level(LogLevel::quiet);

  const bool gpu = gpu_available();
  const Arch arch = gpu ? must(local_arch(0), "local_arch") : Arch::sm_90;
  auto keys = must(preset_keys("glm-5.3-flash", arch), "preset");
  keys.resize(std::min(nkeys, keys.size()));
  std::filesystem::remove_all(root);

  CUcontext ctx = nullptr;
  const DriverApi* api = nullptr;
  CUdevice dev = 0;
  if (gpu) {
    api = must(driver(), "driver");
    api->cuDeviceGet(&dev, 0);
    api->cuDevicePrimaryCtxRetain(&ctx, dev);
    api->cuCtxSetCurrent(ctx);
  }

  std::vector<double> cold, disk, load, mem_ns;
  auto rows = nlohmann::json::array();
  for (const auto& key : keys) {
    CacheOptions o;
    o.root = root;
    double t_cold = 0, t_disk = 0, t_load = 0, t_mem = 0;
    {
      KernelCache c(o);
      auto t0 = Clock::now();
      must(obtain(c, key, /*allow_build=*/true), "cold build");
      t_cold = ms_since(t0);
    }
    {
      KernelCache c(o);  // a new process's view: memory empty, disk warm
      auto t0 = Clock::now();
      auto e = must(obtain(c, key, /*allow_build=*/false), "disk hit").entry;
      t_disk = ms_since(t0);
      if (gpu) {
        auto t1 = Clock::now();
        CUmodule mod = nullptr;
        if (api->cuModuleLoadData(&mod, e->cubin.data()) != CUDA_SUCCESS) return 1;
        t_load = ms_since(t1);
        api->cuModuleUnload(mod);
      }
      // Memory hit of the cache's own map (no I/O).
      constexpr int kIters = 200000;
      auto t2 = Clock::now();
      size_t sink = 0;
      for (int i = 0; i < kIters; ++i) sink += c.find_loaded(key) != nullptr;
      t_mem = ms_since(t2) * 1e6 / kIters;
      if (sink != kIters) return 1;
    }
    cold.push_back(t_cold);
    disk.push_back(t_disk + t_load);
    load.push_back(t_load);
    mem_ns.push_back(t_mem);
    rows.push_back({{"key", key_name(key)}, {"cold_ms", t_cold}, {"disk_hit_ms", t_disk}, {"module_load_ms", t_load},
                    {"cache_map_hit_ns", t_mem}});
    fmt::print("{:<72} cold {:7.1f} ms  disk {:6.2f} ms  load {:5.2f} ms  map {:6.0f} ns\n", key_name(key), t_cold,
               t_disk, t_load, t_mem);
  }

  // The launch path's lookup on a call it has not seen: selection, the key and
  // (context, key) -> CUfunction in the registry (runtime.cpp, Impl::resolve).
  double registry_ns = -1;
  if (gpu) {
    CacheOptions o;
    o.root = root;
    auto cache = std::make_shared<KernelCache>(o);
    KernelRegistry reg(cache);
    const DeviceTraits device = must(device_traits(*api, dev, arch), "device traits");
    // One call shape per key, each mapped by the built-in selector.
    std::vector<CallShape> shapes;
    for (const auto& k : keys) {
      CallShape c;
      c.family = k;
      c.rows = 1024;
      c.num_seqs = k.op == Op::packed ? 256 : 0;
      const KernelKey selected = key_for(c, must(select_route(c, device, {}), "select"), device.arch);
      must(reg.load(ctx, selected, true), "registry load");
      shapes.push_back(c);
    }
    constexpr int kIters = 1000000;
    auto t0 = Clock::now();
    size_t sink = 0;
    for (int i = 0; i < kIters; ++i) {
      const CallShape& c = shapes[i % shapes.size()];
      auto route = select_route(c, device, {});
      sink += route && reg.find(ctx, key_for(c, *route, device.arch)).has_value();
    }
    registry_ns = ms_since(t0) * 1e6 / kIters;
    if (sink != kIters) return 1;
  }

  fmt::print("\nmedian over {} keys: cold compile {:.0f} ms | warm disk hit {:.2f} ms (read+verify {:.2f}, load {:.2f}) | "
             "memory hit: registry {:.0f} ns, cache map {:.0f} ns\n",
             keys.size(), median(cold), median(disk), median(disk) - median(load), median(load), registry_ns,
             median(mem_ns));
  if (!json_path.empty()) {
    nlohmann::json j{{"gpu", gpu},
                     {"arch", to_string(arch)},
                     {"keys", rows},
                     {"median_cold_ms", median(cold)},
                     {"median_disk_hit_ms", median(disk)},
                     {"median_module_load_ms", median(load)},
                     {"registry_hit_ns", registry_ns},
                     {"median_cache_map_hit_ns", median(mem_ns)}};
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  std::filesystem::remove_all(root);
  return 0;
}
