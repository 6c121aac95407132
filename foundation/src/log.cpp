#include "kdajit/log.hpp"

#include "kdajit/printable.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace kdajit {

namespace {

// -1: not set yet; read lazily from KDAJIT_LOG on first use.
std::atomic<int> g_level{-1};

}  // namespace

Result<LogLevel> read_log_level() {
  const char* v = std::getenv("KDAJIT_LOG");
  if (!v || !*v) return LogLevel::info;
  const std::string_view s = v;
  if (s == "quiet") return LogLevel::quiet;
  if (s == "info") return LogLevel::info;
  if (s == "debug") return LogLevel::debug;
  return invalid_argument(fmt::format("KDAJIT_LOG: expected quiet|info|debug, got '{}'", printable(s)));
}

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }

LogLevel log_level() {
  int v = g_level.load(std::memory_order_relaxed);
  if (v < 0) {
    auto l = read_log_level();
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
  s += printable_line(line, 4096);
  s.push_back('\n');
  ssize_t off = 0;
  while (off < static_cast<ssize_t>(s.size())) {
    ssize_t n = ::write(STDERR_FILENO, s.data() + off, s.size() - off);
    if (n <= 0) break;
    off += n;
  }
}

}  // namespace kdajit
