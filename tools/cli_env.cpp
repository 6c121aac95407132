#include "cli_env.hpp"

#include <fmt/format.h>

#include "cli_output.hpp"
#include "commands.hpp"
#include "kdajit/log.hpp"
#include "kdajit/runtime/device/driver_api.hpp"

namespace kdajit::cli {

namespace {
std::optional<Environment> g_env;
}

void load_environment() {
  auto env = read_environment();
  if (!env) throw Failure(env.error().message, kExitUsage);
  set_log_level(env->log_level);
  g_env = std::move(*env);
}

const Environment& environment() {
  if (!g_env) load_environment();
  return *g_env;
}

ArchChoice runtime_arch() {
  if (environment().arch) return {*environment().arch, "KDAJIT_ARCH"};
  if (gpu_available()) {
    auto a = local_arch();
    if (a) return {*a, fmt::format("the local GPU (compute capability {}.{})", arch_compute_capability(*a) / 10,
                                   arch_compute_capability(*a) % 10)};
    log_warning("cannot read the local GPU's arch ({}); assuming {}", a.error().message, to_string(kDefaultArch));
  }
  return {kDefaultArch, "the default without a GPU"};
}

ArchChoice choose_arch(const std::string& flag, std::string_view flag_name) {
  if (flag.empty()) return runtime_arch();
  auto a = parse_arch(flag);
  if (!a) {
    std::string msg = a.error().message;
    if (auto p = msg.find("expected"); p != std::string::npos) msg = msg.substr(p);
    // The key parser echoes the value as given; this one says which flag it was.
    if (auto g = msg.find(", got '"); g != std::string::npos) msg = msg.substr(0, g);
    throw Failure(fmt::format("{}: {}, got '{}'", flag_name, msg, quote(flag)), kExitUsage);
  }
  return {*a, std::string(flag_name)};
}

void warn_if_not_runtime_arch(std::string_view verb, const std::set<Arch>& archs) {
  ArchChoice rt = runtime_arch();
  std::vector<std::string_view> other;
  for (Arch a : archs)
    if (a != rt.arch) other.push_back(to_string(a));
  if (other.empty()) return;
  log_warning("{}: kernels for {} are not used by the runtime on this machine, which picks {} ({}); where they are "
              "to be used, the runtime must pick the same arch (set KDAJIT_ARCH={} there, or build for the GPU's "
              "arch: compute capability 9.0 means sm_90)",
              verb, fmt::join(other, ", "), to_string(rt.arch), rt.source, other.front());
}

void add_common(CLI::App* cmd, CommonOpts& o, bool with_json) {
  cmd->add_option("--cache-dir", o.cache_dir,
                  "cache root, or a ':'-separated list of layers (default: KDAJIT_CACHE_DIR, "
                  "$XDG_CACHE_HOME/kdajit, ~/.cache/kdajit)");
  if (with_json) cmd->add_flag("--json", o.json, "print JSON instead of a table");
}

CacheSetting cache_setting(const CommonOpts& o) {
  if (!o.cache_dir.empty()) {
    if (auto l = split_cache_layers(o.cache_dir, "--cache-dir"); !l) throw Failure(l.error().message, kExitUsage);
    return {o.cache_dir, "--cache-dir"};
  }
  const Environment& env = environment();
  return {default_cache_root(env), std::string(default_cache_root_source(env))};
}

std::unique_ptr<KernelCache> open_cache(const CommonOpts& o, CacheUse use, bool log_compiles) {
  CacheOptions opt;
  opt.root = cache_setting(o).value;
  opt.create_root = use == CacheUse::build;
  opt.writable = use != CacheUse::inspect;
  opt.log_compiles = log_compiles;
  return std::make_unique<KernelCache>(opt, environment());
}

void require_readable(const KernelCache& cache, const CommonOpts& o, std::string_view verb) {
  for (const auto& l : cache.layers())
    if (l.state == LayerState::read_write || l.state == LayerState::read_only) return;
  CacheSetting s = cache_setting(o);
  if (cache.layers().empty())
    throw Failure(fmt::format("{}: there is no cache root (KDAJIT_CACHE_DIR, XDG_CACHE_HOME and HOME are unset)", verb));
  std::vector<std::string> why;
  for (const auto& l : cache.layers()) why.push_back(fmt::format("cache root {} {}", l.path, l.reason));
  throw Failure(fmt::format("{}: {} (set by {})", verb, fmt::join(why, "; "), s.source));
}

}  // namespace kdajit::cli
