// The cache verbs that remove: prune (LRU down to a size) and clear. Both act on
// the write layer only and never on what kdajit's naming and ownership do not
// prove to be its own.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_env.hpp"
#include "cli_output.hpp"
#include "commands.hpp"
#include "kdajit/cache.hpp"

namespace kdajit::cli {

namespace {

using nlohmann::json;

json prune_json(const KernelCache& cache, const CachePruneResult& r) {
  return {{"root", json_text(cache.root())},
          {"removed", r.removed},
          {"bytes_before", r.bytes_before},
          {"bytes_after", r.bytes_after}};
}

// The write layer, or a Failure naming why there is none.
void require_write_layer(const KernelCache& cache, const CommonOpts& o, std::string_view verb) {
  require_readable(cache, o, verb);
  if (cache.mode() == CacheMode::read_write) return;
  std::vector<std::string> why;
  for (const auto& l : cache.layers()) why.push_back(fmt::format("{} {}", l.path, l.reason));
  throw Failure(fmt::format("{}: no cache layer can be written ({})", verb, fmt::join(why, "; ")));
}

void add_prune(CLI::App& app) {
  auto* cmd = app.add_subcommand("prune", "Remove least recently used entries down to a size");
  struct Opts {
    CommonOpts common;
    std::string max_bytes;
  };
  auto o = std::make_shared<Opts>();
  add_common(cmd, o->common);
  auto* max_opt = cmd->add_option("--max-bytes", o->max_bytes, "size to prune to (default: KDAJIT_CACHE_MAX_BYTES)");
  cmd->callback([o, max_opt] {
    uint64_t max_bytes = 0;
    if (max_opt->count() > 0) {
      auto n = parse_byte_count(o->max_bytes, "prune --max-bytes");
      if (!n) throw Failure(n.error().message, kExitUsage);
      max_bytes = *n;
    } else {
      if (!environment().cache_max_bytes)
        throw Failure("prune: expected --max-bytes N (or KDAJIT_CACHE_MAX_BYTES)", kExitUsage);
      max_bytes = *environment().cache_max_bytes;
    }
    auto cache = open_cache(o->common, CacheUse::maintain);
    require_write_layer(*cache, o->common, "prune");
    size_t swept = cache->sweep_tmp(CacheOptions{}.tmp_max_age);
    auto r = cache->prune(max_bytes);
    if (o->common.json) {
      json out = prune_json(*cache, r);
      out["tmp_swept"] = swept;
      fmt::print("{}\n", dump_json(out));
    } else {
      fmt::print("prune: removed {} entries: {} -> {} (limit {}) in {}\n", r.removed, human_bytes(r.bytes_before),
                 human_bytes(r.bytes_after), human_bytes(max_bytes), printable(cache->root()));
    }
  });
}

void add_clear(CLI::App& app) {
  auto* cmd = app.add_subcommand("clear", "Remove every entry of the write layer (foreign files are left alone)");
  auto o = std::make_shared<CommonOpts>();
  add_common(cmd, *o);
  cmd->callback([o] {
    auto cache = open_cache(*o, CacheUse::maintain);
    require_write_layer(*cache, *o, "clear");
    auto r = unwrap(cache->clear());
    if (o->json) fmt::print("{}\n", dump_json(prune_json(*cache, r)));
    else
      fmt::print("clear: removed {} entries ({}) from {}{}\n", r.removed, human_bytes(r.bytes_before - r.bytes_after),
                 printable(cache->root()),
                 r.bytes_after ? fmt::format("; {} left (see the warnings)", human_bytes(r.bytes_after)) : std::string());
  });
}

}  // namespace

void add_maintenance_commands(CLI::App& app) {
  add_prune(app);
  add_clear(app);
}

}  // namespace kdajit::cli
