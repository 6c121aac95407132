#include "prefill_run.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "compile_kernels.hpp"
#include "kdajit_api.hpp"
#include "measure.hpp"
#include "prefill_data.hpp"
#include "prefill_grid.hpp"
#include "prefill_report.hpp"
#include "report.hpp"
#include "setup.hpp"

namespace kdajit::bench {

namespace {

constexpr int kMmaReps = 10;  // timed launches of the tensor-core rate kernel

Outcome selected_prefill_key(Runtime& rt, const kdajit_prefill_args_t& a, cudaStream_t s, std::string* key) {
  return rt.selected_prefill_key(a, reinterpret_cast<StreamHandle>(s), key);
}

Outcome prefill(Runtime& rt, const kdajit_prefill_args_t& a, cudaStream_t s) {
  return rt.prefill(a, reinterpret_cast<StreamHandle>(s));
}

// Every key the run will launch, from the runtimes' route selection (no launch).
std::vector<std::string> prefill_keys(Bench& b, const std::vector<PrefillCell>& cells) {
  std::set<std::string> keys;
  for (const PrefillCell& c : cells) {
    const kdajit_prefill_args_t a = prefill_stand_in_args(c);
    std::string key;
    if (selected_prefill_key(*b.main, a, b.stream, &key)) keys.insert(key);
    for (auto& [name, rt] : b.by_route)
      if (selected_prefill_key(*rt, a, b.stream, &key)) keys.insert(key);
  }
  return {keys.begin(), keys.end()};
}

// Compiles the fill and tensor-core rate kernels (one thread) while the kdajit
// keys of the grid build in the cache (the other threads), then loads them.
Status prepare_kernels(Bench& b, const std::vector<PrefillCell>& cells) {
  Result<BenchCubins> cubins = Error(ErrorCode::internal, "not compiled");
  std::thread nvrtc([&] { cubins = compile_prefill_kernels(b.arch); });
  const std::vector<std::string> keys = prefill_keys(b, cells);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  b.prewarm = prewarm(*b.main, keys, b.opt.jobs > 0 ? b.opt.jobs : std::max(1, hw - 1));
  nvrtc.join();
  fmt::print(stderr, "kdajit_bench: prewarm: {} kdajit keys in {:.1f} s ({} failed)\n", b.prewarm.keys,
             b.prewarm.seconds, b.prewarm.failed);
  for (const auto& e : b.prewarm.errors) fmt::print(stderr, "kdajit_bench: prewarm: {}\n", e);
  KDAJIT_TRY(cubins);
  KDAJIT_TRY(b.fill.load(cubins->fill.cubin));
  if (cubins->mma.cubin.empty())
    b.mma_error = fmt::format("{}: no bf16 mma.sync (sm_80 or later)", b.arch);
  else
    KDAJIT_TRY(b.mma.load(cubins->mma.cubin, b.sms));
  b.kernels_info = kernels_json(*cubins);
  return {};
}

// The dense bf16 rate: kMmaReps launches of the rate kernel after one untimed,
// each between its own events; FLOPs of a launch over the median time.
Status measure_mma_rate(Bench& b) {
  if (!b.mma.loaded()) return {};
  DeviceBuffer out;
  KDAJIT_TRY(out.allocate(b.mma.out_bytes()));
  KDAJIT_TRY(b.mma.launch(out.get(), b.stream));
  KDAJIT_TRY(wait_stream(b.stream, b.opt.gpu_timeout_s, "tensor-core rate warm-up"));
  int timeouts = 0;
  KDAJIT_TRY_ASSIGN(std::vector<double> us,
                    time_on_stream(
                        b.stream, b.events, kMmaReps, b.opt.gpu_timeout_s, b.timing.gating, &timeouts,
                        [](int) { return Status{}; }, [&](int) { return b.mma.launch(out.get(), b.stream); }));
  if (timeouts > 0) b.timing.gating = false;
  b.mma_us = summarize(std::move(us));
  if (b.mma_us.median <= 0) return Error(ErrorCode::cuda, "tensor-core rate: a zero median time");
  b.mma_flops = static_cast<double>(b.mma.flops()) / (b.mma_us.median * 1e-6);
  return {};
}

Status measure_prefill_cell(Bench& b, const kdajit_prefill_args_t& a, PrefillResult& m) {
  const cudaStream_t s = b.stream;
  auto timed = [&](Runtime& rt, bool warm) {
    return time_kdajit_call(
        b, [&](std::string* key) { return selected_prefill_key(rt, a, s, key); },
        [&] { return prefill(rt, a, s); }, "prefill", 1, warm);
  };
  KDAJIT_TRY_ASSIGN(CallRun main, timed(*b.main, b.opt.warm));
  record_selector(m, main);
  main.graph.reset();
  KDAJIT_TRY(time_forced_routes(b, Op::prefill, m, [&](Runtime& rt) { return timed(rt, false); }));
  m.status = "ok";
  return {};
}

int run(Bench& b, const std::vector<PrefillCell>& cells, Clock::time_point t_start) {
  const Options& o = b.opt;
  std::vector<PrefillResult> results(cells.size());
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
    KDAJIT_TRY(b.events.create(std::max({o.iters, o.copy_reps, kMmaReps})));
    b.timing = TimingContext{b.stream, &b.events, &b.flush, o.iters, o.gpu_timeout_s, true, 0};
    KDAJIT_TRY(create_runtimes(b));
    KDAJIT_TRY(prepare_kernels(b, cells));
    KDAJIT_TRY(measure_baselines(b));
    // Without a rate the cells keep the memory floor (the tensor-core column
    // says n/a); only a hung GPU stops the run here.
    if (Status mma = measure_mma_rate(b); !mma) {
      b.mma_flops = 0;
      b.mma_error = "tensor-core rate: " + mma.error().message;
      if (gpu_hung()) return mma;
      (void)cudaGetLastError();
    }
    return {};
  };
  int rc = kExitOk;
  std::string run_status = "running";  // what a JSON written mid-run (or left by a killed run) says
  auto save = [&] {
    if (o.json_path.empty()) return;
    if (Status st = write_json(o.json_path, prefill_report_json(b, cells, results, run_status, elapsed())); !st) {
      fmt::print(stderr, "kdajit_bench: {}\n", st.error().message);
      if (rc == kExitOk) rc = kExitFailed;
    }
  };
  if (Status st = setup(); !st) {
    fmt::print(stderr, "kdajit_bench: setup: {}\n", st.error().message);
    rc = gpu_hung() ? kExitHung : kExitFailed;
    run_status = gpu_hung() ? "gpu_hung" : "failed";
    for (PrefillResult& m : results) m.error = "setup failed: " + st.error().message;
    save();
    return rc;
  }
  fmt::print(stderr, "kdajit_bench: {} ({} SMs, {}), copy roofline {:.0f} GB/s, bf16 mma.sync {}\n",
             b.gpu.value("name", std::string("?")), b.sms, b.arch, b.copy_gbps,
             b.mma_flops > 0 ? fmt::format("{:.0f} TFLOP/s", b.mma_flops / 1e12) : "n/a (" + b.mma_error + ")");
  auto context_usable = [&] {
    if (gpu_hung()) return false;
    (void)cudaGetLastError();  // clears a non-sticky error; a sticky one shows in the wait
    return wait_stream(b.stream, o.gpu_timeout_s, "stream after a failure").ok();
  };
  bool stopped = false;
  for (size_t ci = 0; ci < cells.size() && !stopped; ++ci) {
    const PrefillCell& c = cells[ci];
    PrefillResult& m = results[ci];
    if (Clock::now() > deadline) break;
    std::unique_ptr<PrefillData> data;
    {
      size_t free_b = 0, total_b = 0;
      const size_t need = PrefillData::bytes_needed(c);
      Status st = cuda_status(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
      if (st && need + (size_t{1} << 30) > free_b)
        st = Error(ErrorCode::cuda, fmt::format("the cell needs {:.2f} GiB of device memory, {:.2f} GiB free",
                                                need / 1073741824.0, free_b / 1073741824.0));
      if (st) {
        if (auto d = PrefillData::create(c, b.fill, b.stream, 1000 + ci, o.gpu_timeout_s))
          data = std::move(d).value();
        else
          st = std::move(d).error();
      }
      if (!st) {
        m.status = "failed";
        m.error = "device data: " + st.error().message;
        rc = gpu_hung() ? kExitHung : kExitFailed;
        if (!context_usable()) stopped = true;
        continue;
      }
    }
    const Status st = measure_prefill_cell(b, data->args(), m);
    data.reset();
    if (!st) {
      m.status = "failed";
      m.error = st.error().message;
      rc = gpu_hung() ? kExitHung : kExitFailed;
      fmt::print(stderr, "[{}/{}] {}: FAILED: {}\n", ci + 1, cells.size(), prefill_cell_name(c), m.error);
      if (!context_usable()) {
        run_status = gpu_hung() ? "gpu_hung" : "cuda_context_lost";
        stopped = true;
      }
    } else {
      if (m.sub_failures > 0 && rc == kExitOk) rc = kExitFailed;
      const PrefillFloors f = prefill_floors(c, b.copy_gbps, b.mma_flops);
      fmt::print(stderr, "[{}/{}] {}: {} {:.1f} us, floor {:.1f} us ({}), ratio {:.2f}\n", ci + 1, cells.size(),
                 prefill_cell_name(c), m.route, m.device.median, f.floor_us, f.binds,
                 f.floor_us > 0 ? m.device.median / f.floor_us : 0.0);
    }
    save();
  }
  for (PrefillResult& m : results)
    if (m.status == "skipped" && m.error.empty())
      m.error = gpu_hung() ? "the GPU hung" : stopped ? "stopped after an earlier failure" : "time limit";
  const bool timed_out =
      std::any_of(results.begin(), results.end(), [](const PrefillResult& m) { return m.error == "time limit"; });
  if (timed_out && rc == kExitOk) {
    rc = kExitTimeLimit;
    run_status = "time_limit";
  }
  if (run_status == "running") run_status = rc == kExitOk ? "ok" : "failed";
  if (timed_out) fmt::print(stderr, "kdajit_bench: time limit of {:.0f} s reached: partial results\n", o.time_limit_s);
  print_prefill_tables(b, cells, results);
  save();
  if (!o.json_path.empty()) fmt::print("json: {}\n", o.json_path);
  fmt::print("total: {:.1f} s, exit {}\n", elapsed(), rc);
  return rc;
}

// --list: the prompt batches, then each cell's sizes, bytes, FLOPs, device
// buffers and its arguments (stand-in pointers) through kdajit's validation.
int list(const Options& o, const std::vector<PrefillCell>& cells, const std::vector<std::string>& routes) {
  std::vector<std::string> shapes;
  for (const PrefillCell& c : cells) {
    if (std::find(shapes.begin(), shapes.end(), c.shape) != shapes.end()) continue;
    shapes.push_back(c.shape);
    fmt::print("shape {}: {} prompts, {} tokens, longest {}: lengths {}\n", c.shape, c.seqs(), c.tokens(), c.longest(),
               fmt::join(c.lengths, ","));
  }
  fmt::print("{:<30} {:>5} {:>7} {:>6} {:>14} {:>16} {:>9}  {}\n", "cell", "seqs", "tokens", "max L", "bytes/call",
             "FLOPs/call", "GiB", "args");
  size_t bad_args = 0;
  double gib = 0;
  for (const PrefillCell& c : cells) {
    const kdajit_prefill_args_t a = prefill_stand_in_args(c);
    std::string args = "ok";
    if (kdajit_validate_prefill_args(&a) != KDAJIT_OK) {
      args = fmt::format("kdajit_validate_prefill_args: {}", kdajit_last_error());
      ++bad_args;
    }
    const double g = static_cast<double>(PrefillData::bytes_needed(c)) / 1073741824.0;
    gib = std::max(gib, g);
    fmt::print("{:<30} {:>5} {:>7} {:>6} {:>14} {:>16} {:>9.2f}  {}\n", prefill_cell_name(c), c.seqs(), c.tokens(),
               c.longest(), prefill_bytes(c), prefill_flops(c), g, args);
  }
  fmt::print("{} cells (largest {:.2f} GiB of device buffers); routes timed: {}\n", cells.size(), gib,
             routes.empty() ? std::string("selector only") : fmt::format("{}", fmt::join(routes, ", ")));
  fmt::print("estimated GPU time on an H200: {:.0f} s (plus setup: prewarm compiles, NVRTC)\n",
             estimate_prefill_seconds(o, cells, static_cast<int>(routes.size())));
  if (bad_args > 0) fmt::print("{} cells with invalid arguments\n", bad_args);
  return bad_args > 0 ? kExitFailed : kExitOk;
}

}  // namespace

int prefill_main(const Options& o, Clock::time_point t_start) {
  auto bad = [](const std::string& msg) {
    std::fprintf(stderr, "kdajit_bench: %s\n", msg.c_str());
    return kExitUsage;
  };
  auto cells = make_prefill_cells(o);
  if (!cells) return bad(cells.error().message);
  if (cells->empty()) return bad("no cell selected");
  auto routes = resolve_routes(o.routes, {Op::prefill});
  if (!routes) return bad(routes.error().message);
  if (o.list) return list(o, *cells, *routes);

  int rc = kExitFailed;
  {
    // The hard limit leaves room for the table, the JSON and a slow last wait.
    Watchdog watchdog(o.time_limit_s + o.gpu_timeout_s + 30);
    Bench b;
    b.opt = o;
    b.routes = *routes;
    rc = run(b, *cells, t_start);
    if (gpu_hung()) {
      // Nothing more to wait for: a hung GPU would block teardown.
      std::fflush(nullptr);
      std::_Exit(rc);
    }
  }
  return rc;
}

}  // namespace kdajit::bench
