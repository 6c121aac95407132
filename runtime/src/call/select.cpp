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
  // Measured on the H200 (docs/PERFORMANCE.md, "Selector bands"); `resident`
  // is stream's persistent grid (two CTAs per SM), the unit of every band.
  const int64_t resident = int64_t{stream.occupancy} * sms;
  if (call.family.op == Op::packed) {
    const int64_t items = call.num_seqs * call.family.heads;  // sequence-heads
    const int t = call.family.tokens;
    // Measured with every route forced (docs/PERFORMANCE.md, "Fifth session"):
    // the time depends on N x H, T and the dtype, not on N or H apart.
    // The value split while the sequence-heads leave SMs idle: the T tokens are
    // a dependent chain per CTA, and a split CTA updates 128 / C value rows per
    // token and stores 1 / C of each checkpoint. f32 state: split4 while its
    // CTAs fit one per SM (14-28% faster than stream), split2 while they do at
    // T <= 4 (5-7%; at T = 8 stream ties it). bf16 state: split4 while
    // 8 x N x H <= SMs (2-8% faster than rowcta), 4 x at T <= 2 (1-3%).
    if (route_spec(Route::split4).eligible(call, device)) {
      if (bf16 ? (t <= 2 ? 4 : 8) * items <= sms : 4 * items <= sms) return Route::split4;
      if (!bf16 && t <= 4 && 2 * items <= sms) return Route::split2;
    }
    // f32 state: stream, 3-11% faster than rowcta from N x H = 16 on.
    // bf16 state: rowcta runs 512 threads there. Stream (256; its pipeline
    // since the eighth session) wins at T = 2 (1-5% up to N x H = 256, 3-13%
    // beyond), at T = 1 once the sequence-heads exceed its grid, at T = 3 once
    // they exceed it (3-7% from 512; rowcta 3% faster at 256), at T = 4 once
    // they exceed twice it (5% at 1024, a tie at 512, rowcta 1.5-3.5% faster at
    // 256), and at T = 8 everywhere (2-9% from 32 to 8192 sequence-heads).
    // T = 5..7 were not measured; they take T = 4's band.
    const bool bf16_stream = t <= 2   ? t == 2 || items > resident
                             : t == 3 ? items > resident
                             : t < 8  ? items > 2 * resident
                                      : true;
    if (stream_ok && (!bf16 || bf16_stream)) return Route::stream;
    return Route::rowcta;
  }
  const int64_t ctas = call.rows * call.family.heads;
  // bf16 state: stream once rows x heads exceed its resident CTAs (3-14% faster;
  // below, each CTA has one item and rowcta is as fast).
  if (bf16) return stream_ok && ctas > resident ? Route::stream : Route::rowcta;
  // f32 state: the value split wins only while rows x heads is at most an eighth
  // of the SMs (split4: 0.7-1.2% at H=8, R<=2 and H=16, R=1, in two independent
  // runs; split2 never won). Stream wins 2-4% while rows x heads is between one
  // and four times its grid (rowcta runs 2-8 waves there, each loading its state
  // only after the previous wave's compute), and loses 2-6% beyond that, where
  // rowcta's waves overlap each other and stream's one 64 KiB stage per CTA adds
  // a shared-memory round trip without more bytes in flight.
  if (8 * ctas <= sms) return Route::split4;
  if (stream_ok && ctas > resident && ctas <= 4 * resident) return Route::stream;
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
