#include <atomic>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <string>

#include <unistd.h>

#include "kdajit/env.hpp"
#include "kdajit/log.hpp"

namespace kdajit {

namespace {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

Result<LogLevel> level_from_env() {
  auto v = get("KDAJIT_LOG");
  if (!v) return LogLevel::info;
  if (*v == "quiet") return LogLevel::quiet;
  if (*v == "info") return LogLevel::info;
  if (*v == "debug") return LogLevel::debug;
  return invalid_argument(fmt::format("KDAJIT_LOG: expected quiet|info|debug, got '{}'", *v));
}

// -1: not set yet; read lazily from KDAJIT_LOG on first use.
std::atomic<int> g_level{-1};

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
  KDAJIT_TRY_ASSIGN(env.log_level, level_from_env());
  return env;
}

std::string default_cache_root(const Environment& env) {
  if (env.cache_dir) return *env.cache_dir;
  if (env.xdg_cache_home) return *env.xdg_cache_home + "/kdajit";
  if (env.home) return *env.home + "/.cache/kdajit";
  return {};
}

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }

LogLevel log_level() {
  int v = g_level.load(std::memory_order_relaxed);
  if (v < 0) {
    auto l = level_from_env();
    v = static_cast<int>(l ? *l : LogLevel::info);
    int expected = -1;
    g_level.compare_exchange_strong(expected, v);
    v = g_level.load(std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(v);
}

void log_line(LogLevel, std::string_view line) {
  // One write() per line so lines of concurrent processes/threads never interleave.
  std::string s = "kdajit: ";
  s.append(line);
  s.push_back('\n');
  ssize_t off = 0;
  while (off < static_cast<ssize_t>(s.size())) {
    ssize_t n = ::write(STDERR_FILENO, s.data() + off, s.size() - off);
    if (n <= 0) break;
    off += n;
  }
}

}  // namespace kdajit
