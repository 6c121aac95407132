// The bench's output: the JSON file (every number) and the tables on stdout.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grid.hpp"
#include "measure.hpp"

namespace kdajit::bench {

nlohmann::json report_json(const Bench& b, const std::vector<Cell>& cells, const std::vector<CellResult>& results,
                           const std::string& run_status, double seconds);

// Written to FILE.tmp and renamed, so a run killed mid-write leaves the last good file.
Status write_json(const std::string& path, const nlohmann::json& j);

// The optional tables (tuning, routes, PDL) first, the main table last.
void print_tables(const Bench& b, const std::vector<Cell>& cells, const std::vector<CellResult>& results);

// A Summary as {n, median, min, p10, p90, max, mean}.
nlohmann::json summary_json(const Summary& s);
// One RouteTiming: status, error, key, route, device_us, and ratio (floor_us > 0).
nlohmann::json timing_json(const RouteTiming& t, double floor_us);

// The JSON of a run that both grids share: schema, date, commit, version,
// status, seconds, host, gpu, the settings both grids read, kernels, prewarm and
// the baselines, with `configs` (one object per cell). Each grid adds its own
// settings and fields.
nlohmann::json run_json(const Bench& b, const char* schema, const std::string& run_status, double seconds,
                        nlohmann::json configs);
// A measured cell's call through the selector (key, route, device_us, warm_us,
// first_call_ms) and, with --routes, each forced route against `floor_us`.
void add_call_json(nlohmann::json& j, const CallResult& m, double floor_us);

// The forced-route table: a row per measured cell (`columns(i)`: the cell's
// columns under `cell_header`), the selector's route, then each route's median
// (`width` wide, `precision` digits) or its status.
template <class Record, class Columns>
void print_routes_table(const Bench& b, const char* cell_header, const std::vector<Record>& results,
                        Columns columns, int width, int precision) {
  fmt::print("\nevery route forced (device us, cold L2; n/a: not eligible)\n{} {:<12}", cell_header, "selector");
  for (const std::string& r : b.routes) fmt::print(" {:>{}}", r, width);
  fmt::print("\n");
  for (size_t i = 0; i < results.size(); ++i) {
    const CallResult& m = results[i];
    if (m.status != "ok") continue;
    fmt::print("{} {:<12}", columns(i), m.route);
    for (const RouteTiming& t : m.routes)
      fmt::print(" {}", t.status == "ok" ? fmt::format("{:>{}.{}f}", t.device.median, width, precision)
                                         : fmt::format("{:>{}}", t.status, width));
    fmt::print("\n");
  }
}
// The rest of an unmeasured cell's row in the main table: FAILED or skipped and
// the first line of the error (a compile failure carries its log; the JSON has
// all of it). False for a measured cell, which prints its own numbers.
bool print_unmeasured(const CallResult& m);

std::string utc_now();
std::string host_name();
std::string first_line_of(const char* path);

}  // namespace kdajit::bench
