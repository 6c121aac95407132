#include "prefill_report.hpp"

#include <fmt/format.h>

#include <thread>

#include "report.hpp"

namespace kdajit::bench {

using nlohmann::json;

namespace {

json cell_json(const Bench& b, const PrefillCell& c, const PrefillResult& m) {
  const PrefillFloors f = prefill_floors(c, b.copy_gbps, b.mma_flops);
  json j{{"name", prefill_cell_name(c)},
         {"op", to_string(Op::prefill)},
         {"shape", c.shape},
         {"heads", c.heads},
         {"state", to_string(c.state)},
         {"conv", to_string(c.conv)},
         {"seqs", c.seqs()},
         {"tokens", c.tokens()},
         {"max_seq_len", c.longest()},
         {"lengths", c.lengths},
         {"gate", "bounded"},
         {"has_initial_state", "empty"},
         {"status", m.status},
         {"bytes_per_call", prefill_bytes(c)},
         {"flops_per_call", prefill_flops(c)},
         {"memory_floor_us", f.memory_us},
         {"tensor_core_floor_us", f.tensor_core_us >= 0 ? json(f.tensor_core_us) : json(nullptr)},
         {"floor_us", f.floor_us},
         {"binds", f.binds}};
  if (!m.error.empty()) j["error"] = m.error;
  if (m.status != "ok") return j;
  const double s = m.device.median * 1e-6;
  j["key"] = m.key;
  j["route"] = m.route;
  j["device_us"] = summary_json(m.device);
  if (m.warm.n > 0) j["warm_us"] = summary_json(m.warm);
  j["first_call_ms"] = m.first_call_ms;
  j["ratio"] = f.floor_us > 0 ? m.device.median / f.floor_us : 0;
  j["effective_gbps"] = static_cast<double>(prefill_bytes(c)) / s / 1e9;
  j["pct_of_copy_bandwidth"] = b.copy_gbps > 0 ? 100.0 * j["effective_gbps"].get<double>() / b.copy_gbps : 0;
  j["effective_tflops"] = static_cast<double>(prefill_flops(c)) / s / 1e12;
  if (!m.routes.empty()) {
    json r = json::object();
    for (const RouteTiming& t : m.routes) r[t.route] = timing_json(t, f.floor_us);
    j["routes"] = r;
  }
  return j;
}

std::string cell_columns(const PrefillCell& c) {
  return fmt::format("{:<8} {:>3} {:<5} {:<4}", c.shape, c.heads, to_string(c.state), to_string(c.conv));
}
constexpr const char* kCellHeader = "shape      H state conv";

std::string us_or(double us, int width) {
  return us >= 0 ? fmt::format("{:>{}.1f}", us, width) : fmt::format("{:>{}}", "n/a", width);
}

}  // namespace

json prefill_report_json(const Bench& b, const std::vector<PrefillCell>& cells,
                         const std::vector<PrefillResult>& results, const std::string& run_status, double seconds) {
  json cfgs = json::array();
  for (size_t i = 0; i < cells.size(); ++i) cfgs.push_back(cell_json(b, cells[i], results[i]));
  const Options& o = b.opt;
  json prewarm{{"keys", b.prewarm.keys}, {"failed", b.prewarm.failed}, {"seconds", b.prewarm.seconds}};
  if (!b.prewarm.errors.empty()) prewarm["errors"] = b.prewarm.errors;
  json mma{{"kernel", "mma.sync.m16n8k16 bf16 x bf16 + f32"}};
  if (b.mma_flops > 0) {
    mma["tflops"] = b.mma_flops / 1e12;
    mma["us"] = summary_json(b.mma_us);
    mma["flops_per_launch"] = b.mma.flops();
  } else {
    mma["tflops"] = nullptr;
    mma["error"] = b.mma_error;
  }
  return json{
      {"schema", "kdajit-bench-prefill-grid/1"},
      {"date", utc_now()},
      {"commit", o.commit},
      {"kdajit_version", kdajit::version()},
      {"status", run_status},
      {"total_seconds", seconds},
      {"host", {{"hostname", host_name()}, {"cpus", std::thread::hardware_concurrency()}}},
      {"gpu", b.gpu},
      {"settings",
       {{"iters", o.iters},
        {"routes", o.routes},
        {"routes_timed", b.routes},
        {"warm", o.warm},
        {"flush_bytes", b.flush.bytes()},
        {"copy_bytes", static_cast<int64_t>(o.copy_mib) << 20},
        {"copy_reps", o.copy_reps},
        {"time_limit_s", o.time_limit_s},
        {"gpu_timeout_s", o.gpu_timeout_s},
        {"stream_gate_at_end", b.timing.gating},
        {"gate_timeouts", b.timing.gate_timeouts},
        {"cache_dir", o.cache_dir},
        {"flop_per_chunk_head", kFlopPerChunkHead},
        {"bytes_per_token_head", kPrefillBytesPerTokenHead},
        {"conv_bytes_per_seq_head", kPrefillConvBytesPerSeqHead}}},
      {"kernels", b.kernels_info},
      {"prewarm", prewarm},
      {"copy_bandwidth_gbps", b.copy_gbps},
      {"copy_us", summary_json(b.copy_us)},
      {"memset_host_us_per_call", summary_json(b.memset_host_us)},
      {"mma_bf16", mma},
      {"configs", cfgs},
  };
}

void print_prefill_tables(const Bench& b, const std::vector<PrefillCell>& cells,
                          const std::vector<PrefillResult>& results) {
  if (!b.routes.empty()) {
    fmt::print("\nevery route forced (device us, cold L2; n/a: not eligible)\n{} {:<12}", kCellHeader, "selector");
    for (const std::string& r : b.routes) fmt::print(" {:>10}", r);
    fmt::print("\n");
    for (size_t i = 0; i < cells.size(); ++i) {
      const PrefillResult& m = results[i];
      if (m.status != "ok") continue;
      fmt::print("{} {:<12}", cell_columns(cells[i]), m.route);
      for (const RouteTiming& t : m.routes)
        fmt::print(" {}",
                   t.status == "ok" ? fmt::format("{:>10.1f}", t.device.median) : fmt::format("{:>10}", t.status));
      fmt::print("\n");
    }
  }
  fmt::print("\nkdajit {} prefill on {} ({} SMs) | copy roofline {:.0f} GB/s | bf16 mma.sync {} | {} replays, L2 "
             "flush {} MiB\n",
             kdajit::version(), b.gpu.value("name", std::string("?")), b.sms, b.copy_gbps,
             b.mma_flops > 0 ? fmt::format("{:.0f} TFLOP/s", b.mma_flops / 1e12) : std::string("n/a"), b.opt.iters,
             b.flush.bytes() >> 20);
  fmt::print("{} {:<12} {:>10} {:>9} {:>9} {:>9} {:>6} {}\n", kCellHeader, "route", "kdajit us", "mem us", "tc us",
             "floor us", "ratio", "binds");
  for (size_t i = 0; i < cells.size(); ++i) {
    const PrefillCell& c = cells[i];
    const PrefillResult& m = results[i];
    fmt::print("{} ", cell_columns(c));
    if (m.status != "ok") {  // the first line only: a compile failure carries its log (the JSON has all of it)
      fmt::print("{}: {}\n", m.status == "failed" ? "FAILED" : "skipped", m.error.substr(0, m.error.find('\n')));
      continue;
    }
    const PrefillFloors f = prefill_floors(c, b.copy_gbps, b.mma_flops);
    fmt::print("{:<12} {:>10.1f} {} {} {} {:>6.2f} {}\n", m.route, m.device.median, us_or(f.memory_us, 9),
               us_or(f.tensor_core_us, 9), us_or(f.floor_us, 9), f.floor_us > 0 ? m.device.median / f.floor_us : 0.0,
               f.binds);
  }
}

}  // namespace kdajit::bench
