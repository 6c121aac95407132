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

// A prefill cell: the call and the forced routes, nothing more (its floors
// follow from the cell and the run's rates, prefill_floors).
using PrefillResult = CallResult;

nlohmann::json prefill_report_json(const Bench& b, const std::vector<PrefillCell>& cells,
                                   const std::vector<PrefillResult>& results, const std::string& run_status,
                                   double seconds);

// The forced-route table (with --routes) first, the main table last.
void print_prefill_tables(const Bench& b, const std::vector<PrefillCell>& cells,
                          const std::vector<PrefillResult>& results);

}  // namespace kdajit::bench
