// The route selector and tune tables: the built-in bands depend on the device's
// SM count, every selected route is eligible, a forced route is checked, a
// tuned route wins when eligible, and tune tables round-trip and are checked.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/runtime/call/select.hpp"
#include "kdajit/runtime/tune/tune_table.hpp"

namespace kdajit {
namespace {

CallShape single(int heads, int64_t rows, IndicesMode mode = IndicesMode::unique_or_null) {
  CallShape c;
  c.family = KernelKey{Op::single, heads, StateDtype::bf16, ConvLayout::sd, 1, Gate::bounded, Route::rowcta, Arch::sm_90};
  c.mode = mode;
  c.rows = rows;
  return c;
}

CallShape packed(int heads, int64_t seqs) {
  CallShape c;
  c.family = KernelKey{Op::packed, heads, StateDtype::f32, ConvLayout::sd, 4, Gate::bounded, Route::rowcta, Arch::sm_90};
  c.rows = seqs * 4;
  c.num_seqs = seqs;
  return c;
}

CallShape prefill(int heads, int64_t seqs, int64_t total, int64_t longest) {
  CallShape c;
  c.family = KernelKey{Op::prefill, heads, StateDtype::f32, ConvLayout::sd, kPrefillChunk, Gate::bounded, Route::rowcta,
                       Arch::sm_90};
  c.rows = total;
  c.num_seqs = seqs;
  c.max_seq_len = longest;
  return c;
}

TEST_CASE("select: the prefill band", "[select][prefill]") {
  const DeviceTraits h200{Arch::sm_90, 132}, small{Arch::sm_90, 64};
  // Without a workspace: pipe16, whatever the lengths, the batch and the SMs.
  CHECK(builtin_route(prefill(16, 1, 16384, 16384), h200) == Route::pipe16);
  CHECK(builtin_route(prefill(64, 8, 16384, 2048), h200) == Route::pipe16);
  CHECK(builtin_route(prefill(16, 256, 256 * 64, 64), h200) == Route::pipe16);
  CHECK(builtin_route(prefill(32, 1, 16384, 16384), small) == Route::pipe16);
  CHECK(builtin_route(prefill(1, 1, 1, 0), h200) == Route::pipe16);
  // Every pick serves the op and is eligible.
  for (int h : {1, 8, 16, 64, 128})
    for (int64_t n : {1, 2, 3, 8, 100})
      for (int64_t len : {1, 127, 128, 1024, 32768}) {
        const CallShape c = prefill(h, n, n * len, len);
        const Route r = builtin_route(c, h200);
        CHECK(route_spec(r).serves(Op::prefill));
        CHECK(route_spec(r).eligible(c, h200));
      }
}

TEST_CASE("select: twopass for a call with a workspace whose longest prompt sets pipe16's time", "[select][prefill]") {
  const DeviceTraits h200{Arch::sm_90, 132}, small{Arch::sm_90, 64};
  const auto ws = [](CallShape c) {
    c.workspace_bytes = twopass_workspace_bytes(c.num_seqs, c.rows, c.family.heads);
    return c;
  };
  CHECK(builtin_route(ws(prefill(16, 1, 16384, 16384)), h200) == Route::twopass);  // few long prompts
  CHECK(builtin_route(ws(prefill(64, 1, 16384, 16384)), h200) == Route::twopass);
  CHECK(builtin_route(ws(prefill(128, 1, 16384, 16384)), h200) == Route::pipe16);  // 128 CTAs of one prompt
  // The edge: 8 x longest x SMs > 9 x T_total x H.
  CHECK(builtin_route(ws(prefill(16, 8, 8 * 2048, 2048)), h200) == Route::pipe16);  // 1.03 x T_total x H / SMs
  CHECK(builtin_route(ws(prefill(16, 7, 7 * 2048, 2048)), h200) == Route::twopass);  // 1.18 x
  CHECK(builtin_route(ws(prefill(16, 8, 8 * 2048, 2048)), small) == Route::pipe16);
  CHECK(builtin_route(ws(prefill(16, 4, 4 * 2048, 2048)), small) == Route::pipe16);  // 1.0 x on 64 SMs
  CHECK(builtin_route(ws(prefill(16, 3, 3 * 2048, 2048)), small) == Route::twopass);
  CHECK(builtin_route(ws(prefill(64, 8, 16384, 2048)), h200) == Route::pipe16);    // a full grid
  CHECK(builtin_route(ws(prefill(16, 64, 74979, 1981)), h200) == Route::pipe16);   // a serving mix
  CHECK(builtin_route(ws(prefill(16, 2, 16384 + 1, 16384)), h200) == Route::twopass);  // one long, one short
  CHECK(builtin_route(ws(prefill(1, 256, 256 * 128, 128)), h200) == Route::pipe16);
  CHECK(builtin_route(ws(prefill(16, 1, 127, 127)), h200) == Route::pipe16);           // below 128 tokens
  CHECK(builtin_route(ws(prefill(16, 1, 128, 128)), h200) == Route::twopass);
  CHECK(builtin_route(ws(prefill(16, 1, 16384, 100)), h200) == Route::pipe16);        // the hint decides
  CHECK(builtin_route(ws(prefill(1, 1, 100000, 1000)), h200) == Route::twopass);      // the hint wins over T_total
  CHECK(builtin_route(ws(prefill(1, 1, 100, 5000)), h200) == Route::pipe16);          // a hint past T_total is T_total
  CHECK(builtin_route(ws(prefill(16, 8, 16384, 0)), h200) == Route::twopass);         // no hint: T_total
  // A workspace one byte short is none: pipe16.
  CallShape short_ws = ws(prefill(16, 1, 16384, 16384));
  short_ws.workspace_bytes -= 1;
  CHECK(builtin_route(short_ws, h200) == Route::pipe16);
}

TEST_CASE("select: the chunk op takes the prefill band", "[select][chunk]") {
  const DeviceTraits h200{Arch::sm_90, 132};
  for (int h : {8, 16, 32, 64})
    for (int64_t n : {1, 2, 8})
      for (int64_t len : {1, 1023, 1024, 16384}) {
        CallShape c = prefill(h, n, n * len, len);
        const Route want = builtin_route(c, h200);
        c.family.op = Op::chunk;
        CHECK(builtin_route(c, h200) == want);
      }
  // The routes prewarm keeps for a chunk family are the prefill family's.
  KernelKey p{Op::prefill, 16, StateDtype::f32, ConvLayout::sd, kPrefillChunk, Gate::bounded, Route::rowcta, Arch::sm_90};
  KernelKey c = p;
  c.op = Op::chunk;
  const auto up = builtin_route_uses(p, 132, 64), uc = builtin_route_uses(c, 132, 64);
  REQUIRE(up.size() == uc.size());
  for (size_t i = 0; i < up.size(); ++i) {
    CHECK(up[i].route == uc[i].route);
    CHECK(up[i].batches == uc[i].batches);
  }
}

TEST_CASE("select: prefill calls take no tuned route; a forced one must serve the op", "[select][prefill]") {
  const DeviceTraits d{Arch::sm_90, 132};
  RoutePolicy p;
  p.tuned = Route::stream;  // not a prefill route: never taken
  CHECK(*select_route(prefill(16, 1, 100, 100), d, p) == Route::pipe16);
  p.tuned = Route::split8;  // a prefill route: tune tables hold decode families only
  CHECK(*select_route(prefill(16, 1, 100, 100), d, p) == Route::pipe16);
  p.tuned.reset();
  p.forced = Route::split4;
  CHECK(*select_route(prefill(16, 1, 100, 100), d, p) == Route::split4);
  p.forced = Route::stream;
  auto bad = select_route(prefill(16, 1, 100, 100), d, p);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code == ErrorCode::unsupported);
  CHECK(bad.error().message.find("stream does not serve the prefill op") != std::string::npos);
  p.forced = Route::split8;
  auto dec = select_route(single(8, 1), d, p);
  REQUIRE_FALSE(dec.ok());
  CHECK(dec.error().message.find("split8 does not serve the single op") != std::string::npos);
  // A tune table never answers for a prefill family, and refuses one in its file.
  TuneTable t(TuneIdentity{"NVIDIA H200", 132, 13000, "13.0", "0.1.0", Arch::sm_90});
  t.add(prefill(16, 1, 100, 100).family, {1, Route::split2, 1.0});
  CHECK_FALSE(t.route_for(prefill(16, 1, 100, 100)).has_value());
  auto back = TuneTable::from_json(t.to_json());
  REQUIRE_FALSE(back.ok());
  CHECK(back.error().message.find("op prefill is not tuned") != std::string::npos);
}

TEST_CASE("select: prewarm's route uses of a prefill family are the routes some length picks", "[select][prefill]") {
  auto uses_of = [](int heads, int sms) {
    std::map<Route, std::vector<std::pair<int64_t, int64_t>>> out;
    for (const auto& u : builtin_route_uses(prefill(heads, 1, 1, 1).family, sms, 64)) {
      CHECK(u.any_length);
      CHECK_FALSE(u.repeated_slots);
      out[u.route] = u.batches;
    }
    return out;
  };
  // pipe16 at every N (short prompts, or no workspace); twopass at every N
  // where one long prompt of N (the others empty) sets pipe16's time, so
  // where H < 8/9 x SMs.
  for (int h : {16, 64, 128})
    for (int sms : {132, 16}) {
      const auto uses = uses_of(h, sms);
      const bool twopass = 8 * sms > 9 * h;
      CHECK(uses.size() == (twopass ? 2u : 1u));
      CHECK(uses.at(Route::pipe16) == std::vector<std::pair<int64_t, int64_t>>{{1, 64}});
      if (twopass) CHECK(uses.at(Route::twopass) == std::vector<std::pair<int64_t, int64_t>>{{1, 64}});
    }
  for (const auto& u : builtin_route_uses(single(16, 1).family, 132, 64)) CHECK_FALSE(u.any_length);
}

TEST_CASE("select: built-in bands scale with the device's SM count", "[select]") {
  const DeviceTraits h200{Arch::sm_90, 132}, small{Arch::sm_90, 64};
  auto f32 = [](CallShape c) {
    c.family.state = StateDtype::f32;
    return c;
  };
  // Single f32: split4 while 4 x R x H <= SMs, split2 while R x H <= SMs, then rowcta.
  CHECK(builtin_route(f32(single(8, 1)), h200) == Route::split4);    // 8
  CHECK(builtin_route(f32(single(8, 4)), h200) == Route::split4);    // 32: 4 x 32 <= 132
  CHECK(builtin_route(f32(single(8, 5)), h200) == Route::split2);    // 40
  CHECK(builtin_route(f32(single(8, 16)), h200) == Route::split2);   // 128
  CHECK(builtin_route(f32(single(66, 2)), h200) == Route::split2);   // 132
  CHECK(builtin_route(f32(single(8, 17)), h200) == Route::rowcta);   // 136
  CHECK(builtin_route(f32(single(16, 1)), small) == Route::split4);  // 4 x 16 <= 64 on a 64-SM part
  CHECK(builtin_route(f32(single(16, 2)), small) == Route::split2);  // the same heads, fewer SMs
  CHECK(builtin_route(f32(single(8, 8)), h200) == Route::split2);
  CHECK(builtin_route(f32(single(8, 9)), small) == Route::rowcta);   // 72 > 64
  CHECK(builtin_route(f32(single(8, 34)), h200) == Route::rowcta);   // 272: no stream band for f32
  CHECK(builtin_route(f32(single(8, 66)), h200) == Route::rowcta);
  CHECK(builtin_route(f32(single(64, 16)), h200) == Route::rowcta);
  CHECK(builtin_route(f32(single(64, 512)), h200) == Route::rowcta);
  // Single bf16: split4 while 8 x R x H <= SMs, split2 while 2 x R x H <= SMs,
  // rowcta up to stream's grid (two CTAs per SM), stream beyond.
  CHECK(builtin_route(single(8, 1), h200) == Route::split4);    // 8
  CHECK(builtin_route(single(8, 2), h200) == Route::split4);    // 16: 128 <= 132
  CHECK(builtin_route(single(8, 3), h200) == Route::split2);    // 24
  CHECK(builtin_route(single(8, 8), h200) == Route::split2);    // 64: 128 <= 132
  CHECK(builtin_route(single(8, 9), h200) == Route::rowcta);    // 72
  CHECK(builtin_route(single(8, 2), small) == Route::split2);   // 16: 128 > 64
  CHECK(builtin_route(single(8, 33), h200) == Route::rowcta);   // 264 = 2 x 132
  CHECK(builtin_route(single(8, 34), h200) == Route::stream);   // 272
  CHECK(builtin_route(single(8, 34), {Arch::sm_90, 148}) == Route::rowcta);
  CHECK(builtin_route(single(64, 8), h200) == Route::stream);
  CHECK(builtin_route(single(8, 1, IndicesMode::repeated_positive), h200) == Route::sequential);
  CHECK(builtin_route(single(64, 512, IndicesMode::repeated_positive), h200) == Route::sequential);
  // Packed, f32: split4 while 4 x N x H <= SMs, split2 while 2 x N x H <= SMs
  // at T <= 4; then (T <= 7) rowcta up to stream's grid, stream up to twice
  // it, rowcta beyond; at T = 8 stream.
  auto with = [](CallShape c, StateDtype st, int t) {
    c.family.state = st;
    c.family.tokens = t;
    return c;
  };
  CHECK(builtin_route(packed(8, 4), h200) == Route::split4);   // 32 sequence-heads: 128 CTAs
  CHECK(builtin_route(packed(8, 5), h200) == Route::split2);   // 40
  CHECK(builtin_route(packed(64, 1), h200) == Route::split2);  // 64
  CHECK(builtin_route(packed(66, 1), h200) == Route::split2);  // 2 x 66 <= 132
  CHECK(builtin_route(packed(67, 1), h200) == Route::rowcta);
  CHECK(builtin_route(packed(64, 2), h200) == Route::rowcta);   // 128
  CHECK(builtin_route(packed(8, 33), h200) == Route::rowcta);   // 264
  CHECK(builtin_route(packed(8, 34), h200) == Route::stream);   // 272
  CHECK(builtin_route(packed(8, 66), h200) == Route::stream);   // 528 = 2 x 264
  CHECK(builtin_route(packed(8, 67), h200) == Route::rowcta);   // 536
  CHECK(builtin_route(packed(64, 16), h200) == Route::rowcta);  // 1024
  CHECK(builtin_route(packed(8, 67), {Arch::sm_90, 148}) == Route::stream);  // 536 <= 592
  CHECK(builtin_route(with(packed(64, 2), StateDtype::f32, 8), h200) == Route::stream);    // T = 8: 128
  CHECK(builtin_route(with(packed(64, 128), StateDtype::f32, 8), h200) == Route::stream);  // T = 8: 8192
  CHECK(builtin_route(with(packed(32, 2), StateDtype::f32, 2), h200) == Route::split2);
  CHECK(builtin_route(with(packed(32, 2), StateDtype::f32, 8), h200) == Route::stream);  // T = 8: no split2
  CHECK(builtin_route(with(packed(32, 1), StateDtype::f32, 8), h200) == Route::split4);
  CHECK(builtin_route(packed(8, 4), {Arch::sm_90, 148}) == Route::split4);
  CHECK(builtin_route(packed(8, 4), {Arch::sm_90, 64}) == Route::split2);  // the device's SM count decides
  CHECK(builtin_route(with(packed(64, 8), StateDtype::f32, 9), h200) == Route::rowcta);  // stream, split: T <= 8
  CHECK(builtin_route(with(packed(8, 1), StateDtype::f32, 9), h200) == Route::rowcta);
  // bf16: split4 while 8 x N x H <= SMs, split2 while 2 x N x H <= SMs at
  // T <= 4, no split at T = 8; then T <= 2: stream past its grid; T = 3..7:
  // stream past eight times it; T = 8: stream; else rowcta.
  CHECK(builtin_route(with(packed(16, 1), StateDtype::bf16, 4), h200) == Route::split4);  // 16
  CHECK(builtin_route(with(packed(16, 2), StateDtype::bf16, 4), h200) == Route::split2);  // 32
  CHECK(builtin_route(with(packed(16, 2), StateDtype::bf16, 2), h200) == Route::split2);  // 32 at T = 2
  CHECK(builtin_route(with(packed(16, 4), StateDtype::bf16, 2), h200) == Route::split2);  // 64 at T = 2
  CHECK(builtin_route(with(packed(16, 5), StateDtype::bf16, 2), h200) == Route::rowcta);  // 80 at T = 2
  CHECK(builtin_route(with(packed(16, 4), StateDtype::bf16, 6), h200) == Route::rowcta);  // T = 6: no split2
  CHECK(builtin_route(with(packed(16, 1), StateDtype::bf16, 6), h200) == Route::split4);  // T = 6: 16
  CHECK(builtin_route(with(packed(8, 33), StateDtype::bf16, 2), h200) == Route::rowcta);  // 264 at T = 2
  CHECK(builtin_route(with(packed(8, 34), StateDtype::bf16, 2), h200) == Route::stream);  // 272 at T = 2
  CHECK(builtin_route(with(packed(8, 2), StateDtype::bf16, 8), h200) == Route::stream);   // T = 8: 16, no split
  CHECK(builtin_route(with(packed(16, 1), StateDtype::bf16, 8), h200) == Route::stream);  // 16 at T = 8
  CHECK(builtin_route(with(packed(8, 4), StateDtype::bf16, 8), h200) == Route::stream);   // T = 8: 32
  CHECK(builtin_route(with(packed(64, 8), StateDtype::bf16, 2), h200) == Route::stream);   // 512 sequence-heads
  CHECK(builtin_route(with(packed(16, 8), StateDtype::bf16, 1), h200) == Route::rowcta);   // T = 1: 128 <= 264
  CHECK(builtin_route(with(packed(64, 8), StateDtype::bf16, 1), h200) == Route::stream);   // 512 > 264
  CHECK(builtin_route(with(packed(8, 34), StateDtype::bf16, 3), h200) == Route::rowcta);   // 272 at T = 3
  CHECK(builtin_route(with(packed(8, 264), StateDtype::bf16, 3), h200) == Route::rowcta);  // 2112 = 8 x 264
  CHECK(builtin_route(with(packed(8, 265), StateDtype::bf16, 3), h200) == Route::stream);  // 2120
  CHECK(builtin_route(with(packed(64, 32), StateDtype::bf16, 4), h200) == Route::rowcta);  // 2048
  CHECK(builtin_route(with(packed(16, 32), StateDtype::bf16, 6), h200) == Route::rowcta);  // 512 at T = 6
  CHECK(builtin_route(with(packed(64, 128), StateDtype::bf16, 7), h200) == Route::stream);  // 8192 at T = 7
  CHECK(builtin_route(with(packed(64, 128), StateDtype::bf16, 4), h200) == Route::stream);  // 8192
  CHECK(builtin_route(with(packed(64, 128), StateDtype::bf16, 8), h200) == Route::stream);  // T = 8
}

TEST_CASE("select: the selected route is always eligible and serves the op", "[select]") {
  for (int sms : {1, 16, 132, 148, 1000})
    for (int heads : {1, 8, 64, 128})
      for (int64_t rows : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{64}, int64_t{4096}})
        for (auto mode : {IndicesMode::unique_or_null, IndicesMode::positive_unique, IndicesMode::repeated_positive}) {
          const DeviceTraits d{Arch::sm_90, sms};
          const CallShape c = single(heads, rows, mode);
          auto r = select_route(c, d, {});
          REQUIRE(r.ok());
          INFO(to_string(*r) << " sms " << sms << " heads " << heads << " rows " << rows);
          CHECK(route_spec(*r).serves(Op::single));
          CHECK(route_spec(*r).eligible(c, d));
          for (int t : {1, 2, 4, 8, 9, 16})
            for (auto st : {StateDtype::f32, StateDtype::bf16}) {
              CallShape pc = packed(heads, rows);
              pc.family.tokens = t;
              pc.family.state = st;
              pc.rows = rows * t;
              auto pr = select_route(pc, d, {});
              REQUIRE(pr.ok());
              INFO("packed T " << t << " " << to_string(st) << ": " << to_string(*pr));
              CHECK(route_spec(*pr).serves(Op::packed));
              CHECK(route_spec(*pr).eligible(pc, d));
            }
        }
}

TEST_CASE("select: a forced route is used, or refused with the reason", "[select]") {
  const DeviceTraits d{Arch::sm_90, 132};
  RoutePolicy p;
  p.forced = Route::split2;
  auto r = select_route(single(64, 512), d, p);
  REQUIRE(r.ok());
  CHECK(*r == Route::split2);
  auto bad = select_route(single(8, 4, IndicesMode::repeated_positive), d, p);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code == ErrorCode::unsupported);
  CHECK(bad.error().message.find("split2 cannot run this call exactly") != std::string::npos);
  p.forced = Route::sequential;
  auto op = select_route(packed(8, 2), d, p);
  REQUIRE_FALSE(op.ok());
  CHECK(op.error().message.find("sequential does not serve the packed op") != std::string::npos);
}

TEST_CASE("select: a tuned route wins where eligible", "[select]") {
  const DeviceTraits d{Arch::sm_90, 132};
  TuneTable t(TuneIdentity{"NVIDIA H200", 132, 13000, "13.0", "0.1.0", Arch::sm_90});
  t.add(single(64, 1).family, {1, Route::split2, 5.0});
  t.add(single(64, 1).family, {32, Route::rowcta, 20.0});
  // The runtime hands the selector the table's route for the call.
  auto select = [&](const CallShape& c) { return select_route(c, d, RoutePolicy{std::nullopt, t.route_for(c)}); };
  CHECK(*select(single(64, 1)) == Route::split2);
  CHECK(*select(single(64, 31)) == Route::split2);
  CHECK(*select(single(64, 32)) == Route::rowcta);
  CHECK(*select(single(64, 5000)) == Route::rowcta);
  // Repeated slots: the tuned split2 is not eligible, the built-in sequential runs.
  CHECK(*select(single(64, 1, IndicesMode::repeated_positive)) == Route::sequential);
  // Another family: the built-in bands.
  CHECK(*select(single(8, 1)) == builtin_route(single(8, 1), d));
}

TEST_CASE("tune table: saved atomically, loaded back, identity checked", "[select][tune]") {
  const std::string root = (std::filesystem::temp_directory_path() / ("kdajit-tune-" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(root);
  const TuneIdentity id{"NVIDIA H200", 132, 13000, "13.0", "0.1.0", Arch::sm_90};
  TuneTable t(id);
  t.add(single(16, 1).family, {1, Route::split4, 6.5});
  t.add(single(16, 1).family, {8, Route::rowcta, 9.0});
  t.add(packed(16, 1).family, {1, Route::rowcta, 12.0});
  CHECK_FALSE(TuneTable::present(root, id));
  REQUIRE(t.save(root).ok());
  const std::string path = TuneTable::path_for(root, id);
  // Found without the NVRTC version (the path does not depend on it).
  TuneIdentity no_nvrtc = id;
  no_nvrtc.nvrtc_version.clear();
  CHECK(TuneTable::present(root, no_nvrtc));
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  auto loaded = TuneTable::load(root, id);
  REQUIRE(loaded.ok());
  REQUIRE(loaded->has_value());
  CHECK((*loaded)->families() == 2);
  CHECK((*loaded)->route_for(single(16, 1)) == Route::split4);
  CHECK((*loaded)->route_for(single(16, 100)) == Route::rowcta);
  CHECK((*loaded)->to_json() == t.to_json());

  // Another driver (same GPU, same file): the table does not apply, and the error says why.
  TuneIdentity other = id;
  other.driver_version = 13010;
  auto mismatch = TuneTable::load(root, other);
  REQUIRE_FALSE(mismatch.ok());
  CHECK(mismatch.error().message.find("does not match this process") != std::string::npos);
  CHECK(mismatch.error().message.find("13010") != std::string::npos);
  // Another GPU: another file, so no table at all.
  other = id;
  other.sm_count = 114;
  auto none = TuneTable::load(root, other);
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());
  // The same file claiming another identity is refused.
  {
    nlohmann::json j = t.to_json();
    j["identity"]["nvrtc_version"] = "12.8";
    std::ofstream(path) << j.dump();
  }
  auto forged = TuneTable::load(root, id);
  REQUIRE_FALSE(forged.ok());
  CHECK(forged.error().message.find("does not match this process") != std::string::npos);
  // Junk and a symbolic link are refused, not followed.
  std::ofstream(path) << "{not json";
  CHECK_FALSE(TuneTable::load(root, id).ok());
  std::filesystem::remove(path);
  std::filesystem::create_symlink("/etc/hostname", path);
  CHECK_FALSE(TuneTable::load(root, id).ok());
  // A save replaces the link instead of writing through it.
  REQUIRE(t.save(root).ok());
  CHECK_FALSE(std::filesystem::is_symlink(path));
  // A route that does not serve the family's op is refused.
  nlohmann::json j = t.to_json();
  j["families"][0]["bands"][0]["route"] = "sequential";
  for (auto& fam : j["families"])
    if (fam["family"]["op"] == "packed") fam["bands"][0]["route"] = "sequential";
  CHECK_FALSE(TuneTable::from_json(j).ok());
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace kdajit
