// The benchmark's options and its grid of cells (one cell = one decode call
// configuration), with the bytes each call moves (docs/CONTRACT.md §7).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kdajit/error.hpp"
#include "kdajit/kdajit.h"
#include "kdajit/kernel_key.hpp"

namespace kdajit::bench {

inline constexpr int64_t D = 128;

struct Options {
  std::string op = "all";  // single | packed | all (the decode grid) | prefill (the prefill grid, prefill_grid.hpp)
  std::vector<int> heads, rows, tokens;
  std::vector<std::string> shapes;  // the prefill grid's prompts: NxL or mixN
  std::vector<std::string> states, convs;
  std::string routes = "selector";  // selector | all | NAME,NAME
  std::string tuning = "off";       // off | on | both
  bool pdl = false;
  std::vector<std::string> floor_shapes;  // empty: every shape
  int floor_spin_cycles = 0;  // diagnostic floor shapes: clock cycles between a thread's state loads landing and its stores
  int iters = 200;
  int host_calls = 1000;
  std::string json_path, commit, cache_dir;
  int device = 0;
  double time_limit_s = 280;
  double gpu_timeout_s = 20;
  int jobs = 0;  // prewarm compiles in parallel; 0: cores - 1
  int flush_mib = 256;
  int copy_mib = 2048;
  int copy_reps = 20;
  bool warm = true;
  bool list = false;
  bool compile_only = false;
  std::string arch = "sm_90";  // --compile-only target
  bool verbose = false;
};

// One decode call configuration, in the kernel key's fields (kdajit/kernel_key.hpp:
// their spellings come from its KeyField tables). count is R for the single op, N
// for the packed op (every sequence then has L = T tokens, so R = N * T).
struct Cell {
  Op op = Op::single;
  int heads = 0;
  StateDtype state = StateDtype::f32;
  ConvLayout conv = ConvLayout::sd;
  int tokens = 1;
  int count = 0;
};

// The C ABI's value of a key field, for the calls through kdajit.h.
kdajit_op_t c_op(Op op);
kdajit_dtype_t c_dtype(StateDtype t);
int64_t state_elem_bytes(StateDtype t);
int64_t rows_of(const Cell& c);  // R
std::string cell_name(const Cell& c);

// Bytes one call moves (docs/CONTRACT.md §7, every sequence L = T).
int64_t bytes_per_call(const Cell& c);

// The axes both grids read alike: --state (default every dtype), --conv (empty
// when not given: each grid has its own default) and --heads (checked against
// 1..kMaxHeads; empty when not given), in that order of checks.
struct SharedAxes {
  std::vector<StateDtype> states;
  std::vector<ConvLayout> convs;
};
Result<SharedAxes> parse_shared_axes(const Options& o);

// The default grid (README) or the one the flags select; duplicates removed.
Result<std::vector<Cell>> make_cells(const Options& o);

// Cells that differ only in count share one family: its device buffers are
// allocated and filled once, for the largest count.
struct Family {
  Cell shape;  // count = the largest
  std::vector<size_t> cells;
};
std::vector<Family> make_families(const std::vector<Cell>& cells);

// Rough seconds of GPU work for the whole run (for --list): a guide, not a measurement.
double estimate_seconds(const Options& o, const std::vector<Cell>& cells);

}  // namespace kdajit::bench
