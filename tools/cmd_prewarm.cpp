// `kdajit prewarm`: compile keys into the cache ahead of serving, or (--dry-run,
// --check) say which are there without compiling or writing anything.
#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_env.hpp"
#include "cli_output.hpp"
#include "commands.hpp"
#include "key_selection.hpp"
#include "kdajit/cache.hpp"
#include "kdajit/log.hpp"
#include "kdajit/parallel.hpp"
#include "kdajit/presets.hpp"
#include "kdajit/runtime/call/select.hpp"
#include "kdajit/runtime/device/driver_api.hpp"
#include "kdajit/runtime/jit/obtain.hpp"

namespace kdajit::cli {

namespace {

using nlohmann::json;

struct Opts {
  CommonOpts common;
  std::vector<std::string> presets;
  std::vector<std::string> manifests;
  std::map<std::string, std::vector<std::string>> flags;
  std::string arch;
  std::optional<int> device;  // --device: the arch of that GPU
  unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
  bool strict = false;  // the default since failures fail; accepted for old scripts
  bool allow_failures = false;
  bool dry_run = false;
  bool check = false;
  int sm_count = 0;       // --sm-count: only the routes the built-in bands pick on this many SMs
  bool this_gpu = false;  // --this-gpu: the local GPU's SM count
  bool all_routes = false;
  int64_t max_batch = 1024;
};

struct Selection {
  std::vector<KernelKey> keys;
  ArchChoice arch;
  std::set<Arch> archs;
  // With --sm-count / --this-gpu: the SM count, what gave it, how many keys of
  // the presets and patterns were left out, and per kept key why it is there.
  int sm_count = 0;
  std::string sm_source;
  size_t routes_left_out = 0;
  std::map<KernelKey, std::string> selected_for;
};

// "R 1-16, 33-40", "N 1-4", "repeated slots": where the bands pick the route.
std::string use_text(const KernelKey& key, const BuiltinRouteUse& u) {
  std::vector<std::string> parts;
  for (const auto& [lo, hi] : u.batches)
    parts.push_back(lo == hi ? std::to_string(lo) : fmt::format("{}-{}", lo, hi));
  std::string out;
  if (!parts.empty()) out = fmt::format("{} {}", key.op == Op::single ? "R" : "N", fmt::join(parts, ","));
  if (u.any_length) out += " (at some prompt length)";
  if (u.repeated_slots) out += out.empty() ? "repeated slots" : "; repeated slots";
  return out;
}

// Keeps the keys whose route the built-in bands pick for their family at some
// batch 1..max_batch on `sel.sm_count` SMs (the selector is a pure function of
// the call's shape and the SM count); notes why each stays.
std::vector<KernelKey> routes_for_sm_count(Selection& sel, const std::vector<KernelKey>& keys, int64_t max_batch) {
  std::vector<KernelKey> kept;
  std::map<KernelKey, std::vector<BuiltinRouteUse>> by_family;
  for (const KernelKey& k : keys) {
    KernelKey family = k;
    family.route = Route::rowcta;
    auto it = by_family.find(family);
    if (it == by_family.end()) it = by_family.emplace(family, builtin_route_uses(family, sel.sm_count, max_batch)).first;
    auto use = std::find_if(it->second.begin(), it->second.end(), [&](const auto& u) { return u.route == k.route; });
    if (use == it->second.end()) {
      ++sel.routes_left_out;
      continue;
    }
    sel.selected_for[k] = use_text(k, *use);
    kept.push_back(k);
  }
  return kept;
}

// The arch of GPU --device, for a rank that prewarms its own GPU's keys.
ArchChoice device_arch(const Opts& o) {
  if (!o.arch.empty())
    throw Failure("--device: names the GPU whose arch is built; give --device or --arch, not both", kExitUsage);
  auto ordinal = checked_device_ordinal(*o.device, "--device");
  if (!ordinal) throw Failure(ordinal.error().message, kExitUsage);
  return {unwrap(local_arch(*ordinal)), fmt::format("GPU {} (--device)", *ordinal)};
}

Selection select_keys(const Opts& o) {
  Selection s;
  s.arch = o.device ? device_arch(o) : choose_arch(o.arch);
  if (o.all_routes && (o.sm_count || o.this_gpu))
    throw Failure("prewarm: --all-routes compiles every route; it cannot go with --sm-count or --this-gpu", kExitUsage);
  if (o.sm_count && o.this_gpu)
    throw Failure("prewarm: --sm-count N or --this-gpu, not both", kExitUsage);
  if (o.this_gpu) {
    auto api = driver();
    if (!api) throw Failure(fmt::format("prewarm: --this-gpu: no GPU to read the SM count of ({})", api.error().message));
    auto dev = device_for(**api, o.device ? *o.device : -1);
    auto traits = dev ? device_traits(**api, *dev, std::nullopt) : Result<DeviceTraits>(dev.error());
    if (!traits) throw Failure(fmt::format("prewarm: --this-gpu: cannot read the GPU's SM count ({})", traits.error().message));
    s.sm_count = traits->sm_count;
    s.sm_source = "this GPU";
  } else if (o.sm_count) {
    s.sm_count = o.sm_count;
    s.sm_source = "--sm-count";
  }
  // Presets and patterns name shapes: with an SM count, only their selectable
  // routes. A manifest names exact keys and keeps them all.
  std::vector<KernelKey> shaped;
  for (const auto& p : o.presets) {
    auto k = unwrap(preset_keys(p, s.arch.arch));
    shaped.insert(shaped.end(), k.begin(), k.end());
  }
  for (const auto& m : o.manifests) {
    auto mk = unwrap(manifest_keys(m, s.arch.arch));
    // Decided: a key name or a pattern with an arch is exact; --arch is for the rest.
    // Said once per manifest where it makes a difference.
    std::vector<size_t> ignored;
    for (const auto& [entry, archs] : mk.entries_with_arch)
      if (std::any_of(archs.begin(), archs.end(), [&](Arch a) { return a != s.arch.arch; })) ignored.push_back(entry);
    if (!o.arch.empty() && !ignored.empty()) {
      std::vector<size_t> shown(ignored.begin(), ignored.begin() + std::min<size_t>(ignored.size(), 8));
      log_warning("prewarm: --arch {} is ignored for {} entries of {} that name another arch (entries {}{}); they "
                  "are built for the arch they name",
                  to_string(s.arch.arch), ignored.size(), quote(m), fmt::join(shown, ", "),
                  ignored.size() > shown.size() ? ", ..." : "");
    }
    s.keys.insert(s.keys.end(), mk.keys.begin(), mk.keys.end());
  }
  json pattern = flags_pattern(o.flags);
  if (!pattern.empty()) {
    auto k = pattern_keys(pattern, s.arch.arch);
    if (!k) throw Failure("prewarm: flags: " + k.error().message, kExitUsage);
    shaped.insert(shaped.end(), k->begin(), k->end());
  }
  std::sort(shaped.begin(), shaped.end());
  shaped.erase(std::unique(shaped.begin(), shaped.end()), shaped.end());
  if (s.sm_count) shaped = routes_for_sm_count(s, shaped, o.max_batch);
  s.keys.insert(s.keys.end(), shaped.begin(), shaped.end());
  if (s.keys.empty() && o.presets.empty() && o.manifests.empty())
    throw Failure("prewarm: expected --preset NAME, --manifest FILE or a key pattern (--heads ...)", kExitUsage);
  std::sort(s.keys.begin(), s.keys.end());
  s.keys.erase(std::unique(s.keys.begin(), s.keys.end()), s.keys.end());
  if (s.keys.empty()) throw Failure("prewarm: the presets, manifests and flags given name no keys", kExitUsage);
  if (s.keys.size() > kMaxKeys)
    throw Failure(fmt::format("prewarm: the selection names {} keys, more than {} (the most one run takes); split it "
                              "over several runs",
                              s.keys.size(), kMaxKeys),
                  kExitUsage);
  for (const auto& k : s.keys) s.archs.insert(k.arch);
  return s;
}

std::string archs_text(const std::set<Arch>& archs) {
  std::vector<std::string_view> v;
  for (Arch a : archs) v.push_back(to_string(a));
  return fmt::format("{}", fmt::join(v, ", "));
}

json layers_json(const KernelCache& cache) {
  json out = json::array();
  for (const auto& l : cache.layers())
    out.push_back({{"path", json_text(l.path)}, {"state", to_string(l.state)}, {"reason", json_text(l.reason)}});
  return out;
}

json routes_json(const Selection& sel) {
  return {{"sm_count", sel.sm_count},
          {"sm_count_source", sel.sm_source},
          {"left_out", sel.routes_left_out},
          {"prefill", "the routes some prompt length picks"}};
}

std::string routes_text(const Selection& sel, const Opts& o) {
  return fmt::format(
      "prewarm: routes the built-in selector picks on {} SMs ({}) at batch sizes 1..{}: {} keys left out; SELECTED FOR "
      "says where each is picked (R: rows, N: sequences). A prefill or chunk key stays when some prompt length picks its "
      "route at one of those N. A `kdajit tune` table may pick others; --all-routes compiles every route "
      "(images for several GPU models)",
      sel.sm_count, sel.sm_source, o.max_batch, sel.routes_left_out);
}

// --dry-run / --check: the hash of each key's build inputs, looked up in every
// layer (verified, trust-checked); nothing is compiled, created or written.
void run_probe(const Opts& o, const Selection& sel) {
  auto cache = open_cache(o.common, CacheUse::inspect);
  struct Row {
    KernelKey key;
    std::string hash, status, dir, reason;
  };
  std::vector<Row> rows(sel.keys.size());
  parallel_for(rows.size(), o.jobs, [&](size_t i) {
    Row& row = rows[i];
    row.key = sel.keys[i];
    auto plan = plan_build(row.key);
    if (!plan) {
      row.status = "failed";
      row.reason = plan.error().message;
      return;
    }
    row.hash = plan->hash;
    auto p = cache->probe(row.key, plan->hash);
    row.dir = p.dir;
    row.reason = p.reason;
    row.status = p.state == CacheProbe::State::present ? "present"
                 : p.state == CacheProbe::State::missing ? "missing"
                                                          : "unusable";
  });
  std::map<std::string, size_t> count;
  for (const auto& r : rows) ++count[r.status];
  // Keys with one build hash are one program: a prewarm compiles each program
  // that no present entry holds once (program_order()).
  std::set<std::string> programs, held, to_compile;
  for (const auto& r : rows) {
    if (r.hash.empty()) continue;
    programs.insert(r.hash);
    if (r.status == "present") held.insert(r.hash);
  }
  for (const auto& r : rows)
    if (!r.hash.empty() && !held.count(r.hash)) to_compile.insert(r.hash);
  const size_t absent = count["missing"] + count["unusable"] + count["failed"];
  const char* verb = o.check ? "prewarm --check" : "prewarm --dry-run";
  if (o.common.json) {
    json out = {{"root", json_text(cache->root())}, {"layers", layers_json(*cache)}, {"archs", json::array()},
                {"keys", rows.size()}, {"programs", programs.size()}, {"compiles", to_compile.size()},
                {"present", count["present"]}, {"missing", count["missing"]},
                {"unusable", count["unusable"]}, {"failed", count["failed"]}, {"results", json::array()}};
    for (Arch a : sel.archs) out["archs"].push_back(to_string(a));
    if (sel.sm_count) out["routes"] = routes_json(sel);
    for (const auto& r : rows) {
      json j = {{"key", key_name(r.key)}, {"status", r.status}, {"dir", json_text(r.dir)}};
      if (auto it = sel.selected_for.find(r.key); it != sel.selected_for.end()) j["selected_for"] = it->second;
      if (!r.reason.empty()) j["reason"] = json_text(r.reason);
      out["results"].push_back(j);
    }
    fmt::print("{}\n", dump_json(out));
  } else {
    std::vector<std::vector<std::string>> table;
    for (const auto& r : rows) {
      table.push_back({key_name(r.key), r.status == "missing" ? "missing (would compile)"
                                        : r.status == "unusable" ? "unusable (would rebuild)"
                                                                 : r.status,
                       r.reason.empty() ? r.dir : r.reason});
      if (sel.sm_count) {
        auto it = sel.selected_for.find(r.key);
        table.back().insert(table.back().begin() + 1, it != sel.selected_for.end() ? it->second : "(manifest)");
      }
    }
    if (sel.sm_count) print_table({"KEY", "SELECTED FOR", "STATUS", "WHERE"}, table);
    else print_table({"KEY", "STATUS", "WHERE"}, table);
    if (sel.sm_count) fmt::print("{}\n", routes_text(sel, o));
    // Said only where keys share programs, so a decode-only line reads as before.
    const bool shared = programs.size() != rows.size();
    fmt::print("{}: {} keys{} for {}: {} present, {} missing, {} unusable, {} failed{} ({})\n", verb, rows.size(),
               shared ? fmt::format(" ({} programs)", programs.size()) : std::string(), archs_text(sel.archs),
               count["present"], count["missing"], count["unusable"], count["failed"],
               shared ? fmt::format("; a prewarm compiles {} programs", to_compile.size()) : std::string(),
               printable(cache->root()));
  }
  std::fflush(stdout);
  if (o.check && absent)
    throw Failure(fmt::format("prewarm --check: {} of {} keys are not in the cache", absent, rows.size()));
}

struct Row {
  KernelKey key;
  std::string hash;
  std::string status = "failed";  // compiled | reused | cached | failed
  std::string compiled_for;       // reused: the key whose compile made the cubin
  double ms = 0;
  std::string dir;
  std::string not_stored;  // built or found, but not on disk: why
  std::string error, detail;
  nlohmann::json phases;  // compiled: where the compile's time went (the entry's meta)
};

std::string meta_number(const nlohmann::json& meta, const char* field) {
  auto it = meta.find(field);
  if (it == meta.end() || !it->is_number()) return "?";
  return it->is_number_integer() ? std::to_string(it->get<int64_t>()) : fmt::format("{:.0f}", it->get<double>());
}

// Keys with the same build hash are one program (the prefill op's head
// counts): the first key of each program, preferring one already in the cache
// (the chunked ops' programs first, then route stream's, then the rest), then
// the others, which the process's copy of that program serves (obtain()).
// Keys whose hash cannot be formed go first and report their error there.
// Sets each row's hash where it can be formed.
std::pair<std::vector<size_t>, std::vector<size_t>> program_order(const KernelCache& cache, std::vector<Row>& rows,
                                                                  unsigned jobs) {
  std::vector<std::string> hashes(rows.size());
  parallel_for(rows.size(), jobs, [&](size_t i) {
    if (auto plan = plan_build(rows[i].key)) hashes[i] = rows[i].hash = plan->hash;
  });
  std::map<std::string, size_t> keys_of;  // hash -> how many rows have it
  for (const auto& h : hashes)
    if (!h.empty()) ++keys_of[h];
  // Only a program of several keys has a first key to choose (a probe reads the entry).
  std::vector<char> present(rows.size(), 0);
  parallel_for(rows.size(), jobs, [&](size_t i) {
    if (!hashes[i].empty() && keys_of.at(hashes[i]) > 1)
      present[i] = cache.probe(rows[i].key, hashes[i]).state == CacheProbe::State::present;
  });
  std::map<std::string, size_t> first;  // hash -> the row that builds it
  std::vector<size_t> firsts, rest;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (hashes[i].empty()) {
      firsts.push_back(i);
      continue;
    }
    auto [it, fresh] = first.emplace(hashes[i], i);
    if (!fresh && present[i] && !present[it->second]) it->second = i;
  }
  for (size_t i = 0; i < rows.size(); ++i)
    if (!hashes[i].empty()) (first.at(hashes[i]) == i ? firsts : rest).push_back(i);
  // The longest compiles first, so that the workers finish together instead
  // of one of them compiling a prefill program alone at the end: a prefill or
  // chunk program takes 3-5 s of CPU, a decode program of route stream about
  // twice the others' (docs/PERFORMANCE.md, "Compile and cache").
  const auto tier = [&](size_t i) {
    const KernelKey& k = rows[i].key;
    return hashes[i].empty() ? 0 : chunked(k.op) ? 1 : k.route == Route::stream ? 2 : 3;
  };
  std::stable_sort(firsts.begin(), firsts.end(), [&](size_t a, size_t b) { return tier(a) < tier(b); });
  return {firsts, rest};
}

void run_build(const Opts& o, const Selection& sel) {
  const auto t0 = std::chrono::steady_clock::now();
  // The library's per-compile line would repeat the progress line: prewarm prints one.
  auto cache = open_cache(o.common, CacheUse::build, /*log_compiles=*/false);
  std::vector<Row> rows(sel.keys.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i].key = sel.keys[i];
  auto build_rows = [&](const std::vector<size_t>& order) {
    Progress progress(order.size());
    parallel_for(order.size(), o.jobs, [&](size_t n) {
      Row& row = rows[order[n]];
      const auto k0 = std::chrono::steady_clock::now();
      Result<CacheLookup> r = obtain(*cache, row.key, /*allow_build=*/true);
      if (r) row.hash = r->entry->hash;
      row.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - k0).count();
      if (!r) {
        row.error = r.error().message;
        row.detail = r.error().detail;
        progress.report(fmt::format("{}  FAILED: {}", key_name(row.key), row.error));
        return;
      }
      const nlohmann::json& meta = r->entry->meta;
      const auto of = meta.find(kProgramCompiledForField);
      const bool reused = r->source == CacheSource::built && of != meta.end() && of->is_string();
      row.status = reused ? "reused" : r->source == CacheSource::built ? "compiled" : "cached";
      if (reused) row.compiled_for = of->get<std::string>();
      else if (r->source == CacheSource::built) row.phases = meta.value("phases", nlohmann::json());
      row.dir = r->entry->dir;
      row.not_stored = r->not_stored;
      std::string text = reused ? fmt::format("{}  stored from the program compiled for {}", key_name(row.key),
                                              row.compiled_for)
                         : r->source == CacheSource::built
                             ? fmt::format("{}  compiled in {:.0f} ms ({} registers, {} bytes spilled, NVRTC {})",
                                           key_name(row.key), row.ms, meta_number(meta, "registers"),
                                           meta_number(meta, "spill_bytes"),
                                           meta.value("nvrtc_version", std::string("?")))
                             : fmt::format("{}  cached", key_name(row.key));
      if (row.dir.empty()) text += "  (not stored on disk)";
      progress.report(text);
    });
  };
  auto [firsts, rest] = program_order(*cache, rows, o.jobs);
  build_rows(firsts);
  build_rows(rest);

  // The LRU cap may have evicted what this run stored for earlier keys.
  for (auto& r : rows) {
    if (r.dir.empty() || r.status == "failed") continue;
    if (cache->probe(r.key, r.hash).state != CacheProbe::State::present) {
      r.dir.clear();
      r.not_stored = cache->max_bytes()
                         ? fmt::format("evicted by the LRU cap (KDAJIT_CACHE_MAX_BYTES={}) to make room for later keys",
                                       *cache->max_bytes())
                         : "removed by another process";
    }
  }
  size_t compiled = 0, reused = 0, cached = 0, failed = 0, not_stored = 0;
  std::map<std::string, size_t> reasons;
  std::set<std::string> programs;
  double compile_cpu_ms = 0;  // NVRTC's CPU time over this run's compiles
  for (const auto& r : rows) {
    if (!r.hash.empty()) programs.insert(r.hash);
    if (r.phases.is_object() && r.phases.contains("cpu_ms") && r.phases["cpu_ms"].is_number())
      compile_cpu_ms += r.phases["cpu_ms"].get<double>();
    if (r.status == "compiled") ++compiled;
    else if (r.status == "reused") ++reused;
    else if (r.status == "cached") ++cached;
    else ++failed;
    if (r.status != "failed" && r.dir.empty()) {
      ++not_stored;
      ++reasons[r.not_stored.empty() ? std::string("unknown") : r.not_stored];
    }
  }
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& r : rows)
    if (!r.error.empty()) print_error(r.error, r.detail);
  const std::string where = cache->mode() == CacheMode::memory_only ? std::string("memory only") : cache->root();
  if (o.common.json) {
    json out = {{"root", json_text(cache->root())}, {"mode", to_string(cache->mode())},
                {"layers", layers_json(*cache)},    {"archs", json::array()},
                {"arch_source", sel.arch.source},   {"keys", rows.size()},
                {"programs", programs.size()},      {"reused", reused},
                {"compiled", compiled},             {"cached", cached},
                {"failed", failed},                 {"not_stored", not_stored},
                {"not_stored_reasons", json::object()}, {"wall_s", wall_s},
                {"compile_cpu_s", compile_cpu_ms / 1e3},
                {"results", json::array()}};
    for (Arch a : sel.archs) out["archs"].push_back(to_string(a));
    if (sel.sm_count) out["routes"] = routes_json(sel);
    for (const auto& [why, n] : reasons) out["not_stored_reasons"][json_text(why)] = n;
    for (const auto& r : rows) {
      json row = {{"key", key_name(r.key)}, {"status", r.status}, {"ms", r.ms}, {"dir", json_text(r.dir)}};
      if (!r.phases.is_null()) row["phases"] = r.phases;
      if (!r.compiled_for.empty()) row["program_compiled_for"] = r.compiled_for;
      if (!r.error.empty()) row["error"] = json_text(r.error);
      if (!r.not_stored.empty() && r.dir.empty()) row["not_stored"] = json_text(r.not_stored);
      out["results"].push_back(row);
    }
    fmt::print("{}\n", dump_json(out));
  } else {
    // Said only where keys share programs, so a decode-only line reads as before.
    fmt::print("prewarm: {} keys{} for {}: {} compiled, {}{} already cached, {} failed{} in {:.1f} s ({})\n",
               rows.size(), programs.size() != rows.size() ? fmt::format(" ({} programs)", programs.size()) : "",
               archs_text(sel.archs), compiled,
               reused ? fmt::format("{} stored from a program compiled for another key, ", reused) : "", cached, failed,
               not_stored ? fmt::format(", {} not stored on disk", not_stored) : std::string(), wall_s,
               printable(where));
    for (const auto& [why, n] : reasons) fmt::print("prewarm: {} not stored on disk: {}\n", n, printable(why, 400));
    if (sel.sm_count) fmt::print("{}\n", routes_text(sel, o));
  }
  std::fflush(stdout);
  if ((failed || not_stored) && !o.allow_failures)
    throw Failure(fmt::format("prewarm: {} of {} keys are not in the cache: {} failed, {} not stored on disk "
                              "(--allow-failures accepts this)",
                              failed + not_stored, rows.size(), failed, not_stored));
}

}  // namespace

void add_prewarm(CLI::App& app) {
  auto* cmd = app.add_subcommand("prewarm", "Compile kernel keys into the cache ahead of serving");
  auto o = std::make_shared<Opts>();
  add_common(cmd, o->common);
  cmd->add_option("--preset", o->presets, fmt::format("model preset(s): {}", fmt::join(preset_names(), " | ")));
  cmd->add_option("--manifest", o->manifests, "JSON list of key names, key objects or key patterns");
  for (const auto& [field, help] : pattern_flag_help())
    cmd->add_option(fmt::format("--{}", field), o->flags[field],
                    fmt::format("key pattern: {} (missing fields: every value; --heads is required)", help))
        ->delimiter(',');
  cmd->add_option("--arch", o->arch,
                  fmt::format("target arch ({}) for presets and patterns (default: KDAJIT_ARCH, else the local GPU's, "
                              "else {}); key names keep their own",
                              choices<Arch>(), to_string(kDefaultArch)));
  cmd->add_option("--device", o->device, "build presets and patterns for the arch of this CUDA device ordinal");
  cmd->add_option("-j,--jobs", o->jobs, "parallel compiles (default: the core count)")->check(CLI::Range(1u, 1024u));
  cmd->add_flag("--allow-failures", o->allow_failures,
                "exit 0 even when a key failed or could not be stored on disk (default: exit 1)");
  cmd->add_flag("--strict", o->strict, "the default (kept for old scripts): exit 1 when a key is not in the cache");
  cmd->add_flag("--dry-run", o->dry_run, "list the keys and which are already cached; compile and write nothing");
  cmd->add_flag("--check", o->check, "like --dry-run, and exit 1 if any key is not cached");
  cmd->add_option("--sm-count", o->sm_count,
                  "only the routes the built-in selector picks on a GPU with this many SMs at the presets' and "
                  "patterns' shapes (batch sizes 1..--max-batch); --dry-run says where each is picked")
      ->check(CLI::Range(1, 4096));
  cmd->add_flag("--this-gpu", o->this_gpu, "--sm-count of the local GPU (device 0)");
  cmd->add_option("--max-batch", o->max_batch, "with --sm-count: the largest batch (rows R, sequences N) served")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_flag("--all-routes", o->all_routes,
                "every route of every shape (the default: for images that serve several GPU models)");
  cmd->callback([o] {
    Selection sel = select_keys(*o);
    warn_if_not_runtime_arch("prewarm", sel.archs);
    if (o->dry_run || o->check) run_probe(*o, sel);
    else run_build(*o, sel);
  });
}

}  // namespace kdajit::cli
