// The bench's output: the JSON file (every number) and the tables on stdout.
#pragma once

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

std::string utc_now();
std::string host_name();
std::string first_line_of(const char* path);

}  // namespace kdajit::bench
