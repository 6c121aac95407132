// The route table: one row per Route value, each row complete and consistent
// with the generator and the presets; the launch grid of every route covers
// every row exactly and stays inside the grid limits.
#include <set>
#include <string>

#include "catch.hpp"
#include "kdajit/presets.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/source_generator.hpp"
#include "kdajit/templates.hpp"

namespace kdajit {
namespace {

CallShape shape(Op op, int heads, int64_t rows, int64_t seqs = 0, IndicesMode mode = IndicesMode::unique_or_null) {
  CallShape c;
  c.family.op = op;
  c.family.heads = heads;
  c.family.tokens = op == Op::single ? 1 : op == Op::prefill ? kPrefillChunk : 4;
  c.mode = mode;
  c.rows = rows;
  c.num_seqs = seqs;
  return c;
}

// A key's t field for op: 1 (single), `packed` (packed), the chunk size (prefill).
// A key's t: 1 (single), `packed` (packed), the route's chunk size (prefill, chunk).
int tokens_of(Op op, int packed, Route route) { return op == Op::single ? 1 : chunked(op) ? route_chunk(route) : packed; }

// Other translation units read the table while they are initialised (the GPU
// tests register one test case per preset key from a static initialiser): the
// table must be constant-initialised, never dynamically after them.
const size_t kPresetKeysAtStaticInit = [] {
  auto keys = preset_keys("glm-5.3-flash", Arch::sm_90);
  return keys ? keys->size() : 0;
}();

TEST_CASE("route table: usable during static initialisation", "[routes]") {
  auto keys = preset_keys("glm-5.3-flash", Arch::sm_90);
  REQUIRE(keys.ok());
  CHECK(kPresetKeysAtStaticInit == keys->size());
  CHECK(kPresetKeysAtStaticInit > 64);
}

TEST_CASE("route table: one complete row per route, in enum order", "[routes]") {
  const auto table = route_table();
  REQUIRE(table.size() == KeyField<Route>::values.size());
  std::set<std::string_view> names;
  for (size_t i = 0; i < table.size(); ++i) {
    const RouteSpec& r = table[i];
    INFO(r.name());
    CHECK(static_cast<size_t>(r.route) == i);
    CHECK(&route_spec(r.route) == &r);
    CHECK(names.insert(r.name()).second);
    CHECK(!r.technique.empty());
    CHECK(!r.eligibility.empty());
    CHECK(r.threads != nullptr);
    CHECK(r.eligible != nullptr);
    CHECK(r.grid != nullptr);
    CHECK((r.cluster == 1 || r.cluster == 2 || r.cluster == 4 || r.cluster == 8));
    CHECK(r.ctas_per_sm_of != nullptr);
    CHECK(r.stages != nullptr);
    for (Op op : all_values<Op>())
      for (StateDtype st : all_values<StateDtype>()) {
        const KernelKey k{op, 64, st, ConvLayout::sd, tokens_of(op, 1, r.route), Gate::bounded, r.route, Arch::sm_90};
        CHECK((r.ctas_per_sm(k) >= 1 && r.ctas_per_sm(k) <= 4));
      }
    CHECK((r.serves(Op::single) || r.serves(Op::packed) || r.serves(Op::prefill)));
    CHECK(r.serves(Op::chunk) == r.serves(Op::prefill));
  }
}

TEST_CASE("route table: every key of every route generates its own template with its threads and split",
          "[routes]") {
  for (const RouteSpec& r : route_table()) {
    for (Op op : all_values<Op>()) {
      if (!r.serves(op)) continue;
      for (StateDtype st : all_values<StateDtype>()) {
        // The chunk op has no conv: its keys carry sd.
        KernelKey k{op, 16, st, op == Op::chunk ? ConvLayout::sd : ConvLayout::ds, tokens_of(op, 3, r.route), Gate::bounded,
                    r.route, Arch::sm_90};
        INFO(key_name(k));
        auto src = generate_source(k);
        if (chunked(op) && template_text(r.template_file(op)).empty()) {
          // The prefill kernel's template is not in this build yet: generation
          // fails naming it, and nothing else is checked.
          REQUIRE_FALSE(src.ok());
          CHECK(src.error().message.find("'kda_prefill.cu' is not embedded") != std::string::npos);
          WARN("templates/kda_prefill.cu is not embedded: " << key_name(k) << " not generated");
          continue;
        }
        REQUIRE(src.ok());
        const bool has_smem = src->find("#define KDA_SMEM_BYTES ") != std::string::npos;
        CHECK(has_smem == chunked(op));
        if (chunked(op)) CHECK(src->find("#define KDA_SMEM_BYTES 232448\n") != std::string::npos);
        CHECK((src->find("#define KDA_CHUNK 1\n") != std::string::npos) == (op == Op::chunk));
        CHECK(src->find("#define KDA_T " + std::to_string(k.tokens) + "\n") != std::string::npos);
        CHECK(src->find("// ---- " + std::string(r.template_file(op)) + " ----") != std::string::npos);
        CHECK(src->find("#define KDA_THREADS " + std::to_string(r.threads(k)) + "\n") != std::string::npos);
        CHECK(src->find("#define KDA_SPLIT " + std::to_string(r.cluster) + "\n") != std::string::npos);
        CHECK(src->find("#define KDA_MIN_CTAS_PER_SM " + std::to_string(r.ctas_per_sm(k)) + "\n") != std::string::npos);
        const bool has_stages = src->find("#define KDA_STAGES ") != std::string::npos;
        CHECK(has_stages == (r.stage_count(k) > 0));
        if (has_stages) CHECK(src->find("#define KDA_STAGES " + std::to_string(r.stage_count(k)) + "\n") != std::string::npos);
        CHECK(src->find(std::string("extern \"C\" __global__")) != std::string::npos);
        CHECK(src->find(std::string(entry_name(op))) != std::string::npos);
      }
    }
  }
}

TEST_CASE("route table: shared-memory stages fit the SM next to the route's other CTAs", "[routes]") {
  // Hopper and Blackwell: 227 KiB of shared memory per CTA, 228 KiB per SM, of
  // which 1 KiB per resident CTA is the system's; plus the kernel's static
  // shared memory (Smem<1>, under 4 KiB, and the barriers).
  // Smem<T> (templates/kda_head.cuh) is under 2 KiB per token plus 2 KiB.
  constexpr uint32_t kPerSm = 228 * 1024, kPerCta = 227 * 1024, kSystem = 1024;
  for (const RouteSpec& r : route_table())
    for (Op op : all_values<Op>())
      for (int tokens : {1, 4, 16}) {
        if (!r.serves(op) || (op != Op::packed && tokens != 1)) continue;
        for (StateDtype st : all_values<StateDtype>()) {
          const KernelKey k{op, 64, st, ConvLayout::sd, tokens_of(op, tokens, r.route), Gate::bounded, r.route, Arch::sm_90};
          INFO(key_name(k));
          const uint32_t smem = r.dynamic_smem_bytes(k);
          if (chunked(op)) {
            // The sm_90 opt-in maximum per CTA, one CTA per SM, no state stages.
            CHECK(smem == kPrefillSmemBytes);
            CHECK(smem == 227u * 1024u);
            CHECK(r.stage_count(k) == 0);
            CHECK(r.ctas_per_sm(k) == 1);
            // Route pipe16: two roles of 256 (producers, consumer).
            CHECK(r.threads(k) == (r.route == Route::pipe16 ? 512 : 256));
            CHECK(smem + kSystem <= kPerSm);
            continue;
          }
          CHECK(smem == static_cast<uint32_t>(r.stage_count(k)) * 128u * 128u * (st == StateDtype::bf16 ? 2u : 4u));
          const uint32_t per_cta = smem + 2048u * static_cast<uint32_t>(tokens) + 2048u + kSystem;
          CHECK(per_cta <= kPerCta);
          CHECK(static_cast<uint32_t>(r.ctas_per_sm(k)) * per_cta <= kPerSm);
        }
      }
}

TEST_CASE("route table: a key whose route does not serve its op is invalid", "[routes]") {
  for (const RouteSpec& r : route_table())
    for (Op op : all_values<Op>()) {
      KernelKey k{op, 8, StateDtype::f32, ConvLayout::sd, tokens_of(op, 2, r.route), Gate::bounded, r.route, Arch::sm_90};
      INFO(key_name(k));
      CHECK(validate(k).ok() == r.serves(op));
      if (!r.serves(op)) CHECK(validate(k).error().message.find("does not serve op") != std::string::npos);
    }
}

TEST_CASE("route table: presets hold every route that serves each family (but the forced-only ones)", "[routes]") {
  auto keys = preset_keys("glm-5.3-flash", Arch::sm_90);
  REQUIRE(keys.ok());
  std::set<KernelKey> have(keys->begin(), keys->end());
  for (const KernelKey& k : *keys) {
    for (const RouteSpec& r : route_table()) {
      if (!r.serves(k.op) || forced_only(r.route, k.op)) continue;
      const KernelKey other = key_for(CallShape{k}, r.route, k.arch);  // a chunked op's t is its route's chunk
      INFO(key_name(other));
      CHECK(have.count(other) == 1);
    }
  }
}

TEST_CASE("route table: the prefill op's routes, templates and entry", "[routes]") {
  std::vector<std::string_view> want = {"rowcta", "split2", "split4", "split8", "twopass", "rowcta16", "pipe16"};
  CHECK(route_names(Op::prefill) == want);
  for (const RouteSpec& r : route_table()) {
    INFO(r.name());
    if (r.serves(Op::prefill))
      CHECK(r.template_file(Op::prefill) == (r.route == Route::twopass  ? "kda_prefill_twopass.cu"
                                             : r.route == Route::pipe16 ? "kda_prefill_pipe.cu"
                                                                        : "kda_prefill.cu"));
    // Only twopass launches a kernel before its own, and one after it.
    CHECK((r.pre_grid != nullptr) == (r.route == Route::twopass));
    CHECK((r.post_grid != nullptr) == (r.route == Route::twopass));
  }
  CHECK_FALSE(route_spec(Route::sequential).serves(Op::prefill));
  CHECK_FALSE(route_spec(Route::stream).serves(Op::prefill));
  // split8: a cluster of 8, prefill only.
  const RouteSpec& s8 = route_spec(Route::split8);
  CHECK(s8.cluster == 8);
  CHECK_FALSE(s8.serves(Op::single));
  CHECK_FALSE(s8.serves(Op::packed));
  CHECK(s8.template_file(Op::single).empty());
  CHECK(entry_name(Op::prefill) == "kda_prefill");
  CHECK(entry_name(Op::single) == "kda_single_decode");
  CHECK(entry_name(Op::packed) == "kda_packed_decode");
  CHECK(pre_entry_name(Op::prefill) == "kda_prefill_intra");
  CHECK(pre_entry_name(Op::chunk) == "kda_chunk_intra");
  CHECK(pre_entry_name(Op::single).empty());
  CHECK(post_entry_name(Op::prefill) == "kda_prefill_norm");
  CHECK(post_entry_name(Op::chunk).empty());
  CHECK(post_entry_name(Op::packed).empty());
  // The split routes keep their decode limit (T <= 8) to the packed op: a
  // prefill key's t is the chunk size, and every prefill route is eligible;
  // twopass once the call brings its workspace.
  const DeviceTraits h200{Arch::sm_90, 132};
  CallShape c = shape(Op::prefill, 16, 5000, 3);
  for (const RouteSpec& r : route_table())
    if (r.serves(Op::prefill)) CHECK(r.eligible(c, h200) == (r.route != Route::twopass));
  c.workspace_bytes = twopass_workspace_bytes(3, 5000, 16);
  CHECK(c.workspace_bytes == (3 + 79) * 16 * kTwopassUnitBytes);
  for (const RouteSpec& r : route_table())
    if (r.serves(Op::prefill)) CHECK(r.eligible(c, h200));
  c.workspace_bytes -= 1;
  CHECK_FALSE(route_spec(Route::twopass).eligible(c, h200));
  // No rows: the N sequences' units would take tags in a workspace of 0 bytes.
  c = shape(Op::prefill, 16, 0, 3);
  CHECK(twopass_workspace_bytes(3, 0, 16) == 0);
  CHECK_FALSE(route_spec(Route::twopass).eligible(c, h200));
  c.workspace_bytes = kTwopassUnitBytes * 3 * 16;
  CHECK_FALSE(route_spec(Route::twopass).eligible(c, h200));
  CHECK(route_spec(Route::rowcta).eligible(c, h200));
}

TEST_CASE("route table: route twopass's workspace and intra-chunk grid", "[routes]") {
  // One unit per chunk position: N + ceil(T_total / 64) per head.
  CHECK(twopass_workspace_bytes(1, 64, 1) == 2 * kTwopassUnitBytes);
  CHECK(twopass_workspace_bytes(1, 65, 1) == 3 * kTwopassUnitBytes);
  CHECK(twopass_workspace_bytes(8, 8 * 2048, 16) == (8 + 256) * 16 * kTwopassUnitBytes);
  CHECK(twopass_workspace_bytes(0, 100, 2) == 2 * 2 * kTwopassUnitBytes);
  CHECK(twopass_workspace_bytes(5, 0, 16) == 0);
  CHECK(twopass_workspace_bytes(-1, 10, 1) == INT64_MAX);
  CHECK(twopass_workspace_bytes(1, 10, -1) == INT64_MAX);
  CHECK(twopass_workspace_bytes(2147483646, 2147483647, 128) == (int64_t{2147483646} + 33554432) * 128 * kTwopassUnitBytes);
  CHECK(twopass_workspace_bytes(int64_t{1} << 40, int64_t{1} << 40, 128) == INT64_MAX);
  CHECK(twopass_workspace_bytes(INT64_MAX - 1, 640, 1) == INT64_MAX);
  CHECK(twopass_workspace_bytes(0, INT64_MAX, 0) == 0);
  CHECK(kTwopassUnitBytes % 128 == 0);  // every unit as aligned as the workspace's first
  const DeviceTraits h200{Arch::sm_90, 132};
  for (Op op : {Op::prefill, Op::chunk}) {
    KernelKey k{op, 16, StateDtype::f32, ConvLayout::sd, kPrefillChunk, Gate::bounded, Route::twopass, Arch::sm_90};
    CallShape c = shape(op, 16, 16384, 1);
    const LaunchPlan p = launch_plan(k, c, h200);
    CHECK(p.has_pre());
    CHECK(p.pre_grid.x == 16);
    CHECK(p.pre_grid.y == 1 + 256);
    // Two intra-chunk CTAs per SM: each within half the SM's 228 KiB, less the driver's 1 KiB a CTA.
    CHECK(p.pre_dynamic_smem_bytes == kTwopassIntraSmemBytes);
    CHECK(kTwopassIntraCtasPerSm * (kTwopassIntraSmemBytes + 1024) <= 228 * 1024);
    CHECK(p.grid.x == 16);
    CHECK(p.grid.y == 1);
    CHECK(p.grid.z == 8);  // 8 x 16 CTAs of the state pass on 132 SMs
    CHECK(p.cluster_y == 1);
    // The prefill op norms its rows in a third kernel on the intra-chunk kernel's grid: a CTA per unit.
    CHECK(p.has_post() == (op == Op::prefill));
    if (op == Op::prefill) {
      CHECK(p.post_grid.x == 16);
      CHECK(p.post_grid.y == 1 + 256);
      CHECK(p.post_grid.z == 1);
    }
    // Past 65535 units the kernel loops over them.
    c = shape(op, 16, 2147483647, 70000);
    CHECK(launch_plan(k, c, h200).pre_grid.y == 65535);
    CHECK(launch_plan(k, c, h200).grid.z == 1);
    if (op == Op::prefill) CHECK(launch_plan(k, c, h200).post_grid.y == 65535);
    k.route = Route::rowcta;
    CHECK_FALSE(launch_plan(k, c, h200).has_pre());
    CHECK_FALSE(launch_plan(k, c, h200).has_post());
    CHECK(launch_plan(k, c, h200).grid.z == 1);
  }
}

TEST_CASE("route table: route twopass's state pass CTAs per (sequence, head)", "[routes]") {
  // The largest P of 1, 2, 4, 8 whose P x N x H CTAs fit the SMs.
  const DeviceTraits h200{Arch::sm_90, 132};
  CHECK(twopass_parts(shape(Op::prefill, 16, 16384, 1), h200) == 8);
  CHECK(twopass_parts(shape(Op::prefill, 16, 16384, 2), h200) == 4);
  CHECK(twopass_parts(shape(Op::prefill, 16, 32768, 4), h200) == 2);
  CHECK(twopass_parts(shape(Op::prefill, 32, 16384, 1), h200) == 4);
  CHECK(twopass_parts(shape(Op::prefill, 64, 16384, 1), h200) == 2);
  CHECK(twopass_parts(shape(Op::chunk, 66, 16384, 1), h200) == 2);
  CHECK(twopass_parts(shape(Op::chunk, 67, 16384, 1), h200) == 1);
  CHECK(twopass_parts(shape(Op::prefill, 128, 16384, 8), h200) == 1);
  CHECK(twopass_parts(shape(Op::prefill, 1, 100, 0), h200) == 8);
  CHECK(twopass_parts(shape(Op::prefill, 4, 100, 1), DeviceTraits{Arch::sm_90, 0}) == 1);
  CHECK(twopass_parts(shape(Op::prefill, 4, 100, 1), DeviceTraits{Arch::sm_90, 20}) == 4);
}

TEST_CASE("route table: the prefill launch plan", "[routes]") {
  const DeviceTraits h200{Arch::sm_90, 132};
  for (const RouteSpec& r : route_table()) {
    if (!r.serves(Op::prefill)) continue;
    const int64_t P = r.cluster;
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8191}, int64_t{8192}, int64_t{70000},
                      int64_t{2147483647}}) {
      CallShape c = shape(Op::prefill, 16, std::max<int64_t>(n, 1) * 3, n);
      const KernelKey k = key_for(c, r.route, Arch::sm_90);
      INFO(key_name(k) << " N " << n);
      REQUIRE(validate(k).ok());
      CHECK(items_per_head(c) == std::max<int64_t>(n, 1));
      const LaunchPlan p = launch_plan(k, c, h200);
      const int64_t wave = std::min<int64_t>(std::max<int64_t>(n, 1), 65535 / P);
      CHECK(p.grid.x == 16u);
      CHECK(p.grid.y == static_cast<uint32_t>(P * wave));
      CHECK(p.grid.y <= kMaxGridY);
      // Route twopass's state pass: P CTAs per (sequence, head) along z (twopass_parts).
      CHECK(p.grid.z == (r.route == Route::twopass ? static_cast<uint32_t>(twopass_parts(c, h200)) : 1u));
      CHECK(p.threads == (r.route == Route::pipe16 ? 512u : 256u));
      CHECK(p.cluster_y == static_cast<uint32_t>(P));
      CHECK(p.dynamic_smem_bytes == 232448u);
    }
  }
}

TEST_CASE("route table: eligibility follows the contract's modes", "[routes]") {
  const DeviceTraits h200{Arch::sm_90, 132};
  const CallShape repeated = shape(Op::single, 8, 4, 0, IndicesMode::repeated_positive);
  for (const RouteSpec& r : route_table()) {
    if (!r.serves(Op::single)) continue;
    INFO(r.name());
    // Only the sequential route applies repeated slots in row order.
    CHECK(r.eligible(repeated, h200) == (r.route == Route::sequential));
    CHECK(r.eligible(shape(Op::single, 8, 4), h200));
  }
}

TEST_CASE("route table: the packed op's items are max(N, ceil(R / T))", "[routes]") {
  CHECK(items_per_head(shape(Op::single, 5, 77)) == 77);
  CHECK(items_per_head(shape(Op::packed, 5, 32, 8)) == 8);    // full windows: one item per sequence
  CHECK(items_per_head(shape(Op::packed, 5, 30, 8)) == 8);
  CHECK(items_per_head(shape(Op::packed, 5, 33, 8)) == 9);    // a tail beyond N x T rows
  CHECK(items_per_head(shape(Op::packed, 5, 3, 8)) == 8);     // short and empty sequences
  CHECK(items_per_head(shape(Op::packed, 5, 70005, 4)) == 17502);
  CHECK(items_per_head(shape(Op::packed, 5, 2147483647, 1)) == 536870912);
  // Every row r < R is candidate k = r / n < T of item r % n.
  for (int64_t rows : {1, 7, 8, 9, 31, 32, 33, 100})
    for (int64_t seqs : {1, 3, 8, 40}) {
      const CallShape c = shape(Op::packed, 5, rows, seqs);
      const int64_t n = items_per_head(c);
      CHECK(n >= seqs);
      CHECK(n * c.family.tokens >= rows);
    }
}

TEST_CASE("route table: grids cover every row or item within the grid limits", "[routes]") {
  for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{65535}, int64_t{65536}, int64_t{200000}, int64_t{2147483647}}) {
    for (int64_t seq_div : {int64_t{1}, int64_t{4}}) {  // packed: N = R (short sequences) or N = R / T
      for (const RouteSpec& r : route_table()) {
        for (Op op : all_values<Op>()) {
          if (!r.serves(op) || (op == Op::single && seq_div > 1)) continue;
          if (op == Op::prefill) continue;  // "the prefill launch plan" covers its grid
          const CallShape c =
              op == Op::single ? shape(op, 5, rows) : shape(op, 5, rows, std::max<int64_t>(1, rows / seq_div));
          const int64_t items = items_per_head(c);
          const DeviceTraits h200{Arch::sm_90, 132};
          const LaunchGrid g = r.grid(c, h200);
          INFO(r.name() << " " << to_string(op) << " rows " << rows << " seqs " << c.num_seqs);
          if (r.route == Route::stream) {
            // Persistent: one CTA per (item, head) up to its CTAs per SM;
            // the kernel walks items with stride gridDim.x.
            CHECK(g.x == std::min<int64_t>(items * 5, int64_t{r.ctas_per_sm(c.family)} * h200.sm_count));
            CHECK(g.y == 1u);
            CHECK(g.z == 1u);
            continue;
          }
          CHECK(g.x == 5u);
          CHECK(g.y >= 1u);
          CHECK(g.y <= kMaxGridY);
          CHECK(g.z <= kMaxGridY);
          CHECK(g.y % static_cast<uint32_t>(r.cluster) == 0);
          if (r.route == Route::sequential) {
            CHECK(g.y == 1u);
          } else if (op == Op::packed && r.cluster == 1) {
            // One CTA per item, no loop: y * z covers the items, and the
            // overshoot (CTAs with no item) stays below one grid-y slice.
            const int64_t covered = static_cast<int64_t>(g.y) * g.z;
            CHECK(covered >= items);
            CHECK(covered - items < static_cast<int64_t>(g.y));
          } else {
            // The kernel loops items with stride gridDim.y / cluster.
            CHECK(static_cast<int64_t>(g.y / r.cluster) == std::min<int64_t>(items, kMaxGridY / r.cluster));
            CHECK(g.z == (r.route == Route::twopass ? static_cast<uint32_t>(twopass_parts(c, h200)) : 1u));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kdajit
