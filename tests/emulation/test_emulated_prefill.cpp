// The prefill op's kernel (templates/kda_prefill.cu, the source `kdajit show`
// prints for the key) emulated on the CPU (cuda_on_cpu.hpp) against the f64
// reference: the conv from the slot's taps and its write-back, the gates, the
// chunked delta rule, the gated RMSNorm whose sums cross a split route's
// cluster through distributed shared memory, and the state written back, on
// every route. The call is validated and laid out by the runtime's own code
// (validate_prefill, launch_plan); outputs, states and shared memory start
// poisoned; the check is test_gpu_prefill's (ref::compare over the
// reference's write plan, §10's state limits).
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "catch.hpp"
#include "emulated_launch.hpp"
#include "kdajit/kdajit.hpp"
#include "kdajit/problem.hpp"
#include "kdajit/reference.hpp"

using namespace kdajit;
using ref::Problem;

namespace {

struct Call {
  std::vector<int32_t> lengths, slots, initial;  // per sequence
  int num_slots = 6;
  emu::Workspace* workspace = nullptr;  // route twopass: reused (else a fresh poisoned one)
  int row_pad = 8;                      // odd: the row tensors are not 8-byte aligned (twopass's norm: element-wise)
  int sm_count = 132;                   // the device's (route twopass: 8 state pass CTAs per sequence and head here)
  std::vector<int32_t> qsl{};           // query_start_loc as given (empty: the lengths from row 0)
  int undefined_from = 0, undefined_to = 0;  // output rows in two live ranges: taken from the kernel's
};

// The default call: a new prompt of two chunks (the second of one row, no
// initial state), an empty one, a short one from its slot; slots 1..3 of 6.
Call default_call() { return {{65, 0, 3}, {1, 2, 3}, {0, 1, 1}}; }

void check_key(const std::string& key_name, kdajit_dtype_t state, kdajit_conv_layout_t conv, kdajit_gate_t gate,
               uint64_t seed, const Call& c = default_call(), unsigned max_wave = 0, float lower_bound = -5.f) {
  ref::PrefillMeta meta;
  meta.qsl = c.qsl;
  if (meta.qsl.empty()) {
    meta.qsl.push_back(0);
    for (int32_t len : c.lengths) meta.qsl.push_back(meta.qsl.back() + len);
  }
  meta.slots = c.slots;
  meta.initial = c.initial;
  ref::ProblemSpec spec;
  spec.op = KDAJIT_OP_SINGLE;
  spec.heads = 2;
  spec.state_dtype = state;
  spec.conv = conv;
  spec.gate = gate;
  spec.rows = c.qsl.empty() ? meta.qsl.back() : *std::max_element(meta.qsl.begin(), meta.qsl.end());
  spec.null_rows = spec.rows;  // the problem's own slots play no part
  spec.num_slots = c.num_slots;
  spec.row_pad = c.row_pad;
  spec.slot_pad = 8;
  spec.lower_bound = lower_bound;
  spec.seed = seed;
  auto made = Problem::make(spec);
  REQUIRE(made.ok());
  Problem expected = *made, got = std::move(made).value();
  REQUIRE(ref::prefill(ref::prefill_args(expected, meta)).ok());
  auto plan = ref::plan_prefill_writes(ref::prefill_args(expected, meta));
  REQUIRE(plan.ok());

  kdajit_prefill_args_t a{};
  a.struct_size = sizeof a;
  ref::copy_shared_fields(got.args(), a);
  const auto N = static_cast<int64_t>(c.lengths.size());
  a.state_indices = dense_tensor_view(meta.slots.data(), KDAJIT_DTYPE_INT32, {N});
  a.query_start_loc = dense_tensor_view(meta.qsl.data(), KDAJIT_DTYPE_INT32, {N + 1});
  a.has_initial_state = dense_tensor_view(meta.initial.data(), KDAJIT_DTYPE_INT32, {N});
  std::optional<emu::Workspace> fresh;
  if (key_name.find(".route_twopass.") != std::string::npos) {
    emu::Workspace* ws = c.workspace != nullptr ? c.workspace : &fresh.emplace(N, spec.rows, spec.heads);
    a.workspace = ws->data();
    a.workspace_bytes = ws->size();
  }
  auto call = validate_prefill(a);
  INFO(key_name << ": " << (call ? std::string() : call.error().message));
  REQUIRE(call.ok());
  REQUIRE_NOTHROW(emu::emulate_call(key_name, *call, max_wave, c.sm_count));

  const kdajit_tensor_t& out = got.view(ref::Tensor::output);
  for (int64_t r = c.undefined_from; r < c.undefined_to; ++r)
    for (int64_t h = 0; h < out.shape[1]; ++h)
      for (int64_t d = 0; d < out.shape[2]; ++d)
        ref::store_bits16(expected.view(ref::Tensor::output), {r, h, d}, ref::load_bits16(out, {r, h, d}));
  const ref::CompareReport r = ref::compare(expected, got, *plan, ref::chunked_tolerances());
  INFO(key_name << ": " << r.summary());
  CHECK(r.pass);
}

}  // namespace

TEST_CASE("emulated prefill kernel: f32 state, SD conv, bounded gate, every route", "[emulation][prefill]") {
  for (const char* route : {"rowcta", "split2", "split4", "split8"})
    check_key(std::string("kda_prefill.h2.state_f32.conv_sd.t64.gate_bounded.route_") + route + ".sm_90",
              KDAJIT_DTYPE_F32, KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 9800);
}

TEST_CASE("emulated prefill kernel: bf16 state, DS conv, softplus gate, rowcta and split2", "[emulation][prefill]") {
  for (const char* route : {"rowcta", "split2"})
    check_key(std::string("kda_prefill.h2.state_bf16.conv_ds.t64.gate_softplus.route_") + route + ".sm_90",
              KDAJIT_DTYPE_BF16, KDAJIT_CONV_DS, KDAJIT_GATE_SOFTPLUS, 9801);
}

TEST_CASE("emulated prefill kernel: the bounded programs serve bf16 state and DS conv too, every route",
          "[emulation][prefill]") {
  // One program per (gate, route) serves both state dtypes and conv layouts
  // (KdaParams::state_bf16, the conv strides): the other three pairs, spread over the routes.
  const struct {
    const char* route;
    kdajit_dtype_t state;
    kdajit_conv_layout_t conv;
    const char* name;
  } cases[] = {{"rowcta", KDAJIT_DTYPE_BF16, KDAJIT_CONV_DS, "state_bf16.conv_ds"},
               {"split2", KDAJIT_DTYPE_F32, KDAJIT_CONV_DS, "state_f32.conv_ds"},
               {"split4", KDAJIT_DTYPE_BF16, KDAJIT_CONV_SD, "state_bf16.conv_sd"},
               {"split8", KDAJIT_DTYPE_BF16, KDAJIT_CONV_DS, "state_bf16.conv_ds"}};
  for (const auto& c : cases)
    check_key(std::string("kda_prefill.h2.") + c.name + ".t64.gate_bounded.route_" + c.route + ".sm_90", c.state, c.conv,
              KDAJIT_GATE_BOUNDED, 9804);
}

TEST_CASE("emulated prefill kernel: null and out-of-range slots, every sequence through one CTA", "[emulation][prefill]") {
  // Slot 0 (null) and 9 (past S = 6) compute nothing and write zero rows; the
  // others run in order on one CTA per head and rank (its shared memory
  // carries the previous sequence's values).
  const Call c{{65, 3, 2, 70}, {1, 0, 9, 2}, {0, 1, 1, 1}};
  for (const char* route : {"rowcta", "split2"})
    check_key(std::string("kda_prefill.h2.state_f32.conv_sd.t64.gate_bounded.route_") + route + ".sm_90",
              KDAJIT_DTYPE_F32, KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 9802, c, 1);
}

TEST_CASE("emulated prefill kernel: route twopass, row tensors not 8-byte aligned (the norm kernel element-wise)",
          "[emulation][prefill]") {
  Call c = default_call();
  c.row_pad = 3;
  check_key("kda_prefill.h2.state_f32.conv_sd.t64.gate_bounded.route_twopass.sm_90", KDAJIT_DTYPE_F32, KDAJIT_CONV_SD,
            KDAJIT_GATE_BOUNDED, 9805, c);
}

TEST_CASE("emulated prefill kernel: route pipe16, a weak decay from the slots' states (S W^T weighs on every token)",
          "[emulation][prefill]") {
  // With lower_bound -0.1 the state's products weigh on every token row of a
  // chunk, so a lost element of a slot's operands shows: β's 64 gate threads
  // once wrote past its 16 entries into the ring's first slot.
  const Call c{{150, 40, 75}, {4, 5, 6}, {1, 1, 1}};
  emu::set_slow_warps(8, 15);
  check_key("kda_prefill.h2.state_f32.conv_sd.t16.gate_bounded.route_pipe16.sm_90", KDAJIT_DTYPE_F32, KDAJIT_CONV_SD,
            KDAJIT_GATE_BOUNDED, 9841, c, 1, -0.1f);
  emu::set_slow_warps(1, 0);
}

TEST_CASE("emulated prefill kernel: route twopass, 1, 2 and 4 state pass CTAs per (sequence, head)",
          "[emulation][prefill]") {
  // N x H = 6: P = 1 on 2 SMs (every state warp in one CTA), P = 2 on 12
  // (half of them), P = 4 on 24 (the warps of a group share its step 5). On
  // sm_90 step 5 at P <= 2 runs on wgmma, on sm_100a on mma.sync. Every
  // sequence starts from its slot's state, two run past one chunk, and the
  // decay is weak (lower_bound -0.1), so that S W^T and S Qg^T weigh on every
  // token row of a chunk (with the default call and gate, rows 8.. of W and
  // Q̂ ∘ Γ are below the tolerance: a wrong row stride there passed).
  Call c{{130, 0, 70}, {1, 2, 3}, {1, 1, 1}};
  for (const char* arch : {"sm_90", "sm_100a"})
    for (int sms : {2, 12, 24}) {
      c.sm_count = sms;
      check_key(std::string("kda_prefill.h2.state_f32.conv_sd.t64.gate_bounded.route_twopass.") + arch,
                KDAJIT_DTYPE_F32, KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 9806 + static_cast<uint64_t>(sms), c, 0, -0.1f);
    }
}

TEST_CASE("emulated prefill kernel: a strong decay (the per-element path for A and M), rowcta and split2", "[emulation][prefill]") {
  for (const char* route : {"rowcta", "split2"})
    check_key(std::string("kda_prefill.h2.state_f32.conv_sd.t64.gate_bounded.route_") + route + ".sm_90",
              KDAJIT_DTYPE_F32, KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 9803, default_call(), 0, -20.f);
}

TEST_CASE("emulated prefill kernel: chunks of 16 (routes rowcta16 and pipe16), both programs, a strong decay",
          "[emulation][prefill]") {
  // Lengths around the chunk edges of 16 (0, 1, 15, 16, 17, 40), new prompts
  // and continued ones; then every sequence through one CTA per head with
  // bf16 state, DS conv and the softplus gate (route pipe16: the ring's
  // phases carried across sequences); then the per-element path for the
  // chunk's one block of A and M.
  const Call c{{17, 0, 1, 40, 16, 15}, {1, 2, 3, 4, 5, 6}, {0, 1, 1, 0, 1, 1}, 8};
  for (const std::string route : {"rowcta16", "pipe16"}) {
    INFO("route " << route);
    check_key("kda_prefill.h2.state_f32.conv_sd.t16.gate_bounded.route_" + route + ".sm_90", KDAJIT_DTYPE_F32,
              KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 9830, c);
    check_key("kda_prefill.h2.state_bf16.conv_ds.t16.gate_softplus.route_" + route + ".sm_90", KDAJIT_DTYPE_BF16,
              KDAJIT_CONV_DS, KDAJIT_GATE_SOFTPLUS, 9831, c, 1);
    check_key("kda_prefill.h2.state_f32.conv_sd.t16.gate_bounded.route_" + route + ".sm_90", KDAJIT_DTYPE_F32,
              KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 9832, c, 0, -20.f);
  }
}

TEST_CASE("emulated prefill kernel: route pipe16, long sequences through one CTA (the ring full)",
          "[emulation][prefill]") {
  // Twenty-five chunks of 16 walk one CTA per head with the consumer's
  // warps (8-15) held back most rounds, so the producers fill the ring and
  // wait on its empty barriers: a slot handed back before the consumer's
  // last read of it (the norm's gate rows) shows in the outputs.
  const Call c{{150, 3, 240}, {4, 5, 6}, {1, 0, 1}};
  emu::set_slow_warps(8, 15);
  check_key("kda_prefill.h2.state_f32.conv_sd.t16.gate_bounded.route_pipe16.sm_90", KDAJIT_DTYPE_F32, KDAJIT_CONV_SD,
            KDAJIT_GATE_BOUNDED, 9840, c, 1);
  emu::set_slow_warps(1, 0);
}

TEST_CASE("emulated prefill kernel: route twopass, both programs, one workspace over two calls", "[emulation][prefill]") {
  // The default call (a new prompt of two chunks, an empty and a short one),
  // then longer sequences over CTAs that walk several units and sequences,
  // on the same workspace (its units from the call before); the softplus
  // program with bf16 state and DS conv.
  emu::Workspace ws(3, 200 + 130 + 1, 2);
  Call c = default_call();
  c.workspace = &ws;
  check_key("kda_prefill.h2.state_f32.conv_sd.t64.gate_bounded.route_twopass.sm_90", KDAJIT_DTYPE_F32,
            KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 9811, c);
  c = {{200, 130, 1}, {3, 1, 2}, {1, 0, 1}};
  c.workspace = &ws;
  check_key("kda_prefill.h2.state_f32.conv_sd.t64.gate_bounded.route_twopass.sm_90", KDAJIT_DTYPE_F32,
            KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 9812, c, 2);
  check_key("kda_prefill.h2.state_bf16.conv_ds.t64.gate_softplus.route_twopass.sm_90", KDAJIT_DTYPE_BF16,
            KDAJIT_CONV_DS, KDAJIT_GATE_SOFTPLUS, 9813, default_call());
}

TEST_CASE("emulated prefill kernel: route twopass, a chunk without its unit (the norm kernel walks)",
          "[emulation][prefill]") {
  // query_start_loc steps back: [0, 200) and [100, 300) live (rows 100..199 in
  // both: no defined value), [200, 100) malformed. Units n + qsl[n] / 64 = 0,
  // 4, 3: unit 3 holds chunk 3 of sequence 0, so the state pass computes chunk
  // 0 of sequence 2 itself, sets the call's flag, and the norm kernel walks
  // the sequences (rows 200..299 and both conv windows are checked).
  Call c{{0, 0, 0}, {1, 2, 3}, {1, 0, 1}};
  c.qsl = {0, 200, 100, 300};
  c.undefined_from = 100;
  c.undefined_to = 200;
  check_key("kda_prefill.h2.state_f32.conv_sd.t64.gate_bounded.route_twopass.sm_90", KDAJIT_DTYPE_F32,
            KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 9816, c);
}

TEST_CASE("emulated prefill kernel: route twopass, a null slot, a strong decay", "[emulation][prefill]") {
  // A null slot among live sequences (its units hold no chunk, its rows are
  // zeros), then the per-element path for A and M in the intra-chunk kernel.
  Call c{{65, 70, 3}, {2, 0, 1}, {1, 1, 0}};
  check_key("kda_prefill.h2.state_f32.conv_sd.t64.gate_bounded.route_twopass.sm_90", KDAJIT_DTYPE_F32,
            KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 9814, c, 1);
  check_key("kda_prefill.h2.state_f32.conv_sd.t64.gate_bounded.route_twopass.sm_90", KDAJIT_DTYPE_F32,
            KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 9815, c, 0, -20.f);
}
