#include "kdajit/runtime/call/select.hpp"

#include <fmt/format.h>

#include "kdajit/runtime/call/tune_table.hpp"

namespace kdajit {

Route builtin_route(const CallShape& call, const DeviceTraits& device) {
  if (call.family.op == Op::packed) return Route::rowcta;
  if (call.mode == IndicesMode::repeated_positive) return Route::sequential;
  // rowcta launches rows x heads CTAs. While that leaves most SMs idle, split the
  // value rows of each (row, head) over a cluster so that 2x or 4x the CTAs each
  // move a quarter or half of the state: the per-CTA latency chain shortens.
  const int64_t ctas = call.rows * call.family.heads;
  const int64_t sms = device.sm_count > 0 ? device.sm_count : 1;
  if (4 * ctas <= sms) return Route::split4;
  if (2 * ctas <= sms) return Route::split2;
  return Route::rowcta;
}

Result<Route> select_route(const CallShape& call, const DeviceTraits& device, const RoutePolicy& policy) {
  if (policy.forced) {
    const RouteSpec& r = route_spec(*policy.forced);
    if (!r.serves(call.family.op))
      return Error(ErrorCode::unsupported, fmt::format("route: {} does not serve the {} op (options.route)", r.name(),
                                                       to_string(call.family.op)));
    if (!r.eligible(call, device))
      return Error(ErrorCode::unsupported,
                   fmt::format("route: {} cannot run this call exactly: it needs {} (options.route)", r.name(),
                               r.eligibility));
    return *policy.forced;
  }
  if (policy.tuned) {
    if (auto r = policy.tuned->route_for(call); r && route_spec(*r).eligible(call, device)) return *r;
  }
  return builtin_route(call, device);
}

}  // namespace kdajit
