// The route selector: which route of the route table runs a validated call on
// a device. The key lookup is the selection: the chosen route is a key field.
#pragma once

#include <optional>

#include "kdajit/routes.hpp"

namespace kdajit {

struct RoutePolicy {
  std::optional<Route> forced;  // RuntimeOptions::route: every call must be eligible for it
  std::optional<Route> tuned;   // the route a `kdajit tune` table of this device gives the call, if any
};

// The built-in bands, measured on the H200 (select.cpp says what each band is
// and why; docs/PERFORMANCE.md has the measurements). Always an eligible route.
Route builtin_route(const CallShape& call, const DeviceTraits& device);

// forced > tuned (when its route is eligible) > built-in. Error{unsupported}
// when the forced route does not serve the op or is not eligible for the call.
Result<Route> select_route(const CallShape& call, const DeviceTraits& device, const RoutePolicy& policy);

}  // namespace kdajit
