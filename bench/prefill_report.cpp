#include "prefill_report.hpp"

#include <fmt/format.h>

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
  add_call_json(j, m, f.floor_us);
  j["ratio"] = f.floor_us > 0 ? m.device.median / f.floor_us : 0;
  j["effective_gbps"] = static_cast<double>(prefill_bytes(c)) / s / 1e9;
  j["pct_of_copy_bandwidth"] = b.copy_gbps > 0 ? 100.0 * j["effective_gbps"].get<double>() / b.copy_gbps : 0;
  j["effective_tflops"] = static_cast<double>(prefill_flops(c)) / s / 1e12;
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
  json mma{{"kernel", "mma.sync.m16n8k16 bf16 x bf16 + f32"}};
  if (b.mma_flops > 0) {
    mma["tflops"] = b.mma_flops / 1e12;
    mma["us"] = summary_json(b.mma_us);
    mma["flops_per_launch"] = b.mma.flops();
  } else {
    mma["tflops"] = nullptr;
    mma["error"] = b.mma_error;
  }
  json j = run_json(b, "kdajit-bench-prefill-grid/1", run_status, seconds, std::move(cfgs));
  j["settings"].update({{"flop_per_chunk_head", kFlopPerChunkHead},
                        {"bytes_per_token_head", kPrefillBytesPerTokenHead},
                        {"conv_bytes_per_seq_head", kPrefillConvBytesPerSeqHead}});
  j["mma_bf16"] = mma;
  return j;
}

void print_prefill_tables(const Bench& b, const std::vector<PrefillCell>& cells,
                          const std::vector<PrefillResult>& results) {
  if (!b.routes.empty())
    print_routes_table(b, kCellHeader, results, [&](size_t i) { return cell_columns(cells[i]); }, 10, 1);
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
    if (print_unmeasured(m)) continue;
    const PrefillFloors f = prefill_floors(c, b.copy_gbps, b.mma_flops);
    fmt::print("{:<12} {:>10.1f} {} {} {} {:>6.2f} {}\n", m.route, m.device.median, us_or(f.memory_us, 9),
               us_or(f.tensor_core_us, 9), us_or(f.floor_us, 9), f.floor_us > 0 ? m.device.median / f.floor_us : 0.0,
               f.binds);
  }
}

}  // namespace kdajit::bench
