// A route table measured by `kdajit tune` on one GPU: per key family and rows
// band, the fastest eligible route. Stored in the cache root, keyed and checked
// by the GPU, its SM count, the driver, NVRTC and kdajit versions; a table
// whose identity does not match the running process is ignored (one warning).
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kdajit/routes.hpp"

namespace kdajit {

struct TuneIdentity {
  std::string gpu_name;
  int sm_count = 0;
  int driver_version = 0;  // cuDriverGetVersion
  std::string nvrtc_version;
  std::string kdajit_version;
  Arch arch = Arch::sm_90;

  friend bool operator==(const TuneIdentity&, const TuneIdentity&) = default;
};

class TuneTable {
 public:
  // Rows in [rows_lo, next band's rows_lo) of one family run `route`.
  struct Band {
    int64_t rows_lo = 1;
    Route route = Route::rowcta;
    double us = 0;  // the measured time at rows_lo (reported, not used)
  };

  TuneTable() = default;
  explicit TuneTable(TuneIdentity identity) : identity_(std::move(identity)) {}

  const TuneIdentity& identity() const { return identity_; }
  // Adds a band; bands of a family may come in any order.
  void add(const KernelKey& family, Band band);
  // The tuned route for a call (the band whose rows_lo is the largest <= R), if
  // its family was tuned. The launch hot path: one hash probe, a short scan.
  std::optional<Route> route_for(const CallShape& call) const;
  size_t families() const { return bands_.size(); }
  // The family of a key: the key with route and arch cleared (what bands are kept by).
  static KernelKey family_of(const KernelKey& k);

  nlohmann::json to_json() const;
  static Result<TuneTable> from_json(const nlohmann::json& j);

  // <cache root>/tune/<arch>/<gpu name>.sm<count>.json (the name made file-safe).
  static std::string path_for(const std::string& cache_root, const TuneIdentity& id);
  // Whether a table file exists where path_for() puts the one of `id` (its path
  // does not depend on the NVRTC version, so this needs no NVRTC).
  static bool present(const std::string& cache_root, const TuneIdentity& id);
  // Reads and checks the table for `id`: nullopt when there is none; a table
  // that is unreadable or whose identity differs is an error naming why (the
  // caller warns once and ignores it).
  static Result<std::optional<TuneTable>> load(const std::string& cache_root, const TuneIdentity& id);
  // Writes atomically (a private temporary file, fsync, rename); never follows
  // a symbolic link at the destination.
  Status save(const std::string& cache_root) const;

 private:
  TuneIdentity identity_;
  std::unordered_map<KernelKey, std::vector<Band>, KernelKeyHash> bands_;  // sorted by rows_lo
};

}  // namespace kdajit
