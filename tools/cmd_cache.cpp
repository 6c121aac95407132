// The cache verbs: prewarm, ls, verify, explain, prune, clear. Tables for people,
// --json for scripts; --cache-dir overrides KDAJIT_CACHE_DIR on each of them.
#include <unistd.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "kdajit/cache.hpp"
#include "kdajit/env.hpp"
#include "kdajit/presets.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/sha256.hpp"
#include "kdajit/log.hpp"
#include "kdajit/parallel.hpp"
#include "kdajit/runtime/build/obtain.hpp"
#include "kdajit/runtime/device/driver_api.hpp"

namespace kdajit::cli {

namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------
// Shared option handling.

struct CommonOpts {
  std::string cache_dir;
  bool json = false;
};

void add_common(CLI::App* cmd, CommonOpts& o, bool with_json = true) {
  cmd->add_option("--cache-dir", o.cache_dir, "cache root (default: KDAJIT_CACHE_DIR, $XDG_CACHE_HOME/kdajit, ~/.cache/kdajit)");
  if (with_json) cmd->add_flag("--json", o.json, "print JSON instead of a table");
}

// The environment is read strictly here: a malformed variable is a CLI error.
std::unique_ptr<KernelCache> open_cache(const CommonOpts& o, bool create_root) {
  Environment env = unwrap(read_environment());
  CacheOptions opt;
  opt.root = o.cache_dir;
  opt.create_root = create_root;
  return std::make_unique<KernelCache>(opt, env);
}

std::string human_bytes(uint64_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::string utc_time(int64_t ns) {
  if (ns <= 0) return "-";
  std::time_t secs = static_cast<std::time_t>(ns / 1000000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02} {:02}:{:02}:{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec);
}

std::string iso_time(int64_t ns) {
  if (ns <= 0) return {};
  std::string t = utc_time(ns);
  t[10] = 'T';
  return t + "Z";
}

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
  return v.is_string() ? v.get<std::string>() : v.dump();
}

std::string hash_of(const CacheEntryInfo& e) { return e.dir_name.substr(e.dir_name.rfind('.') + 1); }

// Left-aligned columns, two spaces apart.
void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  auto line = [&](const std::vector<std::string>& r) {
    std::string s;
    for (size_t c = 0; c < r.size(); ++c) {
      s += r[c];
      if (c + 1 < r.size()) s += std::string(width[c] - r[c].size() + 2, ' ');
    }
    fmt::print("{}\n", s);
  };
  line(header);
  for (const auto& r : rows) line(r);
}

// ---------------------------------------------------------------------------
// Key selection: presets, manifests and flags.
//
// A manifest is a JSON array. Each element is
//   - a key name: "kda_packed.h16.state_bf16.conv_ds.t4.gate_bounded.route_rowcta.sm_90", or
//   - an object with the fields of `kdajit keys --json` (op, heads, state, conv, t,
//     gate, route, arch), each a value or a list of values: every combination is a key.
//     Missing fields mean every value, except: heads is required; t applies to packed
//     keys (single keys are always t1) and when missing means 1..16; arch when missing
//     is --arch. A full key object is a pattern with one value per field.

// Every value of each enum field, for patterns that leave a field out.
constexpr auto kAllOps = all_values<Op>();
constexpr auto kAllStates = all_values<StateDtype>();
constexpr auto kAllConvs = all_values<ConvLayout>();
constexpr auto kAllGates = all_values<Gate>();

struct Pattern {
  std::vector<Op> op;
  std::vector<int> heads;
  std::vector<StateDtype> state;
  std::vector<ConvLayout> conv;
  std::vector<int> t;
  std::vector<Gate> gate;
  std::vector<Route> route;  // empty: every route that serves the op
  std::vector<Arch> arch;
};

// The key parsers say "kernel key field 'x': ..."; inside a manifest entry "field 'x': ..." reads better.
Error field_error(std::string_view field, const Error& e) {
  constexpr std::string_view kPrefix = "kernel key ";
  std::string msg = e.message;
  if (msg.rfind(kPrefix, 0) == 0) msg = msg.substr(kPrefix.size());
  else if (msg.rfind("field '", 0) != 0) msg = fmt::format("field '{}': {}", field, msg);
  return invalid_argument(msg);
}

template <class T, class Parse>
Result<std::vector<T>> field_values(const json& v, std::string_view field, Parse parse_one) {
  std::vector<T> out;
  auto one = [&](const json& x) -> Status {
    auto r = parse_one(x);
    if (!r) return field_error(field, r.error());
    if (std::find(out.begin(), out.end(), *r) == out.end()) out.push_back(*r);
    return {};
  };
  if (v.is_array()) {
    if (v.empty()) return invalid_argument(fmt::format("field '{}': expected a value or a non-empty list, got []", field));
    for (const auto& x : v) KDAJIT_TRY(one(x));
  } else {
    KDAJIT_TRY(one(v));
  }
  return out;
}

template <class E>
auto enum_parser(Result<E> (*parse)(std::string_view), std::string_view field) {
  return [parse, field](const json& x) -> Result<E> {
    if (!x.is_string()) return invalid_argument(fmt::format("field '{}': expected a string, got {}", field, x.dump()));
    return parse(x.get<std::string>());
  };
}

auto int_parser(std::string_view field, int lo, int hi) {
  return [field, lo, hi](const json& x) -> Result<int> {
    if (!x.is_number_integer() || x.get<int64_t>() < lo || x.get<int64_t>() > hi)
      return invalid_argument(fmt::format("field '{}': expected an integer in {}..{}, got {}", field, lo, hi, x.dump()));
    return static_cast<int>(x.get<int64_t>());
  };
}

Result<Pattern> parse_pattern(const json& obj) {
  if (!obj.is_object())
    return invalid_argument(fmt::format("expected a key name (string) or a key pattern (object), got {}", obj.dump()));
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (std::none_of(kKeyLayout.begin(), kKeyLayout.end(), [&](const KeyFieldLayout& f) { return f.json_name == it.key(); })) {
      std::vector<std::string_view> names;
      for (const auto& f : kKeyLayout) names.push_back(f.json_name);
      return invalid_argument(fmt::format("unknown field '{}'; expected only {}", it.key(), fmt::join(names, ", ")));
    }
  if (!obj.contains("heads")) return invalid_argument("field 'heads': required in a pattern (a value or a list of head counts)");
  Pattern p;
  auto get = [&](const char* f) -> const json* { return obj.contains(f) ? &obj.at(f) : nullptr; };
  if (auto v = get("op")) { KDAJIT_TRY_ASSIGN(p.op, field_values<Op>(*v, "op", enum_parser(parse_field<Op>, "op"))); }
  else p.op.assign(std::begin(kAllOps), std::end(kAllOps));
  KDAJIT_TRY_ASSIGN(p.heads, field_values<int>(obj.at("heads"), "heads", int_parser("heads", 1, kMaxHeads)));
  if (auto v = get("state")) { KDAJIT_TRY_ASSIGN(p.state, field_values<StateDtype>(*v, "state", enum_parser(parse_field<StateDtype>, "state"))); }
  else p.state.assign(std::begin(kAllStates), std::end(kAllStates));
  if (auto v = get("conv")) { KDAJIT_TRY_ASSIGN(p.conv, field_values<ConvLayout>(*v, "conv", enum_parser(parse_field<ConvLayout>, "conv"))); }
  else p.conv.assign(std::begin(kAllConvs), std::end(kAllConvs));
  if (auto v = get("t")) { KDAJIT_TRY_ASSIGN(p.t, field_values<int>(*v, "t", int_parser("t", 1, kMaxTokens))); }
  if (auto v = get("gate")) { KDAJIT_TRY_ASSIGN(p.gate, field_values<Gate>(*v, "gate", enum_parser(parse_field<Gate>, "gate"))); }
  else p.gate.assign(std::begin(kAllGates), std::end(kAllGates));
  if (auto v = get("route")) { KDAJIT_TRY_ASSIGN(p.route, field_values<Route>(*v, "route", enum_parser(parse_field<Route>, "route"))); }
  if (auto v = get("arch")) { KDAJIT_TRY_ASSIGN(p.arch, field_values<Arch>(*v, "arch", enum_parser(parse_arch, "arch"))); }
  bool t_fits_single = p.t.empty() || std::find(p.t.begin(), p.t.end(), 1) != p.t.end();
  if (p.op == std::vector<Op>{Op::single} && !t_fits_single)
    return invalid_argument(fmt::format("field 't': op single takes only t=1, got {}", json(p.t).dump()));
  return p;
}

std::vector<Route> route_names_of(Op op) {
  std::vector<Route> out;
  for (const RouteSpec& r : route_table())
    if (r.serves(op)) out.push_back(r.route);
  return out;
}

Result<std::vector<KernelKey>> expand(const Pattern& p, Arch default_arch) {
  std::vector<KernelKey> out;
  std::vector<Arch> archs = p.arch.empty() ? std::vector<Arch>{default_arch} : p.arch;
  std::vector<int> packed_t = p.t;
  if (packed_t.empty())
    for (int t = 1; t <= kMaxTokens; ++t) packed_t.push_back(t);
  for (Arch a : archs)
    for (Op op : p.op)
      for (int h : p.heads)
        for (StateDtype s : p.state)
          for (ConvLayout c : p.conv)
            for (int t : op == Op::single ? std::vector<int>{1} : packed_t)
              for (Gate g : p.gate)
                for (Route r : p.route.empty() ? route_names_of(op) : p.route) {
                  KernelKey k{op, h, s, c, t, g, r, a};
                  KDAJIT_TRY(validate(k));
                  out.push_back(k);
                }
  return out;
}

// `where: entry N: message`, entries counted from 1.
std::vector<KernelKey> manifest_keys(const std::string& path, Arch default_arch) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Failure(fmt::format("{}: cannot open the manifest", path));
  std::stringstream ss;
  ss << f.rdbuf();
  json doc;
  try {
    doc = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] " tag.
    if (auto close = what.find("] "); close != std::string::npos) what = what.substr(close + 2);
    throw Failure(fmt::format("{}: not valid JSON: {}", path, what));
  }
  if (!doc.is_array())
    throw Failure(fmt::format("{}: expected a JSON array of key names, key objects or key patterns, got a JSON {}", path,
                              doc.type_name()));
  std::vector<KernelKey> keys;
  for (size_t i = 0; i < doc.size(); ++i) {
    auto fail = [&](const Error& e) { return Failure(fmt::format("{}: entry {}: {}", path, i + 1, e.message)); };
    if (doc[i].is_string()) {
      auto k = parse_key(doc[i].get<std::string>());
      if (!k) throw fail(k.error());
      keys.push_back(*k);
      continue;
    }
    auto p = parse_pattern(doc[i]);
    if (!p) throw fail(p.error());
    auto expanded = expand(*p, default_arch);
    if (!expanded) throw fail(expanded.error());
    keys.insert(keys.end(), expanded->begin(), expanded->end());
  }
  return keys;
}

// `--heads 16,64 --t 2,3` -> the pattern {"heads":[16,64],"t":[2,3]}.
json flags_pattern(const std::map<std::string, std::vector<std::string>>& flags) {
  json p = json::object();
  for (const auto& [field, values] : flags) {
    if (values.empty()) continue;
    json list = json::array();
    for (const auto& v : values) {
      bool integer_field = field == "heads" || field == "t";
      int n = 0;
      auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (integer_field && ec == std::errc() && ptr == v.data() + v.size()) list.push_back(n);
      else list.push_back(v);
    }
    p[field] = list;
  }
  return p;
}

Arch default_arch() {
  // The local GPU's arch when there is one: pre-warming on the serving host.
  if (gpu_available())
    if (auto a = local_arch()) return *a;
  return Arch::sm_90;
}

// ---------------------------------------------------------------------------
// prewarm

// One line per key: rewritten in place on a terminal, appended otherwise.
class Progress {
 public:
  explicit Progress(size_t total) : total_(total), tty_(::isatty(STDERR_FILENO) == 1) {
    struct winsize ws {};
    if (tty_ && ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 10) cols_ = ws.ws_col;
  }
  void report(const std::string& text) {
    if (log_level() == LogLevel::quiet) return;
    std::lock_guard<std::mutex> g(mu_);
    ++done_;
    std::string line = fmt::format("[{}/{}] {}", done_, total_, text);
    if (tty_) {
      // Clear, print, return to column 0: a log line written next overwrites it whole.
      if (line.size() >= cols_) line.resize(cols_ - 1);
      std::fprintf(stderr, "\r\x1b[K%s\r", line.c_str());
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }
  void finish() {
    if (tty_ && log_level() != LogLevel::quiet) std::fprintf(stderr, "\r\x1b[K");
  }

 private:
  size_t total_;
  size_t done_ = 0;
  bool tty_;
  size_t cols_ = 200;
  std::mutex mu_;
};

struct PrewarmRow {
  KernelKey key;
  std::string status = "failed";  // compiled | cached | failed
  double ms = 0;
  std::string dir;
  std::string error;
};

void add_prewarm(CLI::App& app) {
  auto* cmd = app.add_subcommand("prewarm", "Compile kernel keys into the cache ahead of serving");
  struct Opts {
    CommonOpts common;
    std::vector<std::string> presets;
    std::vector<std::string> manifests;
    std::map<std::string, std::vector<std::string>> flags;
    std::string arch;
    unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
    bool strict = false;
  };
  auto o = std::make_shared<Opts>();
  add_common(cmd, o->common);
  cmd->add_option("--preset", o->presets, fmt::format("model preset(s): {}", fmt::join(preset_names(), " | ")));
  cmd->add_option("--manifest", o->manifests, "JSON list of key names, key objects or key patterns")
      ->check(CLI::ExistingFile);
  const std::pair<const char*, std::string> pattern_flags[] = {
      {"op", choices<Op>(",")},           {"heads", "head counts, e.g. 16,64"},
      {"state", choices<StateDtype>(",")}, {"conv", choices<ConvLayout>(",")},
      {"t", "packed tokens, e.g. 2,3,4"},  {"gate", choices<Gate>(",")},
      {"route", choices<Route>(",")}};
  for (const auto& [field, help] : pattern_flags)
    cmd->add_option(fmt::format("--{}", field), o->flags[field],
                    fmt::format("key pattern: {} (missing fields: every value; --heads is required)", help))
        ->delimiter(',');
  cmd->add_option("--arch", o->arch, "target arch for presets and patterns (default: the local GPU's, else sm_90)");
  cmd->add_option("-j,--jobs", o->jobs, "parallel compiles (default: the core count)")->check(CLI::Range(1u, 1024u));
  cmd->add_flag("--strict", o->strict, "exit non-zero when a key failed or could not be stored on disk");
  cmd->callback([o] {
    const auto t0 = std::chrono::steady_clock::now();
    Arch arch = o->arch.empty() ? default_arch() : unwrap(parse_arch(o->arch));
    std::vector<KernelKey> keys;
    for (const auto& p : o->presets) {
      auto k = unwrap(preset_keys(p, arch));
      keys.insert(keys.end(), k.begin(), k.end());
    }
    for (const auto& m : o->manifests) {
      auto k = manifest_keys(m, arch);
      keys.insert(keys.end(), k.begin(), k.end());
    }
    json flag_pattern = flags_pattern(o->flags);
    if (!flag_pattern.empty()) {
      auto p = parse_pattern(flag_pattern);
      if (!p) throw Failure("prewarm: flags: " + p.error().message);
      auto k = expand(*p, arch);
      if (!k) throw Failure("prewarm: flags: " + k.error().message);
      keys.insert(keys.end(), k->begin(), k->end());
    }
    if (keys.empty() && o->presets.empty() && o->manifests.empty())
      throw Failure("prewarm: expected --preset NAME, --manifest FILE or a key pattern (--heads ... )");
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());

    auto cache = open_cache(o->common, /*create_root=*/true);
    std::vector<PrewarmRow> rows(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) rows[i].key = keys[i];
    Progress progress(rows.size());
    parallel_for(rows.size(), o->jobs, [&](size_t i) {
      PrewarmRow& row = rows[i];
      const auto k0 = std::chrono::steady_clock::now();
      Result<CacheLookup> r = obtain(*cache, row.key, /*allow_build=*/true);
      row.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - k0).count();
      if (r) {
        row.status = r->source == CacheSource::built ? "compiled" : "cached";
        row.dir = r->entry->dir;
        progress.report(fmt::format("{}  {}  {:.0f} ms", key_name(row.key), row.status, row.ms));
      } else {
        row.error = r.error().message;
        if (!r.error().detail.empty()) row.error += "\n" + r.error().detail;
        progress.report(fmt::format("{}  FAILED", key_name(row.key)));
      }
    });
    progress.finish();

    size_t compiled = 0, cached = 0, failed = 0, not_stored = 0;
    for (const auto& r : rows) {
      if (r.status == "compiled") ++compiled;
      else if (r.status == "cached") ++cached;
      else ++failed;
      if (r.status != "failed" && r.dir.empty()) ++not_stored;
    }
    double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const auto& r : rows)
      if (!r.error.empty()) std::fprintf(stderr, "kdajit: error: %s\n", r.error.c_str());
    if (o->common.json) {
      json out = {{"root", cache->root()},  {"mode", to_string(cache->mode())}, {"keys", rows.size()},
                  {"compiled", compiled},   {"cached", cached},                 {"failed", failed},
                  {"not_stored", not_stored}, {"wall_s", wall_s},              {"results", json::array()}};
      for (const auto& r : rows) {
        json row = {{"key", key_name(r.key)}, {"status", r.status}, {"ms", r.ms}, {"dir", r.dir}};
        if (!r.error.empty()) row["error"] = r.error;
        out["results"].push_back(row);
      }
      fmt::print("{}\n", out.dump(2));
    } else {
      fmt::print("prewarm: {} keys: {} compiled, {} already cached, {} failed{} in {:.1f} s ({})\n", rows.size(),
                 compiled, cached, failed,
                 not_stored ? fmt::format(", {} not stored on disk", not_stored) : std::string(), wall_s,
                 cache->mode() == CacheMode::memory_only ? "memory only" : cache->root());
    }
    std::fflush(stdout);
    if (o->strict && (failed || not_stored))
      throw Failure(fmt::format("prewarm --strict: {} failed, {} not stored on disk", failed, not_stored));
  });
}

// ---------------------------------------------------------------------------
// ls

json entry_json(const CacheEntryInfo& e) {
  return {{"name", e.key ? key_name(*e.key) : e.dir_name},
          {"hash", hash_of(e)},
          {"dir", e.dir},
          {"bytes", e.bytes},
          {"registers", meta_value(e, "registers")},
          {"spill_bytes", meta_value(e, "spill_bytes")},
          {"created", meta_value(e, "created")},
          {"last_used", iso_time(e.last_used_ns)}};
}

void add_ls(CLI::App& app) {
  auto* cmd = app.add_subcommand("ls", "List the cache's entries");
  auto o = std::make_shared<CommonOpts>();
  add_common(cmd, *o);
  cmd->callback([o] {
    auto cache = open_cache(*o, /*create_root=*/false);
    auto entries = cache->list_entries();
    uint64_t total = 0;
    for (const auto& e : entries) total += e.bytes;
    auto foreign = cache->foreign_paths();
    if (o->json) {
      json out = {{"root", cache->root()}, {"mode", to_string(cache->mode())}, {"total_bytes", total},
                  {"entries", json::array()}, {"foreign", foreign}};
      for (const auto& e : entries) out["entries"].push_back(entry_json(e));
      fmt::print("{}\n", out.dump(2));
      return;
    }
    std::vector<std::vector<std::string>> rows;
    for (const auto& e : entries)
      rows.push_back({e.key ? key_name(*e.key) : e.dir_name, hash_of(e), human_bytes(e.bytes),
                      meta_text(e, "registers"), meta_text(e, "spill_bytes"), created_text(e),
                      utc_time(e.last_used_ns)});
    print_table({"NAME", "HASH", "SIZE", "REGS", "SPILLS", "CREATED (UTC)", "LAST USED (UTC)"}, rows);
    fmt::print("{} entries, {} in {}{}\n", entries.size(), human_bytes(total), cache->root(),
               foreign.empty() ? std::string() : fmt::format(" ({} foreign paths ignored)", foreign.size()));
  });
}

// ---------------------------------------------------------------------------
// verify

void add_verify(CLI::App& app) {
  auto* cmd = app.add_subcommand("verify", "Re-hash every entry (and load it on a GPU); remove bad entries");
  struct Opts {
    CommonOpts common;
    bool load = false;
  };
  auto o = std::make_shared<Opts>();
  add_common(cmd, o->common);
  cmd->add_flag("--load", o->load, "also load each cubin whose arch matches the local GPU");
  cmd->callback([o] {
    auto cache = open_cache(o->common, /*create_root=*/false);
    std::optional<Arch> gpu_arch;
    if (o->load) {
      if (gpu_available()) {
        auto a = local_arch();
        if (a) gpu_arch = *a;
        else log_warning("verify --load: {}; not loading", a.error().message);
      } else {
        log_warning("verify --load: no GPU; entries are re-hashed but not loaded");
      }
    }
    struct Bad {
      std::string name, dir, reason;
      bool removed = false;
    };
    std::vector<Bad> bad;
    size_t ok = 0, stale = 0, loaded = 0, not_loaded = 0;
    auto entries = cache->list_entries();
    for (const auto& e : entries) {
      auto v = cache->verify_entry(e);
      if (v.ok && !v.stale && gpu_arch) {
        if (arch_compute_capability(e.key->arch) != arch_compute_capability(*gpu_arch)) {
          ++not_loaded;
        } else {
          // The cubin verify_entry just checked, through the one lookup path.
          auto found = obtain(*cache, *e.key, /*allow_build=*/false);
          Status s = found ? check_cubin_loads(found->entry->cubin, entry_name(e.key->op)) : Status(found.error());
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
      Bad b{key_name(*e.key), e.dir, v.reason};
      Status removed = cache->remove_entry(e);
      b.removed = removed.ok();
      if (!removed) b.reason += " (not removed: " + removed.error().message + ")";
      bad.push_back(std::move(b));
    }
    auto foreign = cache->foreign_paths();
    if (o->common.json) {
      json out = {{"root", cache->root()}, {"checked", entries.size()}, {"ok", ok},
                  {"stale", stale},        {"loaded", loaded},          {"not_loaded", not_loaded},
                  {"bad", json::array()},  {"foreign", foreign}};
      for (const auto& b : bad)
        out["bad"].push_back({{"name", b.name}, {"dir", b.dir}, {"reason", b.reason}, {"removed", b.removed}});
      fmt::print("{}\n", out.dump(2));
    } else {
      for (const auto& b : bad) fmt::print("BAD  {}: {}{}\n", b.dir, b.reason, b.removed ? " (removed)" : "");
      for (const auto& f : foreign) fmt::print("FOREIGN  {}\n", f);
      fmt::print("verify: {} entries: {} ok ({} stale), {} bad{} in {}\n", entries.size(), ok, stale, bad.size(),
                 gpu_arch ? fmt::format(", {} loaded on {}", loaded, to_string(*gpu_arch)) : std::string(),
                 cache->root());
    }
    std::fflush(stdout);
    if (!bad.empty()) throw Failure(fmt::format("verify: {} bad entries", bad.size()));
  });
}

// ---------------------------------------------------------------------------
// explain

struct Explained {
  KernelKey key;
  BuildPlan plan;
};

Explained explain_one(const std::string& text) {
  Explained e;
  if (!text.empty() && text.front() == '{') {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded()) throw Failure(fmt::format("explain: '{}' is neither a key name nor a JSON key object", text));
    e.key = unwrap(key_from_json(j));
  } else {
    e.key = unwrap(parse_key(text));
  }
  e.plan = unwrap(plan_build(e.key));
  return e;
}

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
    auto cache = open_cache(o->common, /*create_root=*/false);
    auto entries = cache->list_entries();
    std::vector<Explained> ex;
    for (const auto& k : o->keys) ex.push_back(explain_one(k));

    json out = {{"keys", json::array()}};
    for (const auto& e : ex) {
      json j = {{"name", key_name(e.key)},
                {"fields", key_to_json(e.key)},
                {"hash", e.plan.hash},
                {"hash_inputs", inputs_json(e)},
                {"entry_dir", cache->entry_dir(e.key, e.plan.hash)},
                {"cached", "no"},
                {"other_entries", json::array()}};
      // This key's entries on disk: the current one, and older ones with why they differ.
      for (const auto& info : entries) {
        if (!info.key || *info.key != e.key) continue;
        if (info.dir == cache->entry_dir(e.key, e.plan.hash)) {
          auto v = cache->verify_entry(info);
          j["cached"] = v.ok ? "yes" : "corrupt: " + v.reason;
          continue;
        }
        json other = {{"dir", info.dir}, {"differs_in", json::array()}};
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
      for (const KeyFieldLayout& kf : kKeyLayout) {
        const std::string field(kf.json_name);
        if (a[field] != b[field]) fields.push_back({{"field", field}, {"a", a[field]}, {"b", b[field]}});
      }
      out["differing_fields"] = fields;
      out["differing_inputs"] = differing_inputs(out["keys"][0]["hash_inputs"], out["keys"][1]["hash_inputs"]);
    }
    if (o->common.json) {
      fmt::print("{}\n", out.dump(2));
      return;
    }
    for (const auto& j : out["keys"]) {
      fmt::print("{}\n", j["name"].get<std::string>());
      for (const KeyFieldLayout& kf : kKeyLayout) {
        const std::string_view f = kf.json_name;
        const json& v = j["fields"][std::string(f)];
        fmt::print("  {:<16} {}\n", f, v.is_string() ? v.get<std::string>() : v.dump());
      }
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
      fmt::print("  entry            {}\n", j["entry_dir"].get<std::string>());
      fmt::print("  cached           {}\n", j["cached"].get<std::string>());
      for (const auto& other : j["other_entries"])
        fmt::print("  other entry      {} (differs in: {})\n", other["dir"].get<std::string>(),
                   other["differs_in"].empty() ? std::string("unknown: no readable meta.json")
                                               : fmt::format("{}", fmt::join(other["differs_in"].get<std::vector<std::string>>(), ", ")));
    }
    if (ex.size() == 2) {
      if (out["differing_fields"].empty()) {
        fmt::print("the keys are identical\n");
      } else {
        fmt::print("differing fields:\n");
        for (const auto& d : out["differing_fields"])
          fmt::print("  {:<8} {} vs {}\n", d["field"].get<std::string>(),
                     d["a"].is_string() ? d["a"].get<std::string>() : d["a"].dump(),
                     d["b"].is_string() ? d["b"].get<std::string>() : d["b"].dump());
      }
      fmt::print("differing hash inputs: {}\n",
                 out["differing_inputs"].empty()
                     ? std::string("none")
                     : fmt::format("{}", fmt::join(out["differing_inputs"].get<std::vector<std::string>>(), ", ")));
    }
  });
}

// ---------------------------------------------------------------------------
// prune, clear

json prune_json(const KernelCache& cache, const CachePruneResult& r) {
  return {{"root", cache.root()}, {"removed", r.removed}, {"bytes_before", r.bytes_before}, {"bytes_after", r.bytes_after}};
}

void add_prune(CLI::App& app) {
  auto* cmd = app.add_subcommand("prune", "Remove least recently used entries down to a size");
  struct Opts {
    CommonOpts common;
    uint64_t max_bytes = 0;
  };
  auto o = std::make_shared<Opts>();
  add_common(cmd, o->common);
  auto* max_opt = cmd->add_option("--max-bytes", o->max_bytes, "size to prune to (default: KDAJIT_CACHE_MAX_BYTES)");
  cmd->callback([o, max_opt] {
    auto cache = open_cache(o->common, /*create_root=*/false);
    uint64_t max_bytes = o->max_bytes;
    if (max_opt->count() == 0) {
      if (!cache->max_bytes()) throw Failure("prune: expected --max-bytes N (or KDAJIT_CACHE_MAX_BYTES)");
      max_bytes = *cache->max_bytes();
    }
    if (cache->mode() != CacheMode::read_write)
      throw Failure(fmt::format("prune: the cache root {} is {}", cache->root(), to_string(cache->mode())));
    size_t swept = cache->sweep_tmp(CacheOptions{}.tmp_max_age);
    auto r = cache->prune(max_bytes);
    if (o->common.json) {
      json out = prune_json(*cache, r);
      out["tmp_swept"] = swept;
      fmt::print("{}\n", out.dump(2));
    } else {
      fmt::print("prune: removed {} entries: {} -> {} (limit {}) in {}\n", r.removed, human_bytes(r.bytes_before),
                 human_bytes(r.bytes_after), human_bytes(max_bytes), cache->root());
    }
  });
}

void add_clear(CLI::App& app) {
  auto* cmd = app.add_subcommand("clear", "Remove every entry (foreign files are left alone)");
  auto o = std::make_shared<CommonOpts>();
  add_common(cmd, *o);
  cmd->callback([o] {
    auto cache = open_cache(*o, /*create_root=*/false);
    if (cache->mode() == CacheMode::memory_only) {
      // Nothing there (or not a directory): nothing to clear.
      if (o->json) fmt::print("{}\n", prune_json(*cache, {}).dump(2));
      else fmt::print("clear: nothing to remove in {}\n", cache->root());
      return;
    }
    auto r = unwrap(cache->clear());
    if (o->json) fmt::print("{}\n", prune_json(*cache, r).dump(2));
    else fmt::print("clear: removed {} entries ({}) from {}\n", r.removed, human_bytes(r.bytes_before), cache->root());
  });
}

}  // namespace

void add_cache_commands(CLI::App& app) {
  add_prewarm(app);
  add_ls(app);
  add_verify(app);
  add_explain(app);
  add_prune(app);
  add_clear(app);
}

}  // namespace kdajit::cli
