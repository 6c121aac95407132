#include "kdajit/chunk_problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "kdajit/bf16.hpp"
#include "kdajit/problem.hpp"
#include "kdajit/reference.hpp"
#include "kdajit/rng.hpp"

namespace kdajit::ref {

namespace {

constexpr int64_t kD = 128;
constexpr uint16_t kPoisonBf16 = 0x7FC1;  // a quiet NaN

HostTensor host_tensor(kdajit_dtype_t dtype, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> strides) {
  HostTensor t;
  t.view.dtype = dtype;
  t.view.ndim = static_cast<int32_t>(shape.size());
  int64_t extent = 1;
  int i = 0;
  for (int64_t s : shape) t.view.shape[i++] = s;
  i = 0;
  for (int64_t s : strides) t.view.strides[i++] = s;
  for (i = 0; i < t.view.ndim; ++i) extent += (t.view.shape[i] - 1) * t.view.strides[i];
  t.bytes.resize(static_cast<size_t>(extent) * dtype_size(dtype));
  t.view.data = t.bytes.data();
  return t;
}

void put(HostTensor& t, size_t at, double x) {
  if (t.view.dtype == KDAJIT_DTYPE_BF16) {
    const uint16_t b = f64_to_bf16_bits(x);
    std::memcpy(&t.bytes[at], &b, 2);
  } else {
    const float f = static_cast<float>(x);
    std::memcpy(&t.bytes[at], &f, 4);
  }
}

// Every element position of the buffer (padding included) from `draw`.
template <class Draw>
void fill(HostTensor& t, Draw draw) {
  const size_t elem = dtype_size(t.view.dtype);
  for (size_t i = 0; i + elem <= t.bytes.size(); i += elem) put(t, i, draw());
}

void poison(HostTensor& t) {
  const size_t elem = dtype_size(t.view.dtype);
  for (size_t i = 0; i + elem <= t.bytes.size(); i += elem) {
    if (elem == 2) {
      std::memcpy(&t.bytes[i], &kPoisonBf16, 2);
    } else {
      const float nan = std::nanf("");
      std::memcpy(&t.bytes[i], &nan, 4);
    }
  }
}

std::string_view dtype_word(kdajit_dtype_t d) { return d == KDAJIT_DTYPE_F32 ? "f32" : "bf16"; }

}  // namespace

std::string ChunkSpec::name() const {
  std::string s = fmt::format("kda_chunk.h{}.state_{} gate {} g {} beta {}", heads, dtype_word(state),
                              gate == KDAJIT_GATE_BOUNDED ? "bounded" : "softplus", dtype_word(g_dtype),
                              dtype_word(beta_dtype));
  if (!qk_l2norm) s += ", no L2 norm";
  if (!beta_sigmoid) s += ", beta as given";
  if (state_v_first) s += ", state_v_first";
  if (!initial) s += ", no initial state";
  if (in_place) s += ", in place";
  else if (!final_state) s += ", no final state";
  if (!dt_bias) s += ", no dt_bias";
  if (row_pad % 8 != 0) s += fmt::format(", row pad {}", row_pad);
  // The sequences: which call of a test this is (a failure names it).
  if (cu.empty()) s += fmt::format(", lengths {}", fmt::join(lengths, " "));
  else s += fmt::format(", cu_seqlens {}, T_total {}", fmt::join(cu, " "), rows);
  return s;
}

ChunkProblem ChunkProblem::make(const ChunkSpec& s) {
  ChunkProblem p;
  p.spec = s;
  // One stream per tensor (kdajit/rng.hpp: the same values with any C++ library).
  enum : uint64_t { kQ, kK, kV, kG, kBeta, kALog, kDtBias, kInitial };
  std::vector<int32_t> cu = s.cu;
  if (cu.empty()) {
    cu.push_back(0);
    for (int32_t L : s.lengths) cu.push_back(cu.back() + L);
  }
  p.H = s.heads;
  p.N = static_cast<int64_t>(cu.size()) - 1;
  p.R = s.rows > 0 ? s.rows : *std::max_element(cu.begin(), cu.end()) + s.rows_after;
  const int64_t H = p.H, R = p.R, N = p.N, hidden = H * kD, pad = s.row_pad, slice = kD * kD;
  // Padded strides: row padding of q, k, output, beta and the sequence stride
  // of initial_state are never read (and never written: they stay poisoned).
  p.q = host_tensor(KDAJIT_DTYPE_BF16, {R, H, kD}, {hidden + pad, kD, 1});
  p.k = host_tensor(KDAJIT_DTYPE_BF16, {R, H, kD}, {hidden + 2 * pad, kD, 1});
  p.v = host_tensor(KDAJIT_DTYPE_BF16, {R, H, kD}, {hidden, kD, 1});
  p.g = host_tensor(s.g_dtype, {R, H, kD}, {hidden, kD, 1});
  p.beta = host_tensor(s.beta_dtype, {R, H}, {H + 3, 1});
  p.A_log = host_tensor(KDAJIT_DTYPE_F32, {H}, {1});
  p.output = host_tensor(KDAJIT_DTYPE_BF16, {R, H, kD}, {hidden + pad, kD, 1});
  p.cu = host_tensor(KDAJIT_DTYPE_INT32, {N + 1}, {1});
  std::memcpy(p.cu.bytes.data(), cu.data(), cu.size() * 4);
  // Without the L2 norm the caller's q and k carry it: unit-norm rows on average.
  const double qk_sd = s.qk_l2norm ? 1.0 : 1.0 / std::sqrt(static_cast<double>(kD));
  Rng rq(s.seed, kQ), rk(s.seed, kK), rv(s.seed, kV), rg(s.seed, kG), rb(s.seed, kBeta), ra(s.seed, kALog);
  fill(p.q, [&] { return qk_sd * rq.normal(); });
  fill(p.k, [&] { return qk_sd * rk.normal(); });
  fill(p.v, [&] { return rv.normal(); });
  fill(p.g, [&] { return rg.normal(); });
  fill(p.beta, [&] { return s.beta_sigmoid ? rb.normal() : rb.uniform(0.05, 0.95); });
  fill(p.A_log, [&] { return 0.5 * ra.normal(); });
  poison(p.output);
  if (s.dt_bias) {
    p.dt_bias = host_tensor(KDAJIT_DTYPE_F32, {hidden}, {1});
    Rng rd(s.seed, kDtBias);
    fill(p.dt_bias, [&] { return 0.5 * rd.normal(); });
  }
  if (s.initial) {
    p.initial = host_tensor(s.state, {N, H, kD, kD}, {H * slice + 16, slice, kD, 1});
    Rng ri(s.seed, kInitial);
    fill(p.initial, [&] { return 0.3 * ri.normal(); });
  }
  if (s.final_state && !s.in_place) {
    p.final_state = host_tensor(s.state, {N, H, kD, kD}, {H * slice, slice, kD, 1});
    poison(p.final_state);
  }
  p.bind();
  return p;
}

ChunkProblem::ChunkProblem(const ChunkProblem& other)
    : spec(other.spec),
      H(other.H),
      R(other.R),
      N(other.N),
      q(other.q),
      k(other.k),
      v(other.v),
      g(other.g),
      beta(other.beta),
      A_log(other.A_log),
      dt_bias(other.dt_bias),
      initial(other.initial),
      final_state(other.final_state),
      output(other.output),
      cu(other.cu) {
  bind();
}

ChunkProblem& ChunkProblem::operator=(const ChunkProblem& other) {
  if (this != &other) {
    ChunkProblem copy(other);
    *this = std::move(copy);
    bind();
  }
  return *this;
}

std::vector<std::pair<HostTensor*, kdajit_tensor_t kdajit_chunk_args_t::*>> ChunkProblem::tensors() {
  return {{&q, &kdajit_chunk_args_t::q},
          {&k, &kdajit_chunk_args_t::k},
          {&v, &kdajit_chunk_args_t::v},
          {&g, &kdajit_chunk_args_t::g},
          {&beta, &kdajit_chunk_args_t::beta},
          {&A_log, &kdajit_chunk_args_t::A_log},
          {&dt_bias, &kdajit_chunk_args_t::dt_bias},
          {&initial, &kdajit_chunk_args_t::initial_state},
          {&final_state, &kdajit_chunk_args_t::final_state},
          {&output, &kdajit_chunk_args_t::output},
          {&cu, &kdajit_chunk_args_t::cu_seqlens}};
}

void ChunkProblem::bind() {
  // kdajit_chunk_args_init's defaults (this library does not link libkdajit).
  std::memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.scale = 0.08838834764831845f;  // 1 / sqrt(128)
  for (auto& [t, field] : tensors()) {
    if (!t->empty()) t->view.data = t->bytes.data();
    args.*field = t->view;
  }
  if (spec.in_place) args.final_state = args.initial_state;
  args.gate = spec.gate;
  args.lower_bound = spec.lower_bound;
  args.qk_l2norm = spec.qk_l2norm;
  args.beta_sigmoid = spec.beta_sigmoid;
  args.state_v_first = spec.state_v_first;
}

std::vector<int32_t> ChunkProblem::cu_values() const {
  std::vector<int32_t> out(static_cast<size_t>(N + 1));
  std::memcpy(out.data(), cu.bytes.data(), out.size() * 4);
  return out;
}

std::string ChunkReport::summary() const {
  return fmt::format(
      "output rel L2 {} ({} elements outside; {} rows undefined, not compared), state rel L2 {}, untouched state "
      "elements changed {}; {}{}{}",
      output_rel_l2, output_bad, undefined_rows, state_rel_l2, state_untouched_bad, message,
      bad_rows.empty() ? "" : "; bad (row, head): ", bad_rows);
}

std::vector<bool> undefined_output_rows(const std::vector<int32_t>& cu, int64_t rows) {
  // Who writes each row (CONTRACT §11.2): a well-formed range its rows, a
  // malformed one zeros on the part of [cu[n], cu[n+1]) inside [0, R) (none
  // when it steps back), and zeros below cu[0] and from cu[N] on.
  std::vector<int> writers(static_cast<size_t>(rows), 0);
  auto mark = [&](int64_t r0, int64_t r1) {
    for (int64_t r = std::max<int64_t>(r0, 0); r < std::min<int64_t>(r1, rows); ++r) ++writers[static_cast<size_t>(r)];
  };
  mark(0, cu.front());
  mark(cu.back(), rows);
  for (size_t n = 0; n + 1 < cu.size(); ++n) mark(cu[n], cu[n + 1]);
  std::vector<bool> out(static_cast<size_t>(rows));
  for (size_t r = 0; r < out.size(); ++r) out[r] = writers[r] > 1;
  return out;
}

ChunkReport compare_chunk(const ChunkProblem& expected, const ChunkProblem& got) {
  ChunkReport r;
  auto fail = [&](std::string m) {
    r.pass = false;
    if (r.message.empty()) r.message = std::move(m);
  };
  // Output, every element of every defined row (zero rows included): rel L2 and atol + rtol.
  const Tolerances tol = chunked_tolerances();
  const std::vector<bool> undefined = undefined_output_rows(got.cu_values(), got.R);
  r.undefined_rows = std::count(undefined.begin(), undefined.end(), true);
  double num = 0, den = 0;
  int listed = 0;
  for (int64_t row = 0; row < got.R; ++row) {
    if (undefined[static_cast<size_t>(row)]) continue;
    for (int64_t h = 0; h < got.H; ++h) {
      int64_t bad = 0;
      double ge = 0, ee = 0;
      for (int64_t i = 0; i < kD; ++i) {
        const double e = load(expected.output.view, {row, h, i}), g = load(got.output.view, {row, h, i});
        num += (g - e) * (g - e);
        den += e * e;
        ge += g * e;
        ee += e * e;
        if (!tol.output_within(g, e) || (e == 0.0 && g != 0.0)) {
          if (r.output_bad++ == 0) fail(fmt::format("output[{}, {}, {}]: got {}, expected {}", row, h, i, g, e));
          ++bad;
        }
      }
      if (bad > 0 && listed++ < 6)
        r.bad_rows += fmt::format("{}({}, {}) x{} scale {:.3g}", r.bad_rows.empty() ? "" : ", ", row, h, bad,
                                  ee > 0 ? ge / ee : 0.0);
    }
  }
  r.output_rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (!(r.output_rel_l2 <= tol.output_rel_l2))
    fail(fmt::format("output: rel L2 {:.3e} > {:.0e}", r.output_rel_l2, tol.output_rel_l2));
  // The written state: live sequences within the limit, the others untouched.
  if (got.spec.final_state || got.spec.in_place) {
    const kdajit_tensor_t& want = expected.written_state().view;
    const kdajit_tensor_t& have = got.written_state().view;
    const std::vector<int32_t> cu = got.cu_values();
    num = den = 0;
    for (int64_t n = 0; n < got.N; ++n) {
      const bool live = cu[n] >= 0 && cu[n] <= cu[n + 1] && cu[n + 1] <= got.R;
      for (int64_t h = 0; h < got.H; ++h)
        for (int64_t a = 0; a < kD; ++a)
          for (int64_t b = 0; b < kD; ++b) {
            const double e = load(want, {n, h, a, b}), g = load(have, {n, h, a, b});
            if (live) {
              num += (g - e) * (g - e);
              den += e * e;
              if (!std::isfinite(g)) fail(fmt::format("final state[{}, {}, {}, {}]: got {}", n, h, a, b, g));
            } else if (std::memcmp(&e, &g, sizeof e) != 0 && !(std::isnan(e) && std::isnan(g))) {
              if (r.state_untouched_bad++ == 0)
                fail(fmt::format("final state[{}, {}, {}, {}]: sequence {} is not live, but it changed", n, h, a, b, n));
            }
          }
    }
    r.state_rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    const double limit = tol.state_rel_l2(got.spec.state != KDAJIT_DTYPE_F32);
    if (!(r.state_rel_l2 <= limit)) fail(fmt::format("final state: rel L2 {:.3e} > {:.0e}", r.state_rel_l2, limit));
  }
  // The padding of output rows is never written (the last row has none in the buffer).
  const int64_t row_bytes = got.output.view.strides[0] * 2, used = got.H * kD * 2;
  for (int64_t row = 0; row + 1 < got.R && row_bytes > used; ++row)
    if (std::memcmp(expected.output.bytes.data() + row * row_bytes + used,
                    got.output.bytes.data() + row * row_bytes + used, static_cast<size_t>(row_bytes - used)) != 0) {
      fail(fmt::format("output: row {}'s padding was written", row));
      break;
    }
  return r;
}

}  // namespace kdajit::ref
