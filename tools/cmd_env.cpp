// `kdajit env [--json]`: what this machine and this environment make of kdajit:
// versions and the libraries loaded, the GPUs (index, name, arch, SM count), the arch the runtime would pick,
// the cache layers (what chose them, writable or not, entries per arch, stale),
// and every KDAJIT_* variable. Reads only: creates nothing.
#include <dlfcn.h>
#include <link.h>

#include <cstring>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_env.hpp"
#include "cli_output.hpp"
#include "commands.hpp"
#include "kdajit/cache.hpp"
#include "kdajit/kdajit_version.h"
#include "kdajit/runtime/jit/compile.hpp"
#include "kdajit/runtime/jit/nvrtc_api.hpp"
#include "kdajit/runtime/device/driver_api.hpp"

extern char** environ;

namespace kdajit::cli {

namespace {

using nlohmann::json;

// NVRTC as the runtime loads it (dlopen, in its search order), or why it cannot.
json nvrtc_json() {
  auto api = nvrtc();
  if (!api) return {{"loaded", false}, {"version", nullptr}, {"library", nullptr}, {"error", json_text(api.error().message)}};
  return {{"loaded", true},
          {"version", (*api)->version},
          {"library", json_text((*api)->path)},
          {"chosen_by", (*api)->chosen_by}};
}

// The driver as the runtime loads it, plus what the runtime's table lacks
// (version, device names), looked up in the same library.
json driver_json() {
  json out = {{"loaded", false}, {"library", nullptr}, {"version", nullptr}, {"gpus", json::array()}};
  auto api = driver();
  if (!api) {
    out["error"] = api.error().message;
    return out;
  }
  out["loaded"] = true;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!lib) return out;
  if (link_map* lm = nullptr; dlinfo(lib, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name) out["library"] = lm->l_name;
  using VersionFn = CUresult (*)(int*);
  using NameFn = CUresult (*)(char*, int, CUdevice);
  if (auto v = reinterpret_cast<VersionFn>(dlsym(lib, "cuDriverGetVersion"))) {
    int n = 0;
    if (v(&n) == CUDA_SUCCESS) out["version"] = fmt::format("{}.{}", n / 1000, (n % 1000) / 10);
  }
  auto name_fn = reinterpret_cast<NameFn>(dlsym(lib, "cuDeviceGetName"));
  int count = 0;
  if ((*api)->cuDeviceGetCount(&count) == CUDA_SUCCESS) {
    for (int i = 0; i < count; ++i) {
      CUdevice dev = 0;
      if ((*api)->cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
      int major = 0, minor = 0, sm_count = 0;
      (*api)->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
      (*api)->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
      (*api)->cuDeviceGetAttribute(&sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
      char name[256] = {0};
      if (name_fn) name_fn(name, sizeof name - 1, dev);
      auto arch = arch_for_compute_capability(major, minor);
      out["gpus"].push_back({{"index", i},
                             {"name", json_text(name)},
                             {"compute_capability", fmt::format("{}.{}", major, minor)},
                             {"arch", arch ? json(to_string(*arch)) : json(nullptr)},
                             {"sm_count", sm_count}});
    }
  }
  dlclose(lib);
  return out;
}

json cache_json(const CommonOpts& o) {
  CacheSetting setting = cache_setting(o);
  auto cache = open_cache(o, CacheUse::inspect);
  json out = {{"setting", json_text(setting.value)},
              {"source", setting.source.empty() ? json(nullptr) : json(setting.source)},
              {"mode", to_string(cache->mode())},
              {"write_layer", cache->mode() == CacheMode::read_write ? json(json_text(cache->root())) : json(nullptr)},
              {"max_bytes", cache->max_bytes() ? json(*cache->max_bytes()) : json(nullptr)},
              {"disable_jit", cache->disable_jit()},
              {"layers", json::array()}};
  std::vector<json> layers;
  for (const auto& l : cache->layers())
    layers.push_back({{"path", json_text(l.path)},
                      {"state", to_string(l.state)},
                      {"reason", json_text(l.reason)},
                      {"writable", l.state == LayerState::read_write},
                      {"entries", 0},
                      {"bytes", 0},
                      {"entries_per_arch", json::object()},
                      {"stale", 0},
                      {"untrusted", 0}});
  for (const auto& e : cache->list_entries()) {
    if (e.layer >= layers.size()) continue;
    json& l = layers[e.layer];
    if (!e.key) {  // a linked <arch>/ directory: untrusted, not an entry
      l["untrusted"] = l["untrusted"].get<size_t>() + 1;
      continue;
    }
    l["entries"] = l["entries"].get<size_t>() + 1;
    l["bytes"] = l["bytes"].get<uint64_t>() + e.bytes;
    std::string arch = e.key ? std::string(to_string(e.key->arch)) : "?";
    l["entries_per_arch"][arch] = l["entries_per_arch"].value(arch, 0) + 1;
    if (e.stale) l["stale"] = l["stale"].get<size_t>() + 1;
    if (!e.untrusted.empty()) l["untrusted"] = l["untrusted"].get<size_t>() + 1;
  }
  out["layers"] = layers;
  return out;
}

json variables_json(json* unknown) {
  json known = json::object();
  for (auto v : kEnvironmentVariables) {
    const char* value = std::getenv(std::string(v).c_str());
    known[std::string(v)] = value ? json(json_text(value)) : json(nullptr);
  }
  *unknown = json::object();
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv = *e;
    if (kv.rfind("KDAJIT_", 0) != 0) continue;
    size_t eq = kv.find('=');
    std::string name(kv.substr(0, eq));
    if (known.contains(name)) continue;
    (*unknown)[json_text(name)] = eq == std::string_view::npos ? "" : json_text(kv.substr(eq + 1));
  }
  return known;
}

void print_text(const json& j) {
  auto s = [](const json& v) { return v.is_null() ? std::string("-") : v.is_string() ? printable(v.get<std::string>()) : v.dump(); };
  fmt::print("kdajit {}\n", s(j["version"]));
  if (j["nvrtc"]["loaded"] == true)
    fmt::print("nvrtc    {} ({}, chosen by {})\n", s(j["nvrtc"]["version"]), s(j["nvrtc"]["library"]),
               s(j["nvrtc"]["chosen_by"]));
  else
    fmt::print("nvrtc    not loaded: {}\n", s(j["nvrtc"]["error"]));
  const json& d = j["driver"];
  if (d["loaded"].get<bool>())
    fmt::print("driver   {} ({})\n", s(d["version"]), s(d["library"]));
  else
    fmt::print("driver   not loaded: {}\n", s(d.value("error", json("unknown"))));
  if (d["gpus"].empty()) fmt::print("gpu      none\n");
  for (const auto& g : d["gpus"])
    fmt::print("gpu {}    {}, compute capability {} ({}), {} SMs\n", g["index"].get<int>(), s(g["name"]),
               s(g["compute_capability"]), s(g["arch"]), s(g["sm_count"]));
  fmt::print("arch     {} (from {}): the runtime builds kernels for it unless options.arch says otherwise\n",
             s(j["arch"]["value"]), s(j["arch"]["source"]));
  const json& c = j["cache"];
  fmt::print("cache    {} (from {}), {}; max bytes {}; JIT {}\n", s(c["setting"]), s(c["source"]), s(c["mode"]),
             s(c["max_bytes"]), c["disable_jit"].get<bool>() ? "disabled (KDAJIT_DISABLE_JIT=1)" : "enabled");
  size_t i = 0;
  for (const auto& l : c["layers"]) {
    std::vector<std::string> per_arch;
    for (const auto& [a, n] : l["entries_per_arch"].items()) per_arch.push_back(fmt::format("{} {}", a, n.dump()));
    fmt::print("  layer {} {}  {}{}: {} entries{}, {} stale{}\n", ++i, s(l["path"]), s(l["state"]),
               l["reason"].get<std::string>().empty() ? std::string() : " (" + s(l["reason"]) + ")", l["entries"].dump(),
               per_arch.empty() ? std::string() : fmt::format(" ({})", fmt::join(per_arch, ", ")), l["stale"].dump(),
               l["untrusted"].get<size_t>() ? fmt::format(", {} untrusted", l["untrusted"].dump()) : std::string());
  }
  fmt::print("environment\n");
  for (const auto& [k, v] : j["variables"].items())
    fmt::print("  {}{}\n", k, v.is_null() ? std::string(" (unset)") : "=" + s(v));
  for (const auto& [k, v] : j["unknown_variables"].items())
    fmt::print("  {}={}  (not a kdajit variable: a typo?)\n", printable(k), s(v));
}

}  // namespace

void add_env_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("env", "Versions, GPUs, the arch the runtime picks, the cache layers, KDAJIT_* values");
  auto o = std::make_shared<CommonOpts>();
  add_common(cmd, *o);
  cmd->callback([o] {
    ArchChoice arch = runtime_arch();
    json unknown;
    json out = {{"version", KDAJIT_VERSION_STRING},
                {"nvrtc", nvrtc_json()},
                {"driver", driver_json()},
                {"arch", {{"value", to_string(arch.arch)}, {"source", arch.source}}},
                {"cache", cache_json(*o)},
                {"variables", variables_json(&unknown)},
                {"unknown_variables", unknown}};
    if (o->json) fmt::print("{}\n", dump_json(out));
    else print_text(out);
  });
}

}  // namespace kdajit::cli
