// kdajit_bench: kdajit's decode calls against the memory-pattern floor, on a grid
// of (op, H, N, T, state dtype, conv layout), plus the host cost of a call against
// a bare launch of the same kernel (bench/README.md says how to run it and what
// every number means). --op prefill runs the prefill grid instead (prefill_run.hpp).
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
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "compile_kernels.hpp"
#include "device_data.hpp"
#include "grid.hpp"
#include "kdajit_api.hpp"
#include "measure.hpp"
#include "prefill_run.hpp"
#include "report.hpp"
#include "setup.hpp"

namespace kdajit::bench {
namespace {

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

}  // namespace
}  // namespace kdajit::bench

int main(int argc, char** argv) {
  using namespace kdajit::bench;
  const auto t_start = Clock::now();
  Options o;
  CLI::App app{"kdajit_bench: kdajit's decode calls against the memory-pattern floor and the host cost per call; "
               "the prefill op against its memory and tensor-core floors (--op prefill)"};
  add_options(app, o);
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
  if (kdajit::Status st = finish_options(app, o); !st) return bad(st.error().message);
  if (is_prefill(o)) return prefill_main(o, t_start);
  auto cells = make_cells(o);
  if (!cells) return bad(cells.error().message);
  if (cells->empty()) return bad("no cell selected");
  std::vector<kdajit::Op> ops;
  for (const Cell& c : *cells)
    if (std::find(ops.begin(), ops.end(), c.op) == ops.end()) ops.push_back(c.op);
  auto routes = resolve_routes(o.routes, ops);
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
