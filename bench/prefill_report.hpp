// The prefill grid's results: one cell's measurement, the JSON file and the
// tables on stdout (the decode grid's shapes, report.hpp, with the prefill
// cell's fields and its two floors).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "measure.hpp"
#include "prefill_grid.hpp"

namespace kdajit::bench {

struct PrefillResult {
  std::string status = "skipped";  // ok | failed | skipped
  std::string error;
  // kdajit through the selector (RuntimeOptions::route = "").
  std::string key, route;
  Summary device, warm;
  double first_call_ms = 0;
  // --routes all / NAME,...: each route forced.
  std::vector<RouteTiming> routes;
  int sub_failures = 0;  // failed (not n/a) forced routes
};

nlohmann::json prefill_report_json(const Bench& b, const std::vector<PrefillCell>& cells,
                                   const std::vector<PrefillResult>& results, const std::string& run_status,
                                   double seconds);

// The forced-route table (with --routes) first, the main table last.
void print_prefill_tables(const Bench& b, const std::vector<PrefillCell>& cells,
                          const std::vector<PrefillResult>& results);

}  // namespace kdajit::bench
