// Host-side validation of decode calls (docs/CONTRACT.md §6): every rule broken one
// at a time must fail with a message naming the argument and the expected value,
// and validation must write nothing.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "catch.hpp"
#include "decode_args_builder.hpp"
#include "kdajit/runtime/call/validate.hpp"

using kdajit::test::build_args;
using kdajit::test::CallConfig;
using kdajit::test::HostCall;

namespace kdajit {
namespace {

// Validates and checks that neither the args struct nor the buffers changed.
Result<ValidatedCall> validate_untouched(Op op, const HostCall& call) {
  return call.validate_untouched([op](const kdajit_decode_args_t& a) { return validate_decode(op, a); });
}

std::vector<std::pair<std::string, CallConfig>> baselines() {
  CallConfig single_sd_f32;
  CallConfig single_ds_bf16;
  single_ds_bf16.conv = ConvLayout::ds;
  single_ds_bf16.state = StateDtype::bf16;
  CallConfig packed_sd_bf16;
  packed_sd_bf16.op = Op::packed;
  packed_sd_bf16.state = StateDtype::bf16;
  packed_sd_bf16.tokens = 4;
  packed_sd_bf16.heads = 3;
  CallConfig packed_ds_f32;
  packed_ds_f32.op = Op::packed;
  packed_ds_f32.conv = ConvLayout::ds;
  packed_ds_f32.tokens = 2;
  packed_ds_f32.rows = 5;
  return {{"single.sd.f32", single_sd_f32},
          {"single.ds.bf16", single_ds_bf16},
          {"packed.sd.bf16.t4", packed_sd_bf16},
          {"packed.ds.f32.t2", packed_ds_f32}};
}

// The sizes of a configuration, as the messages spell them.
struct Sizes {
  int64_t H, R, S, N, T, hidden, qkv, K;
  explicit Sizes(const CallConfig& c)
      : H(c.heads), R(c.rows), S(c.slots), N(c.seqs), T(c.tokens), hidden(H * 128), qkv(3 * hidden), K(c.tokens + 2) {}
};

constexpr int kSingle = 1, kPacked = 2, kBoth = 3;

struct Rule {
  std::string name;
  int ops;
  std::function<void(kdajit_decode_args_t&, const Sizes&)> breaks;
  ErrorCode code;
  std::function<std::vector<std::string>(const Sizes&)> expect;  // substrings of the message
};

struct TensorInfo {
  const char* name;
  kdajit_tensor_t kdajit_decode_args_t::*member;
  const char* dtype;        // as the message spells the expected dtype
  kdajit_dtype_t wrong;     // a dtype it must not have
  int ndim_single, ndim_packed;
  int ops;
};

const std::vector<TensorInfo>& tensors() {
  using A = kdajit_decode_args_t;
  const auto bf16 = KDAJIT_DTYPE_BF16, f32 = KDAJIT_DTYPE_F32, i32 = KDAJIT_DTYPE_INT32;
  static const std::vector<TensorInfo> t = {
      {"x", &A::x, "bf16", f32, 2, 2, kBoth},
      {"conv_weight", &A::conv_weight, "f32", bf16, 3, 3, kBoth},
      {"conv_state", &A::conv_state, "bf16", f32, 3, 3, kBoth},
      {"raw_gate", &A::raw_gate, "bf16", f32, 3, 3, kBoth},
      {"raw_beta", &A::raw_beta, "bf16", i32, 2, 2, kBoth},
      {"A_log", &A::A_log, "f32", bf16, 1, 1, kBoth},
      {"dt_bias", &A::dt_bias, "f32", i32, 1, 1, kBoth},
      {"state_indices", &A::state_indices, "int32", f32, 1, 2, kBoth},
      {"state", &A::state, "f32 or bf16", i32, 4, 4, kBoth},
      {"output_gate", &A::output_gate, "bf16", f32, 3, 3, kBoth},
      {"norm_weight", &A::norm_weight, "f32", bf16, 1, 1, kBoth},
      {"output", &A::output, "bf16", f32, 3, 3, kBoth},
      {"query_start_loc", &A::query_start_loc, "int32", f32, 1, 1, kPacked},
      {"num_accepted_tokens", &A::num_accepted_tokens, "int32", bf16, 1, 1, kPacked},
  };
  return t;
}

// Rules every tensor has: non-null, dtype, rank, element alignment.
std::vector<Rule> per_tensor_rules() {
  std::vector<Rule> rules;
  for (const TensorInfo& ti : tensors()) {
    const std::string n = ti.name;
    auto m = ti.member;
    rules.push_back({n + " null", ti.ops, [m](auto& a, auto&) { (a.*m).data = nullptr; }, ErrorCode::invalid_argument,
                     [n](auto&) { return std::vector<std::string>{n + ": expected a non-null data pointer, got NULL"}; }});
    rules.push_back({n + " wrong dtype", ti.ops, [m, w = ti.wrong](auto& a, auto&) { (a.*m).dtype = w; },
                     ErrorCode::invalid_argument, [n, d = std::string(ti.dtype)](auto&) {
                       return std::vector<std::string>{n + ": expected dtype " + d + ", got "};
                     }});
    rules.push_back({n + " unknown dtype", ti.ops,
                     [m](auto& a, auto&) { (a.*m).dtype = static_cast<kdajit_dtype_t>(9); },
                     ErrorCode::invalid_argument,
                     [n](auto&) { return std::vector<std::string>{n + ": expected dtype", "got dtype(9)"}; }});
    for (int op : {kSingle, kPacked}) {
      if (!(ti.ops & op)) continue;
      int nd = op == kSingle ? ti.ndim_single : ti.ndim_packed;
      rules.push_back({n + " ndim + 1", op, [m](auto& a, auto&) { (a.*m).ndim += 1; }, ErrorCode::invalid_argument,
                       [n, nd](auto&) {
                         return std::vector<std::string>{fmt::format("{}: expected ndim {}", n, nd),
                                                         fmt::format("got ndim {}", nd + 1)};
                       }});
    }
    rules.push_back({n + " misaligned element", ti.ops,
                     [m](auto& a, auto&) { (a.*m).data = static_cast<char*>((a.*m).data) + 1; },
                     ErrorCode::invalid_argument,
                     [n](auto&) { return std::vector<std::string>{n + ": expected a data pointer aligned to "}; }});
  }
  return rules;
}

// Shapes, strides, alignment, sizes and scalars, one broken at a time.
std::vector<Rule> specific_rules() {
  using V = std::vector<std::string>;
  const auto inv = ErrorCode::invalid_argument;
  const auto unsup = ErrorCode::unsupported;
  const std::string i32max = "2147483647";
  return {
      // Shapes.
      {"x channels", kBoth, [](auto& a, auto& s) { a.x.shape[1] = s.qkv - 128; }, inv,
       [](auto& s) { return V{fmt::format("x: expected shape [R={}, 3*H*128={}], got [{}, {}]", s.R, s.qkv, s.R, s.qkv - 128)}; }},
      {"x zero rows", kBoth, [](auto& a, auto&) { a.x.shape[0] = 0; }, inv,
       [=](auto& s) { return V{fmt::format("x: expected rows R (shape[0]) in 1..{}, got shape [0, {}]", i32max, s.qkv)}; }},
      {"x rows beyond int32", kBoth, [](auto& a, auto&) { a.x.shape[0] = int64_t{1} << 31; }, inv,
       [=](auto&) { return V{"x: expected rows R (shape[0]) in 1.." + i32max}; }},
      {"A_log zero heads", kBoth, [](auto& a, auto&) { a.A_log.shape[0] = 0; }, inv,
       [](auto&) { return V{"A_log: expected shape [H] with H (heads) in 1..128, got [0]"}; }},
      {"A_log 129 heads", kBoth, [](auto& a, auto&) { a.A_log.shape[0] = 129; }, unsup,
       [](auto&) { return V{"A_log: expected shape [H] with H (heads) in 1..128", "got [129]"}; }},
      {"A_log one more head than x", kBoth, [](auto& a, auto& s) { a.A_log.shape[0] = s.H + 1; }, inv,
       [](auto& s) {
         return V{fmt::format("x: expected shape [R={}, 3*H*128={}]", s.R, 3 * (s.H + 1) * 128),
                  fmt::format("H={} from A_log", s.H + 1)};
       }},
      {"conv_weight taps", kBoth, [](auto& a, auto&) { a.conv_weight.shape[1] = 3; }, inv,
       [](auto& s) { return V{fmt::format("conv_weight: expected shape [3, 4, H*128={}], got [3, 3, {}]", s.hidden, s.hidden)}; }},
      {"conv_weight hidden", kBoth, [](auto& a, auto& s) { a.conv_weight.shape[2] = s.hidden + 128; }, inv,
       [](auto& s) { return V{fmt::format("conv_weight: expected shape [3, 4, H*128={}]", s.hidden)}; }},
      {"conv_state channels", kBoth, [](auto& a, auto& s) { a.conv_state.shape[1] = s.qkv - 1; }, inv,
       [](auto& s) { return V{fmt::format("conv_state: expected shape [S={}, 3*H*128={}, K=T+2={}]", s.S, s.qkv, s.K)}; }},
      {"conv_state taps K + 1", kBoth, [](auto& a, auto& s) { a.conv_state.shape[2] = s.K + 1; }, inv,
       [](auto& s) {
         return V{fmt::format("conv_state: expected shape [S={}, 3*H*128={}, K=T+2={}], got [{}, {}, {}]", s.S, s.qkv,
                              s.K, s.S, s.qkv, s.K + 1)};
       }},
      {"conv_state slots differ from state", kBoth, [](auto& a, auto& s) { a.conv_state.shape[0] = s.S + 1; }, inv,
       [](auto& s) { return V{fmt::format("conv_state: expected shape [S={},", s.S), fmt::format("S={} from state", s.S)}; }},
      {"raw_gate head dim 64", kBoth, [](auto& a, auto&) { a.raw_gate.shape[2] = 64; }, inv,
       [](auto& s) { return V{fmt::format("raw_gate: expected shape [R={}, H={}, 128], got [{}, {}, 64]", s.R, s.H, s.R, s.H)}; }},
      {"raw_gate one more row", kBoth, [](auto& a, auto& s) { a.raw_gate.shape[0] = s.R + 1; }, inv,
       [](auto& s) { return V{fmt::format("raw_gate: expected shape [R={}, H={}, 128]", s.R, s.H)}; }},
      {"raw_beta heads", kBoth, [](auto& a, auto& s) { a.raw_beta.shape[1] = s.H + 1; }, inv,
       [](auto& s) { return V{fmt::format("raw_beta: expected shape [R={}, H={}]", s.R, s.H)}; }},
      {"dt_bias size", kBoth, [](auto& a, auto& s) { a.dt_bias.shape[0] = s.hidden - 1; }, inv,
       [](auto& s) { return V{fmt::format("dt_bias: expected shape [H*128={}]", s.hidden)}; }},
      {"state zero slots", kBoth, [](auto& a, auto&) { a.state.shape[0] = 0; }, inv,
       [=](auto&) { return V{"state: expected slots S (shape[0]) in 1.." + i32max}; }},
      {"state heads", kBoth, [](auto& a, auto& s) { a.state.shape[1] = s.H + 1; }, inv,
       [](auto& s) { return V{fmt::format("state: expected shape [S={}, H={}, 128, 128]", s.S, s.H)}; }},
      {"state k dim 64", kBoth, [](auto& a, auto&) { a.state.shape[3] = 64; }, inv,
       [](auto& s) { return V{fmt::format("state: expected shape [S={}, H={}, 128, 128], got [{}, {}, 128, 64]", s.S, s.H, s.S, s.H)}; }},
      {"output_gate one more row", kBoth, [](auto& a, auto& s) { a.output_gate.shape[0] = s.R + 1; }, inv,
       [](auto& s) { return V{fmt::format("output_gate: expected shape [R={}, H={}, 128]", s.R, s.H)}; }},
      {"output one row less", kBoth, [](auto& a, auto& s) { a.output.shape[0] = s.R - 1; }, inv,
       [](auto& s) { return V{fmt::format("output: expected shape [R={}, H={}, 128]", s.R, s.H)}; }},
      {"norm_weight 64", kBoth, [](auto& a, auto&) { a.norm_weight.shape[0] = 64; }, inv,
       [](auto&) { return V{"norm_weight: expected shape [128], got [64]"}; }},
      {"state_indices one more row", kSingle, [](auto& a, auto& s) { a.state_indices.shape[0] = s.R + 1; }, inv,
       [](auto& s) { return V{fmt::format("state_indices: expected shape [R={}], got [{}]", s.R, s.R + 1)}; }},
      {"state_indices zero sequences", kPacked, [](auto& a, auto&) { a.state_indices.shape[0] = 0; }, inv,
       [=](auto&) { return V{"state_indices: expected sequences N (shape[0]) in 1.." + i32max}; }},
      {"state_indices T = 0", kPacked, [](auto& a, auto&) { a.state_indices.shape[1] = 0; }, inv,
       [](auto& s) { return V{fmt::format("state_indices: expected shape [N, T] with T (tokens) in 1..16, got [{}, 0]", s.N)}; }},
      {"state_indices T = 17", kPacked,
       [](auto& a, auto&) {
         a.state_indices.shape[1] = 17;
         a.state_indices.strides[0] = 17;
       },
       unsup,
       [](auto& s) {
         return V{"state_indices: expected shape [N, T] with T (tokens) in 1..16 (the tokens this build serves)",
                  fmt::format("got [{}, 17]", s.N)};
       }},
      {"state_indices T + 1 disagrees with conv_state", kPacked,
       [](auto& a, auto& s) {
         a.state_indices.shape[1] = s.T + 1;
         a.state_indices.strides[0] = s.T + 1;
       },
       inv,
       [](auto& s) {
         return V{fmt::format("conv_state: expected shape [S={}, 3*H*128={}, K=T+2={}]", s.S, s.qkv, s.T + 3),
                  fmt::format("T={} from state_indices", s.T + 1)};
       }},
      {"query_start_loc N", kPacked, [](auto& a, auto& s) { a.query_start_loc.shape[0] = s.N; }, inv,
       [](auto& s) { return V{fmt::format("query_start_loc: expected shape [N+1={}], got [{}]", s.N + 1, s.N)}; }},
      {"num_accepted_tokens N + 1", kPacked, [](auto& a, auto& s) { a.num_accepted_tokens.shape[0] = s.N + 1; }, inv,
       [](auto& s) { return V{fmt::format("num_accepted_tokens: expected shape [N={}], got [{}]", s.N, s.N + 1)}; }},

      // Strides.
      {"x channel stride 2", kBoth, [](auto& a, auto&) { a.x.strides[1] = 2; }, inv,
       [](auto& s) { return V{fmt::format("x: expected strides (row >= {}, 1), got ({}, 2)", s.qkv, s.qkv + 8)}; }},
      {"x row stride below qkv", kBoth, [](auto& a, auto& s) { a.x.strides[0] = s.qkv - 1; }, inv,
       [](auto& s) { return V{fmt::format("x: expected strides (row >= {}, 1), got ({}, 1)", s.qkv, s.qkv - 1)}; }},
      {"x negative row stride", kBoth, [](auto& a, auto& s) { a.x.strides[0] = -s.qkv; }, inv,
       [](auto& s) { return V{fmt::format("x: expected strides (row >= {}, 1)", s.qkv)}; }},
      {"x extent beyond 2^63 bytes", kBoth, [](auto& a, auto&) { a.x.strides[0] = int64_t{1} << 61; }, inv,
       [](auto&) { return V{"x: expected a strided extent below 2^63 bytes"}; }},
      {"conv_weight not contiguous", kBoth, [](auto& a, auto&) { a.conv_weight.strides[0] += 1; }, inv,
       [](auto& s) { return V{fmt::format("conv_weight: expected strides ({}, {}, 1)", 4 * s.hidden, s.hidden)}; }},
      {"conv_state neither SD nor DS", kBoth, [](auto& a, auto&) { a.conv_state.strides[1] = a.conv_state.strides[2] = 1; },
       inv,
       [](auto& s) {
         return V{fmt::format("conv_state: expected strides (slot >= {}, 1, {}) [SD] or (slot >= {}, {}, 1) [DS], got",
                              s.qkv * s.K, s.qkv, s.qkv * s.K, s.K)};
       }},
      {"conv_state slot stride below one slot", kBoth, [](auto& a, auto& s) { a.conv_state.strides[0] = s.qkv * s.K - 4; },
       inv, [](auto& s) { return V{fmt::format("conv_state: expected strides (slot >= {},", s.qkv * s.K)}; }},
      {"conv_state slot stride not 8-byte", kBoth, [](auto& a, auto&) { a.conv_state.strides[0] += 1; }, inv,
       [](auto&) { return V{"conv_state: expected a slot stride that is a multiple of 8 bytes"}; }},
      {"conv_state data not 8-byte", kBoth,
       [](auto& a, auto&) { a.conv_state.data = static_cast<char*>(a.conv_state.data) + 2; }, inv,
       [](auto&) { return V{"conv_state: expected a data pointer aligned to 8 bytes"}; }},
      {"raw_gate head stride", kBoth, [](auto& a, auto&) { a.raw_gate.strides[1] = 256; }, inv,
       [](auto& s) { return V{fmt::format("raw_gate: expected strides (row >= {}, 128, 1)", s.hidden)}; }},
      {"raw_gate row stride below a row", kBoth, [](auto& a, auto& s) { a.raw_gate.strides[0] = s.hidden - 128; }, inv,
       [](auto& s) { return V{fmt::format("raw_gate: expected strides (row >= {}, 128, 1), got ({}, 128, 1)", s.hidden, s.hidden - 128)}; }},
      {"raw_beta head stride 2", kBoth, [](auto& a, auto&) { a.raw_beta.strides[1] = 2; }, inv,
       [](auto& s) { return V{fmt::format("raw_beta: expected strides (row >= {}, 1)", s.H)}; }},
      {"A_log stride 2", kBoth, [](auto& a, auto&) { a.A_log.strides[0] = 2; }, inv,
       [](auto&) { return V{"A_log: expected strides (1), got (2)"}; }},
      {"dt_bias stride 2", kBoth, [](auto& a, auto&) { a.dt_bias.strides[0] = 2; }, inv,
       [](auto&) { return V{"dt_bias: expected strides (1), got (2)"}; }},
      {"state_indices stride 2", kSingle, [](auto& a, auto&) { a.state_indices.strides[0] = 2; }, inv,
       [](auto&) { return V{"state_indices: expected strides (1), got (2)"}; }},
      {"state_indices row stride T + 1", kPacked, [](auto& a, auto& s) { a.state_indices.strides[0] = s.T + 1; }, inv,
       [](auto& s) { return V{fmt::format("state_indices: expected strides ({}, 1), got ({}, 1)", s.T, s.T + 1)}; }},
      {"state head stride", kBoth, [](auto& a, auto&) { a.state.strides[1] += 1; }, inv,
       [](auto& s) { return V{fmt::format("state: expected strides (slot >= {}, 16384, 128, 1)", s.H * 16384)}; }},
      {"state slot stride below one slot", kBoth, [](auto& a, auto& s) { a.state.strides[0] = s.H * 16384 - 16; }, inv,
       [](auto& s) { return V{fmt::format("state: expected strides (slot >= {}, 16384, 128, 1)", s.H * 16384)}; }},
      {"state slot stride not 16-byte", kBoth, [](auto& a, auto&) { a.state.strides[0] += 1; }, inv,
       [](auto&) { return V{"state: expected a slot stride that is a multiple of 16 bytes"}; }},
      {"state data not 16-byte", kBoth, [](auto& a, auto&) { a.state.data = static_cast<char*>(a.state.data) + 4; }, inv,
       [](auto&) { return V{"state: expected a data pointer aligned to 16 bytes"}; }},
      {"state extent beyond 2^63 bytes", kBoth, [](auto& a, auto&) { a.state.strides[0] = int64_t{1} << 61; }, inv,
       [](auto&) { return V{"state: expected a strided extent below 2^63 bytes"}; }},
      {"output_gate row stride below a row", kBoth, [](auto& a, auto& s) { a.output_gate.strides[0] = s.hidden - 1; }, inv,
       [](auto& s) { return V{fmt::format("output_gate: expected strides (row >= {}, 128, 1)", s.hidden)}; }},
      {"output inner stride 2", kBoth, [](auto& a, auto&) { a.output.strides[2] = 2; }, inv,
       [](auto& s) { return V{fmt::format("output: expected strides (row >= {}, 128, 1)", s.hidden)}; }},
      {"norm_weight stride 2", kBoth, [](auto& a, auto&) { a.norm_weight.strides[0] = 2; }, inv,
       [](auto&) { return V{"norm_weight: expected strides (1), got (2)"}; }},
      {"query_start_loc stride 2", kPacked, [](auto& a, auto&) { a.query_start_loc.strides[0] = 2; }, inv,
       [](auto&) { return V{"query_start_loc: expected strides (1), got (2)"}; }},
      {"num_accepted_tokens stride 2", kPacked, [](auto& a, auto&) { a.num_accepted_tokens.strides[0] = 2; }, inv,
       [](auto&) { return V{"num_accepted_tokens: expected strides (1), got (2)"}; }},

      // Scalars.
      {"gate 5", kBoth, [](auto& a, auto&) { a.gate = static_cast<kdajit_gate_t>(5); }, inv,
       [](auto&) { return V{"gate: expected bounded|softplus, got 5"}; }},
      {"lower_bound 0.5", kBoth, [](auto& a, auto&) { a.lower_bound = 0.5f; }, inv,
       [](auto&) { return V{"lower_bound: expected a finite value < 0 for the bounded gate, got 0.5"}; }},
      {"lower_bound 0", kBoth, [](auto& a, auto&) { a.lower_bound = 0.0f; }, inv,
       [](auto&) { return V{"lower_bound: expected a finite value < 0 for the bounded gate, got 0"}; }},
      {"lower_bound -0", kBoth, [](auto& a, auto&) { a.lower_bound = -0.0f; }, inv,
       [](auto&) { return V{"lower_bound: expected a finite value < 0 for the bounded gate, got -0"}; }},
      {"lower_bound nan", kBoth, [](auto& a, auto&) { a.lower_bound = std::numeric_limits<float>::quiet_NaN(); }, inv,
       [](auto&) { return V{"lower_bound: expected a finite value < 0 for the bounded gate, got nan"}; }},
      {"lower_bound -inf", kBoth, [](auto& a, auto&) { a.lower_bound = -std::numeric_limits<float>::infinity(); }, inv,
       [](auto&) { return V{"lower_bound: expected a finite value < 0 for the bounded gate, got -inf"}; }},
      {"norm_eps negative", kBoth, [](auto& a, auto&) { a.norm_eps = -1e-6f; }, inv,
       [](auto&) { return V{"norm_eps: expected a finite value >= 0, got -1e-06"}; }},
      {"norm_eps nan", kBoth, [](auto& a, auto&) { a.norm_eps = std::numeric_limits<float>::quiet_NaN(); }, inv,
       [](auto&) { return V{"norm_eps: expected a finite value >= 0, got nan"}; }},
      {"norm_eps inf", kBoth, [](auto& a, auto&) { a.norm_eps = std::numeric_limits<float>::infinity(); }, inv,
       [](auto&) { return V{"norm_eps: expected a finite value >= 0, got inf"}; }},
      {"state_indices_mode 7", kBoth,
       [](auto& a, auto&) { a.state_indices_mode = static_cast<kdajit_indices_mode_t>(7); }, inv,
       [](auto&) { return V{"state_indices_mode: expected unique_or_null|positive_unique|repeated_positive, got 7"}; }},
      {"packed repeated_positive", kPacked,
       [](auto& a, auto&) { a.state_indices_mode = KDAJIT_INDICES_REPEATED_POSITIVE; }, inv,
       [](auto&) {
         return V{"state_indices_mode: expected unique_or_null or positive_unique for the packed op",
                  "got repeated_positive"};
       }},
      {"oob_counter misaligned", kBoth,
       [](auto& a, auto&) { a.oob_counter = reinterpret_cast<int32_t*>(static_cast<char*>(a.output.data) + 2); }, inv,
       [](auto&) { return V{"oob_counter: expected NULL or an int32 pointer aligned to 4 bytes"}; }},
  };
}

void check_rules(const std::vector<Rule>& rules) {
  for (const auto& [base_name, cfg] : baselines()) {
    const int op_bit = cfg.op == Op::single ? kSingle : kPacked;
    const Sizes sizes(cfg);
    for (const Rule& rule : rules) {
      if (!(rule.ops & op_bit)) continue;
      HostCall call(cfg);
      rule.breaks(call.args, sizes);
      INFO("baseline " << base_name << ", rule: " << rule.name);
      auto r = validate_untouched(cfg.op, call);
      REQUIRE_FALSE(r.ok());
      INFO("message: " << r.error().message);
      CHECK(r.error().code == rule.code);
      for (const std::string& part : rule.expect(sizes)) {
        INFO("expected to contain: " << part);
        CHECK(r.error().message.find(part) != std::string::npos);
      }
    }
  }
}

// Route stream splits work item i into i / H and i % H as
// floor(2i * heads_mul / 2^64) (templates/kda_pipeline.cuh, HeadSplit). It must
// be the exact quotient for every H in 1..128 over every item a call can have
// (R or N up to 2^31 - 1, times H: below 2^38), here at each multiple of H near
// the ends and at random points, one past and one before.
TEST_CASE("validate: route stream's head multiplier divides every item index exactly", "[validate]") {
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  auto next = [&seed] {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return seed;
  };
  for (int32_t h = 1; h <= 128; ++h) {
    INFO("H = " << h);
    const uint64_t mul = kda_heads_multiplier(h), H = static_cast<uint64_t>(h);
    CHECK(mul == ((uint64_t{1} << 63) + H - 1) / H);
    const uint64_t end = uint64_t{128} * std::numeric_limits<int32_t>::max();
    std::vector<uint64_t> at;
    for (uint64_t q = 0; q < 64; ++q) at.push_back(q * H);
    for (uint64_t q = end / H - 64; q <= end / H + 1; ++q) at.push_back(q * H);
    for (int r = 0; r < 2000; ++r) at.push_back((next() % (end / H)) * H);
    for (uint64_t base : at)
      for (uint64_t i : {base, base + 1, base + H - 1, base == 0 ? 0 : base - 1}) {
        const auto quot = static_cast<uint64_t>((static_cast<unsigned __int128>(i << 1) * mul) >> 64);
        if (quot != i / H) FAIL_CHECK("i = " << i << ": " << quot << ", expected " << i / H);
      }
  }
}

TEST_CASE("validate: the baselines pass and fill the parameter block", "[validate]") {
  for (const auto& [name, cfg] : baselines()) {
    INFO("baseline " << name);
    HostCall call(cfg);
    auto r = validate_untouched(cfg.op, call);
    INFO((r.ok() ? std::string() : r.error().message));
    REQUIRE(r.ok());
    const ValidatedCall& v = *r;
    const auto& a = call.args;
    const Sizes s(cfg);
    const KernelKey& f = v.shape.family;
    CHECK(f.op == cfg.op);
    CHECK(f.heads == cfg.heads);
    CHECK(f.tokens == cfg.tokens);
    CHECK(f.state == cfg.state);
    CHECK(f.conv == cfg.conv);
    CHECK(f.gate == cfg.gate);
    CHECK(v.shape.mode == IndicesMode::unique_or_null);
    CHECK(v.shape.rows == s.R);
    CHECK(v.shape.num_seqs == (cfg.op == Op::packed ? s.N : 0));
    CHECK(v.params.num_slots == s.S);
    CHECK(v.params.heads == cfg.heads);  // route stream's H
    CHECK(v.params.heads_mul == kda_heads_multiplier(cfg.heads));  // and its multiplier

    const KdaParams& p = v.params;
    CHECK(static_cast<const void*>(p.x) == a.x.data);
    CHECK(static_cast<const void*>(p.conv_weight) == a.conv_weight.data);
    CHECK(static_cast<const void*>(p.conv_state) == a.conv_state.data);
    CHECK(static_cast<const void*>(p.raw_gate) == a.raw_gate.data);
    CHECK(static_cast<const void*>(p.raw_beta) == a.raw_beta.data);
    CHECK(static_cast<const void*>(p.A_log) == a.A_log.data);
    CHECK(static_cast<const void*>(p.dt_bias) == a.dt_bias.data);
    CHECK(static_cast<const void*>(p.state_indices) == a.state_indices.data);
    CHECK(p.state == a.state.data);
    CHECK(static_cast<const void*>(p.output_gate) == a.output_gate.data);
    CHECK(static_cast<const void*>(p.norm_weight) == a.norm_weight.data);
    CHECK(static_cast<const void*>(p.output) == a.output.data);
    if (cfg.op == Op::packed) {
      CHECK(static_cast<const void*>(p.query_start_loc) == a.query_start_loc.data);
      CHECK(static_cast<const void*>(p.num_accepted) == a.num_accepted_tokens.data);
    } else {
      CHECK(p.query_start_loc == nullptr);
      CHECK(p.num_accepted == nullptr);
    }
    CHECK(p.oob_counter == nullptr);
    CHECK(p.x_row_stride == s.qkv + cfg.row_pad);
    CHECK(p.conv_slot_stride == s.qkv * s.K + cfg.conv_pad);
    CHECK(p.gate_row_stride == s.hidden + cfg.row_pad);
    CHECK(p.beta_row_stride == s.H + cfg.row_pad);
    CHECK(p.state_slot_stride == s.H * 16384 + cfg.state_pad);
    CHECK(p.ogate_row_stride == s.hidden + cfg.row_pad);
    CHECK(p.out_row_stride == s.hidden + cfg.row_pad);
    CHECK(p.rows == s.R);
    CHECK(p.num_seqs == (cfg.op == Op::packed ? s.N : 0));
    CHECK(p.num_slots == s.S);
    CHECK(p.lower_bound == a.lower_bound);
    CHECK(p.norm_eps == a.norm_eps);
  }
}

TEST_CASE("validate: each tensor's pointer, dtype, rank and alignment", "[validate]") {
  check_rules(per_tensor_rules());
}

TEST_CASE("validate: shapes, strides, sizes and scalars, one broken at a time", "[validate]") {
  check_rules(specific_rules());
}

TEST_CASE("tensor_view and dense_tensor_view: the views the API takes", "[validate]") {
  int storage = 0;
  const TensorView t = tensor_view(&storage, KDAJIT_DTYPE_BF16, {4, 384}, {400, 1});
  CHECK(t.data == &storage);
  CHECK(t.dtype == KDAJIT_DTYPE_BF16);
  CHECK(t.ndim == 2);
  CHECK((t.shape[0] == 4 && t.shape[1] == 384 && t.strides[0] == 400 && t.strides[1] == 1));
  const TensorView d = dense_tensor_view(&storage, KDAJIT_DTYPE_F32, {3, 4, 256});
  CHECK(d.ndim == 3);
  CHECK((d.strides[0] == 1024 && d.strides[1] == 256 && d.strides[2] == 1));
  CHECK(tensor_view(&storage, KDAJIT_DTYPE_F32, {1, 2, 3, 4, 5}, {120, 60, 20, 5, 1}).ndim == -1);
  CHECK(tensor_view(&storage, KDAJIT_DTYPE_F32, {2, 3}, {3}).ndim == -1);
  CHECK(dense_tensor_view(&storage, KDAJIT_DTYPE_F32, {1, 2, 3, 4, 5}).ndim == -1);
  // Validation names such a view.
  HostCall call(CallConfig{});
  call.args.x = tensor_view(call.args.x.data, KDAJIT_DTYPE_BF16, {1, 1, 1, 1, 1}, {1, 1, 1, 1, 1});
  auto r = validate_untouched(Op::single, call);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ErrorCode::invalid_argument);
  CHECK(r.error().message.find("x: expected ndim 2") != std::string::npos);
  CHECK(r.error().message.find("got ndim -1") != std::string::npos);
}

TEST_CASE("validate: an unknown op", "[validate]") {
  HostCall call(CallConfig{});
  auto r = validate_untouched(static_cast<Op>(7), call);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ErrorCode::invalid_argument);
  CHECK(r.error().message == "op: expected single|packed, got 7");
}

// Variations inside the contract that must pass.
TEST_CASE("validate: what the contract leaves free", "[validate]") {
  for (const auto& [name, base] : baselines()) {
    const Sizes s(base);
    auto passes = [&](const char* what, const CallConfig& cfg,
                      const std::function<void(kdajit_decode_args_t&)>& change) {
      INFO("baseline " << name << ": " << what);
      HostCall call(cfg);
      change(call.args);
      auto r = validate_untouched(cfg.op, call);
      INFO((r.ok() ? std::string() : r.error().message));
      CHECK(r.ok());
      return r;
    };

    CallConfig softplus = base;
    softplus.gate = Gate::softplus;
    for (float lb : {0.5f, 0.0f, std::numeric_limits<float>::quiet_NaN()}) {
      auto r = passes("softplus ignores lower_bound", softplus, [&](auto& a) { a.lower_bound = lb; });
      if (r.ok()) CHECK(r->shape.family.gate == Gate::softplus);
    }

    (void)passes("norm_eps 0", base, [](auto& a) { a.norm_eps = 0.0f; });

    CallConfig tight = base;
    tight.row_pad = tight.conv_pad = tight.state_pad = 0;
    (void)passes("no padding in the free strides", tight, [](auto&) {});

    CallConfig one_row = base;
    one_row.rows = 1;
    if (auto r = passes("one row, any row stride", one_row, [](auto& a) {
          a.x.strides[0] = 5;
          a.raw_gate.strides[0] = -3;
          a.output.strides[0] = 0;
        });
        r.ok()) {
      // A row stride that is never stepped over reaches the kernel packed.
      CHECK(r->params.x_row_stride == s.qkv);
      CHECK(r->params.gate_row_stride == s.hidden);
      CHECK(r->params.out_row_stride == s.hidden);
    }

    CallConfig one_slot = base;
    one_slot.slots = 1;
    if (auto r = passes("one slot (the null slot only), any slot stride", one_slot, [](auto& a) {
          a.state.strides[0] = 3;
          a.conv_state.strides[0] = 1;
        });
        r.ok()) {
      CHECK(r->params.num_slots == 1);
      CHECK(r->params.state_slot_stride == s.H * 16384);
      CHECK(r->params.conv_slot_stride == s.qkv * s.K);
    }

    CallConfig one_head = base;
    one_head.heads = 1;
    (void)passes("one head: head strides are never used", one_head, [](auto& a) {
      a.raw_beta.strides[1] = 7;
      a.raw_gate.strides[1] = 9;
      a.state.strides[1] = 11;
      a.A_log.strides[0] = 13;
    });

    CallConfig max_heads = base;
    max_heads.heads = 128;
    (void)passes("128 heads", max_heads, [](auto&) {});

    (void)passes("positive_unique", base, [](auto& a) { a.state_indices_mode = KDAJIT_INDICES_POSITIVE_UNIQUE; });

    {
      HostCall call(base);
      auto* counter = reinterpret_cast<int32_t*>(call.arena.base());
      call.args.oob_counter = counter;
      auto r = validate_untouched(base.op, call);
      REQUIRE(r.ok());
      CHECK(r->params.oob_counter == counter);
    }

    if (base.op == Op::single) {
      (void)passes("single: repeated_positive", base,
                   [](auto& a) { a.state_indices_mode = KDAJIT_INDICES_REPEATED_POSITIVE; });
      (void)passes("single: the packed-only tensors are ignored", base, [](auto& a) {
        a.query_start_loc.ndim = 9;
        a.num_accepted_tokens.dtype = static_cast<kdajit_dtype_t>(9);
      });
    } else {
      // Rows past qsl[N] are zeroed on the device, so R need not be N*T.
      CallConfig few = base;
      few.rows = 1;
      (void)passes("packed: one row", few, [](auto&) {});
      CallConfig many = base;
      many.rows = base.seqs * base.tokens + 7;
      (void)passes("packed: more rows than N*T", many, [](auto&) {});
      CallConfig t16 = base;
      t16.tokens = 16;
      t16.seqs = 1;
      auto r = passes("packed: T = 16, one sequence, any row stride", t16,
                      [](auto& a) { a.state_indices.strides[0] = 99; });
      if (r.ok()) CHECK(r->shape.family.tokens == 16);
    }
  }
}

}  // namespace
}  // namespace kdajit
