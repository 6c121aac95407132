#include "grid.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "floor_kernel.hpp"
#include "timing.hpp"

namespace kdajit::bench {

kdajit_op_t c_op(Op op) { return op == Op::single ? KDAJIT_OP_SINGLE : KDAJIT_OP_PACKED; }
kdajit_dtype_t c_dtype(StateDtype t) { return t == StateDtype::f32 ? KDAJIT_DTYPE_F32 : KDAJIT_DTYPE_BF16; }
int64_t state_elem_bytes(StateDtype t) { return t == StateDtype::f32 ? 4 : 2; }
int64_t rows_of(const Cell& c) { return c.op == Op::single ? c.count : int64_t{c.count} * c.tokens; }

std::string cell_name(const Cell& c) {
  if (c.op == Op::single)
    return fmt::format("{} h{} r{} {} {}", to_string(c.op), c.heads, c.count, to_string(c.state), to_string(c.conv));
  return fmt::format("{} h{} n{} t{} {} {}", to_string(c.op), c.heads, c.count, c.tokens, to_string(c.state),
                     to_string(c.conv));
}

int64_t bytes_per_call(const Cell& c) {
  const int64_t b = state_elem_bytes(c.state), H = c.heads;
  if (c.op == Op::single) return int64_t{c.count} * H * (2 * D * D * b + 4608 + 1538);
  const int64_t L = c.tokens;
  return int64_t{c.count} * H * (D * D * b * (1 + L) + 2304 + 768 * (2 + L) + 1538 * L);
}

namespace {

// The values of a list flag (`flag` in messages), each spelled as the key field's table says.
template <KeyEnum E>
Result<std::vector<E>> parse_list(const char* flag, const std::vector<std::string>& spellings) {
  std::vector<E> out;
  for (const auto& s : spellings) {
    auto v = parse_field<E>(s);
    if (!v) return invalid_argument(fmt::format("{}: expected one of {}, got '{}'", flag, choices<E>(", "), s));
    out.push_back(*v);
  }
  return out;
}

}  // namespace

Result<SharedAxes> parse_shared_axes(const Options& o) {
  SharedAxes axes;
  KDAJIT_TRY_ASSIGN(axes.states, parse_list<StateDtype>("--state", o.states));
  if (axes.states.empty())
    for (StateDtype st : all_values<StateDtype>()) axes.states.push_back(st);
  KDAJIT_TRY_ASSIGN(axes.convs, parse_list<ConvLayout>("--conv", o.convs));
  for (int h : o.heads)
    if (h < 1 || h > kMaxHeads)
      return invalid_argument(fmt::format("--heads: expected values in 1..{}, got {}", kMaxHeads, h));
  return axes;
}

Result<std::vector<Cell>> make_cells(const Options& o) {
  std::vector<Op> ops;
  if (o.op == "all") {
    for (Op op : kDecodeOps) ops.push_back(op);
  } else if (auto op = parse_field<Op>(o.op); op && !chunked(*op)) {
    ops.push_back(*op);
  } else {
    // This grid times the decode ops (their cells are rows or sequences of T
    // tokens); --op prefill selects the prefill grid (prefill_grid.hpp). The
    // chunk op is timed by bench/bench_prefill.py beside FLA's chunk_kda.
    return invalid_argument(fmt::format("--op: expected one of {}, {}, all, {}, got '{}'{}", to_string(Op::single),
                                        to_string(Op::packed), to_string(Op::prefill), o.op,
                                        o.op == to_string(Op::chunk) ? " (bench/bench_prefill.py times the chunk op)" : ""));
  }
  KDAJIT_TRY_ASSIGN(const SharedAxes axes, parse_shared_axes(o));
  const std::vector<StateDtype>& states = axes.states;
  const std::vector<ConvLayout>& convs = axes.convs;
  for (int r : o.rows)
    if (r < 1 || r > 4096) return invalid_argument(fmt::format("--rows: expected values in 1..4096, got {}", r));
  for (int t : o.tokens)
    if (t < 1 || t > kFloorMaxTokens)
      return invalid_argument(fmt::format("--tokens: expected values in 1..{}, got {}", kFloorMaxTokens, t));

  std::vector<Cell> out;
  for (Op op : ops) {
    const bool single = op == Op::single;
    const std::vector<int> hs = !o.heads.empty() ? o.heads
                                : single         ? std::vector{8, 16, 32, 64, 96}
                                                 : std::vector{16, 64};
    const std::vector<int> ns = !o.rows.empty() ? o.rows
                                : single        ? std::vector{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}
                                                : std::vector{1, 8, 32, 128};
    const std::vector<int> ts = single ? std::vector{1} : !o.tokens.empty() ? o.tokens : std::vector{2, 3, 4, 8};
    for (int t : ts)
      for (int h : hs)
        for (StateDtype st : states)
          for (int n : ns) {
            if (!convs.empty()) {
              for (ConvLayout cv : convs) out.push_back(Cell{op, h, st, cv, t, n});
              continue;
            }
            // The default layouts: SD everywhere, DS on H = 64 (packed: T = 4).
            out.push_back(Cell{op, h, st, ConvLayout::sd, t, n});
            if (h == 64 && (single || t == 4)) out.push_back(Cell{op, h, st, ConvLayout::ds, t, n});
          }
  }
  std::vector<Cell> unique;
  for (const Cell& c : out) {
    auto same = [&](const Cell& u) {
      return std::tie(u.op, u.heads, u.state, u.conv, u.tokens, u.count) ==
             std::tie(c.op, c.heads, c.state, c.conv, c.tokens, c.count);
    };
    if (std::none_of(unique.begin(), unique.end(), same)) unique.push_back(c);
  }
  return unique;
}

std::vector<Family> make_families(const std::vector<Cell>& cells) {
  std::vector<Family> fams;
  for (size_t i = 0; i < cells.size(); ++i) {
    const Cell& c = cells[i];
    auto it = std::find_if(fams.begin(), fams.end(), [&](const Family& f) {
      return std::tie(f.shape.op, f.shape.heads, f.shape.state, f.shape.conv, f.shape.tokens) ==
             std::tie(c.op, c.heads, c.state, c.conv, c.tokens);
    });
    if (it == fams.end()) {
      fams.push_back(Family{c, {}});
      it = fams.end() - 1;
    }
    it->shape.count = std::max(it->shape.count, c.count);
    it->cells.push_back(i);
  }
  return fams;
}

double estimate_seconds(const Options& o, const std::vector<Cell>& cells) {
  // H200-like guesses: 3.3 TB/s achieved, 8 us for a tiny call, 90 us per L2 flush.
  const double flush_s = static_cast<double>(o.flush_mib) * 1048576.0 / 3.0e12;
  int timed_variants = 1 + static_cast<int>(o.floor_shapes.empty() ? kFloorKernelCount : o.floor_shapes.size());
  if (o.tuning == "both") ++timed_variants;
  if (o.routes != "selector") timed_variants += 2;  // a guess at the routes timed per cell
  double s = 0;
  for (const Cell& c : cells) {
    const double k = static_cast<double>(bytes_per_call(c)) / 3.3e12 + 8e-6;
    s += o.iters * (timed_variants * (k + flush_s) + (o.warm ? k : 0));
    if (o.pdl) s += o.iters * 2 * (2 * k + flush_s);
    s += 2 * host_loop_calls(o.host_calls, k * 1e6) * std::max(k, 5e-6);  // kdajit and bare-launch loops
  }
  return s;
}

}  // namespace kdajit::bench
