// The verbs of the one `kdajit` binary. Each file registers its verbs; main.cpp
// parses and turns failures into one line on stderr and an exit code.
#pragma once

#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "kdajit/error.hpp"

namespace kdajit::cli {

// Exit codes (README, "Exit codes").
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the verb ran and failed, or found problems
inline constexpr int kExitUsage = 2;    // bad arguments, unknown verb, malformed KDAJIT_* variable: nothing done
inline constexpr int kExitSkipped = 77; // selfcheck: nothing could be checked here (no GPU)

// Thrown by a verb to end with `kdajit: error: <message>` (made printable), the
// detail lines indented below it, and exit code `code`.
struct Failure : std::runtime_error {
  int code;
  std::string message;  // what() would stop at a NUL the input may hold
  std::string detail;
  explicit Failure(const std::string& msg, int c = kExitFailure, std::string det = {})
      : std::runtime_error(msg), code(c), message(msg), detail(std::move(det)) {}
};

// An error's exit code: a caller's bad input is a usage error.
inline int exit_code_for(const Error& e) {
  return e.code == ErrorCode::invalid_argument ? kExitUsage : kExitFailure;
}

// Returns the value or throws Failure with the error's message and detail.
template <class T>
T unwrap(Result<T> r) {
  if (!r) throw Failure(r.error().message, exit_code_for(r.error()), r.error().detail);
  return std::move(r).value();
}
inline void unwrap(Status s) {
  if (!s) throw Failure(s.error().message, exit_code_for(s.error()), s.error().detail);
}

void add_keys_command(CLI::App& app);       // keys, fields
void add_compile_commands(CLI::App& app);   // show, compile
void add_cache_commands(CLI::App& app);     // prewarm, ls, verify, explain, prune, clear
void add_prewarm(CLI::App& app);              //   cmd_prewarm.cpp
void add_maintenance_commands(CLI::App& app); //   cmd_maintain.cpp: prune, clear
void add_env_command(CLI::App& app);        // env
void add_selfcheck_command(CLI::App& app);  // selfcheck
void add_routes_command(CLI::App& app);     // routes
void add_tune_command(CLI::App& app);       // tune

}  // namespace kdajit::cli
