// kdajit_bench's command line: the options of both grids (decode: --op single,
// packed, all; prefill: --op prefill), their checks, and --routes.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "grid.hpp"
#include "kdajit/error.hpp"
#include "kdajit/kernel_key.hpp"

namespace kdajit::bench {

void add_options(CLI::App& app, Options& o);

// After parsing: the grid's own defaults for what was not given (the prefill
// grid: --iters kPrefillDefaultIters), the range of every number, and no option
// that the chosen grid does not take (the decode grid: --shapes; the prefill
// grid: --rows, --tokens, --tuning on|both, --pdl, --floor-shapes,
// --floor-spin-cycles, --host-calls). An error names the option and what it expects.
Status finish_options(const CLI::App& app, Options& o);

bool is_prefill(const Options& o);

// --routes over the routes of `ops` (kdajit/routes.hpp): "selector" -> none,
// "all" -> every route that serves one of them, else the named ones, each once.
Result<std::vector<std::string>> resolve_routes(const std::string& routes, const std::vector<Op>& ops);

}  // namespace kdajit::bench
