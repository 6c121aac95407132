// The run's state (device, stream, kernels, runtimes) and the measurement of one cell.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_cuda.hpp"
#include "device_data.hpp"
#include "floor_kernel.hpp"
#include "grid.hpp"
#include "kdajit/kdajit.hpp"
#include "kdajit_api.hpp"
#include "mma_rate.hpp"
#include "timing.hpp"

namespace kdajit::bench {

// One kdajit timing (a runtime's call, graph-replayed) or why there is none.
struct RouteTiming {
  std::string status = "skipped";  // ok | n/a (not eligible / runtime not created) | failed | skipped
  std::string error, key, route;
  Summary device;
};

// What both grids record of a cell: kdajit's call through the selector and
// each forced route.
struct CallResult {
  std::string status = "skipped";  // ok | failed | skipped
  std::string error;
  // kdajit through the selector (RuntimeOptions::route = "").
  std::string key, route;
  Summary device, warm;
  double first_call_ms = 0;
  // --routes all / NAME,...: each route forced.
  std::vector<RouteTiming> routes;
  int sub_failures = 0;  // failed (not n/a) sub-measurements
};

// A decode cell: the call, its floor, its host cost and the optional timings.
struct CellResult : CallResult {
  // The floor: every shape tried, the fastest median wins.
  std::vector<RouteTiming> floor_shapes;  // status/error/device per shape; key = the entry name
  double floor_us = 0;
  std::string floor_shape;
  // Host cost.
  Summary validate;
  HostLoop host;
  RouteTiming bare;  // device unused; status/error of the bare launch
  HostLoop bare_host;
  Summary host_minus_bare;  // per round of the interleaved loop: kdajit call - bare launch
  // --tuning both: the selector with use_tuning = true.
  RouteTiming tuned;
  // --pdl: the same call twice in one graph, without and with PDL.
  RouteTiming pdl_off, pdl_on;
};

struct Bench {
  Bench() = default;
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;
  ~Bench();

  Options opt;
  cudaStream_t stream = nullptr;
  EventPairs events;
  DeviceBuffer flush;
  TimingContext timing;
  FloorKernels floor;
  FillKernels fill;
  std::vector<int> floor_shapes;  // indices into kFloorShapes
  nlohmann::json gpu = nlohmann::json::object();
  nlohmann::json kernels_info = nlohmann::json::object();  // compile times, registers
  int sms = 0;
  int smem_per_sm = 0;  // bytes of shared memory per SM
  std::string arch;
  double copy_gbps = 0;
  Summary copy_us, memset_host_us;
  // The prefill grid's tensor-core rate (mma_rate.hpp): dense bf16 mma.sync
  // FLOP/s, or 0 with the reason.
  MmaRate mma;
  double mma_flops = 0;
  Summary mma_us;
  std::string mma_error;
  PrewarmResult prewarm;

  // Runtimes: the selector, and the optional ones (null with a reason when the
  // option is off or the runtime could not be created).
  std::unique_ptr<Runtime> main;
  std::unique_ptr<Runtime> tuned;
  std::string tuned_error;
  std::unique_ptr<Runtime> pdl;
  std::string pdl_error;
  std::vector<std::string> routes;  // --routes: the names timed (empty: selector only)
  std::map<std::string, std::unique_ptr<Runtime>> by_route;
  std::map<std::string, std::string> route_errors;
};

Status outcome_status(const Outcome& o, const char* what);

// One kdajit runtime's call timed: the key it selects, a first call (a disk-cache
// load after the prewarm), two warm-up calls, then `calls` calls captured in one
// graph and replayed with the L2 flush (and without it when `warm`).
struct CallRun {
  RouteTiming t;
  Summary warm;
  double first_call_ms = 0;
  std::unique_ptr<Graph> graph;
};
// `select` names the key (Runtime::selected_key / selected_prefill_key), `call`
// makes the call on b.stream; `what` names the call in messages.
Result<CallRun> time_kdajit_call(Bench& b, const std::function<Outcome(std::string*)>& select,
                                 const std::function<Outcome()>& call, const char* what, int calls, bool warm);
// Records a sub-measurement: unsupported (a route the call is not eligible for)
// is n/a, anything else a failure (counted in sub_failures).
void record_timing(RouteTiming& out, Result<CallRun> r, int& sub_failures);
void not_available(RouteTiming& out, const std::string& why);
// The selector's call of a cell: key, route, times, first call.
void record_selector(CallResult& m, const CallRun& r);
// Times each route of --routes forced (`run` on its runtime) into m.routes: n/a
// for a route that does not serve `op` or whose runtime could not be created.
// A hung GPU stops it.
Status time_forced_routes(Bench& b, Op op, CallResult& m, const std::function<Result<CallRun>(Runtime&)>& run);
Outcome decode(Runtime& rt, Op op, const kdajit_decode_args_t& a, cudaStream_t s);

// Creates the runtimes the options ask for (an optional one that fails is recorded, not fatal).
Status create_runtimes(Bench& b);

// Every key the run will launch, from the runtimes' route selection (no launch).
std::vector<std::string> keys_to_prewarm(Bench& b, const std::vector<Cell>& cells);

// Measures one cell on its family's buffers. A failure of the kdajit call or of
// every floor shape fails the cell; other failures are recorded in their parts.
Status measure_cell(Bench& b, const Cell& c, const kdajit_decode_args_t& a, CellResult& m);

}  // namespace kdajit::bench
