// The one environment of a kdajit run, read and checked once before any verb, and
// the two choices every verb makes from it the same way: the target arch and the
// cache layers.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>

#include <CLI/CLI.hpp>

#include "kdajit/cache.hpp"
#include "kdajit/env.hpp"
#include "kdajit/kernel_key.hpp"

namespace kdajit::cli {

// Reads and checks the environment (a malformed KDAJIT_* value: Failure, exit 2)
// and applies KDAJIT_LOG. main.cpp calls it once parsing is complete.
void load_environment();
const Environment& environment();

// The arch, and the setting that chose it ("--arch", "KDAJIT_ARCH", "the local
// GPU (compute capability 9.0)", "no GPU: the default").
struct ArchChoice {
  Arch arch = Arch::sm_90;
  std::string source;
};
// The one rule: KDAJIT_ARCH when set, else the local GPU's arch, else sm_90. It is
// the runtime's choice on this machine when no options.arch is given.
ArchChoice runtime_arch();
// `flag` (e.g. --arch, empty when not given) when given, else runtime_arch().
// A bad value is a Failure (exit 2) naming `flag_name`.
ArchChoice choose_arch(const std::string& flag, std::string_view flag_name = "--arch");
// One warning when kernels are built for archs the runtime here does not pick.
void warn_if_not_runtime_arch(std::string_view verb, const std::set<Arch>& archs);

// --cache-dir, --json: the options of the cache verbs.
struct CommonOpts {
  std::string cache_dir;
  bool json = false;
};
void add_common(CLI::App* cmd, CommonOpts& o, bool with_json = true);

// The cache setting in force and what chose it ("--cache-dir", "KDAJIT_CACHE_DIR",
// "XDG_CACHE_HOME", "HOME"); a malformed --cache-dir is a Failure (exit 2).
struct CacheSetting {
  std::string value;
  std::string source;
};
CacheSetting cache_setting(const CommonOpts& o);

enum class CacheUse {
  inspect,   // ls, explain, env, prewarm --dry-run/--check: creates and changes nothing
  maintain,  // verify, prune, clear: changes existing layers, creates none
  build,     // prewarm: creates the write layer
};
std::unique_ptr<KernelCache> open_cache(const CommonOpts& o, CacheUse use, bool log_compiles = true);

// A Failure (exit 1) when no layer of the cache can be read, naming each layer and
// why (item: "verify on /does/not/exist is not '0 entries, ok'").
void require_readable(const KernelCache& cache, const CommonOpts& o, std::string_view verb);

}  // namespace kdajit::cli
