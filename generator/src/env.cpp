#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
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
  return invalid_argument(fmt::format("KDAJIT_LOG: expected quiet|info|debug, got '{}'", printable(*v)));
}

// -1: not set yet; read lazily from KDAJIT_LOG on first use.
std::atomic<int> g_level{-1};

// Length of the UTF-8 sequence at s[i] (1..4), or 0 when it is not valid UTF-8
// (overlong forms, surrogates and code points past U+10FFFF are invalid).
size_t utf8_length(std::string_view s, size_t i, uint32_t* cp) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  unsigned char c = b(0);
  size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(k) & 0x3Fu);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

// Code points a terminal may act on: C1 controls (0x9B is CSI) and the bidi
// overrides that reorder what follows them.
bool is_unsafe_code_point(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

std::string printable(std::string_view s, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(s.size(), max_bytes) + 16);
  size_t i = 0;
  while (i < s.size() && i < max_bytes) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp = 0;
    size_t n = utf8_length(s, i, &cp);
    if (n == 0) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
      continue;
    }
    if (i + n > max_bytes) break;  // never cut a character in half
    if (n == 1 && (c < 0x20 || c == 0x7F)) {
      switch (c) {
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default: out += fmt::format("\\x{:02x}", c);
      }
    } else if (is_unsafe_code_point(cp)) {
      out += fmt::format("\\u{:04x}", cp);
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  if (i < s.size()) out += fmt::format("...({} more bytes)", s.size() - i);
  return out;
}

Result<Environment> read_environment() {
  Environment env;
  env.cache_dir = get("KDAJIT_CACHE_DIR");
  env.xdg_cache_home = get("XDG_CACHE_HOME");
  env.home = get("HOME");
  if (env.cache_dir) KDAJIT_TRY(split_cache_layers(*env.cache_dir, "KDAJIT_CACHE_DIR"));
  if (auto v = get("KDAJIT_CACHE_MAX_BYTES")) {
    uint64_t n = 0;
    auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
    if (ec != std::errc() || p != v->data() + v->size())
      return invalid_argument(fmt::format(
          "KDAJIT_CACHE_MAX_BYTES: expected a byte count (an integer in 0..18446744073709551615), got '{}'",
          printable(*v)));
    env.cache_max_bytes = n;
  }
  if (auto v = get("KDAJIT_DISABLE_JIT")) {
    if (*v == "1") env.disable_jit = true;
    else if (*v != "0")
      return invalid_argument(fmt::format("KDAJIT_DISABLE_JIT: expected 0 or 1, got '{}'", printable(*v)));
  }
  KDAJIT_TRY_ASSIGN(env.log_level, level_from_env());
  if (auto v = get("KDAJIT_ARCH")) {
    auto a = parse_arch(*v);
    if (!a) {
      std::string allowed;
      for (size_t i = 0;; ++i) {
        std::string_view name;
        try {
          name = to_string(static_cast<Arch>(i));
        } catch (const std::out_of_range&) {
          break;
        }
        if (!allowed.empty()) allowed += '|';
        allowed.append(name);
      }
      return invalid_argument(fmt::format("KDAJIT_ARCH: expected one of {}, got '{}'", allowed, printable(*v)));
    }
    env.arch = *a;
  }
  return env;
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
  // One line, always: whatever a message echoes (a file name from a shared root, a
  // key from a manifest) cannot forge a second `kdajit:` line or move the cursor.
  // One write() per line so lines of concurrent processes/threads never interleave.
  std::string s = "kdajit: ";
  s += printable(line, 4096);
  s.push_back('\n');
  ssize_t off = 0;
  while (off < static_cast<ssize_t>(s.size())) {
    ssize_t n = ::write(STDERR_FILENO, s.data() + off, s.size() - off);
    if (n <= 0) break;
    off += n;
  }
}

}  // namespace kdajit
