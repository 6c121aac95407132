#include "grid.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "floor_kernel.hpp"
#include "timing.hpp"

namespace kdajit::bench {

const char* op_name(kdajit_op_t op) { return op == KDAJIT_OP_SINGLE ? "single" : "packed"; }
const char* state_name(kdajit_dtype_t t) { return t == KDAJIT_DTYPE_F32 ? "f32" : "bf16"; }
const char* conv_name(kdajit_conv_layout_t c) { return c == KDAJIT_CONV_SD ? "sd" : "ds"; }
int64_t state_elem_bytes(kdajit_dtype_t t) { return t == KDAJIT_DTYPE_F32 ? 4 : 2; }
int64_t rows_of(const Cell& c) { return c.op == KDAJIT_OP_SINGLE ? c.count : int64_t{c.count} * c.tokens; }

std::string cell_name(const Cell& c) {
  if (c.op == KDAJIT_OP_SINGLE)
    return fmt::format("single h{} r{} {} {}", c.heads, c.count, state_name(c.state), conv_name(c.conv));
  return fmt::format("packed h{} n{} t{} {} {}", c.heads, c.count, c.tokens, state_name(c.state), conv_name(c.conv));
}

int64_t bytes_per_call(const Cell& c) {
  const int64_t b = state_elem_bytes(c.state), H = c.heads;
  if (c.op == KDAJIT_OP_SINGLE) return int64_t{c.count} * H * (2 * D * D * b + 4608 + 1538);
  const int64_t L = c.tokens;
  return int64_t{c.count} * H * (D * D * b * (1 + L) + 2304 + 768 * (2 + L) + 1538 * L);
}

Result<std::vector<Cell>> make_cells(const Options& o) {
  std::vector<kdajit_op_t> ops;
  if (o.op == "single" || o.op == "all") ops.push_back(KDAJIT_OP_SINGLE);
  if (o.op == "packed" || o.op == "all") ops.push_back(KDAJIT_OP_PACKED);
  if (ops.empty()) return invalid_argument(fmt::format("--op: expected single, packed or all, got '{}'", o.op));
  std::vector<kdajit_dtype_t> states;
  for (const auto& s : o.states) {
    if (s == "f32")
      states.push_back(KDAJIT_DTYPE_F32);
    else if (s == "bf16")
      states.push_back(KDAJIT_DTYPE_BF16);
    else
      return invalid_argument(fmt::format("--state: expected f32 or bf16, got '{}'", s));
  }
  if (states.empty()) states = {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16};
  std::vector<kdajit_conv_layout_t> convs;
  for (const auto& s : o.convs) {
    if (s == "sd")
      convs.push_back(KDAJIT_CONV_SD);
    else if (s == "ds")
      convs.push_back(KDAJIT_CONV_DS);
    else
      return invalid_argument(fmt::format("--conv: expected sd or ds, got '{}'", s));
  }
  for (int h : o.heads)
    if (h < 1 || h > 128) return invalid_argument(fmt::format("--heads: expected values in 1..128, got {}", h));
  for (int r : o.rows)
    if (r < 1 || r > 4096) return invalid_argument(fmt::format("--rows: expected values in 1..4096, got {}", r));
  for (int t : o.tokens)
    if (t < 1 || t > kFloorMaxTokens)
      return invalid_argument(fmt::format("--tokens: expected values in 1..{}, got {}", kFloorMaxTokens, t));

  std::vector<Cell> out;
  for (kdajit_op_t op : ops) {
    const bool single = op == KDAJIT_OP_SINGLE;
    const std::vector<int> hs = !o.heads.empty() ? o.heads
                                : single         ? std::vector{8, 16, 32, 64, 96}
                                                 : std::vector{16, 64};
    const std::vector<int> ns = !o.rows.empty() ? o.rows
                                : single        ? std::vector{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}
                                                : std::vector{1, 8, 32, 128};
    const std::vector<int> ts = single ? std::vector{1} : !o.tokens.empty() ? o.tokens : std::vector{2, 3, 4, 8};
    for (int t : ts)
      for (int h : hs)
        for (kdajit_dtype_t st : states)
          for (int n : ns) {
            if (!convs.empty()) {
              for (kdajit_conv_layout_t cv : convs) out.push_back(Cell{op, h, st, cv, t, n});
              continue;
            }
            // The default layouts: SD everywhere, DS on H = 64 (packed: T = 4).
            out.push_back(Cell{op, h, st, KDAJIT_CONV_SD, t, n});
            if (h == 64 && (single || t == 4)) out.push_back(Cell{op, h, st, KDAJIT_CONV_DS, t, n});
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
