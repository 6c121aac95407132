// All configuration that kdajit reads from the environment, in one typed place.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kdajit/error.hpp"
#include "kdajit/kernel_key.hpp"
#include "kdajit/log.hpp"

namespace kdajit {

struct Environment {
  std::optional<std::string> cache_dir;       // KDAJIT_CACHE_DIR
  std::optional<std::string> xdg_cache_home;  // XDG_CACHE_HOME
  std::optional<std::string> home;            // HOME
  std::optional<uint64_t> cache_max_bytes;    // KDAJIT_CACHE_MAX_BYTES
  bool disable_jit = false;                   // KDAJIT_DISABLE_JIT=1
  std::optional<Arch> arch;                   // KDAJIT_ARCH: the target instead of the device's
  LogLevel log_level = LogLevel::info;        // KDAJIT_LOG=quiet|info|debug
};

// Reads the process environment. Malformed values are errors naming the variable.
Result<Environment> read_environment();

// The cache root: KDAJIT_CACHE_DIR, else $XDG_CACHE_HOME/kdajit, else ~/.cache/kdajit
// (empty if none can be formed).
std::string default_cache_root(const Environment& env);

}  // namespace kdajit
