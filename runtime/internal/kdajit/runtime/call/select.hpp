// The route selector: which route of the route table runs a validated call on
// a device. The key lookup is the selection: the chosen route is a key field.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "kdajit/routes.hpp"

namespace kdajit {

class TuneTable;

struct RoutePolicy {
  std::optional<Route> forced;        // RuntimeOptions::route: every call must be eligible for it
  const TuneTable* tuned = nullptr;   // a `kdajit tune` table for this device, when allowed and present
};

// The built-in bands (measured on the H200; docs/PERFORMANCE.md "Selector bands"):
// repeated_positive -> sequential; packed: f32 -> stream (T <= 8), bf16 ->
// stream at T <= 2 with items > 2 x SMs, else rowcta; single: bf16 -> stream
// with R x H > 2 x SMs, else rowcta; f32 with 8 x R x H <= SMs -> split4, else
// rowcta.
// Always an eligible route.
Route builtin_route(const CallShape& call, const DeviceTraits& device);

// Where the built-in bands use one route of a family: the batch sizes (rows R
// of the single op, sequences N of the packed op, each at R = N x T) in
// [1, max_batch] for which builtin_route() picks it on `sm_count` SMs, as
// inclusive runs; `repeated_slots` when it serves calls with repeated slots.
struct BuiltinRouteUse {
  Route route = Route::rowcta;
  std::vector<std::pair<int64_t, int64_t>> batches;
  bool repeated_slots = false;
};

// The routes of `family` (its route and arch fields are ignored) that the
// built-in bands can pick on a device with `sm_count` SMs at batch sizes
// 1..max_batch, with the batches each serves, in route-table order. A pure
// function of the shape and the SM count, like builtin_route(): what
// `kdajit prewarm --sm-count N` compiles.
std::vector<BuiltinRouteUse> builtin_route_uses(const KernelKey& family, int sm_count, int64_t max_batch);

// forced > tuned (when its route is eligible) > built-in. Error{unsupported}
// when the forced route does not serve the op or is not eligible for the call.
Result<Route> select_route(const CallShape& call, const DeviceTraits& device, const RoutePolicy& policy);

// The key `call` runs with on `device` with `route`.
inline KernelKey key_for(const CallShape& call, Route route, Arch arch) {
  KernelKey k = call.family;
  k.route = route;
  k.arch = arch;
  return k;
}

}  // namespace kdajit
