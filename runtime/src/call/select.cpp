#include "kdajit/runtime/call/select.hpp"

#include <fmt/format.h>

#include "kdajit/runtime/call/tune_table.hpp"

namespace kdajit {

Route builtin_route(const CallShape& call, const DeviceTraits& device) {
  if (call.family.op == Op::packed) return Route::rowcta;
  if (call.mode == IndicesMode::repeated_positive) return Route::sequential;
  // Measured on the H200 (docs/PERFORMANCE.md, "Selector bands"): the value
  // split wins only with f32 state while rows x heads is at most an eighth of
  // the SMs (split4: 0.7-1.2% at H=8, R<=2 and H=16, R=1, in two independent
  // runs); everywhere else rowcta is as fast or faster (split2 never won; with
  // bf16 state rowcta won every cell, by 3-40%).
  const int64_t ctas = call.rows * call.family.heads;
  const int64_t sms = device.sm_count > 0 ? device.sm_count : 1;
  if (call.family.state == StateDtype::f32 && 8 * ctas <= sms) return Route::split4;
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
