#include "report.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

namespace kdajit::bench {

using nlohmann::json;

json summary_json(const Summary& s) {
  return json{{"n", s.n},     {"median", s.median}, {"min", s.min},  {"p10", s.p10},
              {"p90", s.p90}, {"max", s.max},       {"mean", s.mean}};
}

namespace {

double ratio(double us, double floor_us) { return floor_us > 0 ? us / floor_us : 0; }

}  // namespace

json timing_json(const RouteTiming& t, double floor_us) {
  json j{{"status", t.status}};
  if (!t.error.empty()) j["error"] = t.error;
  if (!t.key.empty()) j["key"] = t.key;
  if (!t.route.empty()) j["route"] = t.route;
  if (t.status == "ok" && t.device.n > 0) {
    j["device_us"] = summary_json(t.device);
    if (floor_us > 0) j["ratio"] = ratio(t.device.median, floor_us);
  }
  return j;
}

namespace {

json host_json(const HostLoop& h) {
  return json{{"us_per_call", summary_json(h.per_call)},
              {"loop_us_per_call", h.loop_us},
              {"throughput_us_per_call", h.throughput_us},
              {"calls", h.calls}};
}

json cell_json(const Bench& b, const Cell& c, const CellResult& m) {
  json j{{"name", cell_name(c)},
         {"op", to_string(c.op)},
         {"heads", c.heads},
         {"count", c.count},
         {"rows", rows_of(c)},
         {"tokens", c.tokens},
         {"state", to_string(c.state)},
         {"conv", to_string(c.conv)},
         {"gate", "bounded"},
         {"state_indices_mode", "unique_or_null"},
         {"status", m.status},
         {"bytes_per_call", bytes_per_call(c)}};
  if (c.op == Op::packed) j["seqs"] = c.count;
  if (!m.error.empty()) j["error"] = m.error;
  if (m.status != "ok") return j;
  const double bytes = static_cast<double>(bytes_per_call(c));
  add_call_json(j, m, m.floor_us);
  j["floor_us"] = m.floor_us;
  j["floor_shape"] = m.floor_shape;
  json shapes = json::object();
  for (const RouteTiming& t : m.floor_shapes) {
    json s = timing_json(t, 0);
    s["entry"] = t.key;
    s.erase("key");
    s.erase("route");
    shapes[t.route] = s;
  }
  j["floor_shapes"] = shapes;
  j["ratio"] = ratio(m.device.median, m.floor_us);
  j["effective_gbps"] = bytes / (m.device.median * 1e-6) / 1e9;
  j["floor_gbps"] = m.floor_us > 0 ? bytes / (m.floor_us * 1e-6) / 1e9 : 0;
  j["pct_of_copy_bandwidth"] = b.copy_gbps > 0 ? 100.0 * j["effective_gbps"].get<double>() / b.copy_gbps : 0;
  j["host_us_per_call"] = summary_json(m.host.per_call);
  j["host_loop_us_per_call"] = m.host.loop_us;
  j["host_throughput_us_per_call"] = m.host.throughput_us;
  j["host_calls"] = m.host.calls;
  j["validate_us_per_call"] = summary_json(m.validate);
  json bare{{"status", m.bare.status}};
  if (!m.bare.error.empty()) bare["error"] = m.bare.error;
  if (m.bare.status == "ok") {
    bare.update(host_json(m.bare_host));
    j["host_minus_bare_us"] = m.host_minus_bare.median;  // median of the paired differences
    j["host_minus_bare"] = summary_json(m.host_minus_bare);
  }
  j["bare_launch"] = bare;
  if (b.opt.tuning == "both") j["tuned"] = timing_json(m.tuned, m.floor_us);
  if (b.opt.pdl) {
    json p{{"two_calls", timing_json(m.pdl_off, 0)}, {"two_calls_pdl", timing_json(m.pdl_on, 0)}};
    if (m.pdl_off.status == "ok" && m.pdl_on.status == "ok")
      p["saving_us"] = m.pdl_off.device.median - m.pdl_on.device.median;
    j["pdl"] = p;
  }
  return j;
}

}  // namespace

void add_call_json(json& j, const CallResult& m, double floor_us) {
  j["key"] = m.key;
  j["route"] = m.route;
  j["device_us"] = summary_json(m.device);
  if (m.warm.n > 0) j["warm_us"] = summary_json(m.warm);
  j["first_call_ms"] = m.first_call_ms;
  if (!m.routes.empty()) {
    json r = json::object();
    for (const RouteTiming& t : m.routes) r[t.route] = timing_json(t, floor_us);
    j["routes"] = r;
  }
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string first_line_of(const char* path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

json run_json(const Bench& b, const char* schema, const std::string& run_status, double seconds, json configs) {
  const Options& o = b.opt;
  json prewarm{{"keys", b.prewarm.keys}, {"failed", b.prewarm.failed}, {"seconds", b.prewarm.seconds}};
  if (!b.prewarm.errors.empty()) prewarm["errors"] = b.prewarm.errors;
  return json{
      {"schema", schema},
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
        {"cache_dir", o.cache_dir}}},
      {"kernels", b.kernels_info},
      {"prewarm", prewarm},
      {"copy_bandwidth_gbps", b.copy_gbps},
      {"copy_us", summary_json(b.copy_us)},
      {"memset_host_us_per_call", summary_json(b.memset_host_us)},
      {"configs", std::move(configs)},
  };
}

json report_json(const Bench& b, const std::vector<Cell>& cells, const std::vector<CellResult>& results,
                 const std::string& run_status, double seconds) {
  json cfgs = json::array();
  for (size_t i = 0; i < cells.size(); ++i) cfgs.push_back(cell_json(b, cells[i], results[i]));
  const Options& o = b.opt;
  std::vector<std::string> shapes;
  for (int s : b.floor_shapes) shapes.emplace_back(kFloorShapes[static_cast<size_t>(s)].name);
  json j = run_json(b, "kdajit-bench-decode/2", run_status, seconds, std::move(cfgs));
  j["settings"].update({{"host_calls", o.host_calls},
                        {"tuning", o.tuning},
                        {"pdl", o.pdl},
                        {"floor_shapes", shapes},
                        {"floor_spin_cycles", o.floor_spin_cycles}});
  return j;
}

Status write_json(const std::string& path, const json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f)
      return Error(ErrorCode::io, fmt::format("--json: cannot open '{}' for writing: {}", tmp, std::strerror(errno)));
    f << j.dump(2) << '\n';
    if (!f.flush()) return Error(ErrorCode::io, fmt::format("--json: writing '{}' failed", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Error(ErrorCode::io, fmt::format("--json: renaming '{}' to '{}' failed: {}", tmp, path, ec.message()));
  return {};
}

namespace {

std::string cell_columns(const Cell& c) {
  return fmt::format("{:<6} {:>3} {:>4} {:>2} {:<5} {:<4}", to_string(c.op), c.heads, c.count, c.tokens,
                     to_string(c.state), to_string(c.conv));
}
constexpr const char* kCellHeader = "op       H    N  T state conv";

std::string timing_cell(const RouteTiming& t, int width) {
  if (t.status == "ok") return fmt::format("{:>{}.2f}", t.device.median, width);
  return fmt::format("{:>{}}", t.status, width);
}

}  // namespace

bool print_unmeasured(const CallResult& m) {
  if (m.status == "ok") return false;
  fmt::print("{}: {}\n", m.status == "failed" ? "FAILED" : "skipped", m.error.substr(0, m.error.find('\n')));
  return true;
}

void print_tables(const Bench& b, const std::vector<Cell>& cells, const std::vector<CellResult>& results) {
  if (b.opt.tuning == "both") {
    fmt::print("\nselector with use_tuning off / on (device us, cold L2)\n{} {:>10} {:<12} {:>10} {:<12}\n",
               kCellHeader, "off us", "route", "on us", "route");
    for (size_t i = 0; i < cells.size(); ++i) {
      const CellResult& m = results[i];
      if (m.status != "ok") continue;
      fmt::print("{} {:>10.2f} {:<12} {} {:<12}\n", cell_columns(cells[i]), m.device.median, m.route,
                 timing_cell(m.tuned, 10), m.tuned.route);
    }
  }
  if (!b.routes.empty())
    print_routes_table(b, kCellHeader, results, [&](size_t i) { return cell_columns(cells[i]); }, 12, 2);
  if (b.opt.pdl) {
    fmt::print("\ntwo dependent calls in one graph (device us, cold L2)\n{} {:>10} {:>10} {:>10}\n", kCellHeader,
               "no pdl", "pdl", "saving");
    for (size_t i = 0; i < cells.size(); ++i) {
      const CellResult& m = results[i];
      if (m.status != "ok") continue;
      fmt::print("{} {} {}", cell_columns(cells[i]), timing_cell(m.pdl_off, 10), timing_cell(m.pdl_on, 10));
      if (m.pdl_off.status == "ok" && m.pdl_on.status == "ok")
        fmt::print(" {:>10.2f}", m.pdl_off.device.median - m.pdl_on.device.median);
      fmt::print("\n");
    }
  }

  fmt::print("\nkdajit {} on {} ({} SMs) | copy roofline {:.0f} GB/s | memset host {:.2f} us | {} replays, L2 flush "
             "{} MiB\n",
             kdajit::version(), b.gpu.value("name", std::string("?")), b.sms, b.copy_gbps, b.memset_host_us.median,
             b.opt.iters, b.flush.bytes() >> 20);
  fmt::print("{} {:<12} {:>9} {:>9} {:>6} {:<11} {:>7} {:>7} {:>6}\n", kCellHeader, "route", "kdajit us", "floor us",
             "ratio", "floor shape", "host us", "bare us", "diff");
  for (size_t i = 0; i < cells.size(); ++i) {
    const Cell& c = cells[i];
    const CellResult& m = results[i];
    fmt::print("{} ", cell_columns(c));
    if (print_unmeasured(m)) continue;
    fmt::print("{:<12} {:>9.2f} {:>9.2f} {:>6.2f} {:<11} {:>7.2f} ", m.route, m.device.median, m.floor_us,
               ratio(m.device.median, m.floor_us), m.floor_shape, m.host.per_call.median);
    if (m.bare.status == "ok")
      fmt::print("{:>7.2f} {:>6.2f}\n", m.bare_host.per_call.median, m.host_minus_bare.median);
    else
      fmt::print("{:>7} {:>6}\n", m.bare.status, "");
  }
}

}  // namespace kdajit::bench
