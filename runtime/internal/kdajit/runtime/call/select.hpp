// The route selector: which route of the route table runs a validated call on
// a device. The key lookup is the selection: the chosen route is a key field.
#pragma once

#include <optional>

#include "kdajit/routes.hpp"

namespace kdajit {

class TuneTable;

struct RoutePolicy {
  std::optional<Route> forced;        // RuntimeOptions::route: every call must be eligible for it
  const TuneTable* tuned = nullptr;   // a `kdajit tune` table for this device, when allowed and present
};

// The built-in bands (measured on the H200; docs/PERFORMANCE.md "The
// selector's bands"; select.cpp has each threshold and its reason):
// repeated_positive -> sequential; else the value split while its CTAs fit the
// SMs (split4, then split2); else by G, stream's resident grid (two CTAs per
// SM): single f32 -> rowcta; single bf16 and packed bf16 T <= 2 -> rowcta up to
// G items, stream beyond; packed bf16 T = 3..7 -> the same from 8G; packed f32
// T <= 7 -> stream between G and 2G, else rowcta; packed T = 8 -> stream.
// Always an eligible route.
Route builtin_route(const CallShape& call, const DeviceTraits& device);

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
