#include "kdajit/env.hpp"

#include <charconv>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "kdajit/log.hpp"

namespace kdajit {

namespace {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

}  // namespace

Result<Environment> read_environment() {
  Environment env;
  env.cache_dir = get("KDAJIT_CACHE_DIR");
  env.xdg_cache_home = get("XDG_CACHE_HOME");
  env.home = get("HOME");
  if (auto v = get("KDAJIT_CACHE_MAX_BYTES")) {
    uint64_t n = 0;
    auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
    if (ec != std::errc() || p != v->data() + v->size())
      return invalid_argument(fmt::format("KDAJIT_CACHE_MAX_BYTES: expected a byte count (integer >= 0), got '{}'", *v));
    env.cache_max_bytes = n;
  }
  if (auto v = get("KDAJIT_DISABLE_JIT")) {
    if (*v == "1") env.disable_jit = true;
    else if (*v != "0")
      return invalid_argument(fmt::format("KDAJIT_DISABLE_JIT: expected 0 or 1, got '{}'", *v));
  }
  if (auto v = get("KDAJIT_ARCH")) {
    auto arch = parse_arch(*v);
    if (!arch) return invalid_argument(fmt::format("KDAJIT_ARCH: expected one of {}, got '{}'", choices<Arch>(), *v));
    env.arch = *arch;
  }
  KDAJIT_TRY_ASSIGN(env.log_level, read_log_level());
  return env;
}

std::string default_cache_root(const Environment& env) {
  if (env.cache_dir) return *env.cache_dir;
  if (env.xdg_cache_home) return *env.xdg_cache_home + "/kdajit";
  if (env.home) return *env.home + "/.cache/kdajit";
  return {};
}

}  // namespace kdajit
