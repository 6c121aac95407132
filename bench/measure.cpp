#include "measure.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <set>

#include "kdajit_api.hpp"

namespace kdajit::bench {

Bench::~Bench() {
  if (stream) (void)cudaStreamDestroy(stream);
}

Status outcome_status(const Outcome& o, const char* what) {
  if (o) return {};
  return Error(static_cast<ErrorCode>(o.code),
               fmt::format("{}: {} ({})", what, outcome_text(o), kdajit_status_string(o.code)));
}

Outcome decode(Runtime& rt, Op op, const kdajit_decode_args_t& a, cudaStream_t s) {
  auto stream = reinterpret_cast<kdajit_stream_t>(s);
  return op == Op::single ? rt.single_decode(a, stream) : rt.packed_decode(a, stream);
}

namespace {

Result<std::unique_ptr<Runtime>> make_runtime(const Options& o, const std::string& route, bool use_tuning, bool pdl) {
  RuntimeOptions ro;
  ro.cache_dir = o.cache_dir;
  ro.device = -1;  // the stream's context: the primary context the bench opened
  ro.log_level = o.verbose ? KDAJIT_LOG_INFO : KDAJIT_LOG_QUIET;
  set_route_options(ro, route, use_tuning, pdl);
  std::unique_ptr<Runtime> rt;
  KDAJIT_TRY(outcome_status(Runtime::create(ro, &rt), "Runtime::create"));
  return rt;
}

Result<CallRun> run_decode(Bench& b, Runtime& rt, const Cell& c, const kdajit_decode_args_t& a, int calls, bool warm) {
  const cudaStream_t s = b.stream;
  return time_kdajit_call(
      b, [&](std::string* key) { return selected_key(rt, c_op(c.op), a, s, key); },
      [&] { return decode(rt, c.op, a, s); }, "decode", calls, warm);
}

void record(RouteTiming& out, Result<CallRun> r, CallResult& m) { record_timing(out, std::move(r), m.sub_failures); }

}  // namespace

Result<CallRun> time_kdajit_call(Bench& b, const std::function<Outcome(std::string*)>& select,
                                 const std::function<Outcome()>& call, const char* what, int calls, bool warm) {
  CallRun r;
  const cudaStream_t s = b.stream;
  const double timeout = b.opt.gpu_timeout_s;
  KDAJIT_TRY(outcome_status(select(&r.t.key), "selected_key"));
  r.t.route = route_of_key(r.t.key);
  const auto t0 = Clock::now();
  KDAJIT_TRY(outcome_status(call(), fmt::format("{} (first call)", what).c_str()));
  KDAJIT_TRY(wait_stream(s, timeout, fmt::format("first {} call", what).c_str()));
  r.first_call_ms = seconds_since(t0) * 1e3;
  for (int i = 0; i < 2; ++i) KDAJIT_TRY(outcome_status(call(), fmt::format("{} (warm-up)", what).c_str()));
  KDAJIT_TRY(wait_stream(s, timeout, fmt::format("warm-up {} calls", what).c_str()));
  KDAJIT_TRY_ASSIGN(r.graph, capture_graph(s, timeout, [&]() -> Status {
                      for (int i = 0; i < calls; ++i)
                        KDAJIT_TRY(outcome_status(call(), fmt::format("{} (during graph capture)", what).c_str()));
                      return {};
                    }));
  KDAJIT_TRY_ASSIGN(r.t.device, time_graph(b.timing, *r.graph, /*flush=*/true));
  if (warm) {
    KDAJIT_TRY_ASSIGN(r.warm, time_graph(b.timing, *r.graph, /*flush=*/false));
  }
  r.t.status = "ok";
  return r;
}

void record_timing(RouteTiming& out, Result<CallRun> r, int& sub_failures) {
  if (r) {
    out = std::move(r->t);
    return;
  }
  out.error = r.error().message;
  if (r.error().code == ErrorCode::unsupported) {
    out.status = "n/a";
  } else {
    out.status = "failed";
    ++sub_failures;
  }
}

void not_available(RouteTiming& out, const std::string& why) {
  out.status = "n/a";
  out.error = why;
}

void record_selector(CallResult& m, const CallRun& r) {
  m.key = r.t.key;
  m.route = r.t.route;
  m.device = r.t.device;
  m.warm = r.warm;
  m.first_call_ms = r.first_call_ms;
}

Status time_forced_routes(Bench& b, Op op, CallResult& m, const std::function<Result<CallRun>(Runtime&)>& run) {
  const auto serving = kdajit::route_names(op);
  for (const std::string& name : b.routes) {
    RouteTiming& t = m.routes.emplace_back();
    t.route = name;
    if (std::find(serving.begin(), serving.end(), name) == serving.end()) {
      not_available(t, fmt::format("route {} does not serve op {}", name, to_string(op)));
    } else if (auto it = b.by_route.find(name); it != b.by_route.end()) {
      record(t, run(*it->second), m);
      t.route = name;
    } else {
      not_available(t, b.route_errors[name]);
    }
    if (gpu_hung()) return Error(ErrorCode::cuda, t.error);
  }
  return {};
}

Status create_runtimes(Bench& b) {
  const Options& o = b.opt;
  KDAJIT_TRY_ASSIGN(b.main, make_runtime(o, "", o.tuning == "on", false));
  if (o.tuning == "both") {
    if (auto rt = make_runtime(o, "", true, false))
      b.tuned = std::move(rt).value();
    else
      b.tuned_error = rt.error().message;
  }
  if (o.pdl) {
    if (auto rt = make_runtime(o, "", o.tuning == "on", true))
      b.pdl = std::move(rt).value();
    else
      b.pdl_error = rt.error().message;
  }
  for (const std::string& name : b.routes) {
    if (auto rt = make_runtime(o, name, false, false))
      b.by_route[name] = std::move(rt).value();
    else
      b.route_errors[name] = rt.error().message;
  }
  // Say so when an option cannot be honoured (the cells record n/a).
  if (!b.tuned_error.empty()) fmt::print(stderr, "kdajit_bench: --tuning both: {}\n", b.tuned_error);
  if (!b.pdl_error.empty()) fmt::print(stderr, "kdajit_bench: --pdl: {}\n", b.pdl_error);
  for (const auto& [name, why] : b.route_errors) fmt::print(stderr, "kdajit_bench: --routes {}: {}\n", name, why);
  return {};
}

std::vector<std::string> keys_to_prewarm(Bench& b, const std::vector<Cell>& cells) {
  std::set<std::string> keys;
  auto add = [&](Runtime* rt, const Cell& c, const kdajit_decode_args_t& a) {
    std::string key;
    if (rt && selected_key(*rt, c_op(c.op), a, b.stream, &key)) keys.insert(key);
  };
  for (const Family& f : make_families(cells)) {
    const kdajit_decode_args_t base = stand_in_args(f.shape);
    for (size_t ci : f.cells) {
      const Cell& c = cells[ci];
      const kdajit_decode_args_t a = narrow_args(c, base);  // what the run passes, but for the pointers
      add(b.main.get(), c, a);
      add(b.tuned.get(), c, a);
      add(b.pdl.get(), c, a);
      for (auto& [name, rt] : b.by_route) add(rt.get(), c, a);
    }
  }
  return {keys.begin(), keys.end()};
}

Status measure_cell(Bench& b, const Cell& c, const kdajit_decode_args_t& a, CellResult& m) {
  const cudaStream_t s = b.stream;
  const double timeout = b.opt.gpu_timeout_s;

  // 1. kdajit, the selector's route.
  KDAJIT_TRY_ASSIGN(CallRun main, run_decode(b, *b.main, c, a, 1, b.opt.warm));
  record_selector(m, main);

  // 2. The floor, every shape on the same buffers.
  KDAJIT_TRY_ASSIGN(const FloorParams fp, floor_params(c, a));
  for (int sh : b.floor_shapes) {
    const FloorShape& shape = kFloorShapes[static_cast<size_t>(sh)];
    RouteTiming& t = m.floor_shapes.emplace_back();
    t.key = floor_entry(c.op, c.state, sh);
    t.route = shape.name;
    Result<Summary> us = Error(ErrorCode::internal, "not run");
    FloorParams shape_fp = fp;
    if (shape.diagnostic()) shape_fp.spin_cycles = b.opt.floor_spin_cycles;
    if (auto g = capture_graph(s, timeout, [&] { return b.floor.launch(sh, c, shape_fp, s); }))
      us = time_graph(b.timing, **g, /*flush=*/true);
    else
      us = std::move(g).error();
    if (!us) {
      t.status = "failed";
      t.error = us.error().message;
      ++m.sub_failures;
      if (gpu_hung()) return Error(ErrorCode::cuda, "floor kernel: " + t.error);
      continue;
    }
    t.status = "ok";
    t.device = *us;
    if (!shape.diagnostic() && (m.floor_shape.empty() || t.device.median < m.floor_us)) {
      m.floor_us = t.device.median;
      m.floor_shape = t.route;
    }
  }
  if (m.floor_shape.empty())
    return Error(ErrorCode::cuda, "every floor shape failed: " + (m.floor_shapes.empty() ? std::string("none selected")
                                                                                       : m.floor_shapes[0].error));

  // 3. The other kdajit timings the options ask for.
  auto check_hung = [&](const RouteTiming& t) -> Status {
    if (gpu_hung()) return Error(ErrorCode::cuda, t.error);
    return {};
  };
  if (b.opt.tuning == "both") {
    if (b.tuned)
      record(m.tuned, run_decode(b, *b.tuned, c, a, 1, false), m);
    else
      not_available(m.tuned, b.tuned_error);
    KDAJIT_TRY(check_hung(m.tuned));
  }
  KDAJIT_TRY(time_forced_routes(b, c.op, m, [&](Runtime& rt) { return run_decode(b, rt, c, a, 1, false); }));
  if (b.opt.pdl) {
    record(m.pdl_off, run_decode(b, *b.main, c, a, 2, false), m);
    KDAJIT_TRY(check_hung(m.pdl_off));
    if (b.pdl)
      record(m.pdl_on, run_decode(b, *b.pdl, c, a, 2, false), m);
    else
      not_available(m.pdl_on, b.pdl_error);
    KDAJIT_TRY(check_hung(m.pdl_on));
  }

  // 4. Host cost: validation alone, kdajit calls, and bare launches of the very
  // kernel node kdajit captured (function, grid, parameter block).
  {
    std::vector<double> us;
    us.reserve(static_cast<size_t>(b.opt.host_calls));
    for (int i = 0; i < b.opt.host_calls; ++i) {
      const auto t0 = Clock::now();
      const kdajit_status_t st = kdajit_validate_args(c_op(c.op), &a);
      us.push_back(us_between(t0, Clock::now()));
      if (st != KDAJIT_OK)
        return Error(static_cast<ErrorCode>(st), fmt::format("kdajit_validate_args: {}", kdajit_last_error()));
    }
    m.validate = summarize(std::move(us));
  }
  // kdajit and the bare launch interleaved in one loop (paired_host_loops):
  // their difference is the host cost kdajit adds; two separate loops measured
  // a p90 over cells of +0.84 us from host drift alone.
  const int n = host_loop_calls(b.opt.host_calls, m.device.median);
  auto kdajit_call = [&] { return outcome_status(decode(*b.main, c.op, a, s), "decode (host-cost loop)"); };
  auto bare = bare_launch_of(*main.graph);
  if (!bare) {
    m.bare.status = bare.error().code == ErrorCode::unsupported ? "n/a" : "failed";
    m.bare.error = bare.error().message;
    if (m.bare.status == "failed") ++m.sub_failures;
    KDAJIT_TRY_ASSIGN(m.host, host_loop(n, s, timeout, kdajit_call));
  } else {
    BareLaunch launch = *bare;
    auto loops = paired_host_loops(n, s, timeout, kdajit_call, [&] { return launch.launch(s); });
    if (loops) {
      m.bare.status = "ok";
      m.bare.key = m.key;
      m.host = loops->a;
      m.bare_host = loops->b;
      m.host_minus_bare = loops->a_minus_b;
    } else {
      // Tell a failing bare launch from a failing kdajit call: kdajit alone.
      if (gpu_hung()) return std::move(loops).error();
      KDAJIT_TRY_ASSIGN(m.host, host_loop(n, s, timeout, kdajit_call));
      m.bare.status = "failed";
      m.bare.error = loops.error().message;
      ++m.sub_failures;
    }
  }
  m.status = "ok";
  return {};
}

}  // namespace kdajit::bench
