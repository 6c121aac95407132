// The kernel key: presets, name and JSON round trips, digests, validation errors.
#include <algorithm>
#include <set>
#include <string>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "kdajit/kernel_key.hpp"
#include "kdajit/presets.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/sha256.hpp"

using namespace kdajit;

namespace {

constexpr Arch kArchs[] = {Arch::sm_90, Arch::sm_90a, Arch::sm_100a, Arch::sm_103a, Arch::sm_120a};

std::vector<KernelKey> keys_of(std::string_view preset, Arch arch) {
  auto keys = preset_keys(preset, arch);
  INFO((keys ? std::string() : keys.error().message));
  REQUIRE(keys.ok());
  return *keys;
}

// The error message of a failed Result / Status, or "" (and a failed check) if it succeeded.
template <class R>
std::string error_of(const R& r) {
  CHECK_FALSE(r.ok());
  return r.ok() ? std::string() : r.error().message;
}

bool contains(const std::string& s, std::string_view needle) { return s.find(needle) != std::string::npos; }

// The routes of an op that the presets list: every route that serves it but
// the ones forced only for it (the chunked ops': rowcta, the splits, rowcta16).
size_t preset_routes(Op op) {
  size_t n = 0;
  for (std::string_view name : route_names(op)) n += forced_only(*parse_field<Route>(name), op) ? 0 : 1;
  return n;
}
// Families x the routes that serve each op; every preset has one prefill
// family per single-op family (the same heads, dtypes, layouts and gates).
size_t preset_size(size_t single_families, size_t packed_families) {
  return single_families * preset_routes(Op::single) + packed_families * preset_routes(Op::packed) +
         single_families * preset_routes(Op::prefill);
}

TEST_CASE("kernel key: preset sizes", "[kernel_key]") {
  // glm/kimi: 4 heads x 2 dtypes x 2 layouts, single + packed T 2..4 + prefill; full: 10 heads x 2 x 2 x 2
  // gates, single + T 1..8 + prefill.
  CHECK(keys_of("glm-5.3-flash", Arch::sm_90).size() == preset_size(16, 48));
  CHECK(keys_of("kimi-k3", Arch::sm_90).size() == preset_size(16, 48));
  CHECK(keys_of("full", Arch::sm_90a).size() == preset_size(80, 640));
  const auto names = preset_names();
  CHECK(names.size() == 3);
  CHECK(std::find(names.begin(), names.end(), "glm-5.3-flash") != names.end());
  // The preset's arch is stamped on every key.
  for (Arch a : kArchs)
    for (const KernelKey& k : keys_of("kimi-k3", a)) REQUIRE(k.arch == a);
  // sm_120a offers a block 99 KiB of shared memory, the prefill kernel needs 227:
  // its presets have the decode keys only.
  const auto consumer = keys_of("glm-5.3-flash", Arch::sm_120a);
  CHECK(consumer.size() == keys_of("glm-5.3-flash", Arch::sm_90).size() - 16 * preset_routes(Op::prefill));
  for (const KernelKey& k : consumer) CHECK(k.op != Op::prefill);
}

TEST_CASE("kernel key: a launch that needs more shared memory than the arch offers is unsupported", "[kernel_key]") {
  KernelKey k{Op::prefill, 16, StateDtype::f32, ConvLayout::sd, kPrefillChunk, Gate::bounded, Route::rowcta,
              Arch::sm_120a};
  const Status st = validate(k);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().code == ErrorCode::unsupported);
  CHECK(st.error().message ==
        "kernel key field 'arch': op prefill needs 227 KiB of shared memory per block, sm_120a offers 99 KiB");
  for (Arch a : {Arch::sm_90, Arch::sm_90a, Arch::sm_100a, Arch::sm_103a}) {
    k.arch = a;
    CHECK(validate(k).ok());
  }
  // Decode keys fit every arch (route stream's stages: 64 KiB).
  for (const KernelKey& d : keys_of("full", Arch::sm_120a)) CHECK(validate(d).ok());
}

TEST_CASE("kernel key: every preset key round-trips through its name and JSON", "[kernel_key]") {
  size_t checked = 0;
  for (std::string_view preset : preset_names())
    for (Arch arch : kArchs) {
      const auto keys = keys_of(preset, arch);
      std::set<KernelKey> unique(keys.begin(), keys.end());
      CHECK(unique.size() == keys.size());  // no duplicates within a preset
      for (const KernelKey& k : keys) {
        INFO(key_name(k));
        REQUIRE(validate(k).ok());
        const std::string name = key_name(k);
        auto back = parse_key(name);
        REQUIRE(back.ok());
        REQUIRE(*back == k);
        REQUIRE(key_name(*back) == name);
        // JSON: in memory and through text.
        const nlohmann::json j = key_to_json(k);
        auto from_j = key_from_json(nlohmann::json::parse(j.dump()));
        REQUIRE(from_j.ok());
        REQUIRE(*from_j == k);
        REQUIRE(key_to_json(*from_j) == j);
        REQUIRE(KernelKeyHash{}(*back) == KernelKeyHash{}(k));
        ++checked;
      }
    }
  // Every arch but sm_120a, whose blocks lack the prefill kernel's shared memory.
  const size_t prefill_keys = (2 * 16 + 80) * preset_routes(Op::prefill);
  CHECK(checked == (2 * preset_size(16, 48) + preset_size(80, 640)) * 5 - prefill_keys);
}

TEST_CASE("kernel key: name digests are stable and distinct", "[kernel_key]") {
  // Known answers: FIPS 180-2 "abc", and a key name hashed with coreutils sha256sum.
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  auto k = parse_key("kda_single.h64.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90");
  REQUIRE(k.ok());
  CHECK(sha256_hex(key_name(*k)) == "bf71df38e724e068afd2346707abb34ce7fdc2ad079f2323071525f5ebe75055");
  auto k2 = parse_key("kda_packed.h16.state_bf16.conv_ds.t4.gate_bounded.route_rowcta.sm_90a");
  REQUIRE(k2.ok());
  CHECK(sha256_hex(key_name(*k2)) == "fe876dc59a6549f3f0cff8a841cbb55509dc007c48f57c497120e6e66f1c917a");

  std::unordered_set<std::string> digests;
  size_t n = 0;
  for (Arch arch : kArchs)
    for (const KernelKey& key : keys_of("full", arch)) {
      const std::string d = sha256_hex(key_name(key));
      REQUIRE(d.size() == 64);
      REQUIRE(d.find_first_not_of("0123456789abcdef") == std::string::npos);
      REQUIRE(d == sha256_hex(key_name(key)));                  // recomputed
      REQUIRE(d == sha256_hex(key_name(key)));        // the digest of the canonical name
      digests.insert(d);
      ++n;
    }
  CHECK(digests.size() == n);  // every key differs
  // Keys that differ in one field differ in digest.
  KernelKey a{}, b{};
  b.arch = Arch::sm_90a;
  CHECK(sha256_hex(key_name(a)) != sha256_hex(key_name(b)));
}

TEST_CASE("kernel key: validation errors name the field and the allowed values", "[kernel_key]") {
  KernelKey k{};
  k.heads = 0;
  std::string m = error_of(validate(k));
  CHECK(contains(m, "'heads'"));
  CHECK(contains(m, "1..128"));
  CHECK(contains(m, "got 0"));
  k.heads = 129;
  m = error_of(validate(k));
  CHECK(contains(m, "'heads'"));
  CHECK(contains(m, "got 129"));

  k = {};
  k.tokens = 2;  // single with T > 1
  m = error_of(validate(k));
  CHECK(contains(m, "'t'"));
  CHECK(contains(m, "expected 1 for op single"));

  k = {};
  k.op = Op::packed;
  k.tokens = 17;
  m = error_of(validate(k));
  CHECK(contains(m, "'t'"));
  CHECK(contains(m, "1..16"));
  CHECK(contains(m, "got 17"));

  k = {};
  k.op = Op::prefill;
  k.tokens = 16;  // prefill keys carry the chunk size
  m = error_of(validate(k));
  CHECK(contains(m, "'t'"));
  CHECK(contains(m, "expected 64 (the chunk size) for op prefill"));
  CHECK(contains(m, "got 16"));
  k.tokens = kPrefillChunk;
  CHECK(validate(k).ok());
  k.op = Op::packed;  // the packed op's T stays 1..16 although the field's range is 1..64
  m = error_of(validate(k));
  CHECK(contains(m, "'t'"));
  CHECK(contains(m, "1..16 for op packed"));
  CHECK(contains(m, "got 64"));
  m = error_of(parse_key("kda_prefill.h16.state_f32.conv_sd.t32.gate_bounded.route_rowcta.sm_90"));
  CHECK(contains(m, "expected 64 (the chunk size) for op prefill"));
  m = error_of(parse_key("kda_prefill.h16.state_f32.conv_sd.t65.gate_bounded.route_rowcta.sm_90"));
  CHECK(contains(m, "'t'"));
  CHECK(contains(m, "1..64"));
  m = error_of(parse_key("kda_prefill.h16.state_f32.conv_sd.t64.gate_bounded.route_stream.sm_90"));
  CHECK(contains(m, "'route'"));
  CHECK(contains(m, "route stream does not serve op prefill"));
  CHECK(contains(m, "rowcta|split2|split4|split8|twopass"));
  m = error_of(parse_key("kda_single.h16.state_f32.conv_sd.t1.gate_bounded.route_split8.sm_90"));
  CHECK(contains(m, "route split8 does not serve op single"));

  m = error_of(parse_key("kda_single.h64.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_89"));
  CHECK(contains(m, "'arch'"));
  CHECK(contains(m, "sm_90|sm_90a|sm_100a|sm_103a|sm_120a"));
  CHECK(contains(m, "'sm_89'"));
  m = error_of(parse_arch("hopper"));
  CHECK(contains(m, "'arch'"));

  m = error_of(parse_key("kda_single.h64.state_f16.conv_sd.t1.gate_bounded.route_rowcta.sm_90"));
  CHECK(contains(m, "'state'"));
  CHECK(contains(m, "f32|bf16"));
  m = error_of(parse_key("kda_packed.h64.state_f32.conv_sd.t1.gate_sigmoid.route_rowcta.sm_90"));
  CHECK(contains(m, "'gate'"));
  CHECK(contains(m, "bounded|softplus"));
  m = error_of(parse_key("kda_single.h64.state_f32.conv_sd.t3.gate_bounded.route_rowcta.sm_90"));
  CHECK(contains(m, "expected 1 for op single"));
  m = error_of(parse_key("kda_packed.h8.state_f32.conv_sd.t17.gate_bounded.route_rowcta.sm_90"));
  CHECK(contains(m, "'t'"));
  CHECK(contains(m, "1..16"));
}

TEST_CASE("kernel key: prefill keys parse, print and round-trip through JSON", "[kernel_key]") {
  const std::string name = "kda_prefill.h16.state_f32.conv_sd.t64.gate_bounded.route_rowcta.sm_90";
  auto k = parse_key(name);
  REQUIRE(k.ok());
  CHECK(k->op == Op::prefill);
  CHECK(k->heads == 16);
  CHECK(k->tokens == kPrefillChunk);
  CHECK(key_name(*k) == name);
  CHECK(to_string(Op::prefill) == "prefill");
  CHECK(parse_field<Op>("prefill").value() == Op::prefill);
  for (std::string_view route : {"rowcta", "split2", "split4", "split8"}) {
    const std::string n = "kda_prefill.h128.state_bf16.conv_ds.t64.gate_softplus.route_" + std::string(route) + ".sm_100a";
    auto p = parse_key(n);
    INFO(n);
    REQUIRE(p.ok());
    CHECK(key_name(*p) == n);
    auto j = key_from_json(key_to_json(*p));
    REQUIRE(j.ok());
    CHECK(*j == *p);
  }
  CHECK(contains(key_name_shape(), "kda_<single|packed|prefill|chunk>"));
  CHECK(contains(key_name_shape(), "t<1..64>"));
  // The hash keeps t = 64 apart from the other fields.
  KernelKey a = *k, b = *k;
  b.op = Op::packed;
  b.tokens = 16;
  CHECK(KernelKeyHash{}(a) != KernelKeyHash{}(b));
}

TEST_CASE("kernel key: chunk keys carry conv sd and t 64, and serve the prefill routes", "[kernel_key][chunk]") {
  const std::string name = "kda_chunk.h32.state_bf16.conv_sd.t64.gate_softplus.route_split4.sm_90a";
  auto k = parse_key(name);
  REQUIRE(k.ok());
  CHECK(k->op == Op::chunk);
  CHECK(key_name(*k) == name);
  auto j = key_from_json(key_to_json(*k));
  REQUIRE(j.ok());
  CHECK(*j == *k);
  CHECK(chunked(Op::chunk));
  CHECK(chunked(Op::prefill));
  CHECK_FALSE(chunked(Op::packed));
  CHECK(route_names(Op::chunk) == route_names(Op::prefill));
  CHECK(route_spec(Route::split8).template_file(Op::chunk) == route_spec(Route::split8).template_file(Op::prefill));
  CHECK(contains(error_of(parse_key("kda_chunk.h32.state_f32.conv_ds.t64.gate_bounded.route_rowcta.sm_90")),
                 "kernel key field 'conv': expected sd for op chunk (it has no conv), got ds"));
  CHECK(contains(error_of(parse_key("kda_chunk.h32.state_f32.conv_sd.t4.gate_bounded.route_rowcta.sm_90")),
                 "expected 64 (the chunk size) for op chunk on route rowcta, got 4"));
  // Routes rowcta16's and pipe16's keys carry chunks of 16, and only they do.
  CHECK(parse_key("kda_chunk.h32.state_f32.conv_sd.t16.gate_bounded.route_rowcta16.sm_90").ok());
  CHECK(parse_key("kda_prefill.h32.state_bf16.conv_ds.t16.gate_softplus.route_pipe16.sm_90").ok());
  CHECK(contains(error_of(parse_key("kda_chunk.h32.state_f32.conv_sd.t64.gate_bounded.route_pipe16.sm_90")),
                 "expected 16 (the chunk size) for op chunk on route pipe16, got 64"));
  CHECK(contains(error_of(parse_key("kda_prefill.h32.state_f32.conv_sd.t64.gate_bounded.route_rowcta16.sm_90")),
                 "expected 16 (the chunk size) for op prefill on route rowcta16, got 64"));
  CHECK(contains(error_of(parse_key("kda_prefill.h32.state_f32.conv_sd.t16.gate_bounded.route_split2.sm_90")),
                 "expected 64 (the chunk size) for op prefill on route split2, got 16"));
  CHECK(contains(error_of(parse_key("kda_chunk.h32.state_f32.conv_sd.t64.gate_bounded.route_stream.sm_90")),
                 "route stream does not serve op chunk"));
  // The chunk op's shared memory is the prefill's: not on sm_120a.
  auto consumer = parse_key("kda_chunk.h32.state_f32.conv_sd.t64.gate_bounded.route_rowcta.sm_120a");
  REQUIRE_FALSE(consumer.ok());
  CHECK(consumer.error().code == ErrorCode::unsupported);
}

TEST_CASE("kernel key: bad name shapes are errors that show the expected shape", "[kernel_key]") {
  for (const char* bad : {"", "kda_single.h64", "kda_single.h64.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90.extra"}) {
    const std::string m = error_of(parse_key(bad));
    INFO(bad << " -> " << m);
    CHECK(contains(m, "expected 8 dot-separated fields"));
    CHECK(contains(m, "kda_<single|packed|prefill|chunk>"));
  }
  std::string m = error_of(parse_key("kdb_single.h64.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90"));
  CHECK(contains(m, "'op'"));
  CHECK(contains(m, "'kda_'"));
  m = error_of(parse_key("kda_single.heads64.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90"));
  CHECK(contains(m, "'heads'"));
  m = error_of(parse_key("kda_single.h64x.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90"));
  CHECK(contains(m, "'heads'"));
  CHECK(contains(m, "'64x'"));
  m = error_of(parse_key("kda_single.h64.conv_sd.state_f32.t1.gate_bounded.route_rowcta.sm_90"));  // fields swapped
  CHECK(contains(m, "'state'"));
  m = error_of(parse_key("kda_packed.h64.state_f32.conv_sd.t.gate_bounded.route_rowcta.sm_90"));
  CHECK(contains(m, "'t'"));
  m = error_of(parse_key("kda_single.h64.state_f32.conv_xy.t1.gate_bounded.route_rowcta.sm_90"));
  CHECK(contains(m, "'conv'"));
  CHECK(contains(m, "sd|ds"));
  m = error_of(parse_key("kda_single.h64.state_f32.conv_sd.t1.gate_bounded.route_split.sm_90"));
  CHECK(contains(m, "'route'"));
  CHECK(contains(m, "rowcta"));
}

TEST_CASE("kernel key: strict JSON", "[kernel_key]") {
  const nlohmann::json good = key_to_json(KernelKey{});
  nlohmann::json j = good;
  j["colour"] = "blue";
  std::string m = error_of(key_from_json(j));
  CHECK(contains(m, "unknown field 'colour'"));
  CHECK(contains(m, "op, heads, state, conv, t, gate, route, arch"));

  j = good;
  j.erase("gate");
  m = error_of(key_from_json(j));
  CHECK(contains(m, "'gate'"));
  CHECK(contains(m, "missing"));

  j = good;
  j["heads"] = "64";
  m = error_of(key_from_json(j));
  CHECK(contains(m, "'heads'"));
  CHECK(contains(m, "1..128"));
  j["heads"] = 129;
  CHECK(contains(error_of(key_from_json(j)), "got 129"));
  j["heads"] = 1.5;
  CHECK(contains(error_of(key_from_json(j)), "'heads'"));

  j = good;
  j["arch"] = "sm_89";
  m = error_of(key_from_json(j));
  CHECK(contains(m, "'arch'"));
  CHECK(contains(m, "sm_90|sm_90a"));

  j = good;
  j["state"] = 1;
  CHECK(contains(error_of(key_from_json(j)), "'state': expected a string"));

  j = good;
  j["t"] = 4;  // single with T = 4
  CHECK(contains(error_of(key_from_json(j)), "expected 1 for op single"));

  CHECK(contains(error_of(key_from_json(nlohmann::json::array())), "expected a JSON object"));
}

TEST_CASE("kernel key: unknown preset lists the presets", "[kernel_key]") {
  const std::string m = error_of(preset_keys("llama", Arch::sm_90));
  CHECK(contains(m, "preset"));
  CHECK(contains(m, "glm-5.3-flash|kimi-k3|full"));
  CHECK(contains(m, "'llama'"));
}

}  // namespace
