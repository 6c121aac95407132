// `kdajit tune`: times every eligible route of each key family at a list of
// batch sizes on the local GPU and writes the fastest per rows band as a tune
// table into the cache root, where the selector finds it (tune_table.hpp).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kdajit/runtime/tune/tune_table.hpp"
#include "kdajit/runtime/device/driver_api.hpp"

namespace kdajit {

struct TuneOptions {
  std::vector<KernelKey> families;  // route and arch are ignored; duplicates are measured once
  std::vector<int64_t> rows = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};  // R (single op) or N (packed op)
  int reps = 25;                    // timed launches per (key, rows); the median is kept
  std::string cache_dir;            // "" : the environment's default root
  int device = 0;
  std::function<void(std::string_view line)> progress;  // one line per (family, rows)
};

struct TuneMeasurement {
  KernelKey key;  // with its route and arch
  int64_t rows = 0;
  double median_us = 0;
};

struct TuneReport {
  TuneTable table;
  std::vector<TuneMeasurement> measurements;
  std::string path;  // where the table was written
  size_t skipped_families = 0;  // families with a single eligible route: nothing to choose
};

// Measures, writes the table atomically and returns it. Each timed launch is
// one call on a fresh L2 (a 256 MiB memset before it, outside the events), on
// device buffers filled with a non-zero pattern and distinct live slots.
Result<TuneReport> tune_routes(const TuneOptions& options);

// What a tune table is keyed and checked by, for device `dev` targeted as `arch`.
// with_nvrtc = false leaves nvrtc_version empty (no NVRTC is loaded): enough to
// find the table's file, not to check it.
TuneIdentity tune_identity(const DriverApi& api, CUdevice dev, Arch arch, bool with_nvrtc = true);

}  // namespace kdajit
