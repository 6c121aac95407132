// kdajit_bench's prefill grid without a GPU: the prompt batches (mix64 drawn as
// Python's random.Random(0) draws it), the bytes and FLOPs behind the two floors
// (bench/bench_prefill.py's formulas, docs/CONTRACT.md §10.5), the floors, the
// cells and their arguments through kdajit's validation, the slots and
// query_start_loc of the device data, and the command line.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "catch.hpp"
#include "cli.hpp"
#include "kdajit/kdajit.hpp"
#include "kdajit/routes.hpp"
#include "mma_rate.hpp"
#include "prefill_data.hpp"
#include "prefill_grid.hpp"
#include "prefill_report.hpp"

using namespace kdajit;
using namespace kdajit::bench;

namespace {

// Parses a kdajit_bench command line (without the program name) into options
// and runs finish_options; the Status says whether both passed.
Status parse(const std::vector<std::string>& args, Options& o) {
  CLI::App app;
  add_options(app, o);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes the arguments last to first
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return Error(ErrorCode::invalid_argument, e.what());
  }
  return finish_options(app, o);
}

// Equal up to rounding (no Catch Approx: its namespace differs between Catch2 2 and 3).
bool near(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b)); }

std::string error_of(const Status& s) { return s ? std::string() : s.error().message; }

PrefillCell cell(std::vector<int32_t> lengths, int heads, StateDtype st) {
  return PrefillCell{"test", std::move(lengths), heads, st, ConvLayout::sd};
}

}  // namespace

TEST_CASE("PythonRandom reproduces CPython's random.Random", "[bench][prefill]") {
  // random.Random(0).getrandbits(32) three times; random.Random(1) twice (Python 3.11).
  PythonRandom zero(0);
  CHECK(zero.next_u32() == 3626764237u);
  CHECK(zero.next_u32() == 1654615998u);
  CHECK(zero.next_u32() == 3255389356u);
  PythonRandom one(1);
  CHECK(one.next_u32() == 577090037u);
  CHECK(one.next_u32() == 2444712010u);
  // getrandbits(k) keeps the top k bits; randint draws in a..b only.
  PythonRandom a(0), b(0);
  CHECK(a.getrandbits(11) == b.next_u32() >> 21);
  PythonRandom r(7);
  for (int i = 0; i < 2000; ++i) {
    const int64_t v = r.randint(100, 2000);
    REQUIRE((v >= 100 && v <= 2000));
  }
}

TEST_CASE("mix64 is bench_prefill.py's batch", "[bench][prefill]") {
  // lengths_of("mix64") of bench/peers/bench_fla_chunk_kda.py begins 1829, 888,
  // 1652, 1923, 961 and sums to 74979 (the whole list is compared with Python's
  // by the bench_prefill_mix_lengths test).
  const std::vector<int32_t> mix = mix_lengths(64);
  REQUIRE(mix.size() == 64);
  CHECK(std::vector<int32_t>(mix.begin(), mix.begin() + 5) == std::vector<int32_t>{1829, 888, 1652, 1923, 961});
  CHECK(std::accumulate(mix.begin(), mix.end(), int64_t{0}) == 74979);
  CHECK(*std::min_element(mix.begin(), mix.end()) == 182);
  CHECK(*std::max_element(mix.begin(), mix.end()) == 1981);
  // A shorter mix is a prefix of a longer one (the same draws).
  const std::vector<int32_t> mix7 = mix_lengths(7);
  CHECK(std::equal(mix7.begin(), mix7.end(), mix.begin()));
  auto parsed = prompt_lengths("mix64");
  REQUIRE(parsed);
  CHECK(*parsed == mix);
}

TEST_CASE("prompt_lengths reads NxL and mixN and names what it expects", "[bench][prefill]") {
  auto p = prompt_lengths("8x2048");
  REQUIRE(p);
  CHECK(*p == std::vector<int32_t>(8, 2048));
  p = prompt_lengths("1x16384");
  REQUIRE(p);
  CHECK(*p == std::vector<int32_t>{16384});
  for (const char* bad : {"", "x", "8x", "x8", "0x64", "8x0", "-1x5", "8x2048x2", "3y4", "mix", "mix0", "mix-1",
                          "mixx", "8 x 2048", "1x16777217", "4097x4097", "mix65537"}) {
    INFO(bad);
    auto r = prompt_lengths(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().message.find("--shapes: expected NxL") != std::string::npos);
    CHECK(r.error().message.find(std::string("got '") + bad + "'") != std::string::npos);
  }
}

TEST_CASE("prefill bytes and FLOPs are bench_prefill.py's (CONTRACT §10.5)", "[bench][prefill]") {
  // memory_floor_bytes: tokens * H * 1538 + sequences * H * (2 * 128 * 128 * b + 4608).
  CHECK(prefill_bytes(cell(std::vector<int32_t>(8, 2048), 16, StateDtype::f32)) ==
        16384LL * 16 * 1538 + 8LL * 16 * (131072 + 4608));
  CHECK(prefill_bytes(cell(std::vector<int32_t>(8, 2048), 16, StateDtype::f32)) == 420544512);
  CHECK(prefill_bytes(cell({16384}, 64, StateDtype::bf16)) == 16384LL * 64 * 1538 + 64LL * (65536 + 4608));
  // chunk_flops: 11 * 2^20 per chunk of 64 (a partial chunk counts whole) and head.
  CHECK(kFlopPerChunkHead == 11534336);
  CHECK(prefill_flops(cell(std::vector<int32_t>(8, 2048), 16, StateDtype::f32)) == 8LL * 32 * 16 * 11534336);
  CHECK(prefill_flops(cell({1, 64, 65, 128}, 2, StateDtype::bf16)) == (1 + 1 + 2 + 2) * 2LL * 11534336);
  // The state dtype changes the bytes, not the FLOPs.
  CHECK(prefill_flops(cell({100}, 8, StateDtype::f32)) == prefill_flops(cell({100}, 8, StateDtype::bf16)));
  CHECK(prefill_bytes(cell({100}, 8, StateDtype::f32)) - prefill_bytes(cell({100}, 8, StateDtype::bf16)) ==
        8LL * 2 * 128 * 128 * (4 - 2));  // the state read and written, 2 bytes more per element
}

TEST_CASE("prefill floors: the larger of memory and tensor core, n/a without a rate", "[bench][prefill]") {
  const PrefillCell c = cell(std::vector<int32_t>(8, 2048), 16, StateDtype::f32);
  // bench_prefill.py's floors(): bytes / copy_bw and flops / rate, in us.
  PrefillFloors f = prefill_floors(c, 4000, 500e12);
  CHECK(near(f.memory_us, 420544512.0 / 4.0e12 * 1e6));
  CHECK(near(f.tensor_core_us, 47244640256.0 / 500e12 * 1e6));
  CHECK(near(f.floor_us, f.memory_us));  // 105 us against 94 us
  CHECK(f.binds == "memory");
  f = prefill_floors(c, 4000, 400e12);  // 118 us of tensor core
  CHECK(near(f.floor_us, f.tensor_core_us));
  CHECK(f.binds == "tensor core");
  f = prefill_floors(c, 4000, 0);
  CHECK(f.tensor_core_us < 0);
  CHECK(near(f.floor_us, f.memory_us));
  CHECK(f.binds == "memory");
}

TEST_CASE("the default prefill grid: bench_prefill.py's, shapes outermost", "[bench][prefill]") {
  Options o;
  REQUIRE(parse({"--op", "prefill"}, o));
  auto cells = make_prefill_cells(o);
  REQUIRE(cells);
  REQUIRE(cells->size() == 4 * 3 * 2);
  const std::vector<std::string> shapes = {"8x2048", "4x8192", "1x16384", "mix64"};
  const std::vector<int> heads = {16, 32, 64};
  size_t i = 0;
  for (const std::string& s : shapes)
    for (int h : heads)
      for (StateDtype st : {StateDtype::f32, StateDtype::bf16}) {
        const PrefillCell& c = (*cells)[i++];
        CHECK(c.shape == s);
        CHECK(c.heads == h);
        CHECK(c.state == st);
        CHECK(c.conv == ConvLayout::sd);
      }
  CHECK((*cells)[0].lengths == std::vector<int32_t>(8, 2048));
  CHECK((*cells)[6].tokens() == 32768);
  CHECK((*cells)[12].longest() == 16384);
  CHECK((*cells)[18].seqs() == 64);
  CHECK((*cells)[18].lengths == mix_lengths(64));
  CHECK(prefill_cell_name((*cells)[18]) == "prefill mix64 h16 f32 sd");
  // The whole default grid, every route forced, stays well inside the device
  // script's four minutes (estimate only; setup compiles come on top).
  auto routes = resolve_routes("all", {Op::prefill});
  REQUIRE(routes);
  CHECK(estimate_prefill_seconds(o, *cells, static_cast<int>(routes->size())) < 120);
}

TEST_CASE("the prefill grid's flags select cells, duplicates once", "[bench][prefill]") {
  Options o;
  REQUIRE(parse({"--op", "prefill", "--shapes", "2x64,mix3,2x64", "--heads", "8,8", "--state", "bf16", "--conv",
                 "sd,ds"},
                o));
  auto cells = make_prefill_cells(o);
  REQUIRE(cells);
  REQUIRE(cells->size() == 4);
  CHECK((*cells)[0].conv == ConvLayout::sd);
  CHECK((*cells)[1].conv == ConvLayout::ds);
  CHECK((*cells)[2].lengths == mix_lengths(3));
  for (const char* bad : {"--heads=0", "--heads=129", "--state=f16", "--conv=xy", "--shapes=8x"}) {
    Options b;
    INFO(bad);
    REQUIRE(parse({"--op", "prefill", bad}, b));
    auto r = make_prefill_cells(b);
    REQUIRE_FALSE(r);
    const std::string flag = std::string(bad).substr(0, std::string(bad).find('='));
    CHECK(r.error().message.rfind(flag + ": expected", 0) == 0);
  }
}

TEST_CASE("every prefill cell's arguments pass kdajit's validation", "[bench][prefill]") {
  Options o;
  REQUIRE(parse({"--op", "prefill", "--shapes", "8x2048,4x8192,1x16384,mix64,3x1", "--conv", "sd,ds"}, o));
  auto cells = make_prefill_cells(o);
  REQUIRE(cells);
  for (const PrefillCell& c : *cells) {
    INFO(prefill_cell_name(c));
    const kdajit_prefill_args_t a = prefill_stand_in_args(c);
    CHECK(kdajit_validate_prefill_args(&a) == KDAJIT_OK);
    CHECK(a.max_seq_len == c.longest());
    CHECK(a.x.shape[0] == c.tokens());
    CHECK(a.state_indices.shape[0] == c.seqs());
    CHECK(a.state.shape[0] == c.seqs() + 4);
    CHECK(a.has_initial_state.ndim == 0);
    // The device buffers hold at least the bytes the op must move.
    CHECK(static_cast<int64_t>(PrefillData::bytes_needed(c)) >= prefill_bytes(c) / 2);
  }
}

TEST_CASE("prefill metadata: distinct live slots, query_start_loc the running sum", "[bench][prefill]") {
  const PrefillCell c{"mix64", mix_lengths(64), 16, StateDtype::f32, ConvLayout::sd};
  const PrefillMetadata m = prefill_metadata(c, 1018);
  REQUIRE(m.slots.size() == 64);
  CHECK(std::set<int32_t>(m.slots.begin(), m.slots.end()).size() == 64);
  for (int32_t s : m.slots) CHECK((s >= 1 && s < 64 + 4));
  REQUIRE(m.qsl.size() == 65);
  CHECK(m.qsl.front() == 0);
  for (size_t n = 0; n < 64; ++n) CHECK(m.qsl[n + 1] - m.qsl[n] == c.lengths[n]);
  CHECK(m.qsl.back() == c.tokens());
  // Another seed, another order: the slots are shuffled, not 1..N.
  CHECK(prefill_metadata(c, 1019).slots != m.slots);
}

TEST_CASE("kdajit_bench's command line: the prefill grid's defaults and the options it refuses", "[bench][cli]") {
  {
    Options o;
    REQUIRE(parse({"--op", "prefill"}, o));
    CHECK(o.iters == kPrefillDefaultIters);
    CHECK(is_prefill(o));
  }
  {
    Options o;
    REQUIRE(parse({"--op", "prefill", "--iters", "7"}, o));
    CHECK(o.iters == 7);
  }
  {
    Options o;  // the decode grid keeps its own default
    REQUIRE(parse({"--op", "packed"}, o));
    CHECK(o.iters == 200);
    CHECK_FALSE(is_prefill(o));
  }
  struct Refused {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Refused> refused = {
      {{"--op", "prefill", "--pdl"}, "--pdl: applies to the decode grid"},
      {{"--op", "prefill", "--floor-shapes", "cta256"}, "--floor-shapes: applies to the decode grid"},
      {{"--op", "prefill", "--floor-spin-cycles", "5"}, "--floor-spin-cycles: applies to the decode grid"},
      {{"--op", "prefill", "--host-calls", "10"}, "--host-calls: applies to the decode grid"},
      {{"--op", "prefill", "--tuning", "both"}, "--tuning: expected off with --op prefill"},
      {{"--op", "prefill", "--iters", "0"}, "--iters: expected 1..100000, got 0"},
      {{"--shapes", "8x2048"}, "--shapes: applies to --op prefill"},
      {{"--op", "single", "--shapes", "mix64"}, "--shapes: applies to --op prefill"},
  };
  for (const Refused& r : refused) {
    Options o;
    INFO(r.message);
    const Status st = parse(r.args, o);
    REQUIRE_FALSE(st);
    CHECK(error_of(st).rfind(r.message, 0) == 0);
  }
  {
    Options o;  // --rows and --tokens are the decode grid's: make_prefill_cells says so
    REQUIRE(parse({"--op", "prefill", "--rows", "8"}, o));
    auto cells = make_prefill_cells(o);
    REQUIRE_FALSE(cells);
    CHECK(cells.error().message.rfind("--rows: applies to the decode ops", 0) == 0);
    Options t;
    REQUIRE(parse({"--op", "prefill", "--tokens", "4"}, t));
    REQUIRE_FALSE(make_prefill_cells(t));
  }
  {
    Options o;  // the decode grid names prefill among the ops
    REQUIRE(parse({"--op", "bogus"}, o));
    auto cells = make_cells(o);
    REQUIRE_FALSE(cells);
    CHECK(cells.error().message == "--op: expected one of single, packed, all, prefill, got 'bogus'");
    Options c;  // the chunk op is bench_prefill.py's
    REQUIRE(parse({"--op", "chunk"}, c));
    auto chunk = make_cells(c);
    REQUIRE_FALSE(chunk);
    CHECK(chunk.error().message ==
          "--op: expected one of single, packed, all, prefill, got 'chunk' (bench/bench_prefill.py times the chunk op)");
  }
}

TEST_CASE("--routes over the prefill op's routes", "[bench][cli]") {
  const auto names = route_names(Op::prefill);
  auto all = resolve_routes("all", {Op::prefill});
  REQUIRE(all);
  CHECK(all->size() == names.size());
  for (std::string_view r : names) CHECK(std::find(all->begin(), all->end(), r) != all->end());
  for (const char* r : {"rowcta", "split2", "split4", "split8"})
    CHECK(std::find(all->begin(), all->end(), r) != all->end());
  auto none = resolve_routes("selector", {Op::prefill});
  REQUIRE(none);
  CHECK(none->empty());
  auto some = resolve_routes("split4,rowcta,split4", {Op::prefill});
  REQUIRE(some);
  CHECK(*some == std::vector<std::string>{"split4", "rowcta"});
  // A route that only serves the decode ops is unknown to the prefill grid.
  for (std::string_view r : route_names(Op::packed)) {
    if (std::find(names.begin(), names.end(), r) != names.end()) continue;
    auto bad = resolve_routes(std::string(r), {Op::prefill});
    REQUIRE_FALSE(bad);
    CHECK(bad.error().message.rfind("--routes: unknown route '" + std::string(r) + "'", 0) == 0);
  }
}

TEST_CASE("the tensor-core rate kernel: bf16 mma.sync from sm_80 on", "[bench][prefill]") {
  CHECK(mma_bf16_supported("sm_80"));
  CHECK(mma_bf16_supported("sm_90"));
  CHECK(mma_bf16_supported("sm_90a"));
  CHECK(mma_bf16_supported("sm_120a"));
  CHECK_FALSE(mma_bf16_supported("sm_75"));
  CHECK_FALSE(mma_bf16_supported("compute_90"));
  CHECK_FALSE(mma_bf16_supported(""));
  const std::string src = mma_rate_source();
  CHECK(src.find("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") != std::string::npos);
  CHECK(MmaRate::kFlopPerMma == 2 * 16 * 8 * 16);
}

TEST_CASE("the prefill grid's JSON: the decode grid's shape with the prefill cell's fields", "[bench][prefill]") {
  Bench b;
  b.opt.op = "prefill";
  b.copy_gbps = 4000;
  b.mma_flops = 500e12;
  b.routes = {"rowcta", "split8"};
  const std::vector<PrefillCell> cells = {cell(std::vector<int32_t>(8, 2048), 16, StateDtype::f32),
                                          cell({100, 200}, 32, StateDtype::bf16)};
  std::vector<PrefillResult> results(2);
  results[0].status = "ok";
  results[0].key = "kda_prefill.h16.state_f32.conv_sd.t64.gate_bounded.route_rowcta.sm_90";
  results[0].route = "rowcta";
  results[0].device = summarize({1600, 1590, 1610});
  results[0].routes.resize(2);
  results[0].routes[0].status = "ok";
  results[0].routes[0].route = "rowcta";
  results[0].routes[0].device = summarize({1600});
  results[0].routes[1].status = "n/a";
  results[0].routes[1].route = "split8";
  results[0].routes[1].error = "not eligible";
  results[1].status = "failed";
  results[1].error = "prefill (first call): boom";
  const nlohmann::json j = prefill_report_json(b, cells, results, "failed", 1.5);
  CHECK(j["schema"] == "kdajit-bench-prefill-grid/1");
  CHECK(j["status"] == "failed");
  CHECK(j["copy_bandwidth_gbps"] == 4000.0);
  CHECK(j["mma_bf16"]["tflops"] == 500.0);
  CHECK(j["settings"]["flop_per_chunk_head"] == kFlopPerChunkHead);
  REQUIRE(j["configs"].size() == 2);
  const nlohmann::json& c = j["configs"][0];
  CHECK(c["op"] == "prefill");
  CHECK(c["seqs"] == 8);
  CHECK(c["tokens"] == 16384);
  CHECK(c["max_seq_len"] == 2048);
  CHECK(c["bytes_per_call"] == 420544512);
  CHECK(c["flops_per_call"] == 47244640256);
  CHECK(near(c["memory_floor_us"].get<double>(), 420544512.0 / 4e12 * 1e6));
  CHECK(near(c["tensor_core_floor_us"].get<double>(), 47244640256.0 / 500e12 * 1e6));
  CHECK(c["binds"] == "memory");
  CHECK(c["route"] == "rowcta");
  CHECK(c["device_us"]["median"] == 1600.0);
  CHECK(near(c["ratio"].get<double>(), 1600.0 / c["floor_us"].get<double>()));
  CHECK(c["routes"]["rowcta"]["status"] == "ok");
  CHECK(c["routes"]["split8"]["status"] == "n/a");
  const nlohmann::json& f = j["configs"][1];
  CHECK(f["status"] == "failed");
  CHECK(f["error"] == "prefill (first call): boom");
  CHECK(f["lengths"].get<std::vector<int>>() == std::vector<int>{100, 200});
  CHECK_FALSE(f.contains("device_us"));
  // Without a tensor-core rate: null and the reason.
  b.mma_flops = 0;
  b.mma_error = "sm_75: no bf16 mma.sync (sm_80 or later)";
  const nlohmann::json n = prefill_report_json(b, cells, results, "ok", 1);
  CHECK(n["mma_bf16"]["tflops"].is_null());
  CHECK(n["mma_bf16"]["error"] == b.mma_error);
  CHECK(n["configs"][0]["tensor_core_floor_us"].is_null());
}
