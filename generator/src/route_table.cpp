// The route table (kdajit/routes.hpp): the functions its rows name, and the
// rows of kdajit/routes.def. The selector's bands, which pick among the
// eligible routes, are in runtime/src/call/select.cpp.
#include <algorithm>

#include "kdajit/routes.hpp"

namespace kdajit {

namespace {

uint32_t clamp_grid(int64_t n) { return static_cast<uint32_t>(std::clamp<int64_t>(n, 1, kMaxGridY)); }

// Not for repeated slots: rows run concurrently.
bool not_repeated(const CallShape& c, const DeviceTraits&) { return c.mode != IndicesMode::repeated_positive; }
bool any_call(const CallShape&, const DeviceTraits&) { return true; }

int rowcta_threads(const KernelKey& k) {
  // 8 warps: each thread holds 64 state values (f32: 16 rows x 4 k; bf16: 8 rows
  // x 8 k), room for two CTAs per SM without spills. Packed bf16 state: 16 warps
  // (32 values per thread, <= 64 registers) measure 10-13% faster on the H200;
  // single bf16 is 8-12% slower with 16 warps and f32 spills there
  // (docs/PERFORMANCE.md, "Levers measured and rejected").
  return k.op == Op::packed && k.state == StateDtype::bf16 ? 512 : 256;
}
int threads_256(const KernelKey&) { return 256; }

int two_per_sm(const KernelKey&) { return 2; }
int no_stages(const KernelKey&) { return 0; }

LaunchGrid rowcta_grid(const CallShape& c, const DeviceTraits&) {
  const uint32_t heads = static_cast<uint32_t>(c.family.heads);
  if (c.family.op == Op::single) return {heads, clamp_grid(c.rows), 1};  // rows beyond grid y: the kernel's row loop
  // Packed: one CTA per (item, head); grid z carries the overflow of y.
  const int64_t items = items_per_head(c);
  const uint32_t y = clamp_grid(items);
  return {heads, y, static_cast<uint32_t>((items + y - 1) / y)};
}

LaunchGrid sequential_grid(const CallShape& c, const DeviceTraits&) { return {static_cast<uint32_t>(c.family.heads), 1, 1}; }

// Cluster routes: grid y = cluster x items per wave; the kernel loops over
// items with a stride of gridDim.y / cluster.
template <int C>
LaunchGrid split_grid(const CallShape& c, const DeviceTraits&) {
  const int64_t items = items_per_head(c);
  const int64_t wave = std::clamp<int64_t>(items, 1, kMaxGridY / C);
  return {static_cast<uint32_t>(c.family.heads), static_cast<uint32_t>(wave * C), 1};
}

// Persistent: one CTA per item up to its CTAs per SM resident on every SM;
// the kernel walks items i = blockIdx.x + k * gridDim.x.
LaunchGrid stream_grid(const CallShape& c, const DeviceTraits& device) {
  const int64_t items = items_per_head(c) * c.family.heads;
  const int64_t resident = int64_t{two_per_sm(c.family)} * std::max(device.sm_count, 1);
  return {static_cast<uint32_t>(std::clamp<int64_t>(items, 1, resident)), 1, 1};
}
// bf16 slices (32 KiB) fit two stages next to two CTAs per SM; f32 (64 KiB) one.
int stream_stages(const KernelKey& k) { return k.state == StateDtype::bf16 ? 2 : 1; }

// split2, packed op, f32 state: one CTA per SM. Each thread holds 32 state
// values next to the T tokens' staged inputs and the conv history the split
// keeps live across phase B; at two CTAs per SM (128 registers) ptxas spills
// 8-80 bytes at T = 1 (conv ds) and T = 6..8 (84 keys of the `full` preset).
// The selector picks split2 only while its CTAs fit one
// per SM (2 x N x H <= SMs), so the cap costs no selected launch a CTA slot.
// split4 stays at two: the packed op spills at three (80 registers), and the
// selector picks the split only for batches that leave most SMs idle.
int split2_ctas_per_sm(const KernelKey& k) { return k.op == Op::packed && k.state == StateDtype::f32 ? 1 : 2; }

constexpr std::string_view kNotRepeated = "state_indices_mode is not repeated_positive (rows run concurrently)";

// Routes stream and split2/split4: T > 8 spills, next to T tokens of phase A,
// the walk state of stream and the conv history the split keeps live across
// phase B for its write after the cluster barrier.
constexpr int kMaxTokensPacked = 8;
bool not_repeated_up_to_8_tokens(const CallShape& c, const DeviceTraits& d) {
  return not_repeated(c, d) && (c.family.op != Op::packed || c.family.tokens <= kMaxTokensPacked);
}
constexpr std::string_view kNotRepeatedUpTo8Tokens =
    "state_indices_mode is not repeated_positive (rows run concurrently), and T <= 8 (packed op)";

// The prefill op's launch shape is the op's, not the row's (kPrefillThreads,
// kPrefillCtasPerSm, no stages, a cluster-of-P grid over the sequences): these
// wrap a row's decode functions with it.
// Route pipe16: its producers and its consumer, 8 warps each.
int pipe_threads(const KernelKey&) { return 2 * kPrefillThreads; }
template <int (*F)(const KernelKey&)>
int op_threads(const KernelKey& k) {
  if constexpr (F == pipe_threads) return F(k);
  else return chunked(k.op) ? kPrefillThreads : F(k);
}
template <int (*F)(const KernelKey&)>
int op_ctas_per_sm(const KernelKey& k) {
  return chunked(k.op) ? kPrefillCtasPerSm : F(k);
}
template <int (*F)(const KernelKey&)>
int op_stages(const KernelKey& k) {
  return chunked(k.op) ? 0 : F(k);
}
// Route twopass's state pass kernel: grid (H, wave, P), P CTAs per (sequence,
// head), z their value rows' share (kda_prefill.cu, sequence()).
LaunchGrid twopass_grid(const CallShape& c, const DeviceTraits& d) {
  const LaunchGrid g = split_grid<1>(c, d);
  return {g.x, g.y, static_cast<uint32_t>(twopass_parts(c, d))};
}
// A row that serves decode ops names their grid; the chunked ops take
// split_grid<P> instead, except on a route of their own (twopass).
template <LaunchGrid (*F)(const CallShape&, const DeviceTraits&), int P>
LaunchGrid op_grid(const CallShape& c, const DeviceTraits& d) {
  if constexpr (F == twopass_grid) return F(c, d);
  else return chunked(c.family.op) ? split_grid<P>(c, d) : F(c, d);
}

// Route twopass: rows to compute, and the call's workspace holds every
// chunk's unit (with T_total = 0 it holds none, while the N units of the
// sequences would still take their tags).
bool has_workspace(const CallShape& c, const DeviceTraits&) {
  return c.rows > 0 && c.workspace_bytes >= twopass_workspace_bytes(c.num_seqs, c.rows, c.family.heads);
}
constexpr std::string_view kHasWorkspace =
    "T_total > 0 and the call's workspace holds (N + ceil(T_total / 64)) x H x 148096 bytes "
    "(kdajit_prefill_workspace_bytes)";
// Its intra-chunk kernel: one CTA per (head, unit), the units past 65535 by a loop.
LaunchGrid twopass_pre_grid(const CallShape& c, const DeviceTraits&) {
  const int64_t units = std::max<int64_t>(c.num_seqs, 0) + (c.rows + kPrefillChunk - 1) / kPrefillChunk;
  return {static_cast<uint32_t>(c.family.heads), clamp_grid(units), 1};
}
constexpr LaunchGrid (*no_pre)(const CallShape&, const DeviceTraits&) = nullptr;
// Its norm kernel (the ops with one: post_entry_name): the intra-chunk
// kernel's grid, a CTA per (head, unit) normalizing the unit's chunk, a warp
// per row.
LaunchGrid twopass_post_grid(const CallShape& c, const DeviceTraits& d) {
  if (post_entry_name(c.family.op).empty()) return {0, 0, 0};
  return twopass_pre_grid(c, d);
}
constexpr LaunchGrid (*no_post)(const CallShape&, const DeviceTraits&) = nullptr;

// constexpr: constant-initialised, so other translation units may read the
// table from their own static initialisers (the GPU tests register their test
// cases from one).
constexpr RouteSpec kRoutes[] = {
#define ROUTE(name, technique, single_template, packed_template, prefill_template, cluster, ctas_per_sm, threads,     \
              eligible, eligibility, grid, stages, pre_grid, post_grid, chunk, forced)                                 \
  {Route::name,                                                                                                        \
   technique,                                                                                                          \
   {single_template, packed_template, prefill_template},                                                               \
   cluster,                                                                                                            \
   op_ctas_per_sm<ctas_per_sm>,                                                                                        \
   op_threads<threads>,                                                                                                \
   eligible,                                                                                                           \
   eligibility,                                                                                                        \
   op_grid<grid, cluster>,                                                                                             \
   op_stages<stages>,                                                                                                  \
   pre_grid,                                                                                                           \
   post_grid},
#include "kdajit/routes.def"
#undef ROUTE
};
static_assert(std::size(kRoutes) == KeyField<Route>::values.size(), "one row per Route value, in enum order");

}  // namespace

std::span<const RouteSpec> route_table() { return kRoutes; }

int64_t items_per_head(const CallShape& call) {
  if (call.family.op == Op::single) return call.rows;
  if (chunked(call.family.op)) return std::max<int64_t>(call.num_seqs, 1);
  const int64_t t = std::max(call.family.tokens, 1);
  return std::max(call.num_seqs, (call.rows + t - 1) / t);
}

LaunchPlan launch_plan(const KernelKey& key, const CallShape& call, const DeviceTraits& device) {
  const RouteSpec& route = route_spec(key.route);
  LaunchPlan p;
  p.grid = route.grid(call, device);
  p.threads = static_cast<uint32_t>(route.threads(key));
  p.dynamic_smem_bytes = route.dynamic_smem_bytes(key);
  p.cluster_y = static_cast<uint32_t>(route.cluster);
  if (route.pre_grid != nullptr && chunked(key.op)) {
    p.pre_grid = route.pre_grid(call, device);
    p.pre_dynamic_smem_bytes = route.pre_dynamic_smem_bytes(key);
  }
  if (route.post_grid != nullptr && chunked(key.op)) p.post_grid = route.post_grid(call, device);
  return p;
}

uint32_t RouteSpec::pre_dynamic_smem_bytes(const KernelKey& key) const {
  return pre_grid != nullptr && chunked(key.op) ? kTwopassIntraSmemBytes : 0;
}

uint32_t RouteSpec::dynamic_smem_bytes(const KernelKey& key) const {
  if (chunked(key.op)) return kPrefillSmemBytes;
  const uint32_t slice = uint32_t{kHeadDim} * kHeadDim * (key.state == StateDtype::bf16 ? 2 : 4);
  return static_cast<uint32_t>(stage_count(key)) * slice;
}

const RouteSpec& route_spec(Route route) {
  const size_t i = static_cast<size_t>(route);
  return kRoutes[i < std::size(kRoutes) ? i : 0];
}

std::vector<std::string_view> route_names(Op op) {
  std::vector<std::string_view> out;
  for (const RouteSpec& r : kRoutes)
    if (r.serves(op)) out.push_back(r.name());
  return out;
}

int64_t twopass_workspace_bytes(int64_t num_seqs, int64_t rows, int64_t heads) {
  if (num_seqs < 0 || rows < 0 || heads < 0) return INT64_MAX;
  if (rows == 0) return 0;
  const int64_t chunks = rows / kPrefillChunk + (rows % kPrefillChunk != 0 ? 1 : 0);
  if (num_seqs > INT64_MAX - chunks) return INT64_MAX;
  const int64_t units = num_seqs + chunks;
  if (heads > 0 && units > INT64_MAX / kTwopassUnitBytes / heads) return INT64_MAX;
  return units * heads * kTwopassUnitBytes;
}

int twopass_parts(const CallShape& call, const DeviceTraits& device) {
  const int64_t sms = std::max(device.sm_count, 1);
  const int64_t x = std::max<int64_t>(call.num_seqs, 1) * std::max<int64_t>(call.family.heads, 1);
  int parts = 1;
  while (parts < 8 && 2 * parts * x <= sms) parts *= 2;
  return parts;
}

std::string_view post_entry_name(Op op) { return op == Op::prefill ? "kda_prefill_norm" : std::string_view{}; }

std::string_view pre_entry_name(Op op) {
  switch (op) {
    case Op::prefill: return "kda_prefill_intra";
    case Op::chunk: return "kda_chunk_intra";
    default: return {};
  }
}

std::string_view entry_name(Op op) {
  switch (op) {
    case Op::single: return "kda_single_decode";
    case Op::packed: return "kda_packed_decode";
    case Op::prefill: return "kda_prefill";
    case Op::chunk: return "kda_chunk";
  }
  return "kda_single_decode";
}

}  // namespace kdajit
