// The cache verbs that look: ls, verify (which also removes bad entries of the
// write layer) and explain.
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_env.hpp"
#include "cli_output.hpp"
#include "commands.hpp"
#include "key_selection.hpp"
#include "kdajit/cache.hpp"
#include "kdajit/log.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/runtime/jit/obtain.hpp"
#include "kdajit/runtime/device/driver_api.hpp"
#include "kdajit/sha256.hpp"

namespace kdajit::cli {

namespace {

using nlohmann::json;

// "2024-05-01T10:00:00.123Z" -> "2024-05-01 10:00:00"
std::string created_text(const CacheEntryInfo& e) {
  if (!e.meta || !e.meta->contains("created") || !(*e.meta)["created"].is_string()) return "-";
  std::string s = (*e.meta)["created"].get<std::string>().substr(0, 19);
  if (s.size() == 19) s[10] = ' ';
  return s;
}

json meta_value(const CacheEntryInfo& e, const char* field) {
  if (!e.meta || !e.meta->contains(field)) return nullptr;
  return (*e.meta)[field];
}

std::string meta_text(const CacheEntryInfo& e, const char* field) {
  json v = meta_value(e, field);
  if (v.is_null()) return "-";
  return v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string hash_of(const CacheEntryInfo& e) { return e.dir_name.substr(e.dir_name.rfind('.') + 1); }

json layers_json(const KernelCache& cache) {
  json out = json::array();
  for (const auto& l : cache.layers())
    out.push_back({{"path", json_text(l.path)}, {"state", to_string(l.state)}, {"reason", json_text(l.reason)}});
  return out;
}

// Lines for layers that are not plainly usable, under the tables.
void print_layer_notes(const KernelCache& cache) {
  const auto& layers = cache.layers();
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& l = layers[i];
    if (layers.size() == 1 && l.state == LayerState::read_write) continue;
    fmt::print("layer {}: {} {}{}\n", i + 1, printable(l.path), to_string(l.state),
               l.reason.empty() ? std::string() : " (" + printable(l.reason) + ")");
  }
}

json entry_json(const CacheEntryInfo& e) {
  json j = {{"name", e.key ? key_name(*e.key) : json_text(e.dir_name)},
            {"hash", hash_of(e)},
            {"dir", json_text(e.dir)},
            {"layer", e.layer},
            {"bytes", e.bytes},
            {"disk_bytes", e.disk_bytes},
            {"registers", meta_value(e, "registers")},
            {"spill_bytes", meta_value(e, "spill_bytes")},
            {"created", meta_value(e, "created")},
            {"last_used", iso_time(e.last_used_ns)},
            {"stale", e.stale}};
  if (!e.untrusted.empty()) j["untrusted"] = json_text(e.untrusted);
  return j;
}

void add_ls(CLI::App& app) {
  auto* cmd = app.add_subcommand("ls", "List the cache's entries (every layer)");
  auto o = std::make_shared<CommonOpts>();
  add_common(cmd, *o);
  cmd->callback([o] {
    auto cache = open_cache(*o, CacheUse::inspect);
    require_readable(*cache, *o, "ls");
    auto entries = cache->list_entries();
    uint64_t total = 0, disk = 0;
    for (const auto& e : entries) total += e.bytes, disk += e.disk_bytes;
    auto foreign = cache->foreign_paths();
    if (o->json) {
      json out = {{"root", json_text(cache->root())}, {"mode", to_string(cache->mode())},
                  {"layers", layers_json(*cache)},    {"total_bytes", total}, {"disk_bytes", disk},
                  {"entries", json::array()},         {"foreign", json_texts(foreign)}};
      for (const auto& e : entries) out["entries"].push_back(entry_json(e));
      fmt::print("{}\n", dump_json(out));
      return;
    }
    std::vector<std::vector<std::string>> rows;
    for (const auto& e : entries) {
      std::string name = e.key ? key_name(*e.key) : e.dir_name;
      if (!e.untrusted.empty()) name += "  UNTRUSTED (" + e.untrusted + ")";
      else if (e.stale) name += "  (stale)";
      rows.push_back({name, hash_of(e), human_bytes(e.bytes), meta_text(e, "registers"), meta_text(e, "spill_bytes"),
                      created_text(e), utc_time(e.last_used_ns)});
    }
    print_table({"NAME", "HASH", "SIZE", "REGS", "SPILLS", "CREATED (UTC)", "LAST USED (UTC)"}, rows);
    print_layer_notes(*cache);
    // Sizes count a file in every entry that links it; "on disk" counts it once.
    fmt::print("{} entries, {} ({} on disk) in {}{}\n", entries.size(), human_bytes(total), human_bytes(disk),
               printable(cache->root()),
               foreign.empty() ? std::string() : fmt::format(" ({} foreign paths ignored)", foreign.size()));
  });
}

void add_verify(CLI::App& app) {
  auto* cmd = app.add_subcommand("verify", "Re-hash every entry (and load it on a GPU); remove bad entries");
  struct Opts {
    CommonOpts common;
    bool load = false;
    int device = 0;
  };
  auto o = std::make_shared<Opts>();
  add_common(cmd, o->common);
  cmd->add_flag("--load", o->load, "also load each cubin whose arch matches the local GPU");
  cmd->add_option("--device", o->device, "CUDA device ordinal --load loads on")->capture_default_str();
  cmd->callback([o] {
    if (o->load && gpu_available()) unwrap(checked_device_ordinal(o->device, "--device"));
    auto cache = open_cache(o->common, CacheUse::maintain);
    require_readable(*cache, o->common, "verify");
    std::optional<Arch> gpu_arch;
    // One primary context for the whole loop, not one per entry (PrimaryContextHold).
    std::optional<PrimaryContextHold> context;
    if (o->load) {
      if (gpu_available()) {
        auto a = local_arch(o->device);
        auto held = a ? PrimaryContextHold::retain(o->device) : Result<PrimaryContextHold>(a.error());
        if (held) {
          gpu_arch = *a;
          context.emplace(std::move(*held));
        } else {
          log_warning("verify --load: {}; not loading", held.error().message);
        }
      } else {
        log_warning("verify --load: no GPU; entries are re-hashed but not loaded");
      }
    }
    struct Bad {
      std::string name, dir, reason;
      bool removed = false;
      bool untrusted = false;
    };
    std::vector<Bad> bad;
    size_t ok = 0, stale = 0, loaded = 0, not_loaded = 0;
    auto entries = cache->list_entries();
    for (const auto& e : entries) {
      auto v = cache->verify_entry(e);
      if (v.ok && gpu_arch) {
        if (arch_compute_capability(e.key->arch) != arch_compute_capability(*gpu_arch)) {
          ++not_loaded;
        } else {
          // The verified entry itself (no build: allow_build = false).
          json hash = meta_value(e, "hash");
          auto got = hash.is_string() ? cache->get_or_build(*e.key, hash.get<std::string>(), BuildFn(), false)
                                      : Result<std::shared_ptr<const CacheEntry>>(Error(ErrorCode::cache, "no hash"));
          json entry = meta_value(e, "entry");
          std::string fn = entry.is_string() ? entry.get<std::string>() : std::string(entry_name(e.key->op));
          Status s = got ? check_cubin_loads((*got)->cubin, fn, o->device) : Status(got.error());
          if (!s) {
            v.ok = false;
            v.reason = "does not load: " + s.error().message;
          } else {
            ++loaded;
          }
        }
      }
      if (v.ok) {
        ++ok;
        stale += v.stale;
        continue;
      }
      Bad b{e.key ? key_name(*e.key) : json_text(e.dir_name), e.dir, v.reason, false, v.untrusted};
      if (!v.untrusted) {  // never another user's files
        Status removed = cache->remove_entry(e);
        b.removed = removed.ok();
        if (!removed) b.reason += " (not removed: " + removed.error().message + ")";
      }
      bad.push_back(std::move(b));
    }
    std::vector<std::string> bad_layers;
    for (const auto& l : cache->layers())
      if (l.state == LayerState::untrusted || l.state == LayerState::unusable)
        bad_layers.push_back(fmt::format("cache root {} {}", l.path, l.reason));
    auto foreign = cache->foreign_paths();
    if (o->common.json) {
      json out = {{"root", json_text(cache->root())}, {"layers", layers_json(*cache)}, {"checked", entries.size()},
                  {"ok", ok},  {"stale", stale},  {"loaded", loaded},  {"not_loaded", not_loaded},
                  {"bad", json::array()},  {"foreign", json_texts(foreign)}};
      for (const auto& b : bad)
        out["bad"].push_back({{"name", b.name}, {"dir", json_text(b.dir)}, {"reason", json_text(b.reason)},
                              {"removed", b.removed}, {"untrusted", b.untrusted}});
      fmt::print("{}\n", dump_json(out));
    } else {
      for (const auto& b : bad)
        fmt::print("{}  {}: {}{}\n", b.untrusted ? "UNTRUSTED" : "BAD", printable(b.dir), printable(b.reason, 400),
                   b.removed ? " (removed)" : "");
      for (const auto& f : foreign) fmt::print("FOREIGN  {}\n", printable(f));
      for (const auto& l : bad_layers) fmt::print("LAYER  {}\n", printable(l, 400));
      fmt::print("verify: {} entries: {} ok ({} stale), {} bad{} in {}\n", entries.size(), ok, stale, bad.size(),
                 gpu_arch ? fmt::format(", {} loaded on {}", loaded, to_string(*gpu_arch)) : std::string(),
                 printable(cache->root()));
    }
    std::fflush(stdout);
    if (!bad.empty() || !bad_layers.empty())
      throw Failure(fmt::format("verify: {} bad entries, {} unusable or untrusted layers", bad.size(), bad_layers.size()));
  });
}

struct Explained {
  KernelKey key;
  BuildPlan plan;  // what obtain() would look up: the inputs and their hash
};

json inputs_json(const Explained& e) {
  return {{"schema", kCacheSchemaVersion},
          {"library_version", cache_library_version()},
          {"arch", to_string(e.key.arch)},
          {"nvrtc_version", e.plan.inputs.nvrtc_version},
          {"options", e.plan.inputs.options},
          {"source_bytes", e.plan.inputs.source.size()},
          {"source_sha256", sha256_hex(e.plan.inputs.source)}};
}

// Names of the hash inputs in which `a` and `b` (both inputs_json) differ.
std::vector<std::string> differing_inputs(const json& a, const json& b) {
  std::vector<std::string> out;
  for (const char* f : {"schema", "library_version", "arch", "nvrtc_version", "options", "source_sha256"})
    if (a.value(f, json()) != b.value(f, json())) out.push_back(f == std::string("source_sha256") ? "source" : f);
  return out;
}

std::string value_text(const json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, json::error_handler_t::replace);
}

void add_explain(CLI::App& app) {
  auto* cmd = app.add_subcommand("explain", "Show a key's fields and hash inputs, or why two keys differ");
  struct Opts {
    CommonOpts common;
    std::vector<std::string> keys;
  };
  auto o = std::make_shared<Opts>();
  add_common(cmd, o->common);
  cmd->add_option("KEY", o->keys, "one or two kernel key names (or JSON key objects)")->required()->expected(1, 2);
  cmd->callback([o] {
    std::vector<Explained> ex;
    for (const auto& k : o->keys) {
      Explained e;
      e.key = unwrap(parse_key_or_json(k));
      e.plan = unwrap(plan_build(e.key));
      ex.push_back(std::move(e));
    }
    auto cache = open_cache(o->common, CacheUse::inspect);
    auto entries = cache->list_entries();

    json out = {{"keys", json::array()}};
    for (const auto& e : ex) {
      json j = {{"name", key_name(e.key)},
                {"fields", key_to_json(e.key)},
                {"hash", e.plan.hash},
                {"hash_inputs", inputs_json(e)},
                {"entry_dir", json_text(cache->entry_dir(e.key, e.plan.hash))},
                {"cached", "no"},
                {"other_entries", json::array()}};
      auto probe = cache->probe(e.key, e.plan.hash);
      if (probe.state == CacheProbe::State::present) {
        j["cached"] = "yes";
        j["cached_in"] = json_text(probe.dir);
      } else if (probe.state == CacheProbe::State::unusable) j["cached"] = "unusable: " + json_text(probe.reason);
      // This key's other entries on disk, with the inputs they differ in.
      for (const auto& info : entries) {
        if (!info.key || *info.key != e.key) continue;
        if (info.dir_name.substr(info.dir_name.rfind('.') + 1) == e.plan.hash.substr(0, 16)) continue;
        json other = {{"dir", json_text(info.dir)}, {"differs_in", json::array()}};
        if (info.meta) {
          const json& m = *info.meta;
          json theirs = {{"schema", m.value("schema", json())},
                         {"library_version", m.value("library_version", json())},
                         {"arch", m.value("arch", json())},
                         {"nvrtc_version", m.value("nvrtc_version", json())},
                         {"options", m.value("options", json())},
                         {"source_sha256", m.value("source_sha256", json())}};
          other["differs_in"] = differing_inputs(j["hash_inputs"], theirs);
        }
        j["other_entries"].push_back(other);
      }
      out["keys"].push_back(j);
    }
    if (ex.size() == 2) {
      json fields = json::array();
      json a = key_to_json(ex[0].key), b = key_to_json(ex[1].key);
      for (const auto& field : key_fields())
        if (a[field] != b[field]) fields.push_back({{"field", field}, {"a", a[field]}, {"b", b[field]}});
      out["differing_fields"] = fields;
      out["differing_inputs"] = differing_inputs(out["keys"][0]["hash_inputs"], out["keys"][1]["hash_inputs"]);
    }
    if (o->common.json) {
      fmt::print("{}\n", dump_json(out));
      return;
    }
    for (const auto& j : out["keys"]) {
      fmt::print("{}\n", j["name"].get<std::string>());
      for (const auto& f : key_fields()) fmt::print("  {:<16} {}\n", f, value_text(j["fields"][f]));
      const json& in = j["hash_inputs"];
      fmt::print("  hash inputs:\n");
      fmt::print("    {:<16} {}\n", "schema", in["schema"].dump());
      fmt::print("    {:<16} {}\n", "library_version", in["library_version"].get<std::string>());
      fmt::print("    {:<16} {}\n", "arch", in["arch"].get<std::string>());
      fmt::print("    {:<16} {}\n", "nvrtc_version", in["nvrtc_version"].get<std::string>());
      fmt::print("    {:<16} {}\n", "options", fmt::join(in["options"].get<std::vector<std::string>>(), " "));
      fmt::print("    {:<16} {} bytes, sha256 {}\n", "source", in["source_bytes"].dump(),
                 in["source_sha256"].get<std::string>());
      fmt::print("  hash             {}\n", j["hash"].get<std::string>());
      fmt::print("  entry            {}\n", printable(j["entry_dir"].get<std::string>()));
      fmt::print("  cached           {}{}\n", printable(j["cached"].get<std::string>(), 400),
                 j.contains("cached_in") ? " (" + printable(j["cached_in"].get<std::string>()) + ")" : std::string());
      for (const auto& other : j["other_entries"])
        fmt::print("  other entry      {} (differs in: {})\n", printable(other["dir"].get<std::string>()),
                   other["differs_in"].empty()
                       ? std::string("unknown: no readable meta.json")
                       : fmt::format("{}", fmt::join(other["differs_in"].get<std::vector<std::string>>(), ", ")));
    }
    if (ex.size() == 2) {
      if (out["differing_fields"].empty()) {
        fmt::print("the keys are identical\n");
      } else {
        fmt::print("differing fields:\n");
        for (const auto& d : out["differing_fields"])
          fmt::print("  {:<8} {} vs {}\n", d["field"].get<std::string>(), value_text(d["a"]), value_text(d["b"]));
      }
      fmt::print("differing hash inputs: {}\n",
                 out["differing_inputs"].empty()
                     ? std::string("none")
                     : fmt::format("{}", fmt::join(out["differing_inputs"].get<std::vector<std::string>>(), ", ")));
    }
  });
}

}  // namespace

void add_cache_commands(CLI::App& app) {
  add_prewarm(app);
  add_ls(app);
  add_verify(app);
  add_explain(app);
  add_maintenance_commands(app);
}

}  // namespace kdajit::cli
