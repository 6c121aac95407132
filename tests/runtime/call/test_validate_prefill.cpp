// Host-side validation of the prefill op (docs/CONTRACT.md §10): the baselines
// pass and fill the parameter block; every rule broken one at a time fails with
// a message naming the argument and the expected value; validation writes nothing.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "catch.hpp"
#include "kdajit/runtime/call/validate.hpp"
#include "prefill_args_builder.hpp"

using kdajit::test::build_prefill_args;
using kdajit::test::HostPrefill;
using kdajit::test::PrefillConfig;

namespace kdajit {
namespace {

Result<ValidatedCall> validate_untouched(const HostPrefill& call) {
  return call.validate_untouched([](const kdajit_prefill_args_t& a) { return validate_prefill(a); });
}

std::vector<PrefillConfig> baselines() {
  std::vector<PrefillConfig> out;
  for (StateDtype st : all_values<StateDtype>())
    for (ConvLayout cv : all_values<ConvLayout>())
      for (Gate g : all_values<Gate>()) {
        PrefillConfig c;
        c.state = st;
        c.conv = cv;
        c.gate = g;
        c.taps = cv == ConvLayout::sd ? 3 : 6;
        c.has_initial_state = st == StateDtype::f32;
        out.push_back(c);
      }
  return out;
}

TEST_CASE("validate prefill: the baselines pass and fill the parameter block", "[validate][prefill]") {
  for (const PrefillConfig& c : baselines()) {
    HostPrefill call(c);
    INFO(to_string(c.state) << " " << to_string(c.conv) << " " << to_string(c.gate) << " K=" << c.taps);
    auto r = validate_untouched(call);
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r.ok());
    const KernelKey& f = r->shape.family;
    CHECK(f.op == Op::prefill);
    CHECK(f.heads == c.heads);
    CHECK(f.tokens == kPrefillChunk);
    CHECK(f.state == c.state);
    CHECK(f.conv == c.conv);
    CHECK(f.gate == c.gate);
    CHECK(r->shape.rows == c.total);
    CHECK(r->shape.num_seqs == c.seqs);
    CHECK(r->shape.max_seq_len == c.total);  // 0: T_total
    const KdaParams& p = r->params;
    const kdajit_prefill_args_t& a = call.args;
    CHECK(p.rows == c.total);
    CHECK(p.num_seqs == c.seqs);
    CHECK(p.num_slots == c.slots);
    CHECK(p.conv_taps == c.taps);
    // The program reads the state dtype and the conv layout from here (one
    // program serves both): conv_state element (channel, tap) at these strides.
    CHECK(p.state_bf16 == (c.state == StateDtype::bf16 ? 1 : 0));
    CHECK(p.conv_chan_stride == a.conv_state.strides[1]);
    CHECK(p.conv_tap_stride == a.conv_state.strides[2]);
    CHECK(p.x == a.x.data);
    CHECK(p.conv_state == a.conv_state.data);
    CHECK(p.state == a.state.data);
    CHECK(p.state_indices == a.state_indices.data);
    CHECK(p.query_start_loc == a.query_start_loc.data);
    CHECK(p.num_accepted == nullptr);
    CHECK(p.has_initial_state == (c.has_initial_state ? a.has_initial_state.data : nullptr));
    CHECK(p.output == a.output.data);
    CHECK(p.x_row_stride == a.x.strides[0]);
    CHECK(p.conv_slot_stride == a.conv_state.strides[0]);
    CHECK(p.gate_row_stride == a.raw_gate.strides[0]);
    CHECK(p.beta_row_stride == a.raw_beta.strides[0]);
    CHECK(p.state_slot_stride == a.state.strides[0]);
    CHECK(p.ogate_row_stride == a.output_gate.strides[0]);
    CHECK(p.out_row_stride == a.output.strides[0]);
    CHECK(p.lower_bound == a.lower_bound);
    CHECK(p.norm_eps == a.norm_eps);
  }
}

TEST_CASE("validate prefill: what the contract leaves free", "[validate][prefill]") {
  // has_initial_state empty as shape [0] (data NULL or not), K at both ends,
  // one row, one slot (every sequence null), max_seq_len clamped to T_total.
  PrefillConfig c;
  c.has_initial_state = false;
  HostPrefill call(c);
  call.args.has_initial_state = tensor_view(nullptr, KDAJIT_DTYPE_INT32, {0}, {1});
  auto r = validate_untouched(call);
  REQUIRE(r.ok());
  CHECK(r->params.has_initial_state == nullptr);
  call.args.has_initial_state = tensor_view(call.args.x.data, KDAJIT_DTYPE_F32, {0}, {1});  // empty: nothing read
  REQUIRE(validate_untouched(call).ok());

  for (int64_t taps : {3, 18}) {
    PrefillConfig k = c;
    k.taps = taps;
    k.conv = taps == 3 ? ConvLayout::ds : ConvLayout::sd;
    HostPrefill kc(k);
    auto kr = validate_untouched(kc);
    INFO("K " << taps);
    REQUIRE(kr.ok());
    CHECK(kr->params.conv_taps == taps);
    CHECK(kr->shape.family.conv == k.conv);
  }
  PrefillConfig tiny = c;
  tiny.total = 1;
  tiny.seqs = 1;
  tiny.slots = 1;
  HostPrefill tc(tiny);
  REQUIRE(validate_untouched(tc).ok());

  for (auto [hint, want] : {std::pair<int64_t, int64_t>{0, 200}, {1, 1}, {64, 64}, {200, 200}, {5000, 200}}) {
    call.args.max_seq_len = hint;
    auto h = validate_untouched(call);
    INFO("max_seq_len " << hint);
    REQUIRE(h.ok());
    CHECK(h->shape.max_seq_len == want);
  }
  // A workspace goes to the kernel and its size to the selector (route twopass).
  call.args.workspace = reinterpret_cast<void*>(0x7f0000010000);
  call.args.workspace_bytes = 12345;
  auto w = validate_untouched(call);
  REQUIRE(w.ok());
  CHECK(w->params.workspace == call.args.workspace);
  CHECK(w->shape.workspace_bytes == 12345);
}

struct Rule {
  std::string what;
  std::function<void(kdajit_prefill_args_t&)> breaks;
  std::vector<std::string> message;  // substrings of the error
  ErrorCode code = ErrorCode::invalid_argument;
};

std::vector<Rule> rules() {
  // Baseline: H = 2 (hidden 256, qkv 768), T_total = 200, N = 3, S = 5, K = 3, SD.
  using A = kdajit_prefill_args_t;
  const kdajit_dtype_t f32 = KDAJIT_DTYPE_F32, bf16 = KDAJIT_DTYPE_BF16, i32 = KDAJIT_DTYPE_INT32;
  auto set_shape = [](kdajit_tensor_t& t, int d, int64_t v) { t.shape[d] = v; };
  std::vector<Rule> r;
  // Scalars.
  r.push_back({"gate", [](A& a) { int32_t v = 7; std::memcpy(&a.gate, &v, 4); }, {"gate: expected bounded|softplus, got 7"}});
  r.push_back({"lower_bound", [](A& a) { a.lower_bound = 0.0f; }, {"lower_bound: expected a finite value < 0"}});
  r.push_back({"lower_bound nan", [](A& a) { a.lower_bound = std::nanf(""); }, {"lower_bound: expected a finite value < 0"}});
  r.push_back({"norm_eps", [](A& a) { a.norm_eps = -1.0f; }, {"norm_eps: expected a finite value >= 0, got -1"}});
  r.push_back({"max_seq_len", [](A& a) { a.max_seq_len = -1; },
               {"max_seq_len: expected 0 (T_total) or a bound >= 1 on the longest sequence, got -1"}});
  r.push_back({"oob_counter", [](A& a) { a.oob_counter = reinterpret_cast<int32_t*>(0x1002); },
               {"oob_counter: expected NULL or an int32 pointer aligned to 4 bytes, got 0x1002"}});
  r.push_back({"workspace_bytes", [](A& a) { a.workspace_bytes = -5; }, {"workspace_bytes: expected >= 0, got -5"}});
  r.push_back({"workspace NULL", [](A& a) { a.workspace_bytes = 4096; },
               {"workspace: expected a device pointer for workspace_bytes 4096, got NULL"}});
  r.push_back({"workspace alignment", [](A& a) {
                 a.workspace = reinterpret_cast<void*>(0x10004);
                 a.workspace_bytes = 4096;
               },
               {"workspace: expected a pointer aligned to 16 bytes, got 0x10004"}});
  // Sizes.
  r.push_back({"A_log H=0", [=](A& a) { set_shape(a.A_log, 0, 0); }, {"A_log: expected shape [H] with H (heads) in 1..128"}});
  r.push_back({"A_log H=129", [=](A& a) { set_shape(a.A_log, 0, 129); },
               {"A_log: expected shape [H] with H (heads) in 1..128 (the heads this build serves), got [129]"},
               ErrorCode::unsupported});
  r.push_back({"A_log dtype", [=](A& a) { a.A_log.dtype = bf16; }, {"A_log: expected dtype f32, got bf16"}});
  r.push_back({"x null", [](A& a) { a.x.data = nullptr; }, {"x: expected a non-null data pointer, got NULL"}});
  r.push_back({"x dtype", [=](A& a) { a.x.dtype = f32; }, {"x: expected dtype bf16, got f32"}});
  r.push_back({"x ndim", [](A& a) { a.x.ndim = 3; }, {"x: expected ndim 2 [T_total, 3*H*128], got ndim 3"}});
  r.push_back({"x rows 0", [=](A& a) { set_shape(a.x, 0, 0); }, {"x: expected rows T_total (shape[0]) in 1..2147483647"}});
  r.push_back({"x rows 2^31", [=](A& a) { set_shape(a.x, 0, int64_t{1} << 31); }, {"x: expected rows T_total (shape[0]) in 1..2147483647"}});
  r.push_back({"x width", [=](A& a) { set_shape(a.x, 1, 700); }, {"x: expected shape [R=200, 3*H*128=768], got [200, 700]", "R=T_total=200 from x"}});
  r.push_back({"x row stride", [](A& a) { a.x.strides[0] = 767; }, {"x: expected strides (row >= 768, 1), got (767, 1)"}});
  r.push_back({"x align", [](A& a) { a.x.data = static_cast<char*>(a.x.data) + 1; }, {"x: expected a data pointer aligned to 2 bytes"}});
  r.push_back({"state dtype", [=](A& a) { a.state.dtype = i32; }, {"state: expected dtype f32 or bf16, got int32"}});
  r.push_back({"state S=0", [=](A& a) { set_shape(a.state, 0, 0); }, {"state: expected slots S (shape[0]) in 1..2147483647"}});
  r.push_back({"state ndim", [](A& a) { a.state.ndim = 3; }, {"state: expected ndim 4 [S, H, 128, 128], got ndim 3"}});
  r.push_back({"state slot stride", [](A& a) { a.state.strides[0] += 1; }, {"state: expected a slot stride that is a multiple of 16 bytes"}});
  r.push_back({"state heads", [=](A& a) { set_shape(a.state, 1, 3); }, {"state: expected shape [S=5, H=2, 128, 128]"}});
  r.push_back({"state_indices ndim", [](A& a) { a.state_indices.ndim = 2; }, {"state_indices: expected ndim 1 [N], got ndim 2"}});
  r.push_back({"state_indices dtype", [=](A& a) { a.state_indices.dtype = f32; }, {"state_indices: expected dtype int32, got f32"}});
  r.push_back({"state_indices N=0", [=](A& a) { set_shape(a.state_indices, 0, 0); },
               {"state_indices: expected sequences N (shape[0]) in 1..2147483646, got shape [0]"}});
  r.push_back({"state_indices N=2^31-1", [=](A& a) { set_shape(a.state_indices, 0, 2147483647); },
               {"state_indices: expected sequences N (shape[0]) in 1..2147483646"}});
  r.push_back({"state_indices stride", [](A& a) { a.state_indices.strides[0] = 2; }, {"state_indices: expected strides (1), got (2)"}});
  r.push_back({"conv_state K=2", [=](A& a) { set_shape(a.conv_state, 2, 2); },
               {"conv_state: expected shape [S, 3*H*128, K] with K (taps) in 3..18, got [5, 768, 2]"}});
  r.push_back({"conv_state K=19", [=](A& a) { set_shape(a.conv_state, 2, 19); },
               {"conv_state: expected shape [S, 3*H*128, K] with K (taps) in 3..18, got [5, 768, 19]"}});
  r.push_back({"conv_state dtype", [=](A& a) { a.conv_state.dtype = f32; }, {"conv_state: expected dtype bf16, got f32"}});
  r.push_back({"conv_state ndim", [](A& a) { a.conv_state.ndim = 2; }, {"conv_state: expected ndim 3 [S, 3*H*128, K], got ndim 2"}});
  r.push_back({"conv_state S", [=](A& a) { set_shape(a.conv_state, 0, 4); }, {"conv_state: expected shape [S=5, 3*H*128=768, K=3], got [4, 768, 3]"}});
  r.push_back({"conv_state strides", [](A& a) { a.conv_state.strides[1] = 2; },
               {"conv_state: expected strides (slot >= 2304, 1, 768) [SD] or (slot >= 2304, 3, 1) [DS], got"}});
  r.push_back({"conv_state slot alignment", [](A& a) { a.conv_state.strides[0] += 1; },
               {"conv_state: expected a slot stride that is a multiple of 8 bytes"}});
  r.push_back({"conv_weight", [=](A& a) { set_shape(a.conv_weight, 1, 3); }, {"conv_weight: expected shape [3, 4, H*128=256]"}});
  r.push_back({"raw_gate", [=](A& a) { set_shape(a.raw_gate, 0, 199); }, {"raw_gate: expected shape [R=200, H=2, 128], got [199, 2, 128]"}});
  r.push_back({"raw_beta", [](A& a) { a.raw_beta.strides[1] = 2; }, {"raw_beta: expected strides (row >= 2, 1)"}});
  r.push_back({"dt_bias", [=](A& a) { set_shape(a.dt_bias, 0, 128); }, {"dt_bias: expected shape [H*128=256], got [128]"}});
  r.push_back({"output_gate", [=](A& a) { a.output_gate.dtype = f32; }, {"output_gate: expected dtype bf16, got f32"}});
  r.push_back({"norm_weight", [=](A& a) { set_shape(a.norm_weight, 0, 64); }, {"norm_weight: expected shape [128], got [64]"}});
  r.push_back({"output", [=](A& a) { set_shape(a.output, 0, 201); }, {"output: expected shape [R=200, H=2, 128], got [201, 2, 128]"}});
  r.push_back({"output null", [](A& a) { a.output.data = nullptr; }, {"output: expected a non-null data pointer, got NULL"}});
  r.push_back({"query_start_loc shape", [=](A& a) { set_shape(a.query_start_loc, 0, 3); },
               {"query_start_loc: expected shape [N+1=4], got [3]", "N=3 from state_indices"}});
  r.push_back({"query_start_loc dtype", [=](A& a) { a.query_start_loc.dtype = f32; }, {"query_start_loc: expected dtype int32, got f32"}});
  r.push_back({"query_start_loc stride", [](A& a) { a.query_start_loc.strides[0] = 2; }, {"query_start_loc: expected strides (1), got (2)"}});
  r.push_back({"query_start_loc null", [](A& a) { a.query_start_loc.data = nullptr; }, {"query_start_loc: expected a non-null data pointer"}});
  r.push_back({"has_initial_state shape", [=](A& a) { set_shape(a.has_initial_state, 0, 4); },
               {"has_initial_state: expected shape [N=3], got [4]"}});
  r.push_back({"has_initial_state dtype", [=](A& a) { a.has_initial_state.dtype = f32; },
               {"has_initial_state: expected dtype int32, got f32"}});
  r.push_back({"has_initial_state ndim", [](A& a) { a.has_initial_state.ndim = 2; },
               {"has_initial_state: expected ndim 1 [N] (or empty: ndim 0 or shape [0]), got ndim 2"}});
  r.push_back({"has_initial_state null", [](A& a) { a.has_initial_state.data = nullptr; },
               {"has_initial_state: expected a non-null data pointer, got NULL"}});
  r.push_back({"has_initial_state stride", [](A& a) { a.has_initial_state.strides[0] = 3; },
               {"has_initial_state: expected strides (1), got (3)"}});
  return r;
}

TEST_CASE("validate prefill: every rule broken one at a time names the argument and the expected value",
          "[validate][prefill]") {
  for (const Rule& rule : rules()) {
    HostPrefill call(PrefillConfig{});
    rule.breaks(call.args);
    auto r = validate_untouched(call);
    INFO(rule.what);
    REQUIRE_FALSE(r.ok());
    INFO(r.error().message);
    CHECK(r.error().code == rule.code);
    for (const std::string& m : rule.message) CHECK(r.error().message.find(m) != std::string::npos);
  }
}

TEST_CASE("validate prefill: the decode validation refuses the prefill op by name", "[validate][prefill]") {
  kdajit_decode_args_t a;
  std::memset(&a, 0, sizeof a);
  auto r = validate_decode(Op::prefill, a);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ErrorCode::invalid_argument);
  CHECK(r.error().message.rfind("op: expected single|packed for kdajit_decode_args_t, got prefill", 0) == 0);
}

}  // namespace
}  // namespace kdajit
