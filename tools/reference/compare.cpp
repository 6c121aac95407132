// The checker of docs/CONTRACT.md §8.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "kdajit/bf16.hpp"
#include "kdajit/problem.hpp"
#include "view_iter.hpp"

namespace kdajit::ref {

namespace {

using Interval = std::pair<int64_t, int64_t>;  // [begin, end) in bytes

class Failures {
 public:
  explicit Failures(CompareReport& rep) : rep_(rep) {}
  void add(std::string msg) {
    rep_.pass = false;
    if (rep_.message.empty()) rep_.message = msg;
    if (rep_.failures.size() < 12) rep_.failures.push_back(std::move(msg));
  }

 private:
  CompareReport& rep_;
};

double value_at(const std::vector<std::byte>& b, kdajit_dtype_t dtype, int64_t off) {
  if (dtype == KDAJIT_DTYPE_BF16) {
    uint16_t v;
    std::memcpy(&v, &b[static_cast<size_t>(off)], 2);
    return bf16_bits_to_f64(v);
  }
  float f;
  std::memcpy(&f, &b[static_cast<size_t>(off)], 4);
  return f;
}

void add_interval(std::vector<Interval>& iv, int64_t off, int64_t size) {
  if (!iv.empty() && iv.back().second == off) iv.back().second = off + size;
  else iv.emplace_back(off, off + size);
}

// Every byte outside the written intervals must equal the before-snapshot.
void check_untouched(Failures& fail, CompareReport& rep, std::string_view name, const std::vector<std::byte>& got,
                     const std::vector<std::byte>& before, std::vector<Interval> written, int64_t slot_bytes) {
  std::sort(written.begin(), written.end());
  int64_t pos = 0, first_bad = -1, bad = 0;
  auto scan = [&](int64_t lo, int64_t hi) {
    if (lo >= hi || std::memcmp(&got[static_cast<size_t>(lo)], &before[static_cast<size_t>(lo)], static_cast<size_t>(hi - lo)) == 0) return;
    for (int64_t i = lo; i < hi; ++i)
      if (got[static_cast<size_t>(i)] != before[static_cast<size_t>(i)]) {
        if (first_bad < 0) first_bad = i;
        ++bad;
      }
  };
  for (const auto& [b, e] : written) {
    scan(pos, b);
    pos = std::max(pos, e);
  }
  scan(pos, static_cast<int64_t>(got.size()));
  if (bad == 0) return;
  rep.untouched_mismatches += bad;
  fail.add(fmt::format("{}: {} byte(s) changed that the call must not write; first at byte {}{}", name, bad, first_bad,
                       slot_bytes > 0 ? fmt::format(" (slot {}, outside the written elements)", first_bad / slot_bytes)
                                      : std::string(" (row padding)")));
}

double rel_l2(double err2, double ref2) {
  if (ref2 == 0.0) return err2 == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(err2 / ref2);
}

void compare_output(Failures& fail, CompareReport& rep, const Problem& exp, const Problem& got, const WritePlan& plan,
                    const Tolerances& tol) {
  const kdajit_tensor_t& v = exp.view(Tensor::output);
  const auto& eb = exp.bytes(Tensor::output);
  const auto& gb = got.bytes(Tensor::output);
  std::vector<Interval> written;
  double err2 = 0, ref2 = 0;
  detail::for_each_element(v, [&](const detail::Index& i, int64_t off) {
    add_interval(written, off, 2);
    const double e = value_at(eb, KDAJIT_DTYPE_BF16, off), g = value_at(gb, KDAJIT_DTYPE_BF16, off);
    const bool live = plan.row_live[static_cast<size_t>(i[0])] != 0;
    const double d = std::fabs(g - e);
    err2 += (g - e) * (g - e);
    ref2 += e * e;
    if (std::isfinite(d)) rep.output_max_abs = std::max(rep.output_max_abs, d);
    std::string why;
    if (!std::isfinite(g)) why = "not finite";
    else if (!live && g != 0.0) why = fmt::format("row {} is not computed and must be zero", i[0]);
    else if (live && !tol.output_within(g, e))
      why = fmt::format("outside rtol {} / atol {}", tol.output_rtol, tol.output_atol);
    if (why.empty()) return;
    if (rep.output_bad_elements++ < 3)
      fail.add(fmt::format("output[{}, {}, {}]: got {}, expected {} ({})", i[0], i[1], i[2], g, e, why));
  });
  if (rep.output_bad_elements > 3) fail.add(fmt::format("output: {} bad elements in all", rep.output_bad_elements));
  rep.output_rel_l2 = rel_l2(err2, ref2);
  if (!(rep.output_rel_l2 <= tol.output_rel_l2))
    fail.add(fmt::format("output: relative L2 error {:.3e} > {:.0e}", rep.output_rel_l2, tol.output_rel_l2));
  check_untouched(fail, rep, "output", gb, got.initial(Tensor::output), std::move(written), 0);
}

void compare_state(Failures& fail, CompareReport& rep, const Problem& exp, const Problem& got, const WritePlan& plan,
                   const Tolerances& tol) {
  const kdajit_tensor_t& v = exp.view(Tensor::state);
  const auto& eb = exp.bytes(Tensor::state);
  const auto& gb = got.bytes(Tensor::state);
  const auto& bb = got.initial(Tensor::state);
  const int64_t es = static_cast<int64_t>(dtype_size(v.dtype));
  std::vector<Interval> written;
  double err2 = 0, ref2 = 0, change2 = 0;
  // A row of k is one written interval when k is contiguous (the intervals
  // merge the same either way); the element type is fixed per walk.
  const bool contiguous_k = v.strides[3] == 1;
  // The maximum and the bad count in locals, written to rep after the walk:
  // the byte loads may alias anything, so members of rep would be stored and
  // reloaded per element.
  double max_abs = rep.state_max_abs;
  int64_t bad = rep.state_bad_elements;
  auto walk = [&](auto element) {
    using E = decltype(element);
    auto at = [](const std::vector<std::byte>& b, int64_t off) {
      E x;
      std::memcpy(&x, &b[static_cast<size_t>(off)], sizeof(E));
      if constexpr (std::is_same_v<E, uint16_t>) return bf16_bits_to_f64(x);
      else return static_cast<double>(x);
    };
    for (int64_t s = 0; s < plan.slots; ++s) {
      if (!plan.state_written[static_cast<size_t>(s)]) continue;
      for (int64_t h = 0; h < v.shape[1]; ++h)
        for (int64_t r = 0; r < v.shape[2]; ++r) {
          const int64_t row = (s * v.strides[0] + h * v.strides[1] + r * v.strides[2]) * es;
          if (contiguous_k) add_interval(written, row, v.shape[3] * es);
          for (int64_t k = 0; k < v.shape[3]; ++k) {
            const int64_t off = row + k * v.strides[3] * es;
            if (!contiguous_k) add_interval(written, off, es);
            const double e = at(eb, off), g = at(gb, off), b = at(bb, off);
            err2 += (g - e) * (g - e);
            ref2 += e * e;
            change2 += (e - b) * (e - b);
            if (std::isfinite(g)) {
              max_abs = std::max(max_abs, std::fabs(g - e));
            } else if (bad++ < 3) {
              fail.add(fmt::format("state[slot {}, {}, {}, {}]: got {}, expected {}", s, h, r, k, g, e));
            }
          }
        }
    }
  };
  const bool bf16 = v.dtype == KDAJIT_DTYPE_BF16;
  if (bf16) walk(uint16_t{});
  else walk(float{});
  rep.state_max_abs = max_abs;
  rep.state_bad_elements = bad;
  const double lim = tol.state_rel_l2(bf16);
  rep.state_rel_l2 = rel_l2(err2, ref2);
  rep.state_change_rel_l2 = rel_l2(err2, change2);
  if (!(rep.state_rel_l2 <= lim))
    fail.add(fmt::format("state ({}): relative L2 error {:.3e} > {:.0e} over the written slots", to_string(bf16 ? StateDtype::bf16 : StateDtype::f32),
                         rep.state_rel_l2, lim));
  if (!(rep.state_change_rel_l2 <= tol.state_change_rel_l2))
    fail.add(fmt::format("state: relative L2 error of the change (after - before) {:.3e} > {:.0e}",
                         rep.state_change_rel_l2, tol.state_change_rel_l2));
  check_untouched(fail, rep, "state", gb, bb, std::move(written), v.strides[0] * es);
}

void compare_conv(Failures& fail, CompareReport& rep, const Problem& exp, const Problem& got, const WritePlan& plan) {
  const kdajit_tensor_t& v = exp.view(Tensor::conv_state);
  const auto& eb = exp.bytes(Tensor::conv_state);
  const auto& gb = got.bytes(Tensor::conv_state);
  if (eb == gb) return;
  detail::for_each_element(v, [&](const detail::Index& i, int64_t off) {
    uint16_t e, g;
    std::memcpy(&e, &eb[static_cast<size_t>(off)], 2);
    std::memcpy(&g, &gb[static_cast<size_t>(off)], 2);
    if (e == g) return;
    const bool written = i[2] < plan.conv_taps_written[static_cast<size_t>(i[0])];
    if (!written) ++rep.untouched_mismatches;
    if (rep.conv_mismatches++ < 3)
      fail.add(fmt::format("conv_state[slot {}, channel {}, tap {}]: got 0x{:04x}, expected 0x{:04x} ({}; must be exact)",
                           i[0], i[1], i[2], g, e, written ? "a written tap" : "must stay untouched"));
  });
  if (rep.conv_mismatches > 3) fail.add(fmt::format("conv_state: {} elements differ in all", rep.conv_mismatches));
  if (rep.conv_mismatches == 0) {  // then only padding differs; a bit mask (SD elements do not merge into intervals)
    const auto& bb = got.initial(Tensor::conv_state);
    std::vector<bool> element(gb.size(), false);
    detail::for_each_element(v, [&](const detail::Index&, int64_t off) {
      element[static_cast<size_t>(off)] = element[static_cast<size_t>(off) + 1] = true;
    });
    int64_t bad = 0, first_bad = -1;
    for (size_t i = 0; i < gb.size(); ++i)
      if (!element[i] && gb[i] != bb[i]) {
        if (first_bad < 0) first_bad = static_cast<int64_t>(i);
        ++bad;
      }
    rep.untouched_mismatches += bad;
    fail.add(fmt::format("conv_state: {} padding byte(s) changed; first at byte {} (slot {})", bad, first_bad,
                         v.strides[0] > 0 ? first_bad / (v.strides[0] * 2) : 0));
  }
}

}  // namespace

std::string CompareReport::summary() const {
  return fmt::format("{}: output rel L2 {:.3e} (max abs {:.3e}, {} bad), state rel L2 {:.3e} (change {:.3e}, max abs {:.3e}), "
                     "conv mismatches {}, untouched bytes changed {}{}{}",
                     pass ? "PASS" : "FAIL", output_rel_l2, output_max_abs, output_bad_elements, state_rel_l2,
                     state_change_rel_l2, state_max_abs, conv_mismatches, untouched_mismatches, pass ? "" : "; first: ",
                     message);
}

namespace {

// Both must be copies of one problem: same geometry, same inputs, same
// before-snapshot. False when they are not (nothing more can be compared);
// a changed input is a failure but leaves the rest comparable.
bool same_problem(Failures& fail, const Problem& expected, const Problem& got) {
  for (int i = 0; i < kNumTensors; ++i) {
    const auto t = static_cast<Tensor>(i);
    const bool same_before = &expected.initial(t) == &got.initial(t) || expected.initial(t) == got.initial(t);
    if (expected.bytes(t).size() != got.bytes(t).size() || !same_before) {
      fail.add(fmt::format("{}: expected and got are not copies of one problem (different size or before-state)", tensor_name(t)));
      return false;
    }
    if (!tensor_written(t) && expected.bytes(t) != got.bytes(t))
      fail.add(fmt::format("{}: an input changed (it must be read only)", tensor_name(t)));
  }
  return true;
}

}  // namespace

CompareReport compare(const Problem& expected, const Problem& got, const WritePlan& plan, const Tolerances& tol) {
  CompareReport rep;
  Failures fail(rep);
  if (!same_problem(fail, expected, got)) return rep;
  compare_output(fail, rep, expected, got, plan, tol);
  compare_state(fail, rep, expected, got, plan, tol);
  compare_conv(fail, rep, expected, got, plan);
  return rep;
}

CompareReport compare(const Problem& expected, const Problem& got, const Tolerances& tol) {
  auto plan = plan_writes(expected.op(), expected.args());
  if (!plan) {
    CompareReport rep;
    Failures(rep).add("the problem's arguments are invalid: " + plan.error().message);
    return rep;
  }
  return compare(expected, got, *plan, tol);
}

bool bitwise_equal(const Problem& a, const Problem& b) {
  for (Tensor t : {Tensor::output, Tensor::state, Tensor::conv_state})
    if (a.bytes(t) != b.bytes(t)) return false;
  return true;
}

}  // namespace kdajit::ref
