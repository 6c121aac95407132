#include "kdajit/runtime/call/select.hpp"

#include <fmt/format.h>

#include "kdajit/runtime/call/tune_table.hpp"

namespace kdajit {

Route builtin_route(const CallShape& call, const DeviceTraits& device) {
  if (call.mode == IndicesMode::repeated_positive) return Route::sequential;
  const RouteSpec& stream = route_spec(Route::stream);
  const bool stream_ok = stream.eligible(call, device);
  const int64_t sms = device.sm_count > 0 ? device.sm_count : 1;
  const bool bf16 = call.family.state == StateDtype::bf16;
  // Measured on the H200 (docs/PERFORMANCE.md, "Selector bands").
  if (call.family.op == Op::packed) {
    // f32 state: stream 3-11% faster than rowcta from N x H = 16 on, equal below.
    // bf16 state: rowcta runs 512 threads there; stream (256) wins at T = 2 once
    // the sequences x heads exceed its resident CTAs (4-10%), and loses or ties at T = 4.
    const bool fills = call.num_seqs * call.family.heads > int64_t{stream.occupancy} * sms;
    if (stream_ok && (!bf16 || (call.family.tokens <= 2 && fills))) return Route::stream;
    return Route::rowcta;
  }
  const int64_t ctas = call.rows * call.family.heads;
  // bf16 state: stream once rows x heads exceed its resident CTAs (3-14% faster;
  // below, each CTA has one item and rowcta is as fast).
  if (bf16) return stream_ok && ctas > int64_t{stream.occupancy} * sms ? Route::stream : Route::rowcta;
  // f32 state: the value split wins only while rows x heads is at most an eighth
  // of the SMs (split4: 0.7-1.2% at H=8, R<=2 and H=16, R=1, in two independent
  // runs); everywhere else rowcta is as fast or faster (split2 never won; stream
  // loses 4-6% at large N: one 64 KiB stage per CTA keeps no more bytes in
  // flight than rowcta's registers do, and adds the shared-memory round trip).
  if (8 * ctas <= sms) return Route::split4;
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
