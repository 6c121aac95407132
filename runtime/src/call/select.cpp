#include "kdajit/runtime/call/select.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>


namespace kdajit {

namespace {

// The chunked ops (docs/DESIGN.md, "Prefill: the chunked op"): route pipe16
// (one CTA per (sequence, head) over chunks of 16, no workspace) unless its
// longest chain sets its time: route twopass (its intra-chunk kernel runs
// every chunk at once, its state pass splits a long prompt's value rows over
// up to 8 CTAs) when the call brings its workspace, its longest prompt has
// kPrefillTwopassMinLength tokens or more, and that prompt is longer than
// 9/8 of pipe16's tokens per SM (T_total x H / SMs). pipe16's time is about
// max(longest, T_total x H / SMs) times a token's cost on its CTA, twopass's
// about T_total x H / SMs times its own (more for one long prompt): on the
// H100 a twopass token costs 1.2-1.35x a pipe16 one (docs/PERFORMANCE.md,
// "The prefill selector"). The longest sequence is the caller's hint
// (max_seq_len; T_total without one, which takes twopass below 8/9 x SMs
// heads): every route computes every length, the hint only picks the faster.
constexpr int64_t kPrefillTwopassMinLength = 128;

bool prefill_chain_bound(const CallShape& call, const DeviceTraits& device, int64_t longest) {
  const int64_t sms = device.sm_count > 0 ? device.sm_count : 1;
  return 8 * longest * sms > 9 * call.rows * call.family.heads;
}

// The other chunked routes run only when options.route names them
// (forced_only): pipe16 outran them on every batch measured, and twopass on
// one long prompt.
Route prefill_route(const CallShape& call, const DeviceTraits& device) {
  const int64_t longest = call.max_seq_len > 0 ? std::min(call.max_seq_len, call.rows) : call.rows;
  if (longest >= kPrefillTwopassMinLength && prefill_chain_bound(call, device, longest) &&
      route_spec(Route::twopass).eligible(call, device))
    return Route::twopass;
  return Route::pipe16;
}

}  // namespace

Route builtin_route(const CallShape& call, const DeviceTraits& device) {
  if (chunked(call.family.op)) return prefill_route(call, device);
  if (call.mode == IndicesMode::repeated_positive) return Route::sequential;
  const RouteSpec& stream = route_spec(Route::stream);
  const bool stream_ok = stream.eligible(call, device);
  const bool split_ok = route_spec(Route::split4).eligible(call, device);  // split2's rule too
  const int64_t sms = device.sm_count > 0 ? device.sm_count : 1;
  const bool bf16 = call.family.state == StateDtype::bf16;
  // Measured on the H200: `kdajit tune` of the glm-5.3-flash preset and the
  // grid with every route forced, both at 0219fef (docs/PERFORMANCE.md,
  // "The selector's bands"). `resident` is stream's persistent grid (two CTAs per
  // SM), the unit of the upper bands; the split bands count CTAs against the
  // SMs. x below is rows x heads (single) or sequence-heads (packed): the time
  // depends on it, the dtype and T, not on N or H apart.
  const int64_t resident = int64_t{stream.ctas_per_sm(call.family)} * sms;
  if (call.family.op == Op::packed) {
    const int64_t x = call.num_seqs * call.family.heads;
    const int t = call.family.tokens;
    // The value split while its CTAs leave SMs idle: the T tokens are a
    // dependent chain per CTA, and a split CTA updates 128 / C value rows per
    // token and stores 1 / C of each checkpoint. f32: split4 while its CTAs fit
    // one per SM (10-46% faster than split2 or rowcta at 8-32), split2 while
    // they do at T <= 4 (3-8% at 64). bf16: split4 while 8 x N x H <= SMs
    // (6-10% at 8-16), split2 while its CTAs fit one per SM at T <= 4 (0-4% at
    // 32-64); at T = 8 stream beats split4 (7.5% at 16).
    if (split_ok && !(bf16 && t >= 8)) {
      if ((bf16 ? 8 : 4) * x <= sms) return Route::split4;
      if (t <= 4 && 2 * x <= sms) return Route::split2;
    }
    // Above the split, T <= 7 (T = 5..7 are not measured and take T = 4's
    // band; their rowcta issues the slice before the inputs, kda_head.cuh):
    // - bf16 state, T <= 2: rowcta while the sequence-heads fit stream's grid
    //   (4-8% faster at 128-256), stream beyond (0-2% at 512-2048, 7-12% from
    //   4096). T >= 3: rowcta up to eight times the grid (0-5% at 512-2048;
    //   stream ties at 4096 for T = 4 and wins 3% for T = 3).
    // - f32 state: rowcta while they fit the grid (4-6%), stream up to twice
    //   it (0-3% at 512), rowcta beyond (0-3% at 1024, 4-6% from 2048), where
    //   its waves overlap each other and stream's 64 KiB stage per CTA adds a
    //   shared-memory round trip without more bytes in flight.
    // T = 8: stream everywhere (2-9% from 32 to 8192 sequence-heads).
    if (!stream_ok) return Route::rowcta;
    if (t >= 8) return Route::stream;
    if (bf16) return x > (t <= 2 ? 1 : 8) * resident ? Route::stream : Route::rowcta;
    return x > resident && x <= 2 * resident ? Route::stream : Route::rowcta;
  }
  const int64_t x = call.rows * call.family.heads;
  // The value split while its CTAs fit the SMs: split4 while they fit one per
  // SM for f32 (4 x R x H <= SMs; 1-6% over split2 at 8-32), one per two SMs
  // for bf16 (6% over rowcta at 8-16); split2 while they fit two per SM for f32
  // (R x H <= SMs; 0-4% over rowcta at 64-128), one per SM for bf16 (1-3% at
  // 32-64; rowcta from 96).
  if (split_ok) {
    if ((bf16 ? 8 : 4) * x <= sms) return Route::split4;
    if ((bf16 ? 2 : 1) * x <= sms) return Route::split2;
  }
  // bf16 state: stream once rows x heads exceed its resident CTAs (0-4% at
  // 512-768, 1-3% at 2048; the two are within 1.5% beyond, either way; below,
  // each CTA has one item and rowcta is 1-10% faster). f32 state: rowcta (stream
  // ties it at 512, 0.6-2% either way, loses 6.7% at 384 and 1-5% beyond: its one
  // 64 KiB stage per CTA adds a shared-memory round trip without more bytes in
  // flight, while rowcta's waves overlap each other).
  return bf16 && stream_ok && x > resident ? Route::stream : Route::rowcta;
}

std::vector<BuiltinRouteUse> builtin_route_uses(const KernelKey& family, int sm_count, int64_t max_batch) {
  const DeviceTraits device{family.arch, sm_count};
  const size_t n = static_cast<size_t>(std::max<int64_t>(max_batch, 0));
  struct Picked {
    std::vector<bool> at;  // at[b - 1]: picked for batch b
    bool repeated = false;
  };
  std::map<Route, Picked> picked;
  const auto pick = [&](const CallShape& call, size_t b) {
    Picked& p = picked[builtin_route(call, device)];
    p.at.resize(n);
    p.at[b - 1] = true;
  };
  CallShape call;
  call.family = family;
  const bool prefill = chunked(family.op);
  if (prefill) {
    // The pick depends on whether the longest prompt reaches
    // kPrefillTwopassMinLength, whether it is chain-bound (against T_total)
    // and whether the call brings a workspace: per N, a short and a long
    // longest prompt with the others empty (the most chain-bound call of N
    // sequences: any call of N that takes twopass makes this one take it),
    // with and without one.
    for (size_t b = 1; b <= n; ++b)
      for (int64_t longest : {int64_t{1}, kPrefillTwopassMinLength})
        for (bool workspace : {false, true}) {
          call.num_seqs = static_cast<int64_t>(b);
          call.rows = longest;
          call.max_seq_len = longest;
          call.workspace_bytes = workspace ? twopass_workspace_bytes(call.num_seqs, call.rows, family.heads) : 0;
          pick(call, b);
        }
  } else {
    // Every slot-index mode validation can derive from the data; the packed op's
    // rows run concurrently and never take repeated slots.
    std::vector<IndicesMode> modes = {IndicesMode::unique_or_null, IndicesMode::positive_unique};
    if (family.op == Op::single) modes.push_back(IndicesMode::repeated_positive);
    for (IndicesMode mode : modes) {
      call.mode = mode;
      for (size_t b = 1; b <= n; ++b) {
        call.num_seqs = family.op == Op::packed ? static_cast<int64_t>(b) : 0;
        call.rows = static_cast<int64_t>(family.op == Op::packed ? b * static_cast<size_t>(family.tokens) : b);
        if (mode == IndicesMode::repeated_positive) picked[builtin_route(call, device)].repeated = true;
        else pick(call, b);
      }
    }
  }
  std::vector<BuiltinRouteUse> uses;
  for (const auto& [route, p] : picked) {
    BuiltinRouteUse u{route, {}, p.repeated, prefill};
    for (size_t i = 0; i < p.at.size(); ++i) {
      if (!p.at[i]) continue;
      const auto b = static_cast<int64_t>(i + 1);
      if (!u.batches.empty() && u.batches.back().second + 1 == b) u.batches.back().second = b;
      else u.batches.push_back({b, b});
    }
    uses.push_back(std::move(u));
  }
  return uses;
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
  // Tune tables hold decode families only (`kdajit tune` times decode calls).
  if (policy.tuned && !chunked(call.family.op) && route_spec(*policy.tuned).serves(call.family.op) &&
      route_spec(*policy.tuned).eligible(call, device))
    return *policy.tuned;
  return builtin_route(call, device);
}

}  // namespace kdajit
