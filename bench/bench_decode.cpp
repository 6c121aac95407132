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

// Compiles the floor and fill kernels while the kdajit keys of the grid build
// in the cache, then loads the two modules.
Status prepare_kernels(Bench& b, const std::vector<Cell>& cells) {
  int max_t = 1;
  for (const Cell& c : cells) max_t = std::max(max_t, c.tokens);
  KDAJIT_TRY_ASSIGN(const BenchCubins cubins,
                    compile_while_prewarming(
                        b, [&] { return compile_bench_kernels(b.arch, max_t); },
                        [&] { return keys_to_prewarm(b, cells); }));
  KDAJIT_TRY(b.floor.load(cubins.floor.cubin, b.sms, b.smem_per_sm, max_t));
  KDAJIT_TRY(b.fill.load(cubins.fill.cubin));
  b.kernels_info = kernels_json(cubins);
  nlohmann::json regs = nlohmann::json::object();
  for (Op op : kDecodeOps)  // the floor kernels are the decode ops
    for (StateDtype st : all_values<StateDtype>())
      for (int sh = 0; sh < kFloorKernelCount; ++sh) regs[floor_entry(op, st, sh)] = b.floor.registers(op, st, sh);
  b.kernels_info["floor_registers"] = regs;
  return {};
}

int run(Bench& b, const std::vector<Cell>& cells, Clock::time_point t_start) {
  const Options& o = b.opt;
  GridRun<CellResult> r(b, cells.size(), t_start,
                        [&](const std::vector<CellResult>& results, const std::string& status, double seconds) {
                          return report_json(b, cells, results, status, seconds);
                        });
  if (!r.open()) return r.rc;
  const std::vector<Family> fams = make_families(cells);
  fmt::print(stderr, "kdajit_bench: {} cells in {} families\n", cells.size(), fams.size());
  auto prepare = [&] { return prepare_kernels(b, cells); };
  if (!r.set_up([&] { return set_up_run(b, std::max(o.iters, o.copy_reps), prepare); })) return r.rc;
  fmt::print(stderr, "kdajit_bench: {} ({} SMs, {}), copy roofline {:.0f} GB/s, memset host {:.2f} us\n",
             b.gpu.value("name", std::string("?")), b.sms, b.arch, b.copy_gbps, b.memset_host_us.median);
  size_t done = 0;
  for (size_t fi = 0; fi < fams.size() && !r.stopped && Clock::now() < r.deadline; ++fi) {
    const Family& f = fams[fi];
    auto data = create_device_data<DeviceData>(DeviceData::bytes_needed(f.shape), "family", [&] {
      return DeviceData::create(f.shape, b.fill, b.stream, 1000 + fi, o.gpu_timeout_s);
    });
    if (!data) {
      r.data_failed(f.cells, data.error());
      continue;
    }
    for (size_t ci : f.cells) {
      const Cell& c = cells[ci];
      CellResult& m = r.results[ci];
      if (Clock::now() > r.deadline) {
        m.error = "time limit";
        continue;
      }
      const Status st = measure_cell(b, c, narrow_args(c, (*data)->args()), m);
      ++done;
      if (!st) {
        if (r.measure_failed(m, st.error(), done, cell_name(c))) break;
        continue;
      }
      r.measured(m);
      fmt::print(stderr, "[{}/{}] {}: {} {:.2f} us, floor {:.2f} us ({}), ratio {:.2f}; host {:.2f} us, bare {}\n",
                 done, cells.size(), cell_name(c), m.route, m.device.median, m.floor_us, m.floor_shape,
                 m.floor_us > 0 ? m.device.median / m.floor_us : 0.0, m.host.per_call.median,
                 m.bare.status == "ok" ? fmt::format("{:.2f} us", m.bare_host.per_call.median) : m.bare.status);
    }
    data->reset();
    r.save();
  }
  return r.finish([&](const std::vector<CellResult>& results) { print_tables(b, cells, results); });
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
  if (o.compile_only) return compile_only(o.arch) ? 0 : kExitFailed;
  if (kdajit::Status st = finish_options(app, o); !st) return usage_error(st.error().message);
  if (is_prefill(o)) return prefill_main(o, t_start);
  auto cells = make_cells(o);
  if (!cells) return usage_error(cells.error().message);
  if (cells->empty()) return usage_error("no cell selected");
  std::vector<kdajit::Op> ops;
  for (const Cell& c : *cells)
    if (std::find(ops.begin(), ops.end(), c.op) == ops.end()) ops.push_back(c.op);
  auto routes = resolve_routes(o.routes, ops);
  if (!routes) return usage_error(routes.error().message);
  std::vector<int> shapes;
  for (const std::string& s : o.floor_shapes) {
    const int i = floor_shape_index(s);
    if (i < 0) return usage_error(fmt::format("--floor-shapes: unknown shape '{}'", s));
    if (std::find(shapes.begin(), shapes.end(), i) == shapes.end()) shapes.push_back(i);
  }
  if (shapes.empty())
    for (int i = 0; i < kFloorKernelCount; ++i) shapes.push_back(i);
  if (std::all_of(shapes.begin(), shapes.end(), [](int i) { return kFloorShapes[static_cast<size_t>(i)].diagnostic(); }))
    return usage_error(
        "--floor-shapes: expected at least one floor shape (cta256, split4x128, persist4x128) beside the diagnostic "
        "ones");

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
               cells->size(), fams.size(), static_cast<double>(dev) / 1073741824.0, routes_timed_text(*routes));
    return finish_list(estimate_seconds(o, *cells), bad_args);
  }

  return run_guarded(o, [&](Bench& b) {
    b.routes = *routes;
    b.floor_shapes = shapes;
    return run(b, *cells, t_start);
  });
}
