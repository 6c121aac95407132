// `kdajit tune`: times every eligible route per key family and batch size on
// the local GPU and stores the fastest per rows band in the cache, where the
// runtime's selector prefers it over its built-in bands.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "kdajit/presets.hpp"
#include "kdajit/runtime/device/driver_api.hpp"
#include "kdajit/runtime/tune/tune.hpp"

namespace kdajit::cli {

void add_tune_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "tune", "Time every eligible route per key family and batch size on this GPU; store the fastest in the cache");
  struct Opts {
    std::vector<std::string> presets{"glm-5.3-flash"};
    std::vector<int64_t> rows{1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    int reps = 25;
    int device = 0;
    std::string cache_dir;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--preset", o->presets, fmt::format("model preset(s) whose key families are tuned: {}",
                                                      fmt::join(preset_names(), " | ")))
      ->capture_default_str();
  cmd->add_option("--rows", o->rows, "batch sizes: R of the single op, N of the packed op")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--reps", o->reps, "timed launches per route and batch size (median)")->capture_default_str();
  cmd->add_option("--device", o->device, "CUDA device ordinal")->capture_default_str();
  cmd->add_option("--cache-dir", o->cache_dir, "cache root the table is written into (default: as the runtime's)");
  cmd->add_flag("--json", o->json, "print the table and every measurement as JSON");
  cmd->callback([o] {
    TuneOptions t;
    for (const auto& p : o->presets)
      for (const auto& k : unwrap(preset_keys(p, kDefaultArch))) t.families.push_back(k);
    t.rows = o->rows;
    t.reps = o->reps;
    t.device = unwrap(checked_device_ordinal(o->device, "--device"));
    t.cache_dir = o->cache_dir;
    if (!o->json) t.progress = [](std::string_view line) { fmt::print("{}\n", line); };
    TuneReport r = unwrap(tune_routes(t));
    if (o->json) {
      nlohmann::json m = nlohmann::json::array();
      for (const auto& x : r.measurements) m.push_back({{"key", key_name(x.key)}, {"rows", x.rows}, {"median_us", x.median_us}});
      fmt::print("{}\n", nlohmann::json{{"path", r.path}, {"table", r.table.to_json()}, {"measurements", m},
                                        {"skipped_families", r.skipped_families}}
                             .dump(2));
      return;
    }
    fmt::print("tune: {} families tuned ({} with one eligible route skipped), table written to {}\n",
               r.table.families(), r.skipped_families, r.path);
  });
}

}  // namespace kdajit::cli
