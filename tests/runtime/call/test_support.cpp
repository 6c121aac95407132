// The static support query and the configuration -> key questions: they run
// validation itself on a synthetic call, so they agree with it over the whole
// kernel key space by construction; the sweep below proves it.
#include <array>
#include <set>
#include <string>

#include <fmt/format.h>

#include "catch.hpp"
#include "decode_args_builder.hpp"
#include "kdajit/presets.hpp"
#include "kdajit/runtime/jit/compile.hpp"
#include "kdajit/runtime/call/support.hpp"
#include "kdajit/runtime/call/validate.hpp"

using kdajit::test::build_args;
using kdajit::test::CallConfig;

namespace kdajit {
namespace {

constexpr std::array<const char*, 5> kArchNames = {"sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a"};

kdajit_config_t good_config() {
  kdajit_config_t c = default_config();
  c.heads = 16;
  c.arch = "sm_90";
  c.device = 0;
  return c;
}

// The C config of one key family (arch, device, mode and SM count at their defaults).
kdajit_config_t config_of(Op op, int heads, StateDtype state, ConvLayout conv, int tokens, Gate gate) {
  kdajit_config_t c = default_config();
  c.op = static_cast<kdajit_op_t>(op);
  c.heads = heads;
  c.state_dtype = state == StateDtype::f32 ? KDAJIT_DTYPE_F32 : KDAJIT_DTYPE_BF16;
  c.conv_layout = conv == ConvLayout::sd ? KDAJIT_CONV_SD : KDAJIT_CONV_DS;
  c.tokens = tokens;
  c.gate = gate == Gate::bounded ? KDAJIT_GATE_BOUNDED : KDAJIT_GATE_SOFTPLUS;
  return c;
}

void check_rejects(const kdajit_config_t& c, ErrorCode code, const std::string& part) {
  Status s = query_support(c);
  REQUIRE_FALSE(s.ok());
  INFO("message: " << s.error().message);
  CHECK(s.error().code == code);
  CHECK(s.error().message.find(part) != std::string::npos);
}

TEST_CASE("support: a Hopper target is always served", "[support]") {
  CHECK(check_arch_target(Arch::sm_90).ok());
  CHECK(check_arch_target(Arch::sm_90a).ok());
  Status s = query_support(good_config());
  INFO((s.ok() ? std::string() : s.error().message));
  CHECK(s.ok());
}

TEST_CASE("support: each configuration field is checked and named", "[support]") {
  auto c = good_config();
  c.op = static_cast<kdajit_op_t>(7);
  check_rejects(c, ErrorCode::invalid_argument, "op: expected single|packed|prefill|chunk, got 7");

  c = good_config();
  // Heads and tokens are judged by validation itself, which names the tensor that carries them.
  c.heads = 0;
  check_rejects(c, ErrorCode::invalid_argument, "A_log: expected shape [H] with H (heads) in 1..128, got [0]");
  c.heads = -3;
  check_rejects(c, ErrorCode::invalid_argument, "A_log: expected shape [H] with H (heads) in 1..128, got [-3]");
  c.heads = 129;
  check_rejects(c, ErrorCode::unsupported, "A_log: expected shape [H] with H (heads) in 1..128 (the heads this build serves), got [129]");

  c = good_config();
  c.state_dtype = KDAJIT_DTYPE_INT32;
  check_rejects(c, ErrorCode::invalid_argument, "state_dtype: expected f32 or bf16, got int32");
  c.state_dtype = static_cast<kdajit_dtype_t>(11);
  check_rejects(c, ErrorCode::invalid_argument, "state_dtype: expected f32 or bf16, got dtype(11)");

  c = good_config();
  c.conv_layout = static_cast<kdajit_conv_layout_t>(2);
  check_rejects(c, ErrorCode::invalid_argument, "conv_layout: expected sd|ds, got 2");

  c = good_config();
  c.tokens = 2;
  check_rejects(c, ErrorCode::invalid_argument, "tokens: expected T = 1 for the single op, got 2");
  c.op = KDAJIT_OP_PACKED;
  c.tokens = 0;
  check_rejects(c, ErrorCode::invalid_argument, "state_indices: expected shape [N, T] with T (tokens) in 1..16, got [1, 0]");
  c.tokens = 17;
  check_rejects(c, ErrorCode::unsupported, "state_indices: expected shape [N, T] with T (tokens) in 1..16 (the tokens this build serves), got [1, 17]");

  c = good_config();
  c.sm_count = -1;
  check_rejects(c, ErrorCode::invalid_argument, "sm_count: expected 0 (the device's) or > 0, got -1");
  c = good_config();
  c.state_indices_mode = static_cast<kdajit_indices_mode_t>(3);
  check_rejects(c, ErrorCode::invalid_argument, "state_indices_mode: expected unique_or_null|positive_unique|repeated_positive, got 3");
  c.op = KDAJIT_OP_PACKED;
  c.tokens = 2;
  c.state_indices_mode = KDAJIT_INDICES_REPEATED_POSITIVE;
  check_rejects(c, ErrorCode::invalid_argument, "for the packed op");

  c = good_config();
  c.gate = static_cast<kdajit_gate_t>(4);
  check_rejects(c, ErrorCode::invalid_argument, "gate: expected bounded|softplus, got 4");

  c = good_config();
  c.arch = "sm_80";
  check_rejects(c, ErrorCode::unsupported,
                "arch: expected one of sm_90|sm_90a|sm_100a|sm_103a|sm_120a (the targets this build serves), got 'sm_80'");
  c.arch = "sm_100";  // only the arch-specific sm_100a is a target
  check_rejects(c, ErrorCode::unsupported, "got 'sm_100'");
  c.arch = "hopper";
  check_rejects(c, ErrorCode::invalid_argument, "arch: expected one of sm_90|sm_90a|sm_100a|sm_103a|sm_120a, got 'hopper'");
  c.arch = "";
  check_rejects(c, ErrorCode::invalid_argument, "got ''");
}

TEST_CASE("support: prefill where the arch lacks its shared memory is unsupported", "[support][prefill]") {
  auto c = good_config();
  c.op = KDAJIT_OP_PREFILL;
  c.tokens = kPrefillChunk;
  CHECK(query_support(c).ok());
  c.arch = "sm_120a";
  check_rejects(c, ErrorCode::unsupported, "op prefill needs 227 KiB of shared memory per block, sm_120a offers 99 KiB");
  c.op = KDAJIT_OP_SINGLE;
  c.tokens = 1;
  CHECK(query_support(c).ok());  // the decode ops fit
}

TEST_CASE("support: a NULL arch reads the device or says why it cannot", "[support]") {
  auto c = good_config();
  c.arch = nullptr;
  Status s = query_support(c);
  if (!s.ok()) {
    INFO("message: " << s.error().message);
    CHECK((s.error().code == ErrorCode::unsupported || s.error().code == ErrorCode::cuda));
    CHECK(s.error().message.rfind("arch: ", 0) == 0);
  }
}

TEST_CASE("support: the key a configuration gets, per rows and SM count", "[support]") {
  kdajit_config_t c = good_config();
  c.op = KDAJIT_OP_PACKED;
  c.heads = 7;
  c.state_dtype = KDAJIT_DTYPE_BF16;
  c.conv_layout = KDAJIT_CONV_DS;
  c.tokens = 3;
  c.gate = KDAJIT_GATE_SOFTPLUS;
  for (const char* name : kArchNames) {
    c.arch = name;
    auto k = config_key(c, 16);  // 112 sequence-heads: past the split on every arch's part
    REQUIRE(k.ok());
    CHECK(key_name(*k) == fmt::format("kda_packed.h7.state_bf16.conv_ds.t3.gate_softplus.route_rowcta.{}", name));
    CHECK(config_key(c, 5)->route == Route::split2);  // 35: 2 x 35 <= 132
  }
  // Single op: the split routes while rows x heads leave SMs idle; the SM count
  // is the configuration's, else the arch's reference part (132 for sm_90).
  c = good_config();  // f32 state
  c.heads = 8;
  CHECK(config_key(c, 1)->route == Route::split4);    // 8 rows x heads: 4 x 8 <= 132
  CHECK(config_key(c, 2)->route == Route::split4);    // 16
  CHECK(config_key(c, 8)->route == Route::split2);    // 64 <= 132
  CHECK(config_key(c, 17)->route == Route::rowcta);   // 136
  c.sm_count = 64;
  CHECK(config_key(c, 2)->route == Route::split4);    // 4 x 16 <= 64
  CHECK(config_key(c, 4)->route == Route::split2);    // 32 <= 64
  CHECK(config_key(c, 9)->route == Route::rowcta);    // 72
  c.sm_count = 0;
  c.state_dtype = KDAJIT_DTYPE_BF16;
  CHECK(config_key(c, 1)->route == Route::split4);    // 8 x 8 <= 132
  CHECK(config_key(c, 9)->route == Route::rowcta);    // 2 x 72 > 132
  c.state_indices_mode = KDAJIT_INDICES_REPEATED_POSITIVE;
  CHECK(config_key(c, 8)->route == Route::sequential);
  auto keys = config_keys(c);
  REQUIRE(keys.ok());
  REQUIRE(keys->size() == 1);
  CHECK((*keys)[0].route == Route::sequential);
  CHECK_FALSE(config_key(c, 0).ok());
}

TEST_CASE("support: N x T rows past int64 is an error naming rows, not a negative shape", "[support]") {
  kdajit_config_t c = good_config();
  c.op = KDAJIT_OP_PACKED;
  c.conv_layout = KDAJIT_CONV_DS;
  c.tokens = 16;
  auto k = config_key(c, INT64_MAX);
  REQUIRE_FALSE(k.ok());
  INFO(k.error().message);
  CHECK(k.error().code == ErrorCode::invalid_argument);
  CHECK(k.error().message.rfind("rows: expected N in 1..576460752303423487", 0) == 0);
  CHECK(k.error().message.find("[-") == std::string::npos);
}

// A pre-warmed deployment never compiles at serving time: for every family of
// each preset and a sweep of batch sizes, modes and SM counts, the key the
// selector picks is in the preset.
TEST_CASE("support: every key the selector picks for a preset's shapes is in the preset", "[support]") {
  for (std::string_view preset : preset_names()) {
    auto keys = preset_keys(preset, Arch::sm_90);
    REQUIRE(keys.ok());
    const std::set<KernelKey> have(keys->begin(), keys->end());
    size_t checked = 0;
    for (const KernelKey& k : *keys) {
      // A chunked op's configuration names t = 64 whatever its key's route's chunk.
      kdajit_config_t c = config_of(k.op, k.heads, k.state, k.conv, chunked(k.op) ? kPrefillChunk : k.tokens, k.gate);
      c.arch = "sm_90";
      for (auto mode : {KDAJIT_INDICES_UNIQUE_OR_NULL, KDAJIT_INDICES_POSITIVE_UNIQUE, KDAJIT_INDICES_REPEATED_POSITIVE}) {
        if (k.op != Op::single && mode == KDAJIT_INDICES_REPEATED_POSITIVE) continue;
        c.state_indices_mode = mode;
        for (int sms : {0, 16, 132, 148})
          for (int64_t rows : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{8}, int64_t{33}, int64_t{512}, int64_t{70000}}) {
            c.sm_count = sms;
            auto picked = config_key(c, rows);
            REQUIRE(picked.ok());
            INFO(preset << ": " << key_name(*picked) << " at rows " << rows << ", " << sms << " SMs");
            CHECK(have.count(*picked) == 1);
            ++checked;
          }
      }
    }
    CHECK(checked > 0);
  }
}

// For every configuration, inside the key space and just outside it, the query
// accepts exactly when validation accepts a call built with it (and the arch is
// a target of the linked NVRTC); when both reject, they agree on the code.
TEST_CASE("support: the query agrees with validation over the key space", "[support]") {
  std::array<bool, kArchNames.size()> arch_ok{};
  for (size_t i = 0; i < kArchNames.size(); ++i) arch_ok[i] = check_arch_target(*parse_arch(kArchNames[i])).ok();

  int configs = 0, accepted = 0, mismatches = 0;
  for (Op op : {Op::single, Op::packed}) {
    const std::vector<int> token_values =
        op == Op::single ? std::vector<int>{1, 2} : std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    for (int heads = 0; heads <= kMaxHeads + 1; ++heads)
      for (StateDtype state : {StateDtype::f32, StateDtype::bf16})
        for (ConvLayout conv : {ConvLayout::sd, ConvLayout::ds})
          for (int tokens : token_values)
            for (Gate gate : {Gate::bounded, Gate::softplus}) {
              CallConfig cfg;
              cfg.op = op;
              cfg.heads = heads;
              cfg.state = state;
              cfg.conv = conv;
              cfg.tokens = tokens;
              cfg.gate = gate;
              // A bare device-like address: validation never dereferences it.
              auto v = validate_decode(op, build_args(cfg, uintptr_t{1} << 40));

              kdajit_config_t q = config_of(op, heads, state, conv, tokens, gate);
              for (size_t i = 0; i < kArchNames.size(); ++i) {
                q.arch = kArchNames[i];
                Status s = query_support(q);
                ++configs;
                accepted += s.ok();
                bool agree = s.ok() == (v.ok() && arch_ok[i]) &&
                             (v.ok() || s.error().code == v.error().code);
                if (!agree && ++mismatches <= 5) {
                  INFO(fmt::format("op {} H {} state {} conv {} T {} gate {} arch {}", to_string(op), heads,
                                   to_string(state), to_string(conv), tokens, to_string(gate), kArchNames[i]));
                  INFO("query: " << (s.ok() ? std::string("ok") : s.error().message));
                  INFO("validate: " << (v.ok() ? std::string("ok") : v.error().message));
                  CHECK(agree);
                }
              }
            }
  }
  CHECK(mismatches == 0);
  // Every in-range key on every NVRTC target is accepted: 128 heads x 2 x 2 x 2 gates
  // x (1 single + 16 packed token counts) per arch.
  int targets = 0;
  for (bool ok : arch_ok) targets += ok;
  CHECK(accepted == 128 * 2 * 2 * 2 * 17 * targets);
  CHECK(configs == 130 * 2 * 2 * 2 * (2 + 18) * 5);
}

}  // namespace
}  // namespace kdajit
