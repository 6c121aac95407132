// The verbs of the one `kdajit` binary. Each file registers its verbs; main.cpp
// parses and turns failures into one line on stderr and an exit code.
#pragma once

#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "kdajit/error.hpp"

namespace kdajit::cli {

// Thrown by a verb to end with `kdajit: error: <message>` and exit code `code`.
struct Failure : std::runtime_error {
  int code;
  explicit Failure(const std::string& msg, int c = 1) : std::runtime_error(msg), code(c) {}
};

// Returns the value or throws Failure with the error's message (and detail).
template <class T>
T unwrap(Result<T> r) {
  if (!r) throw Failure(r.error().detail.empty() ? r.error().message : r.error().message + "\n" + r.error().detail);
  return std::move(r).value();
}
inline void unwrap(Status s) {
  if (!s) throw Failure(s.error().detail.empty() ? s.error().message : s.error().message + "\n" + s.error().detail);
}

void add_keys_command(CLI::App& app);       // keys
void add_compile_commands(CLI::App& app);   // show, compile
void add_cache_commands(CLI::App& app);     // prewarm, ls, verify, explain, prune, clear
void add_selfcheck_command(CLI::App& app);  // selfcheck
void add_routes_command(CLI::App& app);     // routes
void add_tune_command(CLI::App& app);       // tune

}  // namespace kdajit::cli
