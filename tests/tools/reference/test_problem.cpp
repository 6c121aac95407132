// The random problems (docs/CONTRACT.md §8 draws, slots, padding) and the checker:
// compare() must pass a correct result and flag a planted error in every tensor.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "catch.hpp"
#include "kdajit/bf16.hpp"
#include "kdajit/kernel_key.hpp"
#include "kdajit/problem.hpp"
#include "test_util.hpp"

using namespace kdajit::ref;
using namespace kdajit::ref::test;
using kdajit::ref::Tensor;

namespace {

constexpr int D = 128;

TEST_CASE("problem: same seed same bytes, new seed new values, no zeros, shuffled slots", "[problem]") {
  ProblemSpec s;
  s.heads = 2;
  s.rows = 12;
  s.null_rows = 2;
  s.oob_rows = 1;
  s.row_pad = 8;
  s.seed = 3;
  Problem a = make_problem(s), b = make_problem(s);
  s.seed = 4;
  Problem c = make_problem(s);
  for (int i = 0; i < kNumTensors; ++i) CHECK(a.bytes(static_cast<Tensor>(i)) == b.bytes(static_cast<Tensor>(i)));
  for (Tensor t : {Tensor::x, Tensor::conv_state, Tensor::state, Tensor::raw_gate, Tensor::A_log, Tensor::norm_weight})
    CHECK(a.bytes(t) != c.bytes(t));
  // Draws are never exactly zero.
  for (int64_t r = 0; r < a.rows(); ++r)
    for (int64_t ch = 0; ch < 3 * 2 * D; ++ch) REQUIRE(get(a, Tensor::x, {r, ch}) != 0.0);
  // Distributions roughly as in docs/CONTRACT.md §8 (mean, spread).
  double sum = 0, sum2 = 0, nw = 0;
  for (int64_t i = 0; i < 2 * D; ++i) {
    const double v = get(a, Tensor::dt_bias, {i});
    sum += v;
    sum2 += v * v;
  }
  CHECK(std::fabs(sum / (2 * D)) < 0.03);
  CHECK(std::sqrt(sum2 / (2 * D)) > 0.07);
  CHECK(std::sqrt(sum2 / (2 * D)) < 0.13);
  for (int64_t i = 0; i < D; ++i) nw += get(a, Tensor::norm_weight, {i});
  CHECK(std::fabs(nw / D - 1.0) < 0.03);
  // Slots: 9 live rows with distinct slots in 1..S-1, not in increasing order; 2 null, 1 out of range.
  std::set<int> live;
  int nulls = 0, oob = 0;
  bool increasing = true;
  int prev = 0;
  for (int64_t r = 0; r < a.rows(); ++r) {
    const int sl = slot_of(a, {r});
    if (sl <= 0) { ++nulls; continue; }
    if (sl >= a.num_slots()) { ++oob; continue; }
    live.insert(sl);
    increasing = increasing && sl > prev;
    prev = sl;
  }
  CHECK(nulls == 2);
  CHECK(oob == 1);
  CHECK(live.size() == 9);
  CHECK_FALSE(increasing);
  CHECK(a.num_slots() == 9 + 4);  // null slot + 3 spares
  // Outputs start poisoned; padding holds NaN patterns.
  CHECK(load_bits16(a.view(Tensor::output), {0, 0, 0}) == 0xffff);
  CHECK(std::isnan(bf16_bits_to_f32(load_bits16(a.view(Tensor::x), {0, 3 * 2 * D}))));  // first padding element
}

TEST_CASE("problem: packed metadata follows the spec fields", "[problem]") {
  ProblemSpec s;
  s.op = KDAJIT_OP_PACKED;
  s.heads = 1;
  s.tokens = 4;
  s.seq_lens = {4, 0, 2, 3, 1};
  s.num_accepted = {2, 1, 4, 3, 0};
  s.extra_rows = 2;
  s.null_rows = 1;
  s.oob_rows = 1;
  s.null_checkpoints = 2;
  s.seed = 8;
  Problem p = make_problem(s);
  CHECK(p.rows() == 12);
  CHECK(p.num_slots() == 5 * 4 + 4);
  const std::vector<int> qsl = {0, 4, 4, 6, 9, 10};
  for (int64_t n = 0; n <= 5; ++n) CHECK(get(p, Tensor::query_start_loc, {n}) == qsl[static_cast<size_t>(n)]);
  for (int64_t n = 0; n < 5; ++n) CHECK(get(p, Tensor::num_accepted_tokens, {n}) == s.num_accepted[static_cast<size_t>(n)]);
  int broken_seqs = 0, broken_ckpts = 0;
  std::set<int> valid;
  for (int64_t n = 0; n < 5; ++n) {
    const int a = std::clamp(s.num_accepted[static_cast<size_t>(n)], 1, 4);
    for (int64_t t = 0; t < 4; ++t) {
      const int sl = slot_of(p, {n, t});
      const bool ok = sl >= 1 && sl < p.num_slots();
      if (ok) CHECK(valid.insert(sl).second);  // distinct
      else if (t == 0 || t == a - 1) ++broken_seqs;
      else ++broken_ckpts;
    }
  }
  CHECK(broken_seqs == 2);
  CHECK(broken_ckpts == 2);
}

TEST_CASE("problem: bad specs are errors naming the field", "[problem]") {
  auto error_of = [](const ProblemSpec& s) {
    auto p = Problem::make(s);
    REQUIRE_FALSE(p.ok());
    return p.error().message;
  };
  ProblemSpec s;
  s.heads = 0;
  CHECK(error_of(s).find("ProblemSpec.heads") != std::string::npos);
  s = {};
  s.tokens = 2;
  CHECK(error_of(s).find("ProblemSpec.tokens") != std::string::npos);
  s = {};
  s.rows = 2;
  s.null_rows = 3;
  CHECK(error_of(s).find("null_rows") != std::string::npos);
  s = {};
  s.rows = 6;
  s.num_slots = 3;
  CHECK(error_of(s).find("ProblemSpec.num_slots") != std::string::npos);
  s = {};
  s.mode = KDAJIT_INDICES_POSITIVE_UNIQUE;
  s.null_rows = 1;
  CHECK(error_of(s).find("ProblemSpec.null_rows") != std::string::npos);
  s = {};
  s.op = KDAJIT_OP_PACKED;
  s.tokens = 2;
  s.seq_lens = {1, 2};
  s.num_accepted = {1};
  CHECK(error_of(s).find("ProblemSpec.num_accepted") != std::string::npos);
}

TEST_CASE("problem: empty calls (R = 0, N = 0) run and leave the caches untouched", "[problem]") {
  ProblemSpec s;
  s.heads = 1;
  s.rows = 0;
  Problem p = make_problem(s);
  CHECK(p.rows() == 0);
  Problem q = p;
  run_ref(q);
  CHECK(bitwise_equal(p, q));
  ProblemSpec ps;
  ps.op = KDAJIT_OP_PACKED;
  ps.heads = 1;
  ps.tokens = 2;
  Problem e = make_problem(ps);
  CHECK(e.num_seqs() == 0);
  Problem f = e;
  run_ref(f);
  CHECK(bitwise_equal(e, f));
}

TEST_CASE("problem: buffers() backs every view and copies re-point their views", "[problem]") {
  ProblemSpec s;
  s.op = KDAJIT_OP_PACKED;
  s.tokens = 2;
  s.seq_lens = {2, 1};
  s.heads = 1;
  Problem p = make_problem(s);
  int written = 0;
  const kdajit_decode_args_t args = p.args();
  for (const BufferRef& b : p.buffers()) {
    CHECK((args.*b.view).data == b.bytes->data());
    written += b.written;
  }
  CHECK(p.buffers().size() == kNumTensors);
  CHECK(written == 3);
  Problem q = p;
  CHECK(q.args().state.data != p.args().state.data);
  CHECK(q.args().state.data == q.bytes(Tensor::state).data());
  Problem m = std::move(q);
  CHECK(m.args().x.data == m.bytes(Tensor::x).data());
  // The single op has no query_start_loc / num_accepted_tokens buffers.
  ProblemSpec single;
  single.heads = 1;
  CHECK(make_problem(single).buffers().size() == kNumTensors - 2);
}

TEST_CASE("problem: default_spec for every kind of preset key runs and checks clean", "[problem]") {
  for (const char* name : {"kda_single.h2.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90",
                           "kda_packed.h1.state_bf16.conv_ds.t4.gate_softplus.route_rowcta.sm_90a"}) {
    auto key = kdajit::parse_key(name);
    REQUIRE(key.ok());
    Problem p = make_problem(default_spec(*key, 5));
    Problem expected = p;
    Capture cap;
    REQUIRE(expected.run_reference(&cap).ok());
    const CompareReport rep = compare(expected, expected);
    INFO(rep.summary());
    CHECK(rep.pass);
    // Rounding the exact output to bf16 alone costs about 2e-3 (docs/CONTRACT.md §8).
    double err2 = 0, ref2 = 0;
    for (int64_t r = 0; r < p.rows(); ++r)
      for (int64_t h = 0; h < p.heads(); ++h)
        for (int64_t v = 0; v < D; ++v) {
          const double y = cap.output[static_cast<size_t>((r * p.heads() + h) * D + v)];
          const double o = get(expected, Tensor::output, {r, h, v});
          err2 += (o - y) * (o - y);
          ref2 += y * y;
        }
    CHECK(std::sqrt(err2 / ref2) < 4e-3);
    CHECK(std::sqrt(err2 / ref2) > 5e-4);
  }
}

// ---- the checker ----

struct Case {
  Problem expected, got;
};

Case make_case(kdajit_op_t op) {
  ProblemSpec s;
  s.heads = 2;
  s.row_pad = 8;
  s.slot_pad = 8;
  s.seed = 77;
  if (op == KDAJIT_OP_PACKED) {
    s.op = op;
    s.tokens = 3;
    s.seq_lens = {3, 1, 2, 0};
    s.num_accepted = {2, 3, 1, 1};
    s.null_rows = 0;
    s.extra_rows = 1;
  } else {
    s.rows = 5;
    s.null_rows = 1;
    s.oob_rows = 1;
  }
  Problem p = make_problem(s);
  Case c{p, p};
  run_ref(c.expected);
  run_ref(c.got);
  return c;
}

void poke_bf16(Problem& p, Tensor t, std::initializer_list<int64_t> idx, double v) { store(p.view(t), idx, v); }

CompareReport check(const Case& c) { return compare(c.expected, c.got); }

bool fails_with(const Case& c, const std::string& needle) {
  const CompareReport rep = check(c);
  INFO(rep.summary());
  return !rep.pass && rep.message.find(needle) != std::string::npos;
}

int live_row(const Problem& p) {
  for (int64_t r = 0; r < p.rows(); ++r)
    if (load_bits16(p.view(Tensor::output), {r, 0, 0}) != 0) return static_cast<int>(r);
  return -1;
}
int zero_row(const Problem& p) {
  for (int64_t r = 0; r < p.rows(); ++r)
    if (load_bits16(p.view(Tensor::output), {r, 0, 0}) == 0 && load_bits16(p.view(Tensor::output), {r, 1, 5}) == 0)
      return static_cast<int>(r);
  return -1;
}
int written_slot(const Problem& p) {
  auto plan = plan_writes(p.op(), p.args());
  for (int64_t s = 0; s < p.num_slots(); ++s)
    if (plan->state_written[static_cast<size_t>(s)]) return static_cast<int>(s);
  return -1;
}
int spare_slot(const Problem& p) {
  auto plan = plan_writes(p.op(), p.args());
  for (int64_t s = p.num_slots() - 1; s > 0; --s)
    if (!plan->state_written[static_cast<size_t>(s)] && !plan->conv_taps_written[static_cast<size_t>(s)]) return static_cast<int>(s);
  return -1;
}

TEST_CASE("compare: a correct result passes, small noise passes", "[compare]") {
  for (auto op : {KDAJIT_OP_SINGLE, KDAJIT_OP_PACKED}) {
    Case c = make_case(op);
    CompareReport rep = check(c);
    INFO(rep.summary());
    CHECK(rep.pass);
    CHECK(rep.message.empty());
    CHECK(rep.output_rel_l2 == 0.0);
    // One bf16 ulp on a few outputs and 1e-6 relative on a written state slot are within tolerance.
    const int r = live_row(c.got);
    for (int64_t v = 0; v < 4; ++v) {
      const uint16_t b = load_bits16(c.got.view(Tensor::output), {r, 0, v});
      store_bits16(c.got.view(Tensor::output), {r, 0, v}, static_cast<uint16_t>(b + 1));
    }
    const int s = written_slot(c.got);
    for (int64_t k = 0; k < D; ++k) set(c.got, Tensor::state, {s, 0, 3, k}, get(c.got, Tensor::state, {s, 0, 3, k}) * (1 + 1e-6));
    rep = check(c);
    INFO(rep.summary());
    CHECK(rep.pass);
    CHECK(rep.output_rel_l2 > 0.0);
  }
}

TEST_CASE("compare: flags a planted error in every tensor", "[compare]") {
  for (auto op : {KDAJIT_OP_SINGLE, KDAJIT_OP_PACKED}) {
    DYNAMIC_SECTION("op " << op) {
      const Case base = make_case(op);
      REQUIRE(check(base).pass);
      const int r = live_row(base.got), z = zero_row(base.got), s = written_slot(base.got), spare = spare_slot(base.got);
      REQUIRE(r >= 0);
      REQUIRE(z >= 0);
      REQUIRE(s > 0);
      REQUIRE(spare > 0);
      Case c = base;
      SECTION("output element far off") {
        poke_bf16(c.got, Tensor::output, {r, 1, 7}, get(c.got, Tensor::output, {r, 1, 7}) + 1.0);
        CHECK(fails_with(c, "output[" + std::to_string(r) + ", 1, 7]"));
      }
      SECTION("output NaN never passes") {
        store_bits16(c.got.view(Tensor::output), {r, 0, 0}, 0x7fc0);
        CHECK(fails_with(c, "not finite"));
      }
      SECTION("output left poisoned") {
        store_bits16(c.got.view(Tensor::output), {r, 1, 127}, 0xffff);
        CHECK(fails_with(c, "not finite"));
      }
      SECTION("output nonzero in a zero row") {
        poke_bf16(c.got, Tensor::output, {z, 0, 3}, 1e-3);
        CHECK(fails_with(c, "must be zero"));
      }
      SECTION("output off by 2% everywhere: relative L2") {
        for (int64_t rr = 0; rr < c.got.rows(); ++rr)
          for (int64_t h = 0; h < 2; ++h)
            for (int64_t v = 0; v < D; ++v) poke_bf16(c.got, Tensor::output, {rr, h, v}, get(c.got, Tensor::output, {rr, h, v}) * 1.02);
        CHECK(fails_with(c, "output: relative L2"));
      }
      SECTION("output row padding written") {
        auto& b = c.got.bytes(Tensor::output);
        const int64_t off = (r * c.got.view(Tensor::output).strides[0] + 2 * D) * 2;  // first padding element of row r
        b[static_cast<size_t>(off)] = std::byte{0};
        CHECK(fails_with(c, "output: 1 byte(s) changed"));
      }
      SECTION("state: a written slot off by 1%") {
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t v = 0; v < D; ++v)
            for (int64_t k = 0; k < D; ++k) set(c.got, Tensor::state, {s, h, v, k}, get(c.got, Tensor::state, {s, h, v, k}) * 1.01);
        CHECK(fails_with(c, "state (f32): relative L2"));
      }
      SECTION("state: a checkpoint not written (slot keeps its before-state)") {
        const auto before = slot_bytes(c.got, Tensor::state, c.got.initial(Tensor::state), s);
        auto& buf = c.got.bytes(Tensor::state);
        std::memcpy(buf.data() + s * c.got.view(Tensor::state).strides[0] * 4, before.data(), before.size());
        CHECK(fails_with(c, "state (f32): relative L2"));
      }
      SECTION("state: NaN in a written slot") {
        set(c.got, Tensor::state, {s, 1, 2, 3}, NAN);
        CHECK(fails_with(c, "state[slot " + std::to_string(s) + ", 1, 2, 3]"));
      }
      SECTION("state: the null slot 0 written") {
        c.got.bytes(Tensor::state)[4] ^= std::byte{0xff};
        CHECK(fails_with(c, "state: 1 byte(s) changed that the call must not write; first at byte 4 (slot 0"));
      }
      SECTION("state: a spare slot written") {
        set(c.got, Tensor::state, {spare, 1, 0, 0}, 0.5);
        CHECK(fails_with(c, "(slot " + std::to_string(spare) + ""));
      }
      SECTION("state: slot padding written") {
        auto& b = c.got.bytes(Tensor::state);
        const int64_t off = (s * c.got.view(Tensor::state).strides[0] + 2 * D * D) * 4;  // padding after slot s
        b[static_cast<size_t>(off)] ^= std::byte{0xff};
        CHECK(fails_with(c, "(slot " + std::to_string(s) + ", outside the written elements)"));
      }
      SECTION("conv_state: a written tap off by one ulp") {
        const uint16_t b = load_bits16(c.got.view(Tensor::conv_state), {s, 5, 0});
        store_bits16(c.got.view(Tensor::conv_state), {s, 5, 0}, static_cast<uint16_t>(b ^ 1));
        CHECK(fails_with(c, "conv_state[slot " + std::to_string(s) + ", channel 5, tap 0]"));
        CHECK(check(c).conv_mismatches == 1);
      }
      SECTION("conv_state: a spare slot written") {
        store_bits16(c.got.view(Tensor::conv_state), {spare, 0, 1}, 0);
        CHECK(fails_with(c, "must stay untouched"));
      }
      SECTION("conv_state: slot padding written") {
        auto& b = c.got.bytes(Tensor::conv_state);
        const kdajit_tensor_t& v = c.got.view(Tensor::conv_state);
        const int64_t off = (spare * v.strides[0] + v.shape[1] * v.shape[2]) * 2;
        b[static_cast<size_t>(off)] = std::byte{0};
        CHECK(fails_with(c, "conv_state: 1 padding byte(s) changed"));
      }
      SECTION("an input changed") {
        c.got.bytes(Tensor::raw_gate)[6] ^= std::byte{0x10};
        CHECK(fails_with(c, "raw_gate: an input changed"));
      }
      SECTION("not copies of one problem") {
        c.got.snapshot();
        CHECK(fails_with(c, "not copies of one problem"));
      }
    }
  }
}

TEST_CASE("compare: packed taps beyond L+1 must stay untouched; bf16 state tolerance", "[compare]") {
  ProblemSpec s;
  s.op = KDAJIT_OP_PACKED;
  s.heads = 1;
  s.tokens = 4;
  s.seq_lens = {2};
  s.state_dtype = KDAJIT_DTYPE_BF16;
  s.seed = 9;
  Problem p = make_problem(s);
  Case c{p, p};
  run_ref(c.expected);
  run_ref(c.got);
  const int cs = slot_of(p, {0, 0});
  REQUIRE(check(c).pass);
  Case tap = c;
  store_bits16(tap.got.view(Tensor::conv_state), {cs, 9, 4}, 0x3f80);  // tap L+2 = 4
  CHECK(fails_with(tap, "conv_state[slot " + std::to_string(cs) + ", channel 9, tap 4]"));
  CHECK(check(tap).message.find("must stay untouched") != std::string::npos);
  // bf16 state: 0.25% noise (after bf16 rounding about 3e-3) on a written slot passes (<= 6e-3), 1% does not.
  Case noisy = c, bad = c;
  const int ck = slot_of(p, {0, 1});
  for (int64_t v = 0; v < D; ++v)
    for (int64_t k = 0; k < D; ++k) {
      const double e = get(c.got, Tensor::state, {ck, 0, v, k});
      set(noisy.got, Tensor::state, {ck, 0, v, k}, e * ((v + k) % 2 ? 1.0025 : 0.9975));
      set(bad.got, Tensor::state, {ck, 0, v, k}, e * ((v + k) % 2 ? 1.02 : 0.98));
    }
  const CompareReport ok = check(noisy);
  INFO(ok.summary());
  CHECK(ok.pass);
  CHECK(ok.state_rel_l2 > 1e-3);
  CHECK(fails_with(bad, "state (bf16): relative L2"));
}

TEST_CASE("compare: bitwise_equal sees every written tensor", "[compare]") {
  Case c = make_case(KDAJIT_OP_SINGLE);
  CHECK(bitwise_equal(c.expected, c.got));
  for (Tensor t : {Tensor::output, Tensor::state, Tensor::conv_state}) {
    Case d = c;
    d.got.bytes(t)[0] ^= std::byte{1};
    CHECK_FALSE(bitwise_equal(d.expected, d.got));
  }
}

}  // namespace
