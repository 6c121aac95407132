#include "cli.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <string_view>

#include "kdajit/routes.hpp"
#include "prefill_grid.hpp"

namespace kdajit::bench {

void add_options(CLI::App& app, Options& o) {
  app.add_option("--op", o.op,
                 kdajit::choices<kdajit::Op>(" | ") + " | all (single and packed); prefill: the prefill grid")
      ->capture_default_str();
  app.add_option("--heads", o.heads, "H values (default: single 8,16,32,64,96; packed 16,64; prefill 16,32,64)")
      ->delimiter(',');
  app.add_option("--rows", o.rows, "R of the single op, N of the packed op (default 1,2,...,512 / 1,8,32,128)")
      ->delimiter(',');
  app.add_option("--tokens", o.tokens, "T values of the packed op (default 2,3,4,8; every sequence L = T)")
      ->delimiter(',');
  app.add_option("--shapes", o.shapes,
                 "prefill: the prompt batches, NxL (N prompts of L tokens) or mixN (N prompts of 100-2000 tokens, "
                 "bench_prefill.py's draw) (default 8x2048,4x8192,1x16384,mix64)")
      ->delimiter(',');
  app.add_option("--state", o.states, "state dtypes: " + kdajit::choices<kdajit::StateDtype>(",") + " (default: all)")
      ->delimiter(',');
  app.add_option("--conv", o.convs,
                 "conv_state layouts: " + kdajit::choices<kdajit::ConvLayout>(",") +
                     " (default: sd, plus ds at H 64 (packed: T 4); prefill sd)")
      ->delimiter(',');
  app.add_option("--routes", o.routes, "selector | all | NAME,NAME: also time these routes forced")
      ->capture_default_str();
  app.add_option("--tuning", o.tuning, "off | on | both: RuntimeOptions::use_tuning of the selector (decode)")
      ->capture_default_str();
  app.add_flag("--pdl", o.pdl, "also time two dependent calls in one graph, without and with PDL (decode)");
  app.add_option("--floor-shapes", o.floor_shapes,
                 "floor launch shapes to try (default: cta256,split4x128,persist4x128); also diagnostic ones, not "
                 "counted as the floor: cta256x2, cta256x3, cta256x4 (cta256 at most 2, 3, 4 CTAs per SM) (decode)")
      ->delimiter(',');
  app.add_option("--floor-spin-cycles", o.floor_spin_cycles,
                 "diagnostic floor shapes only: clock cycles each thread waits between its state loads landing and "
                 "its stores (a stand-in for the op's arithmetic) (decode)")
      ->capture_default_str();
  app.add_option("--iters", o.iters,
                 fmt::format("timed graph replays per measurement (prefill default {})", kPrefillDefaultIters))
      ->capture_default_str();
  app.add_option("--host-calls", o.host_calls, "calls of the host-cost loops (cut for slow kernels) (decode)")
      ->capture_default_str();
  app.add_flag("!--no-warm", o.warm, "skip the replays without the L2 flush");
  app.add_option("--json", o.json_path, "write every number to this JSON file");
  app.add_option("--commit", o.commit, "git commit recorded in the JSON");
  app.add_option("--device", o.device, "CUDA device ordinal")->capture_default_str();
  app.add_option("--cache-dir", o.cache_dir,
                 "kernel cache (default: KDAJIT_CACHE_DIR, $XDG_CACHE_HOME/kdajit, ~/.cache/kdajit)");
  app.add_option("--jobs", o.jobs, "parallel kdajit compiles of the prewarm (0: cores - 1)")->capture_default_str();
  app.add_option("--time-limit", o.time_limit_s, "seconds after which remaining cells are skipped (exit 3)")
      ->capture_default_str();
  app.add_option("--gpu-timeout", o.gpu_timeout_s, "seconds any one wait for the GPU may take before it counts as hung")
      ->capture_default_str();
  app.add_option("--flush-mib", o.flush_mib, "L2 flush buffer (at least 4x the L2 is used)")->capture_default_str();
  app.add_option("--copy-mib", o.copy_mib, "size of the roofline copy")->capture_default_str();
  app.add_option("--copy-reps", o.copy_reps, "timed roofline copies")->capture_default_str();
  app.add_flag("--list", o.list,
               "print the cells, their bytes (prefill: and FLOPs) and a time estimate, then exit (no GPU needed)");
  app.add_flag("--compile-only", o.compile_only,
               "compile the bench's kernels (floor, fill, tensor-core rate) with NVRTC for --arch and print their "
               "resources (no GPU needed)");
  app.add_option("--arch", o.arch, "arch of --compile-only")->capture_default_str();
  app.add_flag("-v,--verbose", o.verbose, "kdajit runtime log at info level");
}

bool is_prefill(const Options& o) { return o.op == to_string(Op::prefill); }

Status finish_options(const CLI::App& app, Options& o) {
  auto given = [&](const char* name) { return app.count(name) > 0; };
  if (is_prefill(o)) {
    if (!given("--iters")) o.iters = kPrefillDefaultIters;
    for (const char* name : {"--pdl", "--floor-shapes", "--floor-spin-cycles", "--host-calls"})
      if (given(name))
        return invalid_argument(
            fmt::format("{}: applies to the decode grid (--op single, packed, all), not to --op prefill", name));
    if (o.tuning != "off")
      return invalid_argument(fmt::format("--tuning: expected off with --op prefill (a prefill call never reads a "
                                          "tune table), got '{}'",
                                          o.tuning));
  } else if (given("--shapes")) {
    return invalid_argument("--shapes: applies to --op prefill; the decode grid takes --rows and --tokens");
  }
  if (o.iters < 1 || o.iters > 100000)
    return invalid_argument(fmt::format("--iters: expected 1..100000, got {}", o.iters));
  if (o.host_calls < 1 || o.host_calls > 1000000)
    return invalid_argument(fmt::format("--host-calls: expected 1..1000000, got {}", o.host_calls));
  if (o.copy_reps < 1 || o.copy_reps > 1000)
    return invalid_argument(fmt::format("--copy-reps: expected 1..1000, got {}", o.copy_reps));
  if (o.copy_mib < 1 || o.copy_mib > 65536)
    return invalid_argument(fmt::format("--copy-mib: expected 1..65536, got {}", o.copy_mib));
  if (o.flush_mib < 1 || o.flush_mib > 65536)
    return invalid_argument(fmt::format("--flush-mib: expected 1..65536, got {}", o.flush_mib));
  if (!(o.time_limit_s > 0))
    return invalid_argument(fmt::format("--time-limit: expected > 0 s, got {}", o.time_limit_s));
  if (!(o.gpu_timeout_s > 0))
    return invalid_argument(fmt::format("--gpu-timeout: expected > 0 s, got {}", o.gpu_timeout_s));
  if (o.floor_spin_cycles < 0 || o.floor_spin_cycles > 100000000)
    return invalid_argument(fmt::format("--floor-spin-cycles: expected 0..100000000, got {}", o.floor_spin_cycles));
  if (o.jobs < 0 || o.jobs > 1024) return invalid_argument(fmt::format("--jobs: expected 0..1024, got {}", o.jobs));
  if (o.tuning != "off" && o.tuning != "on" && o.tuning != "both")
    return invalid_argument(fmt::format("--tuning: expected off, on or both, got '{}'", o.tuning));
  return {};
}

Result<std::vector<std::string>> resolve_routes(const std::string& routes, const std::vector<Op>& ops) {
  std::vector<std::string> known;
  for (Op op : ops)
    for (std::string_view r : kdajit::route_names(op))
      if (std::find(known.begin(), known.end(), r) == known.end()) known.emplace_back(r);
  if (routes == "selector") return std::vector<std::string>{};
  if (routes == "all") return known;
  std::vector<std::string> out;
  std::stringstream ss(routes);
  for (std::string r; std::getline(ss, r, ',');) {
    if (std::find(known.begin(), known.end(), r) == known.end())
      return invalid_argument(
          fmt::format("--routes: unknown route '{}' (this kdajit has: {})", r, fmt::join(known, ", ")));
    if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
  }
  return out;
}

}  // namespace kdajit::bench
