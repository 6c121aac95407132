// The f64 reference against independent scalar code and against identities
// between the two ops (docs/CONTRACT.md §2-§4).
#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "catch.hpp"
#include "kdajit/bf16.hpp"
#include "kdajit/chunk_problem.hpp"
#include "kdajit/kdajit.hpp"
#include "kdajit/problem.hpp"
#include "kdajit/reference.hpp"
#include "test_util.hpp"

using namespace kdajit::ref;
using namespace kdajit::ref::test;
using kdajit::ref::Tensor;

namespace {

constexpr int D = 128;

// ---- bf16 -----------------------------------------------------------------

TEST_CASE("bf16: hand values, ties to even, NaN, overflow, subnormals", "[bf16]") {
  CHECK(f32_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(bf16_bits_to_f32(0x3f80) == 1.0f);
  CHECK(bf16_bits_to_f32(0xc040) == -3.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even goes down, 1 + 3*2^-8 goes up.
  CHECK(round_bf16(1.0 + 0x1.0p-8) == 1.0);
  CHECK(round_bf16(1.0 + 3 * 0x1.0p-8) == 1.0 + 0x1.0p-6);
  CHECK(round_bf16(1.0 + 0x1.0p-8 + 0x1.0p-30) == 1.0 + 0x1.0p-7);  // just above the tie
  CHECK(f32_to_bf16_bits(1.0f + 0x1.0p-8f) == 0x3f80);
  CHECK(f32_to_bf16_bits(1.0f + 3 * 0x1.0p-8f) == 0x3f82);
  CHECK(std::isnan(round_bf16(NAN)));
  CHECK(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::bit_cast<float>(0x7f800001u)))));  // signalling NaN stays NaN
  CHECK(std::isinf(round_bf16(3.4e38)));
  CHECK(round_bf16(3.39e38) == kBf16Max);  // below max + half an ulp (3.3962e38)
  CHECK(f32_to_bf16_bits(3.4e38f) == 0x7f80);
  CHECK(round_bf16(0x1.0p-133) == 0x1.0p-133);          // smallest bf16 subnormal
  CHECK(round_bf16(0x1.0p-134) == 0.0);                  // tie to even (0)
  CHECK(round_bf16(0x1.8p-134) == 0x1.0p-133);
  CHECK(round_bf16(-2.5) == -2.5);
}

TEST_CASE("bf16: round_bf16 equals the f32 path for every f32-representable value tried", "[bf16]") {
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(gen);
    if (i % 4 == 1) u = (u & 0xffff0000u) | 0x8000u;  // exact ties
    const float f = std::bit_cast<float>(u);
    if (std::isnan(f)) continue;
    const double want = bf16_bits_to_f32(f32_to_bf16_bits(f));
    const double got = round_bf16(static_cast<double>(f));
    if (got != want) FAIL("f32 bits " << u << ": round_bf16 " << got << " vs f32 path " << want);
  }
}

// round_bf16's bit path (bf16's normal range) against the frexp / nearbyint
// form it replaced, on f64 values of every exponent that f32 cannot hold:
// random fraction bits, exact ties, one ulp either side of a tie, the range's
// edges and the values that round up past the largest bf16.
double round_bf16_by_frexp(double x) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  int e = 0;
  std::frexp(x, &e);
  const int ulp_exp = e - 8 > -133 ? e - 8 : -133;
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -ulp_exp)), ulp_exp);
  return std::fabs(r) > kBf16Max ? std::copysign(INFINITY, x) : r;
}

TEST_CASE("bf16: round_bf16 equals the frexp form on f64 values of every exponent", "[bf16]") {
  std::mt19937_64 gen(11);
  auto same = [](double x) {
    const double want = round_bf16_by_frexp(x), got = round_bf16(x);
    if (std::bit_cast<uint64_t>(got) != std::bit_cast<uint64_t>(want))
      FAIL("x = " << std::hexfloat << x << ": round_bf16 " << got << " vs frexp form " << want);
  };
  for (int i = 0; i < 400000; ++i) {
    uint64_t u = gen();
    const uint64_t exp = 1023 - 140 + gen() % 275;  // 2^-140 .. 2^134: subnormal bf16 to past the max
    u = (u & 0x800fffffffffffffull) | (exp << 52);
    switch (i % 4) {
      case 1: u = (u & ~((uint64_t{1} << 45) - 1)) | (uint64_t{1} << 44); break;  // an exact tie
      case 2: u = ((u & ~((uint64_t{1} << 45) - 1)) | (uint64_t{1} << 44)) + 1; break;  // just above it
      case 3: u = ((u & ~((uint64_t{1} << 45) - 1)) | (uint64_t{1} << 44)) - 1; break;  // just below it
      default: break;
    }
    same(std::bit_cast<double>(u));
  }
  for (double x : {0x1.0p-126, std::nextafter(0x1.0p-126, 0.0), std::nextafter(0x1.0p-126, 1.0), 0x1.fep-127,
                   0x1.ffp-127, kBf16Max, std::nextafter(kBf16Max, INFINITY), 0x1.ff7fffffffffp127, 0x1.ff8p127,
                   0x1.ffffffffffffp127, 0x1.0p128, 1.0, 0x1.008p0, 0x1.018p0, DBL_MAX, DBL_MIN, 0x1.0p-1074})
    for (double sgn : {1.0, -1.0}) same(sgn * x);
}

// ---- hand-written scalar code for H = 1, straight from the spec formulas ----

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct Lcg {  // simple, independent value source for the hand cases
  uint64_t s;
  double next() {  // multiples of 1/64 in [-2, 2): exact in bf16
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(static_cast<int>((s >> 33) % 256) - 128) / 64.0;
  }
};

uint16_t bf(double v) { return f32_to_bf16_bits(static_cast<float>(v)); }
double fb(uint16_t b) { return bf16_bits_to_f32(b); }

kdajit_tensor_t view(void* data, kdajit_dtype_t dt, std::initializer_list<int64_t> shape,
                     std::initializer_list<int64_t> strides) {
  return kdajit::tensor_view(data, dt, shape, strides);
}

// Everything of an H = 1 call in plain arrays.
struct Hand {
  int R = 0, S = 0, T = 1, N = 0;
  bool bf16_state = false;
  kdajit_gate_t gate = KDAJIT_GATE_BOUNDED;
  float lb = -5.f, eps = 1e-5f;
  std::vector<uint16_t> x, conv, gate_in, beta, og, out;
  std::vector<float> w, dt, nw, state_f;
  std::vector<uint16_t> state_b;
  float A_log = 0.3f;
  std::vector<int32_t> idx, qsl, acc;

  int K() const { return T + 2; }
  // conv layout: single uses SD [S][tap][384]; packed uses DS [S][384][K].
  size_t conv_at(int s, int c, int tap) const {
    return T == 1 && N == 0 ? static_cast<size_t>((s * 3 + tap) * 384 + c) : static_cast<size_t>((s * 384 + c) * K() + tap);
  }
  double state_get(int s, int v, int k) const {
    const size_t i = static_cast<size_t>((s * D + v) * D + k);
    return bf16_state ? fb(state_b[i]) : state_f[i];
  }

  void fill(uint64_t seed) {
    Lcg g{seed};
    const auto n = [&](size_t count, double scale) {
      std::vector<double> v(count);
      for (auto& e : v) e = scale * g.next();
      return v;
    };
    for (double v : n(static_cast<size_t>(R) * 384, 1.0)) x.push_back(bf(v));
    for (double v : n(3 * 4 * D, 0.5)) w.push_back(static_cast<float>(v + 0.0078125));
    for (double v : n(static_cast<size_t>(S) * 384 * K(), 1.0)) conv.push_back(bf(v));
    for (double v : n(static_cast<size_t>(R) * D, 1.0)) gate_in.push_back(bf(v));
    for (double v : n(static_cast<size_t>(R), 1.0)) beta.push_back(bf(v));
    for (double v : n(D, 0.1)) dt.push_back(static_cast<float>(v));
    for (double v : n(static_cast<size_t>(S) * D * D, 0.05)) {
      state_f.push_back(static_cast<float>(v + 0.001));
      state_b.push_back(bf(v + 0.001));
    }
    for (double v : n(static_cast<size_t>(R) * D, 1.0)) og.push_back(bf(v));
    for (double v : n(D, 0.1)) nw.push_back(static_cast<float>(1.0 + v));
    out.assign(static_cast<size_t>(R) * D, 0xffff);
  }

  kdajit_decode_args_t args() {
    kdajit_decode_args_t a{};
    const bool packed = N > 0;
    a.x = view(x.data(), KDAJIT_DTYPE_BF16, {R, 384}, {384, 1});
    a.conv_weight = view(w.data(), KDAJIT_DTYPE_F32, {3, 4, D}, {4 * D, D, 1});
    a.conv_state = packed ? view(conv.data(), KDAJIT_DTYPE_BF16, {S, 384, K()}, {384 * K(), K(), 1})
                          : view(conv.data(), KDAJIT_DTYPE_BF16, {S, 384, 3}, {384 * 3, 1, 384});
    a.raw_gate = view(gate_in.data(), KDAJIT_DTYPE_BF16, {R, 1, D}, {D, D, 1});
    a.raw_beta = view(beta.data(), KDAJIT_DTYPE_BF16, {R, 1}, {1, 1});
    a.A_log = view(&A_log, KDAJIT_DTYPE_F32, {1}, {1});
    a.dt_bias = view(dt.data(), KDAJIT_DTYPE_F32, {D}, {1});
    a.state_indices = packed ? view(idx.data(), KDAJIT_DTYPE_INT32, {N, T}, {T, 1}) : view(idx.data(), KDAJIT_DTYPE_INT32, {R}, {1});
    a.state = bf16_state ? view(state_b.data(), KDAJIT_DTYPE_BF16, {S, 1, D, D}, {D * D, D * D, D, 1})
                         : view(state_f.data(), KDAJIT_DTYPE_F32, {S, 1, D, D}, {D * D, D * D, D, 1});
    a.output_gate = view(og.data(), KDAJIT_DTYPE_BF16, {R, 1, D}, {D, D, 1});
    a.norm_weight = view(nw.data(), KDAJIT_DTYPE_F32, {D}, {1});
    a.output = view(out.data(), KDAJIT_DTYPE_BF16, {R, 1, D}, {D, D, 1});
    if (packed) {
      a.query_start_loc = view(qsl.data(), KDAJIT_DTYPE_INT32, {N + 1}, {1});
      a.num_accepted_tokens = view(acc.data(), KDAJIT_DTYPE_INT32, {N}, {1});
    }
    a.gate = gate;
    a.lower_bound = lb;
    a.norm_eps = eps;
    return a;
  }
};

// The expected result of one token: steps 1-7 with a 3-tap history `hist`
// (raw bf16 values per channel) and the carried state S (f64, [v][k]).
struct TokenResult {
  std::vector<double> y;  // before rounding point 4
};

TokenResult hand_token(const Hand& in, int r, const std::vector<std::array<double, 3>>& hist, std::vector<double>& S) {
  std::vector<double> m(384);
  for (int c = 0; c < 384; ++c) {
    const int j = c / D, d = c % D;
    double a = 0;
    for (int w = 0; w < 3; ++w) a += in.w[static_cast<size_t>((j * 4 + w) * D + d)] * hist[static_cast<size_t>(c)][static_cast<size_t>(w)];
    a += in.w[static_cast<size_t>((j * 4 + 3) * D + d)] * fb(in.x[static_cast<size_t>(r * 384 + c)]);
    m[static_cast<size_t>(c)] = round_bf16(a * sig(a));
  }
  double sq = 0, sk = 0;
  for (int i = 0; i < D; ++i) {
    sq += m[static_cast<size_t>(i)] * m[static_cast<size_t>(i)];
    sk += m[static_cast<size_t>(D + i)] * m[static_cast<size_t>(D + i)];
  }
  std::vector<double> q(D), k(D), v(D), decay(D), o(D);
  for (int i = 0; i < D; ++i) {
    q[static_cast<size_t>(i)] = m[static_cast<size_t>(i)] * (1.0 / std::sqrt(sq + 1e-6) / std::sqrt(128.0));
    k[static_cast<size_t>(i)] = m[static_cast<size_t>(D + i)] * (1.0 / std::sqrt(sk + 1e-6));
    v[static_cast<size_t>(i)] = m[static_cast<size_t>(2 * D + i)];
  }
  const double A = std::exp(static_cast<double>(in.A_log));
  for (int i = 0; i < D; ++i) {
    const double g = fb(in.gate_in[static_cast<size_t>(r * D + i)]) + in.dt[static_cast<size_t>(i)];
    const double gv = in.gate == KDAJIT_GATE_BOUNDED ? in.lb * sig(A * g) : -A * (g > 20 ? g : std::log(1.0 + std::exp(g)));
    decay[static_cast<size_t>(i)] = std::exp(gv);
  }
  const double beta = sig(fb(in.beta[static_cast<size_t>(r)]));
  for (int vi = 0; vi < D; ++vi) {
    double u = 0;
    for (int ki = 0; ki < D; ++ki) {
      S[static_cast<size_t>(vi * D + ki)] *= decay[static_cast<size_t>(ki)];
      u += S[static_cast<size_t>(vi * D + ki)] * k[static_cast<size_t>(ki)];
    }
    const double delta = beta * (v[static_cast<size_t>(vi)] - u);
    double ov = 0;
    for (int ki = 0; ki < D; ++ki) {
      S[static_cast<size_t>(vi * D + ki)] += delta * k[static_cast<size_t>(ki)];
      ov += S[static_cast<size_t>(vi * D + ki)] * q[static_cast<size_t>(ki)];
    }
    o[static_cast<size_t>(vi)] = ov;
  }
  double ms = 0;
  std::vector<double> ob(D);
  for (int i = 0; i < D; ++i) {
    ob[static_cast<size_t>(i)] = round_bf16(o[static_cast<size_t>(i)]);
    ms += ob[static_cast<size_t>(i)] * ob[static_cast<size_t>(i)];
  }
  ms /= D;
  TokenResult res;
  for (int i = 0; i < D; ++i)
    res.y.push_back(ob[static_cast<size_t>(i)] / std::sqrt(ms + in.eps) * in.nw[static_cast<size_t>(i)] *
                    sig(fb(in.og[static_cast<size_t>(r * D + i)])));
  return res;
}

// y to 1e-12 (relative to the row's scale) and the rounded output bit for bit.
void check_row(const Hand& h, const Capture& cap, int r, const std::vector<double>& y) {
  double scale = 0;
  for (double v : y) scale = std::max(scale, std::fabs(v));
  for (int i = 0; i < D; ++i) {
    INFO("row " << r << " v " << i);
    REQUIRE(std::fabs(cap.output[static_cast<size_t>(r * D + i)] - y[static_cast<size_t>(i)]) <= 1e-12 * scale);
    REQUIRE(h.out[static_cast<size_t>(r * D + i)] == f64_to_bf16_bits(y[static_cast<size_t>(i)]));
  }
}

// A stored state element against the exact f64 value: within half an ulp of its dtype.
void check_state(const Hand& h, int s, const std::vector<double>& S) {
  const double half_ulp = h.bf16_state ? 0x1.0p-8 : 0x1.0p-24;  // relative, at the bottom of a binade
  for (int i = 0; i < D * D; ++i) {
    const double got = h.state_get(s, i / D, i % D), want = S[static_cast<size_t>(i)];
    if (!(std::fabs(got - want) <= half_ulp * std::fabs(want) + 1e-300)) FAIL("state slot " << s << " elem " << i << ": " << got << " vs " << want);
  }
}

TEST_CASE("reference: one head, single op, against hand-written scalar code", "[reference]") {
  for (bool bf16_state : {false, true})
    for (auto gate : {KDAJIT_GATE_BOUNDED, KDAJIT_GATE_SOFTPLUS}) {
      DYNAMIC_SECTION("state " << (bf16_state ? "bf16" : "f32") << " gate " << gate) {
        Hand h;
        h.R = 5;
        h.S = 5;
        h.bf16_state = bf16_state;
        h.gate = gate;
        h.fill(bf16_state * 2 + gate + 11);
        h.idx = {3, 0, 1, 7 /* >= S */, -2};
        const Hand before = h;
        Capture cap;
        auto a = h.args();
        REQUIRE(single_decode(a, &cap).ok());
        for (int r = 0; r < h.R; ++r) {
          const int s = h.idx[static_cast<size_t>(r)];
          if (s < 1 || s >= h.S) {
            for (int i = 0; i < D; ++i) REQUIRE(h.out[static_cast<size_t>(r * D + i)] == 0);
            continue;
          }
          std::vector<std::array<double, 3>> hist(384);
          for (int c = 0; c < 384; ++c)
            for (int w = 0; w < 3; ++w) hist[static_cast<size_t>(c)][static_cast<size_t>(w)] = fb(before.conv[before.conv_at(s, c, w)]);
          std::vector<double> S(D * D);
          for (int i = 0; i < D * D; ++i) S[static_cast<size_t>(i)] = before.state_get(s, i / D, i % D);
          const TokenResult res = hand_token(before, r, hist, S);
          check_row(h, cap, r, res.y);
          check_state(h, s, S);
          for (int c = 0; c < 384; ++c) {  // history shifted, raw x appended
            REQUIRE(h.conv[h.conv_at(s, c, 0)] == before.conv[before.conv_at(s, c, 1)]);
            REQUIRE(h.conv[h.conv_at(s, c, 1)] == before.conv[before.conv_at(s, c, 2)]);
            REQUIRE(h.conv[h.conv_at(s, c, 2)] == before.x[static_cast<size_t>(r * 384 + c)]);
          }
        }
        // Slots of null / out-of-range rows and the unused slots are untouched.
        for (int s : {0, 2, 4}) {
          for (int i = 0; i < 384 * 3; ++i) REQUIRE(h.conv[static_cast<size_t>(s * 384 * 3 + i)] == before.conv[static_cast<size_t>(s * 384 * 3 + i)]);
          for (int i = 0; i < D * D; ++i) REQUIRE(h.state_get(s, i / D, i % D) == before.state_get(s, i / D, i % D));
        }
      }
    }
}

TEST_CASE("reference: one head, packed op, every accepted count, against hand-written scalar code", "[reference]") {
  // T = 3, DS layout. Sequence n accepts a = n + 1 (plus one that says 0 and
  // one that says 9, which clamp to 1 and T). Lengths vary, one checkpoint
  // entry is null, one sequence has L = 0.
  Hand h;
  h.T = 3;
  h.N = 6;
  const std::vector<int> lens = {3, 2, 3, 1, 0, 2};
  h.qsl = {0};
  for (int L : lens) h.qsl.push_back(h.qsl.back() + L);
  h.R = h.qsl.back() + 1;  // one row beyond qsl[N]
  h.S = 22;
  h.acc = {1, 2, 3, 0, 2, 9};
  h.idx = {5, 2, 9,   11, 4, 1,   7, 0, 3,   14, 15, 16,   17, 18, 19,   20, 21, 6};
  h.fill(99);
  const Hand before = h;
  Capture cap;
  auto a = h.args();
  REQUIRE(packed_decode(a, &cap).ok());

  std::vector<bool> row_done(static_cast<size_t>(h.R), false);
  for (int n = 0; n < h.N; ++n) {
    const int L = lens[static_cast<size_t>(n)];
    const int acc = std::clamp(h.acc[static_cast<size_t>(n)], 1, h.T);
    const int cs = h.idx[static_cast<size_t>(n * h.T)], src = h.idx[static_cast<size_t>(n * h.T + acc - 1)];
    if (L == 0) continue;
    // History taps acc-1 .. acc+1 of slot cs.
    std::vector<std::array<double, 3>> hist(384);
    for (int c = 0; c < 384; ++c)
      for (int w = 0; w < 3; ++w) hist[static_cast<size_t>(c)][static_cast<size_t>(w)] = fb(before.conv[before.conv_at(cs, c, acc - 1 + w)]);
    std::vector<double> S(D * D);
    for (int i = 0; i < D * D; ++i) S[static_cast<size_t>(i)] = before.state_get(src, i / D, i % D);
    std::vector<std::vector<uint16_t>> seen(384);  // every conv input in order: 3 history taps, then the x
    for (int c = 0; c < 384; ++c)
      for (int w = 0; w < 3; ++w) seen[static_cast<size_t>(c)].push_back(before.conv[before.conv_at(cs, c, acc - 1 + w)]);
    for (int t = 0; t < L; ++t) {
      const int r = h.qsl[static_cast<size_t>(n)] + t;
      const TokenResult res = hand_token(before, r, hist, S);
      INFO("sequence " << n << " token " << t);
      check_row(h, cap, r, res.y);
      row_done[static_cast<size_t>(r)] = true;
      const int ck = h.idx[static_cast<size_t>(n * h.T + t)];
      if (ck >= 1 && ck < h.S) check_state(h, ck, S);
      for (int c = 0; c < 384; ++c) {
        const uint16_t xb = before.x[static_cast<size_t>(r * 384 + c)];
        hist[static_cast<size_t>(c)] = {hist[static_cast<size_t>(c)][1], hist[static_cast<size_t>(c)][2], fb(xb)};
        seen[static_cast<size_t>(c)].push_back(xb);
      }
    }
    // New window: the last L + 2 conv inputs at positions 0 .. L+1; the rest untouched.
    for (int c = 0; c < 384; ++c) {
      const auto& sc = seen[static_cast<size_t>(c)];
      for (int p = 0; p < h.K(); ++p) {
        const uint16_t want = p < L + 2 ? sc[sc.size() - static_cast<size_t>(L + 2) + static_cast<size_t>(p)] : before.conv[before.conv_at(cs, c, p)];
        REQUIRE(h.conv[h.conv_at(cs, c, p)] == want);
      }
    }
  }
  for (int r = 0; r < h.R; ++r)
    if (!row_done[static_cast<size_t>(r)])
      for (int i = 0; i < D; ++i) REQUIRE(h.out[static_cast<size_t>(r * D + i)] == 0);
  // Slot 0, never-named slots, unwritten checkpoint and source slots, and the
  // slots of the L = 0 sequence are untouched.
  for (int s : {0, 1, 6, 8, 10, 12, 13, 15, 16, 17, 18, 19})
    for (int i = 0; i < D * D; ++i) REQUIRE(h.state_get(s, i / D, i % D) == before.state_get(s, i / D, i % D));
}

// ---- identities between the ops ---------------------------------------------

ProblemSpec packed_spec(int heads, int T, std::vector<int> lens, uint64_t seed) {
  ProblemSpec s;
  s.op = KDAJIT_OP_PACKED;
  s.heads = heads;
  s.tokens = T;
  s.seq_lens = std::move(lens);
  s.seed = seed;
  return s;
}

TEST_CASE("reference: packed with T = 1 equals single on the remapped rows", "[reference]") {
  for (auto dtype : {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16}) {
    ProblemSpec s = packed_spec(3, 1, {1, 0, 1, 1, 0, 1, 1}, 5 + dtype);
    s.extra_rows = 2;
    s.null_rows = 1;
    s.oob_rows = 1;
    s.row_pad = 4;
    s.state_dtype = dtype;
    Problem packed = make_problem(s);
    Problem single = packed;
    const Problem before = packed;
    run_ref(packed);

    // The single op reads one slot per row: the sequence's slot, or null for
    // rows outside every sequence.
    std::vector<int32_t> slots(static_cast<size_t>(single.rows()), 0);
    for (int64_t n = 0; n < single.num_seqs(); ++n) {
      const auto q0 = static_cast<int64_t>(get(single, Tensor::query_start_loc, {n}));
      const auto q1 = static_cast<int64_t>(get(single, Tensor::query_start_loc, {n + 1}));
      if (q1 - q0 == 1) slots[static_cast<size_t>(q0)] = slot_of(single, {n, 0});
    }
    kdajit_decode_args_t a = single.args();
    a.state_indices.data = slots.data();
    a.state_indices.ndim = 1;
    a.state_indices.shape[0] = single.rows();
    a.state_indices.strides[0] = 1;
    REQUIRE(single_decode(a).ok());
    CHECK(bitwise_equal(packed, single));
    CHECK_FALSE(bitwise_equal(packed, before));
  }
}

TEST_CASE("reference: accepted count a reads history taps a-1..a+1 and source slot a-1 (vs single op)", "[reference]") {
  // One token per sequence, sequence n accepts a = n + 1 of T = 5. The single op
  // on a slot holding taps a-1..a+1 and the state of slot state_indices[n, a-1]
  // must give the same output, checkpoint and conv taps, bit for bit.
  const int T = 5;
  ProblemSpec ps = packed_spec(2, T, std::vector<int>(T, 1), 21);
  ps.num_accepted = {1, 2, 3, 4, 5};
  Problem packed = make_problem(ps);
  const Problem before = packed;
  run_ref(packed);

  ProblemSpec ss;
  ss.heads = 2;
  ss.rows = T;
  ss.num_slots = T + 1;
  ss.seed = 21;
  Problem single = make_problem(ss);
  for (Tensor t : {Tensor::conv_weight, Tensor::A_log, Tensor::dt_bias, Tensor::norm_weight})
    REQUIRE(single.bytes(t) == before.bytes(t));  // same seed and H: same weights
  for (int64_t n = 0; n < T; ++n) {
    const int64_t a = n + 1, cs = slot_of(before, {n, 0}), src = slot_of(before, {n, a - 1});
    const int64_t slot = n + 1;
    set(single, Tensor::state_indices, {n}, static_cast<double>(slot));
    copy_token_inputs(before, n, single, n);
    for (int64_t c = 0; c < 3 * 2 * D; ++c)
      for (int64_t w = 0; w < 3; ++w)
        store_bits16(single.view(Tensor::conv_state), {slot, c, w}, load_bits16(before.view(Tensor::conv_state), {cs, c, a - 1 + w}));
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t v = 0; v < D; ++v)
        for (int64_t k = 0; k < D; ++k) set(single, Tensor::state, {slot, h, v, k}, get(before, Tensor::state, {src, h, v, k}));
  }
  run_ref(single);
  for (int64_t n = 0; n < T; ++n) {
    INFO("accepted " << n + 1);
    const int64_t cs = slot_of(before, {n, 0}), slot = n + 1;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t v = 0; v < D; ++v) {
        REQUIRE(load_bits16(packed.view(Tensor::output), {n, h, v}) == load_bits16(single.view(Tensor::output), {n, h, v}));
        for (int64_t k = 0; k < D; ++k)  // checkpoint of token 0 goes to state_indices[n, 0]
          REQUIRE(get(packed, Tensor::state, {cs, h, v, k}) == get(single, Tensor::state, {slot, h, v, k}));
      }
    for (int64_t c = 0; c < 3 * 2 * D; ++c) {
      for (int64_t p = 0; p < 3; ++p)
        REQUIRE(load_bits16(packed.view(Tensor::conv_state), {cs, c, p}) == load_bits16(single.view(Tensor::conv_state), {slot, c, p}));
      for (int64_t p = 3; p < T + 2; ++p)  // L = 1: taps 3..T+1 untouched
        REQUIRE(load_bits16(packed.view(Tensor::conv_state), {cs, c, p}) == load_bits16(before.view(Tensor::conv_state), {cs, c, p}));
    }
  }
}

TEST_CASE("reference: two chained packed windows equal one longer window", "[reference]") {
  // Identity: a window of T = 4 (accepting a0 of the previous window) equals
  // window 1 of T = 2 (its history taps 0..2 and source slot hold what the long
  // window reads at a0-1..a0+1 and state_indices[n, a0-1]) followed by window 2
  // of T = 2 with num_accepted = 2 and the SAME state_indices: window 2 then
  // reads taps 1..3 (the last 3 conv inputs) and its source state_indices[n, 1]
  // (window 1's checkpoint after its last token), exactly as an engine chains
  // draft windows. Window 1 matches bit for bit. Window 2 starts from the stored
  // f32 checkpoint while the long window carries the unrounded value, so it
  // matches to f32 rounding (state) and one bf16 ulp (output).
  ProblemSpec ls = packed_spec(2, 4, {4, 4}, 31);
  ls.num_accepted = {3, 2};
  Problem long_run = make_problem(ls);
  const Problem before = long_run;
  run_ref(long_run);

  ProblemSpec ws = packed_spec(2, 2, {2, 2}, 31);
  ws.num_accepted = {1, 1};
  Problem win = make_problem(ws);
  REQUIRE(win.bytes(Tensor::conv_weight) == before.bytes(Tensor::conv_weight));  // same seed and H: same weights
  const int64_t channels = 3 * 2 * D;
  for (int64_t n = 0; n < 2; ++n) {
    const int64_t a0 = n == 0 ? 3 : 2;
    const int64_t cs_l = slot_of(before, {n, 0}), src_l = slot_of(before, {n, a0 - 1}), cs_w = slot_of(win, {n, 0});
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t w = 0; w < 3; ++w)
        store_bits16(win.view(Tensor::conv_state), {cs_w, c, w}, load_bits16(before.view(Tensor::conv_state), {cs_l, c, a0 - 1 + w}));
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t v = 0; v < D; ++v)
        for (int64_t k = 0; k < D; ++k) set(win, Tensor::state, {cs_w, h, v, k}, get(before, Tensor::state, {src_l, h, v, k}));
  }
  auto window = [&](int first_token) {
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t t = 0; t < 2; ++t) copy_token_inputs(before, n * 4 + first_token + t, win, n * 2 + t);
    run_ref(win);
  };
  auto out_bits = [](const Problem& p, int64_t r, int64_t h, int64_t v) { return load_bits16(p.view(Tensor::output), {r, h, v}); };

  window(0);
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t t = 0; t < 2; ++t) {
      const int64_t ck_l = slot_of(before, {n, t}), ck_w = slot_of(win, {n, t});
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t v = 0; v < D; ++v) {
          REQUIRE(out_bits(long_run, n * 4 + t, h, v) == out_bits(win, n * 2 + t, h, v));
          for (int64_t k = 0; k < D; ++k) REQUIRE(get(long_run, Tensor::state, {ck_l, h, v, k}) == get(win, Tensor::state, {ck_w, h, v, k}));
        }
    }
  for (int64_t n = 0; n < 2; ++n) set(win, Tensor::num_accepted_tokens, {n}, 2);
  window(2);
  double diff2 = 0, ref2 = 0;
  int64_t differing_outputs = 0;
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t t = 2; t < 4; ++t) {
      const int64_t ck_l = slot_of(before, {n, t}), ck_w = slot_of(win, {n, t - 2});
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t v = 0; v < D; ++v) {
          const double want = bf16_bits_to_f64(out_bits(long_run, n * 4 + t, h, v));
          const double got = bf16_bits_to_f64(out_bits(win, n * 2 + t - 2, h, v));
          REQUIRE(std::fabs(got - want) <= 0x1.0p-7 * std::fabs(want));
          differing_outputs += got != want;
          for (int64_t k = 0; k < D; ++k) {
            const double sl = get(long_run, Tensor::state, {ck_l, h, v, k}), sw = get(win, Tensor::state, {ck_w, h, v, k});
            diff2 += (sl - sw) * (sl - sw);
            ref2 += sl * sl;
          }
        }
    }
    // The long window's taps 2..5 are the chained window's 0..3 (the last 4 conv inputs).
    const int64_t cs_l = slot_of(before, {n, 0}), cs_w = slot_of(win, {n, 0});
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t p = 0; p < 4; ++p)
        REQUIRE(load_bits16(long_run.view(Tensor::conv_state), {cs_l, c, p + 2}) == load_bits16(win.view(Tensor::conv_state), {cs_w, c, p}));
  }
  const double state_rel_l2 = std::sqrt(diff2 / ref2);
  CHECK(state_rel_l2 < 1e-6);  // f32 rounding of the carry at the window boundary
  CHECK(state_rel_l2 > 0.0);   // and there is one: the windows really were chained
  CHECK(differing_outputs <= 8);  // of 1024: the carry rounding flips at most a few bf16 roundings
}

TEST_CASE("reference: heads are independent (H = 3 equals three H = 1 calls on the head slices)", "[reference]") {
  // Catches any head mixed into another's channels, gate, beta, decay or state.
  for (auto op : {KDAJIT_OP_SINGLE, KDAJIT_OP_PACKED}) {
    ProblemSpec s = op == KDAJIT_OP_SINGLE ? ProblemSpec{} : packed_spec(3, 3, {3, 1, 2}, 0);
    s.heads = 3;
    s.rows = 4;
    s.null_rows = 1;
    s.seed = 35;
    Problem all = make_problem(s);
    const int64_t H = 3, hidden = H * D;
    std::vector<Problem> heads;
    for (int64_t h = 0; h < H; ++h) {
      ProblemSpec hs = s;
      hs.heads = 1;
      hs.null_rows = 0;
      hs.num_slots = static_cast<int>(all.num_slots());
      hs.seed = 1000 + static_cast<uint64_t>(h);
      Problem q = make_problem(hs);
      for (Tensor t : {Tensor::state_indices, Tensor::query_start_loc, Tensor::num_accepted_tokens})
        q.bytes(t) = all.bytes(t);
      q = Problem(q);  // re-point the views at the replaced buffers
      set(q, Tensor::A_log, {0}, get(all, Tensor::A_log, {h}));
      for (int64_t i = 0; i < D; ++i) {
        set(q, Tensor::dt_bias, {i}, get(all, Tensor::dt_bias, {h * D + i}));
        set(q, Tensor::norm_weight, {i}, get(all, Tensor::norm_weight, {i}));
      }
      for (int64_t j = 0; j < 3; ++j)
        for (int64_t d = 0; d < D; ++d) {
          for (int64_t w = 0; w < 4; ++w) set(q, Tensor::conv_weight, {j, w, d}, get(all, Tensor::conv_weight, {j, w, h * D + d}));
          for (int64_t r = 0; r < all.rows(); ++r)
            store_bits16(q.view(Tensor::x), {r, j * D + d}, load_bits16(all.view(Tensor::x), {r, j * hidden + h * D + d}));
          for (int64_t sl = 0; sl < all.num_slots(); ++sl)
            for (int64_t tap = 0; tap < all.tokens() + 2; ++tap)
              store_bits16(q.view(Tensor::conv_state), {sl, j * D + d, tap},
                           load_bits16(all.view(Tensor::conv_state), {sl, j * hidden + h * D + d, tap}));
        }
      for (int64_t r = 0; r < all.rows(); ++r) {
        store_bits16(q.view(Tensor::raw_beta), {r, 0}, load_bits16(all.view(Tensor::raw_beta), {r, h}));
        for (int64_t i = 0; i < D; ++i) {
          store_bits16(q.view(Tensor::raw_gate), {r, 0, i}, load_bits16(all.view(Tensor::raw_gate), {r, h, i}));
          store_bits16(q.view(Tensor::output_gate), {r, 0, i}, load_bits16(all.view(Tensor::output_gate), {r, h, i}));
        }
      }
      for (int64_t sl = 0; sl < all.num_slots(); ++sl)
        for (int64_t v = 0; v < D; ++v)
          for (int64_t k = 0; k < D; ++k) set(q, Tensor::state, {sl, 0, v, k}, get(all, Tensor::state, {sl, h, v, k}));
      run_ref(q);
      heads.push_back(std::move(q));
    }
    run_ref(all);
    for (int64_t h = 0; h < H; ++h) {
      INFO("op " << op << " head " << h);
      const Problem& q = heads[static_cast<size_t>(h)];
      for (int64_t r = 0; r < all.rows(); ++r)
        for (int64_t v = 0; v < D; ++v)
          REQUIRE(load_bits16(all.view(Tensor::output), {r, h, v}) == load_bits16(q.view(Tensor::output), {r, 0, v}));
      for (int64_t sl = 0; sl < all.num_slots(); ++sl) {
        for (int64_t v = 0; v < D; ++v)
          for (int64_t k = 0; k < D; ++k) REQUIRE(get(all, Tensor::state, {sl, h, v, k}) == get(q, Tensor::state, {sl, 0, v, k}));
        for (int64_t j = 0; j < 3; ++j)
          for (int64_t d = 0; d < D; ++d)
            for (int64_t tap = 0; tap < all.tokens() + 2; ++tap)
              REQUIRE(load_bits16(all.view(Tensor::conv_state), {sl, j * hidden + h * D + d, tap}) ==
                      load_bits16(q.view(Tensor::conv_state), {sl, j * D + d, tap}));
      }
    }
  }
}

TEST_CASE("reference: null rows give zeros and leave the caches untouched", "[reference]") {
  ProblemSpec s;
  s.heads = 2;
  s.rows = 8;
  s.null_rows = 3;
  s.row_pad = 8;
  s.slot_pad = 8;
  s.seed = 41;
  Problem p = make_problem(s);
  const Problem before = p;
  run_ref(p);
  std::vector<bool> live_slot(static_cast<size_t>(p.num_slots()), false);
  int nulls = 0;
  for (int64_t r = 0; r < p.rows(); ++r) {
    const int s_r = slot_of(p, {r});
    if (s_r > 0) {
      live_slot[static_cast<size_t>(s_r)] = true;
      continue;
    }
    ++nulls;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t v = 0; v < D; ++v) REQUIRE(load_bits16(p.view(Tensor::output), {r, h, v}) == 0);
  }
  REQUIRE(nulls == 3);
  for (int64_t sl = 0; sl < p.num_slots(); ++sl)
    for (Tensor t : {Tensor::state, Tensor::conv_state}) {
      const bool same = slot_bytes(p, t, p.bytes(t), sl) == slot_bytes(p, t, before.bytes(t), sl);
      INFO("slot " << sl << " " << tensor_name(t));
      CHECK(same == !live_slot[static_cast<size_t>(sl)]);
    }
  // The padding between rows of the output is left as it was.
  CHECK(compare(p, p).pass);
}

TEST_CASE("reference: out-of-range slots are treated as null", "[reference]") {
  ProblemSpec s;
  s.heads = 2;
  s.rows = 7;
  s.oob_rows = 3;
  s.seed = 43;
  Problem p = make_problem(s);
  Problem as_null = p;
  int oob = 0;
  for (int64_t r = 0; r < p.rows(); ++r)
    if (slot_of(p, {r}) >= p.num_slots()) {
      set(as_null, Tensor::state_indices, {r}, -1);
      ++oob;
    }
  REQUIRE(oob == 3);
  const Problem before = p;
  run_ref(p);
  run_ref(as_null);
  CHECK(bitwise_equal(p, as_null));
  CHECK_FALSE(bitwise_equal(p, before));

  // Packed: sequences whose cs or src is out of range are not live.
  ProblemSpec ps = packed_spec(2, 3, {3, 2, 3, 1}, 44);
  ps.oob_rows = 2;
  Problem q = make_problem(ps);
  Problem q_null = q;
  for (int64_t n = 0; n < q.num_seqs(); ++n)
    for (int64_t t = 0; t < 3; ++t)
      if (slot_of(q, {n, t}) >= q.num_slots()) set(q_null, Tensor::state_indices, {n, t}, 0);
  run_ref(q);
  run_ref(q_null);
  CHECK(bitwise_equal(q, q_null));
}

TEST_CASE("reference: num_accepted is clamped into [1, T]; bad lengths are not live", "[reference]") {
  ProblemSpec s = packed_spec(1, 4, {4, 2, 3}, 51);
  s.num_accepted = {0, 9, -3};
  Problem p = make_problem(s);
  Problem clamped = p;
  set(clamped, Tensor::num_accepted_tokens, {0}, 1);
  set(clamped, Tensor::num_accepted_tokens, {1}, 4);
  set(clamped, Tensor::num_accepted_tokens, {2}, 1);
  run_ref(p);
  run_ref(clamped);
  CHECK(bitwise_equal(p, clamped));

  // Sequence 1 claims 5 > T rows (qsl[2] - qsl[1]): not live, its rows zero, its slots untouched.
  ProblemSpec b = packed_spec(1, 4, {2, 5, 1}, 52);
  Problem bad = make_problem(b);
  const Problem before = bad;
  run_ref(bad);
  for (int64_t r = 2; r < 7; ++r)
    for (int64_t v = 0; v < D; ++v) REQUIRE(load_bits16(bad.view(Tensor::output), {r, 0, v}) == 0);
  for (int64_t t = 0; t < 4; ++t) {
    const int64_t sl = slot_of(bad, {1, t});
    CHECK(slot_bytes(bad, Tensor::state, bad.bytes(Tensor::state), sl) == slot_bytes(bad, Tensor::state, before.bytes(Tensor::state), sl));
  }
  CHECK(load_bits16(bad.view(Tensor::output), {0, 0, 0}) != 0);  // the live neighbours are computed
  CHECK(load_bits16(bad.view(Tensor::output), {7, 0, 0}) != 0);
}

// Every logical element of a tensor equal between two problems of different layouts.
bool same_elements(const Problem& a, const Problem& b, Tensor t) {
  const kdajit_tensor_t& va = a.view(t);
  const kdajit_tensor_t& vb = b.view(t);
  bool same = true;
  std::array<int64_t, 4> i{};
  for (i[0] = 0; i[0] < va.shape[0]; ++i[0])
    for (i[1] = 0; i[1] < va.shape[1]; ++i[1])
      for (i[2] = 0; i[2] < (va.ndim > 2 ? va.shape[2] : 1); ++i[2])
        for (i[3] = 0; i[3] < (va.ndim > 3 ? va.shape[3] : 1); ++i[3]) {
          if (va.ndim == 3) same = same && load(va, {i[0], i[1], i[2]}) == load(vb, {i[0], i[1], i[2]});
          else if (va.ndim == 4) same = same && load(va, {i[0], i[1], i[2], i[3]}) == load(vb, {i[0], i[1], i[2], i[3]});
          if (!same) return false;
        }
  return same;
}

TEST_CASE("reference: SD and DS conv layouts, padded rows and slots give identical results", "[reference]") {
  for (auto op : {KDAJIT_OP_SINGLE, KDAJIT_OP_PACKED}) {
    ProblemSpec s = op == KDAJIT_OP_SINGLE ? ProblemSpec{} : packed_spec(2, 3, {3, 1, 0, 2}, 0);
    s.heads = 2;
    s.rows = 6;
    s.null_rows = 1;
    s.seed = 61;
    ProblemSpec ds = s, padded = s;
    ds.conv = KDAJIT_CONV_DS;
    padded.row_pad = 24;
    padded.slot_pad = 16;
    padded.conv = KDAJIT_CONV_DS;
    Problem a = make_problem(s), b = make_problem(ds), c = make_problem(padded);
    REQUIRE(same_elements(a, b, Tensor::conv_state));  // the same logical draws
    REQUIRE(a.bytes(Tensor::conv_state) != b.bytes(Tensor::conv_state));
    run_ref(a);
    run_ref(b);
    run_ref(c);
    CHECK(a.bytes(Tensor::output) == b.bytes(Tensor::output));
    CHECK(a.bytes(Tensor::state) == b.bytes(Tensor::state));
    CHECK(same_elements(a, b, Tensor::conv_state));
    CHECK(same_elements(a, c, Tensor::output));
    CHECK(same_elements(a, c, Tensor::state));
    CHECK(same_elements(a, c, Tensor::conv_state));
  }
}

TEST_CASE("reference: repeated_positive applies rows in order, like one call per row", "[reference]") {
  ProblemSpec s;
  s.heads = 2;
  s.rows = 9;
  s.mode = KDAJIT_INDICES_REPEATED_POSITIVE;
  s.state_dtype = KDAJIT_DTYPE_BF16;
  s.row_pad = 8;
  s.seed = 71;
  Problem p = make_problem(s);
  int repeats = 0;
  for (int64_t r = 1; r < p.rows(); ++r)
    for (int64_t q = 0; q < r; ++q) repeats += slot_of(p, {r}) == slot_of(p, {q});
  REQUIRE(repeats >= 1);

  auto one_row_at_a_time = [](Problem& q, bool reverse) {
    for (int64_t i = 0; i < q.rows(); ++i) {
      const int64_t r = reverse ? q.rows() - 1 - i : i;
      kdajit_decode_args_t a = q.args();
      for (auto f : {&kdajit_decode_args_t::x, &kdajit_decode_args_t::raw_gate, &kdajit_decode_args_t::raw_beta,
                     &kdajit_decode_args_t::output_gate, &kdajit_decode_args_t::output, &kdajit_decode_args_t::state_indices}) {
        kdajit_tensor_t& v = a.*f;
        v.data = static_cast<std::byte*>(v.data) + r * v.strides[0] * static_cast<int64_t>(dtype_size(v.dtype));
        v.shape[0] = 1;
      }
      REQUIRE(single_decode(a).ok());
    }
  };
  Problem rows = p, reversed = p;
  run_ref(p);
  one_row_at_a_time(rows, false);
  one_row_at_a_time(reversed, true);
  CHECK(bitwise_equal(p, rows));
  CHECK_FALSE(bitwise_equal(p, reversed));  // the order matters, so the check above means something
}

TEST_CASE("reference: invalid arguments are errors naming the argument", "[reference]") {
  ProblemSpec s;
  s.heads = 2;
  s.rows = 2;
  Problem p = make_problem(s);
  auto expect_error = [](const kdajit_decode_args_t& a, kdajit_op_t op, const std::string& needle) {
    const kdajit::Status st = decode(op, a);
    REQUIRE_FALSE(st.ok());
    INFO(st.error().message);
    CHECK(st.error().message.find(needle) != std::string::npos);
  };
  kdajit_decode_args_t a = p.args();
  a.x.dtype = KDAJIT_DTYPE_F32;
  expect_error(a, KDAJIT_OP_SINGLE, "x: expected bf16");
  a = p.args();
  a.conv_state.shape[2] = 5;
  expect_error(a, KDAJIT_OP_SINGLE, "conv_state: expected bf16 [");
  a = p.args();
  a.lower_bound = 0.0f;
  expect_error(a, KDAJIT_OP_SINGLE, "lower_bound");
  a = p.args();
  a.norm_eps = -1.0f;
  expect_error(a, KDAJIT_OP_SINGLE, "norm_eps");
  a = p.args();
  a.conv_state.shape[0] = p.num_slots() + 1;
  expect_error(a, KDAJIT_OP_SINGLE, "conv_state");
  a = p.args();
  a.output.data = nullptr;
  expect_error(a, KDAJIT_OP_SINGLE, "output: expected a host pointer");
  expect_error(p.args(), KDAJIT_OP_PACKED, "state_indices: expected int32 [N, T]");
  a = p.args();
  a.A_log.shape[0] = 0;
  expect_error(a, KDAJIT_OP_SINGLE, "A_log");
}

}  // namespace

// ---- the prefill op ------------------------------------------------------------

namespace prefill_test {

void run_prefill(const Problem& p, const PrefillMeta& m) {
  const kdajit::Status s = prefill(prefill_args(p, m));
  INFO((s ? std::string() : s.error().message));
  REQUIRE(s.ok());
}

// Row r of a row tensor as a one-row view.
kdajit_tensor_t row_view(kdajit_tensor_t t, int64_t r) {
  t.data = static_cast<std::byte*>(t.data) + r * t.strides[0] * static_cast<int64_t>(dtype_size(t.dtype));
  t.shape[0] = 1;
  return t;
}

// The single op on row r alone, with slot s.
void single_step(const Problem& p, int64_t r, int32_t s) {
  kdajit_decode_args_t a = p.args();
  for (auto f : {&kdajit_decode_args_t::x, &kdajit_decode_args_t::raw_gate, &kdajit_decode_args_t::raw_beta,
                 &kdajit_decode_args_t::output_gate, &kdajit_decode_args_t::output})
    a.*f = row_view(a.*f, r);
  a.state_indices = kdajit::dense_tensor_view(&s, KDAJIT_DTYPE_INT32, {1});
  REQUIRE(single_decode(a).ok());
}

// ||a - b|| / ||b|| over every element of tensor t.
double rel_diff(const Problem& a, const Problem& b, Tensor t) {
  const kdajit_tensor_t& v = a.view(t);
  double d2 = 0, r2 = 0;
  const int64_t n0 = v.shape[0], n1 = v.shape[1], n2 = v.ndim > 2 ? v.shape[2] : 1, n3 = v.ndim > 3 ? v.shape[3] : 1;
  for (int64_t i = 0; i < n0; ++i)
    for (int64_t j = 0; j < n1; ++j)
      for (int64_t k = 0; k < n2; ++k)
        for (int64_t l = 0; l < n3; ++l) {
          const double x = v.ndim == 4 ? load(a.view(t), {i, j, k, l}) : v.ndim == 3 ? load(a.view(t), {i, j, k}) : load(a.view(t), {i, j});
          const double y = v.ndim == 4 ? load(b.view(t), {i, j, k, l}) : v.ndim == 3 ? load(b.view(t), {i, j, k}) : load(b.view(t), {i, j});
          d2 += (x - y) * (x - y);
          r2 += y * y;
        }
  return r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
}

ProblemSpec rows_spec(int heads, int rows, kdajit_dtype_t dtype, uint64_t seed) {
  ProblemSpec s;
  s.heads = heads;
  s.rows = rows;
  s.state_dtype = dtype;
  s.num_slots = 0;  // enough for every row, the null slot and spares
  s.seed = seed;
  return s;
}

}  // namespace prefill_test

TEST_CASE("reference: prefill equals the single op token by token", "[reference][prefill]") {
  using namespace prefill_test;
  for (auto dtype : {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16})
    for (auto conv : {KDAJIT_CONV_SD, KDAJIT_CONV_DS}) {
      ProblemSpec spec = rows_spec(2, 13, dtype, 40 + dtype + 2 * conv);
      spec.conv = conv;
      Problem chunked = make_problem(spec);
      Problem stepwise = chunked;
      // Two sequences: rows 0..7 on slot 4, rows 8..12 on slot 2.
      PrefillMeta m{{4, 2}, {0, 8, 13}, {1, 1}};
      run_prefill(chunked, m);
      for (int64_t r = 0; r < 13; ++r) single_step(stepwise, r, r < 8 ? 4 : 2);
      INFO("dtype " << dtype << " conv " << conv);
      CHECK(same_elements(chunked, stepwise, Tensor::conv_state));  // raw x, bit for bit
      // The single op stores (and rounds) the state after every token; the
      // prefill carries it unrounded: f32 differs by rounding, bf16 by the
      // contract's tolerances.
      const bool bf16 = dtype == KDAJIT_DTYPE_BF16;
      CHECK(rel_diff(chunked, stepwise, Tensor::state) < (bf16 ? 6e-3 : 1e-6));
      CHECK(rel_diff(chunked, stepwise, Tensor::output) < (bf16 ? 1e-2 : 1e-4));
    }
}

TEST_CASE("reference: a prefill split into two calls equals one call", "[reference][prefill]") {
  using namespace prefill_test;
  for (int split : {1, 5, 9}) {
    Problem one = make_problem(rows_spec(1, 10, KDAJIT_DTYPE_F32, 50));
    Problem two = one;
    PrefillMeta whole{{3}, {0, 10}, {1}};
    run_prefill(one, whole);
    PrefillMeta first{{3}, {0, split}, {1}}, second{{3}, {split, 10}, {1}};
    run_prefill(two, first);
    const Problem after_first = two;
    run_prefill(two, second);
    // Each call zeroes the rows outside its sequence: the first call's rows come from its own output.
    for (int64_t r = 0; r < split; ++r) copy_row(after_first, r, two, r, Tensor::output);
    INFO("split at " << split);
    CHECK(same_elements(one, two, Tensor::conv_state));
    CHECK(rel_diff(two, one, Tensor::state) < 1e-6);  // the f32 rounding of the state at the split
    CHECK(rel_diff(two, one, Tensor::output) < 1e-4);
  }
}

TEST_CASE("reference: prefill without initial state equals a zeroed slot", "[reference][prefill]") {
  using namespace prefill_test;
  for (auto dtype : {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16}) {
    Problem fresh = make_problem(rows_spec(2, 6, dtype, 60 + dtype));
    Problem zeroed = fresh;
    const Problem before = fresh;
    const kdajit_tensor_t& st = zeroed.view(Tensor::state);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t v = 0; v < D; ++v)
        for (int64_t k = 0; k < D; ++k) store(st, {5, h, v, k}, 0.0);
    const kdajit_tensor_t& cs = zeroed.view(Tensor::conv_state);
    for (int64_t c = 0; c < cs.shape[1]; ++c)
      for (int64_t w = 0; w < 3; ++w) store_bits16(cs, {5, c, w}, 0);
    PrefillMeta no_init{{5}, {0, 6}, {0}}, init{{5}, {0, 6}, {1}};
    run_prefill(fresh, no_init);
    run_prefill(zeroed, init);
    CHECK(bitwise_equal(fresh, zeroed));
    CHECK_FALSE(same_elements(fresh, before, Tensor::state));
  }
}

TEST_CASE("reference: prefill rows of no live sequence are zeros; their slots are untouched", "[reference][prefill]") {
  using namespace prefill_test;
  Problem p = make_problem(rows_spec(1, 12, KDAJIT_DTYPE_F32, 70));
  const Problem before = p;
  // Row 0 below qsl[0]; a live sequence (rows 1..3, slot 1); an empty one (slot 2);
  // a null slot (rows 4..5); an out-of-range slot (rows 6..7); a live one (rows
  // 8..9, slot 3, no initial state); rows 10..11 past qsl[N].
  PrefillMeta m{{1, 2, 0, 1000, 3}, {1, 4, 4, 6, 8, 10}, {1, 1, 1, 1, 0}};
  run_prefill(p, m);
  for (int64_t r = 0; r < 12; ++r) {
    const bool live = (r >= 1 && r < 4) || (r >= 8 && r < 10);
    double ss = 0;
    for (int64_t v = 0; v < D; ++v) ss += std::fabs(load(p.view(Tensor::output), {r, 0, v}));
    INFO("row " << r);
    CHECK((live ? ss > 0 : ss == 0));
  }
  for (int s : {0, 2, 4, 5}) {
    INFO("slot " << s);
    CHECK(slot_bytes(p, Tensor::state, p.bytes(Tensor::state), s) == slot_bytes(before, Tensor::state, before.bytes(Tensor::state), s));
    CHECK(slot_bytes(p, Tensor::conv_state, p.bytes(Tensor::conv_state), s) ==
          slot_bytes(before, Tensor::conv_state, before.bytes(Tensor::conv_state), s));
  }
  for (int s : {1, 3}) CHECK(slot_bytes(p, Tensor::state, p.bytes(Tensor::state), s) != slot_bytes(before, Tensor::state, before.bytes(Tensor::state), s));
}

TEST_CASE("reference: the prefill write plan, and compare against it (any conv K)", "[reference][prefill]") {
  using namespace prefill_test;
  ProblemSpec spec = rows_spec(1, 12, KDAJIT_DTYPE_F32, 80);
  spec.conv_taps = 5;  // taps 3..4 belong to no prefill
  spec.slot_pad = 8;
  Problem p = make_problem(spec);
  REQUIRE(p.view(Tensor::conv_state).shape[2] == 5);
  // The sequences of the zero-rows case: live rows 1..3 (slot 1) and 8..9 (slot 3).
  PrefillMeta m{{1, 2, 0, 1000, 3}, {1, 4, 4, 6, 8, 10}, {1, 1, 1, 1, 0}};
  auto plan = plan_prefill_writes(prefill_args(p, m));
  REQUIRE(plan.ok());
  CHECK(plan->row_live == std::vector<uint8_t>{0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0});
  for (int64_t s = 0; s < p.num_slots(); ++s) {
    INFO("slot " << s);
    CHECK(plan->state_written[static_cast<size_t>(s)] == (s == 1 || s == 3 ? 1 : 0));
    CHECK(plan->conv_taps_written[static_cast<size_t>(s)] == (s == 1 || s == 3 ? 3 : 0));
  }
  Problem expected = p;
  run_prefill(expected, m);
  Problem got = expected;
  CHECK(compare(expected, got, *plan).pass);
  // A changed tap 3 (no prefill writes it) and a changed padding byte of a written slot fail.
  auto bad_tap = got;
  store_bits16(bad_tap.view(Tensor::conv_state), {1, 0, 3}, 0x3f80);
  auto rep = compare(expected, bad_tap, *plan);
  CHECK_FALSE(rep.pass);
  CHECK(rep.untouched_mismatches == 1);
  auto bad_pad = got;
  const int64_t slot_bytes = bad_pad.view(Tensor::state).strides[0] * 4;
  bad_pad.bytes(Tensor::state)[static_cast<size_t>(2 * slot_bytes - 1)] ^= std::byte{1};  // slot 1's padding
  CHECK_FALSE(compare(expected, bad_pad, *plan).pass);
  ProblemSpec bad = spec;
  bad.conv_taps = 19;
  CHECK_FALSE(Problem::make(bad).ok());
}

// The GPU tests hold a prefill against the single op applied token by token
// with the prefill's state limits (f32 2e-3, bf16 8e-3); the reference itself,
// which rounds the single op's state after every token and carries the
// prefill's unrounded, must sit well inside them over 300 tokens.
TEST_CASE("reference: 300 tokens of single steps stay within the prefill's tolerances", "[reference][prefill]") {
  using namespace prefill_test;
  for (auto dtype : {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16}) {
    Problem chunked = make_problem(rows_spec(2, 300, dtype, 90 + dtype));
    Problem stepwise = chunked;
    PrefillMeta m{{3}, {0, 300}, {1}};
    run_prefill(chunked, m);
    for (int64_t r = 0; r < 300; ++r) single_step(stepwise, r, 3);
    auto plan = plan_prefill_writes(prefill_args(chunked, m));
    REQUIRE(plan.ok());
    const CompareReport rep = compare(chunked, stepwise, *plan, chunked_tolerances());
    INFO("dtype " << dtype << ": " << rep.summary());
    CHECK(rep.pass);
    CHECK(rep.state_rel_l2 < (dtype == KDAJIT_DTYPE_BF16 ? 4e-3 : 1e-6));
    CHECK(rep.output_rel_l2 < 5e-3);
  }
}

TEST_CASE("the chunk op's undefined output rows: two writers of CONTRACT §11.2", "[reference][chunk]") {
  using kdajit::ref::undefined_output_rows;
  auto rows_of = [](const std::vector<bool>& u) {
    std::vector<int> out;
    for (size_t r = 0; r < u.size(); ++r)
      if (u[r]) out.push_back(static_cast<int>(r));
    return out;
  };
  // Non-decreasing: every row has one writer (zero rows before cu[0], after cu[N], empty ranges).
  CHECK(rows_of(undefined_output_rows({3, 70, 70, 100}, 110)).empty());
  // [70, 60) steps back: [60, 200) also covers rows 60..69 of [3, 70).
  std::vector<int> want;
  for (int r = 60; r < 70; ++r) want.push_back(r);
  CHECK(rows_of(undefined_output_rows({3, 70, 60, 200, 200, 1100, 1300}, 1250)) == want);
  // [4, 30) is past T_total = 12: zeros on [4, 12), where the tail from cu[N] = 8 also writes.
  CHECK(rows_of(undefined_output_rows({2, 4, 30, 8}, 12)) == std::vector<int>{8, 9, 10, 11});
}
