// Diagnostics go to stderr with a `kdajit: ` prefix, filtered by one process-wide level.
#pragma once

#include <string_view>

#include <fmt/format.h>

#include "kdajit/error.hpp"

namespace kdajit {

enum class LogLevel : int { quiet = 0, info = 1, debug = 2 };

// KDAJIT_LOG (quiet|info|debug; unset: info), read lazily on the first log line.
Result<LogLevel> read_log_level();

void set_log_level(LogLevel level);
LogLevel log_level();
void log_line(LogLevel level, std::string_view line);  // writes "kdajit: <line>\n" atomically

template <class... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() >= LogLevel::info) log_line(LogLevel::info, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() >= LogLevel::debug) log_line(LogLevel::debug, fmt::format(f, std::forward<Args>(args)...));
}
// Warnings are shown at info and debug, hidden by quiet.
template <class... Args>
void log_warning(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() >= LogLevel::info) log_line(LogLevel::info, "warning: " + fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace kdajit
