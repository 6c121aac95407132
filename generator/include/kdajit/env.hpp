// All configuration that kdajit reads from the environment, in one typed place.
// Every reader (the runtime, the cache, every CLI verb) goes through
// read_environment(), so a malformed value is the same error everywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kdajit/error.hpp"
#include "kdajit/kernel_key.hpp"
#include "kdajit/log.hpp"
#include "kdajit/printable.hpp"

namespace kdajit {

struct Environment {
  std::optional<std::string> cache_dir;       // KDAJIT_CACHE_DIR: a root, or a ':'-separated list of layers
  std::optional<std::string> xdg_cache_home;  // XDG_CACHE_HOME
  std::optional<std::string> home;            // HOME
  std::optional<uint64_t> cache_max_bytes;    // KDAJIT_CACHE_MAX_BYTES
  bool disable_jit = false;                   // KDAJIT_DISABLE_JIT=1
  LogLevel log_level = LogLevel::info;        // KDAJIT_LOG=quiet|info|debug
  // KDAJIT_ARCH: the arch kernels are built for instead of the device's (the
  // runtime: options.arch > KDAJIT_ARCH > the device; the CLI's default --arch).
  std::optional<Arch> arch;
};

// The variables read_environment() reads, in the order the docs list them.
// KDAJIT_NVRTC is read where NVRTC is loaded (runtime/src/jit/nvrtc_api.cpp: a
// path, checked by loading it); KDAJIT_LIBRARY and KDAJIT_PYTHON_HOTPATH by the
// Python package only.
inline constexpr std::string_view kEnvironmentVariables[] = {
    "KDAJIT_CACHE_DIR", "KDAJIT_CACHE_MAX_BYTES", "KDAJIT_DISABLE_JIT", "KDAJIT_LOG",           "KDAJIT_ARCH",
    "KDAJIT_NVRTC",     "KDAJIT_LIBRARY",         "KDAJIT_PYTHON_HOTPATH"};

// Reads the process environment. Malformed values are errors naming the variable
// and the expected value (the value quoted through printable()).
Result<Environment> read_environment();

// A size in bytes as every setting takes it (KDAJIT_CACHE_MAX_BYTES, `prune
// --max-bytes`): decimal digits only, 0..2^64-1. Anything else ("", "-0", "0x10",
// "1e3", 2^64) is an error naming `setting`.
Result<uint64_t> parse_byte_count(std::string_view text, std::string_view setting);

// The cache root setting: KDAJIT_CACHE_DIR, else $XDG_CACHE_HOME/kdajit, else
// ~/.cache/kdajit (empty if none can be formed). May be a ':'-separated list.
std::string default_cache_root(const Environment& env);
// Which variable default_cache_root() took: "KDAJIT_CACHE_DIR", "XDG_CACHE_HOME",
// "HOME", or "" when none is set.
std::string_view default_cache_root_source(const Environment& env);

// A cache setting split into its layers ("a:b" -> {"a", "b"}). An empty element
// ("a::b", a trailing ':') is an error naming `setting`.
Result<std::vector<std::string>> split_cache_layers(std::string_view value, std::string_view setting);


}  // namespace kdajit
