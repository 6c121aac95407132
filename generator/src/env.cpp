#include "kdajit/env.hpp"

#include <charconv>
#include <cstdlib>
#include <string>

#include "kdajit/log.hpp"
#include "kdajit/printable.hpp"

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
  if (env.cache_dir) KDAJIT_TRY(split_cache_layers(*env.cache_dir, "KDAJIT_CACHE_DIR"));
  if (auto v = get("KDAJIT_CACHE_MAX_BYTES")) {
    KDAJIT_TRY_ASSIGN(env.cache_max_bytes, parse_byte_count(*v, "KDAJIT_CACHE_MAX_BYTES"));
  }
  if (auto v = get("KDAJIT_DISABLE_JIT")) {
    if (*v == "1") env.disable_jit = true;
    else if (*v != "0")
      return invalid_argument(fmt::format("KDAJIT_DISABLE_JIT: expected 0 or 1, got '{}'", printable(*v)));
  }
  KDAJIT_TRY_ASSIGN(env.log_level, read_log_level());
  if (auto v = get("KDAJIT_ARCH")) {
    auto a = parse_arch(*v);
    if (!a) return invalid_argument(fmt::format("KDAJIT_ARCH: expected one of {}, got '{}'", choices<Arch>(), printable(*v)));
    env.arch = *a;
  }
  return env;
}

Result<uint64_t> parse_byte_count(std::string_view text, std::string_view setting) {
  uint64_t n = 0;
  // Decimal digits only: no sign (from_chars would take "-0"), no base prefix, no blanks.
  const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (!digits || ec != std::errc() || p != text.data() + text.size())
    return invalid_argument(fmt::format("{}: expected a byte count (decimal digits, 0..18446744073709551615), got '{}'",
                                        setting, printable(text)));
  return n;
}

std::string default_cache_root(const Environment& env) {
  if (env.cache_dir) return *env.cache_dir;
  if (env.xdg_cache_home) return *env.xdg_cache_home + "/kdajit";
  if (env.home) return *env.home + "/.cache/kdajit";
  return {};
}

std::string_view default_cache_root_source(const Environment& env) {
  if (env.cache_dir) return "KDAJIT_CACHE_DIR";
  if (env.xdg_cache_home) return "XDG_CACHE_HOME";
  if (env.home) return "HOME";
  return {};
}

Result<std::vector<std::string>> split_cache_layers(std::string_view value, std::string_view setting) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t colon = value.find(':', start);
    std::string_view part = value.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start);
    if (part.empty())
      return invalid_argument(fmt::format("{}: expected a directory or a ':'-separated list of directories, got '{}' "
                                          "(an empty element)",
                                          setting, printable(value)));
    out.emplace_back(part);
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  return out;
}

}  // namespace kdajit
