// kdajit_bench: kdajit's decode calls against the memory-pattern floor, on a grid
// of (op, H, N, T, state dtype, conv layout), plus the host cost of a call against
// a bare launch of the same kernel (bench/README.md says how to run it and what
// every number means).
//
// The run: open the device; compile the floor and fill kernels with NVRTC while
// every kdajit key the grid needs is compiled into the kernel cache in parallel;
// the copy roofline; then per family of cells (same op, H, dtype, layout, T)
// device buffers filled with random data on the device, and per cell: kdajit
// (graph replays, cold L2), each floor shape, the optional route / tuning / PDL
// timings, and the host loops. Tables on stdout at the end, JSON after each family.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "compile_kernels.hpp"
#include "device_data.hpp"
#include "grid.hpp"
#include "kdajit_api.hpp"
#include "measure.hpp"
#include "report.hpp"

namespace kdajit::bench {
namespace {

// Exit codes (README): 0 all measured, 1 a decode or CUDA call failed,
// 2 usage error or no usable CUDA device, 3 time limit hit (partial results),
// 4 the GPU hung (a wait or the watchdog ran out of time).
enum ExitCode : int { kExitOk = 0, kExitFailed = 1, kExitUsage = 2, kExitTimeLimit = 3, kExitHung = 4 };

// Kills the process if the run outlives its hard limit: the last guard against
// a hang inside a CUDA call that no timeout of ours covers.
class Watchdog {
 public:
  explicit Watchdog(double seconds)
      : thread_([this, seconds] {
          std::unique_lock<std::mutex> l(m_);
          if (!cv_.wait_for(l, std::chrono::duration<double>(seconds), [this] { return done_; })) {
            std::fprintf(stderr, "kdajit_bench: watchdog: still running after %.0f s (a hung GPU or call); exiting\n",
                         seconds);
            std::fflush(nullptr);
            std::_Exit(kExitHung);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> l(m_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

// Opens the device; a machine without one is a usage error (exit 2), not a crash.
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

// D2D copy bandwidth, read + write bytes counted: the roofline. Then the host
// cost of a 4-byte cudaMemsetAsync, a launch-like baseline for the host column.
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

// Compiles the floor and fill kernels (one thread) while the kdajit keys of the
// grid build in the cache (the other threads), then loads the two modules.
Status prepare_kernels(Bench& b, const std::vector<Cell>& cells) {
  int max_t = 1;
  for (const Cell& c : cells) max_t = std::max(max_t, c.tokens);
  Result<BenchCubins> cubins = Error(ErrorCode::internal, "not compiled");
  std::thread nvrtc([&] { cubins = compile_bench_kernels(b.arch, max_t); });
  const std::vector<std::string> keys = keys_to_prewarm(b, cells);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  b.prewarm = prewarm(*b.main, keys, b.opt.jobs > 0 ? b.opt.jobs : std::max(1, hw - 1));
  nvrtc.join();
  fmt::print(stderr, "kdajit_bench: prewarm: {} kdajit keys in {:.1f} s ({} failed)\n", b.prewarm.keys,
             b.prewarm.seconds, b.prewarm.failed);
  for (const auto& e : b.prewarm.errors) fmt::print(stderr, "kdajit_bench: prewarm: {}\n", e);
  KDAJIT_TRY(cubins);
  KDAJIT_TRY(b.floor.load(cubins->floor.cubin, b.sms, b.smem_per_sm, max_t));
  KDAJIT_TRY(b.fill.load(cubins->fill.cubin));
  b.kernels_info = kernels_json(*cubins);
  nlohmann::json regs = nlohmann::json::object();
  for (Op op : kDecodeOps)  // the floor kernels are the decode ops
    for (StateDtype st : all_values<StateDtype>())
      for (int sh = 0; sh < kFloorKernelCount; ++sh) regs[floor_entry(op, st, sh)] = b.floor.registers(op, st, sh);
  b.kernels_info["floor_registers"] = regs;
  return {};
}

int run(Bench& b, const std::vector<Cell>& cells, Clock::time_point t_start) {
  const Options& o = b.opt;
  std::vector<CellResult> results(cells.size());
  const auto deadline =
      t_start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.time_limit_s));
  auto elapsed = [&] { return seconds_since(t_start); };

  if (Status st = open_device(o.device); !st) {
    fmt::print(stderr, "kdajit_bench: {}\n", st.error().message);
    return kExitUsage;
  }
  auto setup = [&]() -> Status {
    KDAJIT_TRY(describe_device(b));
    KDAJIT_TRY(bench_driver());
    BENCH_CUDA(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
    KDAJIT_TRY(b.events.create(std::max(o.iters, o.copy_reps)));
    b.timing = TimingContext{b.stream, &b.events, &b.flush, o.iters, o.gpu_timeout_s, true, 0};
    KDAJIT_TRY(create_runtimes(b));
    KDAJIT_TRY(prepare_kernels(b, cells));
    return measure_baselines(b);
  };
  const std::vector<Family> fams = make_families(cells);
  fmt::print(stderr, "kdajit_bench: {} cells in {} families\n", cells.size(), fams.size());
  int rc = kExitOk;
  std::string run_status = "running";  // what a JSON written mid-run (or left by a killed run) says
  auto save = [&] {
    if (o.json_path.empty()) return;
    if (Status st = write_json(o.json_path, report_json(b, cells, results, run_status, elapsed())); !st) {
      fmt::print(stderr, "kdajit_bench: {}\n", st.error().message);
      if (rc == kExitOk) rc = kExitFailed;
    }
  };
  if (Status st = setup(); !st) {
    fmt::print(stderr, "kdajit_bench: setup: {}\n", st.error().message);
    rc = gpu_hung() ? kExitHung : kExitFailed;
    run_status = gpu_hung() ? "gpu_hung" : "failed";
    for (CellResult& m : results) m.error = "setup failed: " + st.error().message;
    save();
    return rc;
  }
  fmt::print(stderr, "kdajit_bench: {} ({} SMs, {}), copy roofline {:.0f} GB/s, memset host {:.2f} us\n",
             b.gpu.value("name", std::string("?")), b.sms, b.arch, b.copy_gbps, b.memset_host_us.median);
  // A failure that leaves the context unusable (a sticky error, a hang) stops the run.
  auto context_usable = [&] {
    if (gpu_hung()) return false;
    (void)cudaGetLastError();  // clears a non-sticky error; a sticky one shows in the wait
    return wait_stream(b.stream, o.gpu_timeout_s, "stream after a failure").ok();
  };
  bool stopped = false;
  size_t done = 0;
  for (size_t fi = 0; fi < fams.size() && !stopped && Clock::now() < deadline; ++fi) {
    const Family& f = fams[fi];
    std::unique_ptr<DeviceData> data;
    {
      size_t free_b = 0, total_b = 0;
      const size_t need = DeviceData::bytes_needed(f.shape);
      Status st = cuda_status(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
      if (st && need + (size_t{1} << 30) > free_b)
        st = Error(ErrorCode::cuda, fmt::format("the family needs {:.2f} GiB of device memory, {:.2f} GiB free",
                                                need / 1073741824.0, free_b / 1073741824.0));
      if (st) {
        if (auto d = DeviceData::create(f.shape, b.fill, b.stream, 1000 + fi, o.gpu_timeout_s))
          data = std::move(d).value();
        else
          st = std::move(d).error();
      }
      if (!st) {
        for (size_t ci : f.cells) {
          results[ci].status = "failed";
          results[ci].error = "device data: " + st.error().message;
        }
        rc = gpu_hung() ? kExitHung : kExitFailed;
        if (!context_usable()) stopped = true;
        continue;
      }
    }
    for (size_t ci : f.cells) {
      const Cell& c = cells[ci];
      CellResult& m = results[ci];
      if (Clock::now() > deadline) {
        m.error = "time limit";
        continue;
      }
      const Status st = measure_cell(b, c, narrow_args(c, data->args()), m);
      ++done;
      if (!st) {
        m.status = "failed";
        m.error = st.error().message;
        rc = gpu_hung() ? kExitHung : kExitFailed;
        fmt::print(stderr, "[{}/{}] {}: FAILED: {}\n", done, cells.size(), cell_name(c), m.error);
        if (!context_usable()) {
          run_status = gpu_hung() ? "gpu_hung" : "cuda_context_lost";
          stopped = true;
          break;
        }
        continue;
      }
      if (m.sub_failures > 0 && rc == kExitOk) rc = kExitFailed;
      fmt::print(stderr, "[{}/{}] {}: {} {:.2f} us, floor {:.2f} us ({}), ratio {:.2f}; host {:.2f} us, bare {}\n",
                 done, cells.size(), cell_name(c), m.route, m.device.median, m.floor_us, m.floor_shape,
                 m.floor_us > 0 ? m.device.median / m.floor_us : 0.0, m.host.per_call.median,
                 m.bare.status == "ok" ? fmt::format("{:.2f} us", m.bare_host.per_call.median) : m.bare.status);
    }
    data.reset();
    save();
  }
  for (CellResult& m : results)
    if (m.status == "skipped" && m.error.empty())
      m.error = gpu_hung() ? "the GPU hung" : stopped ? "stopped after an earlier failure" : "time limit";
  const bool timed_out =
      std::any_of(results.begin(), results.end(), [](const CellResult& m) { return m.error == "time limit"; });
  if (timed_out && rc == kExitOk) {
    rc = kExitTimeLimit;
    run_status = "time_limit";
  }
  if (run_status == "running") run_status = rc == kExitOk ? "ok" : "failed";
  if (timed_out) fmt::print(stderr, "kdajit_bench: time limit of {:.0f} s reached: partial results\n", o.time_limit_s);
  print_tables(b, cells, results);
  save();
  if (!o.json_path.empty()) fmt::print("json: {}\n", o.json_path);
  fmt::print("total: {:.1f} s, exit {}\n", elapsed(), rc);
  return rc;
}

// --routes: "selector" -> none, "all" -> every route of the ops in the grid, else the named ones.
Result<std::vector<std::string>> resolve_routes(const Options& o, const std::vector<Cell>& cells) {
  std::vector<std::string> known;
  std::set<Op> ops;
  for (const Cell& c : cells) ops.insert(c.op);
  for (Op op : ops)
    for (std::string_view r : kdajit::route_names(op))
      if (std::find(known.begin(), known.end(), r) == known.end()) known.emplace_back(r);
  if (o.routes == "selector") return std::vector<std::string>{};
  if (o.routes == "all") return known;
  std::vector<std::string> out;
  std::stringstream ss(o.routes);
  for (std::string r; std::getline(ss, r, ',');) {
    if (std::find(known.begin(), known.end(), r) == known.end())
      return invalid_argument(fmt::format("--routes: unknown route '{}' (this kdajit has: {})", r, fmt::join(known, ", ")));
    if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
  }
  return out;
}

}  // namespace
}  // namespace kdajit::bench

int main(int argc, char** argv) {
  using namespace kdajit::bench;
  const auto t_start = Clock::now();
  Options o;
  CLI::App app{"kdajit_bench: kdajit's decode calls against the memory-pattern floor, and the host cost per call"};
  app.add_option("--op", o.op, kdajit::choices<kdajit::Op>(" | ") + " | all")->capture_default_str();
  app.add_option("--heads", o.heads, "H values (default: single 8,16,32,64,96; packed 16,64)")->delimiter(',');
  app.add_option("--rows", o.rows, "R of the single op, N of the packed op (default 1,2,...,512 / 1,8,32,128)")
      ->delimiter(',');
  app.add_option("--tokens", o.tokens, "T values of the packed op (default 2,3,4,8; every sequence L = T)")
      ->delimiter(',');
  app.add_option("--state", o.states, "state dtypes: " + kdajit::choices<kdajit::StateDtype>(",") + " (default: all)")
      ->delimiter(',');
  app.add_option("--conv", o.convs,
                 "conv_state layouts: " + kdajit::choices<kdajit::ConvLayout>(",") +
                     " (default: sd, plus ds at H 64 (packed: T 4))")
      ->delimiter(',');
  app.add_option("--routes", o.routes, "selector | all | NAME,NAME: also time these routes forced")
      ->capture_default_str();
  app.add_option("--tuning", o.tuning, "off | on | both: RuntimeOptions::use_tuning of the selector")
      ->capture_default_str();
  app.add_flag("--pdl", o.pdl, "also time two dependent calls in one graph, without and with PDL");
  app.add_option("--floor-shapes", o.floor_shapes,
                 "floor launch shapes to try (default: cta256,split4x128,persist4x128); also diagnostic ones, not "
                 "counted as the floor: cta256x2, cta256x3, cta256x4 (cta256 at most 2, 3, 4 CTAs per SM)")
      ->delimiter(',');
  app.add_option("--floor-spin-cycles", o.floor_spin_cycles,
                 "diagnostic floor shapes only: clock cycles each thread waits between its state loads landing and "
                 "its stores (a stand-in for the op's arithmetic)")
      ->capture_default_str();
  app.add_option("--iters", o.iters, "timed graph replays per measurement")->capture_default_str();
  app.add_option("--host-calls", o.host_calls, "calls of the host-cost loops (cut for slow kernels)")
      ->capture_default_str();
  app.add_flag("!--no-warm", o.warm, "skip the replays without the L2 flush");
  app.add_option("--json", o.json_path, "write every number to this JSON file");
  app.add_option("--commit", o.commit, "git commit recorded in the JSON");
  app.add_option("--device", o.device, "CUDA device ordinal")->capture_default_str();
  app.add_option("--cache-dir", o.cache_dir,
                 "kernel cache (default: KDAJIT_CACHE_DIR, $XDG_CACHE_HOME/kdajit, ~/.cache/kdajit)");
  app.add_option("--jobs", o.jobs, "parallel kdajit compiles of the prewarm (0: cores - 1)")->capture_default_str();
  app.add_option("--time-limit", o.time_limit_s, "seconds after which remaining cells are skipped (exit 3)")
      ->capture_default_str();
  app.add_option("--gpu-timeout", o.gpu_timeout_s, "seconds any one wait for the GPU may take before it counts as hung")
      ->capture_default_str();
  app.add_option("--flush-mib", o.flush_mib, "L2 flush buffer (at least 4x the L2 is used)")->capture_default_str();
  app.add_option("--copy-mib", o.copy_mib, "size of the roofline copy")->capture_default_str();
  app.add_option("--copy-reps", o.copy_reps, "timed roofline copies")->capture_default_str();
  app.add_flag("--list", o.list, "print the cells, their bytes and a time estimate, then exit (no GPU needed)");
  app.add_flag("--compile-only", o.compile_only,
               "compile the floor and fill kernels with NVRTC for --arch and print their resources (no GPU needed)");
  app.add_option("--arch", o.arch, "arch of --compile-only")->capture_default_str();
  app.add_flag("-v,--verbose", o.verbose, "kdajit runtime log at info level");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  auto bad = [](const std::string& msg) {
    std::fprintf(stderr, "kdajit_bench: %s\n", msg.c_str());
    return kExitUsage;
  };
  if (o.compile_only) return compile_only(o.arch) ? 0 : kExitFailed;
  if (o.iters < 1 || o.iters > 100000) return bad(fmt::format("--iters: expected 1..100000, got {}", o.iters));
  if (o.host_calls < 1 || o.host_calls > 1000000)
    return bad(fmt::format("--host-calls: expected 1..1000000, got {}", o.host_calls));
  if (o.copy_reps < 1 || o.copy_reps > 1000) return bad(fmt::format("--copy-reps: expected 1..1000, got {}", o.copy_reps));
  if (o.copy_mib < 1 || o.copy_mib > 65536) return bad(fmt::format("--copy-mib: expected 1..65536, got {}", o.copy_mib));
  if (o.flush_mib < 1 || o.flush_mib > 65536)
    return bad(fmt::format("--flush-mib: expected 1..65536, got {}", o.flush_mib));
  if (!(o.time_limit_s > 0)) return bad(fmt::format("--time-limit: expected > 0 s, got {}", o.time_limit_s));
  if (!(o.gpu_timeout_s > 0)) return bad(fmt::format("--gpu-timeout: expected > 0 s, got {}", o.gpu_timeout_s));
  if (o.floor_spin_cycles < 0 || o.floor_spin_cycles > 100000000)
    return bad(fmt::format("--floor-spin-cycles: expected 0..100000000, got {}", o.floor_spin_cycles));
  if (o.jobs < 0 || o.jobs > 1024) return bad(fmt::format("--jobs: expected 0..1024, got {}", o.jobs));
  if (o.tuning != "off" && o.tuning != "on" && o.tuning != "both")
    return bad(fmt::format("--tuning: expected off, on or both, got '{}'", o.tuning));
  auto cells = make_cells(o);
  if (!cells) return bad(cells.error().message);
  if (cells->empty()) return bad("no cell selected");
  auto routes = resolve_routes(o, *cells);
  if (!routes) return bad(routes.error().message);
  std::vector<int> shapes;
  for (const std::string& s : o.floor_shapes) {
    const int i = floor_shape_index(s);
    if (i < 0) return bad(fmt::format("--floor-shapes: unknown shape '{}'", s));
    if (std::find(shapes.begin(), shapes.end(), i) == shapes.end()) shapes.push_back(i);
  }
  if (shapes.empty())
    for (int i = 0; i < kFloorKernelCount; ++i) shapes.push_back(i);
  if (std::all_of(shapes.begin(), shapes.end(), [](int i) { return kFloorShapes[static_cast<size_t>(i)].diagnostic(); }))
    return bad("--floor-shapes: expected at least one floor shape (cta256, split4x128, persist4x128) beside the "
               "diagnostic ones");

  if (o.list) {
    // Each cell's arguments (stand-in pointers) through kdajit's validation and the floor's checks.
    const auto fams = make_families(*cells);
    std::vector<std::string> arg_errors(cells->size());
    for (const Family& f : fams)
      for (size_t ci : f.cells) {
        const Cell& c = (*cells)[ci];
        const kdajit_decode_args_t a = narrow_args(c, stand_in_args(f.shape));
        if (kdajit_validate_args(c_op(c.op), &a) != KDAJIT_OK)
          arg_errors[ci] = fmt::format("kdajit_validate_args: {}", kdajit_last_error());
        else if (auto fp = floor_params(c, a); !fp)
          arg_errors[ci] = fp.error().message;
      }
    fmt::print("{:<34} {:>14}  {}\n", "cell", "bytes/call", "args");
    for (size_t i = 0; i < cells->size(); ++i)
      fmt::print("{:<34} {:>14}  {}\n", cell_name((*cells)[i]), bytes_per_call((*cells)[i]),
                 arg_errors[i].empty() ? "ok" : arg_errors[i]);
    const size_t bad_args = static_cast<size_t>(std::count_if(arg_errors.begin(), arg_errors.end(),
                                                              [](const std::string& e) { return !e.empty(); }));
    size_t dev = 0;
    for (const auto& f : fams) dev = std::max(dev, DeviceData::bytes_needed(f.shape));
    fmt::print("{} cells in {} families (largest family {:.2f} GiB of device buffers); routes timed: {}\n",
               cells->size(), fams.size(), static_cast<double>(dev) / 1073741824.0,
               routes->empty() ? std::string("selector only") : fmt::format("{}", fmt::join(*routes, ", ")));
    fmt::print("estimated GPU time on an H200: {:.0f} s (plus setup: prewarm compiles, NVRTC)\n",
               estimate_seconds(o, *cells));
    if (bad_args > 0) fmt::print("{} cells with invalid arguments\n", bad_args);
    return bad_args > 0 ? kExitFailed : 0;
  }

  int rc = kExitFailed;
  {
    // The hard limit leaves room for the table, the JSON and a slow last wait.
    Watchdog watchdog(o.time_limit_s + o.gpu_timeout_s + 30);
    Bench b;
    b.opt = o;
    b.routes = *routes;
    b.floor_shapes = shapes;
    rc = run(b, *cells, t_start);
    if (gpu_hung()) {
      // Nothing more to wait for: a hung GPU would block teardown.
      std::fflush(nullptr);
      std::_Exit(rc);
    }
  }
  return rc;
}
