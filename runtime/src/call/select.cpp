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
    // Above the split, T <= 7 (`kdajit tune` at 559685d, docs/PERFORMANCE.md
    // "Eleventh session"; T = 5..7 were not measured and take T = 4's band,
    // though their rowcta keeps phase A0's old order, kda_head.cuh):
    // - bf16 state: rowcta while the sequence-heads fit stream's grid (3-8%
    //   faster at 128-256), stream beyond (1-3% at 512-2048, 5-15% from 4096).
    // - f32 state: rowcta while they fit its grid (0-5%), stream up to four
    //   times it (0-3.5% at 512-1024), rowcta beyond (4-6%), where its waves
    //   overlap each other and stream's 64 KiB stage per CTA adds a
    //   shared-memory round trip without more bytes in flight.
    // T = 8: stream everywhere (2-9% from 32 to 8192 sequence-heads, measured
    // before the eleventh session; its rowcta kernels did not change since).
    if (!stream_ok) return Route::rowcta;
    if (t >= 8) return Route::stream;
    if (bf16) return items > resident ? Route::stream : Route::rowcta;
    return items > resident && items <= 4 * resident ? Route::stream : Route::rowcta;
  }
  const int64_t ctas = call.rows * call.family.heads;
  // bf16 state: stream once rows x heads exceed its resident CTAs (3-14% faster;
  // below, each CTA has one item and rowcta is as fast).
  if (bf16) return stream_ok && ctas > resident ? Route::stream : Route::rowcta;
  // f32 state: the value split wins only while rows x heads is at most an eighth
  // of the SMs (split4: 0.7-1.2% at H=8, R<=2 and H=16, R=1, in two independent
  // runs; split2 never won). Stream wins 1-3% while rows x heads is between one
  // and two times its grid (`kdajit tune` at 559685d; rowcta runs two or more
  // waves there, each loading its state only after the previous wave's
  // compute). Beyond, rowcta is 0.4-6% faster: its waves overlap each other,
  // and stream's one 64 KiB stage per CTA adds a shared-memory round trip
  // without more bytes in flight. (Before the eleventh session's rowcta gains,
  // stream's band reached four times its grid.)
  if (8 * ctas <= sms) return Route::split4;
  if (stream_ok && ctas > resident && ctas <= 2 * resident) return Route::stream;
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
