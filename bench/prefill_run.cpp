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

// Compiles the fill and tensor-core rate kernels while the kdajit keys of the
// grid build in the cache, then loads them.
Status prepare_kernels(Bench& b, const std::vector<PrefillCell>& cells) {
  KDAJIT_TRY_ASSIGN(const BenchCubins cubins,
                    compile_while_prewarming(
                        b, [&] { return compile_prefill_kernels(b.arch); }, [&] { return prefill_keys(b, cells); }));
  KDAJIT_TRY(b.fill.load(cubins.fill.cubin));
  if (cubins.mma.cubin.empty())
    b.mma_error = fmt::format("{}: no bf16 mma.sync (sm_80 or later)", b.arch);
  else
    KDAJIT_TRY(b.mma.load(cubins.mma.cubin, b.sms));
  b.kernels_info = kernels_json(cubins);
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
  GridRun<PrefillResult> r(b, cells.size(), t_start,
                           [&](const std::vector<PrefillResult>& results, const std::string& status, double seconds) {
                             return prefill_report_json(b, cells, results, status, seconds);
                           });
  if (!r.open()) return r.rc;
  auto setup = [&]() -> Status {
    auto prepare = [&] { return prepare_kernels(b, cells); };
    KDAJIT_TRY(set_up_run(b, std::max({o.iters, o.copy_reps, kMmaReps}), prepare));
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
  if (!r.set_up(setup)) return r.rc;
  fmt::print(stderr, "kdajit_bench: {} ({} SMs, {}), copy roofline {:.0f} GB/s, bf16 mma.sync {}\n",
             b.gpu.value("name", std::string("?")), b.sms, b.arch, b.copy_gbps,
             b.mma_flops > 0 ? fmt::format("{:.0f} TFLOP/s", b.mma_flops / 1e12) : "n/a (" + b.mma_error + ")");
  for (size_t ci = 0; ci < cells.size() && !r.stopped; ++ci) {
    const PrefillCell& c = cells[ci];
    PrefillResult& m = r.results[ci];
    if (Clock::now() > r.deadline) break;
    auto data = create_device_data<PrefillData>(PrefillData::bytes_needed(c), "cell", [&] {
      return PrefillData::create(c, b.fill, b.stream, 1000 + ci, o.gpu_timeout_s);
    });
    if (!data) {
      r.data_failed({ci}, data.error());
      continue;
    }
    const Status st = measure_prefill_cell(b, (*data)->args(), m);
    data->reset();
    if (!st) {
      r.measure_failed(m, st.error(), ci + 1, prefill_cell_name(c));
    } else {
      r.measured(m);
      const PrefillFloors f = prefill_floors(c, b.copy_gbps, b.mma_flops);
      fmt::print(stderr, "[{}/{}] {}: {} {:.1f} us, floor {:.1f} us ({}), ratio {:.2f}\n", ci + 1, cells.size(),
                 prefill_cell_name(c), m.route, m.device.median, f.floor_us, f.binds,
                 f.floor_us > 0 ? m.device.median / f.floor_us : 0.0);
    }
    r.save();
  }
  return r.finish([&](const std::vector<PrefillResult>& results) { print_prefill_tables(b, cells, results); });
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
             routes_timed_text(routes));
  return finish_list(estimate_prefill_seconds(o, cells, static_cast<int>(routes.size())), bad_args);
}

}  // namespace

int prefill_main(const Options& o, Clock::time_point t_start) {
  auto cells = make_prefill_cells(o);
  if (!cells) return usage_error(cells.error().message);
  if (cells->empty()) return usage_error("no cell selected");
  auto routes = resolve_routes(o.routes, {Op::prefill});
  if (!routes) return usage_error(routes.error().message);
  if (o.list) return list(o, *cells, *routes);
  return run_guarded(o, [&](Bench& b) {
    b.routes = *routes;
    return run(b, *cells, t_start);
  });
}

}  // namespace kdajit::bench
