// The route selector: which route of the route table runs a validated call on
// a device. The key lookup is the selection: the chosen route is a key field.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "kdajit/routes.hpp"

namespace kdajit {

struct RoutePolicy {
  std::optional<Route> forced;  // RuntimeOptions::route: every call must be eligible for it
  std::optional<Route> tuned;   // the route a `kdajit tune` table of this device gives the call, if any
};

// The built-in bands, measured on the H200 (select.cpp says what each band is
// and why; docs/PERFORMANCE.md has the measurements). Always an eligible route.
Route builtin_route(const CallShape& call, const DeviceTraits& device);

// Where the built-in bands use one route of a family: the batch sizes (rows R
// of the single op, sequences N of the packed op, each at R = N x T) in
// [1, max_batch] for which builtin_route() picks it on `sm_count` SMs, as
// inclusive runs; `repeated_slots` when it serves calls with repeated slots.
// A prefill family's pick depends on the prompt lengths as well: its uses
// have `any_length` set and the sequence counts N at which some prompt length
// picks the route.
struct BuiltinRouteUse {
  Route route = Route::rowcta;
  std::vector<std::pair<int64_t, int64_t>> batches;
  bool repeated_slots = false;
  bool any_length = false;
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

}  // namespace kdajit
