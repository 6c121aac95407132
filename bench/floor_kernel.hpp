// The memory-pattern floor: a kernel that moves exactly the bytes of one decode
// call (docs/CONTRACT.md §7) on the same device buffers, with no math, in a few launch
// shapes; the fastest shape per cell is the cell's floor (README: "The floor kernel").
// Diagnostic shapes (ctas_per_sm > 0) run a floor kernel held to fewer resident
// CTAs per SM; they are timed when named and never count as the floor.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <array>
#include <string>

#include "driver.hpp"
#include "grid.hpp"
#include "kdajit/error.hpp"
#include "kdajit/kdajit.h"

namespace kdajit::bench {

inline constexpr int kFloorMaxTokens = 16;  // T of the packed op the floor kernel can take

struct FloorShape {
  const char* name;
  const char* kernel;  // the entry's shape: floor_<op>_<state>_<kernel>
  int parts;    // CTAs per (item, head), each owning 128 / parts value rows of the state
  int threads;  // per CTA
  bool persistent;  // grid = resident CTAs, looping over the (item, head, part) work
  int ctas_per_sm;  // > 0: diagnostic, at most this many resident CTAs per SM (dynamic
                    // shared memory as padding); not a floor
  constexpr bool diagnostic() const { return ctas_per_sm > 0; }
};
inline constexpr std::array<FloorShape, 6> kFloorShapes = {{
    {"cta256", "cta256", 1, 256, false, 0},
    {"split4x128", "split4x128", 4, 128, false, 0},
    {"persist4x128", "persist4x128", 4, 128, true, 0},
    // cta256 at kdajit's own occupancies: how much of a route's distance to the
    // floor its CTAs per SM alone explain (the state bytes in flight per SM).
    {"cta256x2", "cta256", 1, 256, false, 2},
    {"cta256x3", "cta256", 1, 256, false, 3},
    {"cta256x4", "cta256", 1, 256, false, 4},
}};
inline constexpr int kFloorShapeCount = static_cast<int>(kFloorShapes.size());
inline constexpr int kFloorKernelCount = 3;  // the first three shapes are the kernels and the floor
static_assert([] {
  for (int i = 0; i < kFloorShapeCount; ++i)
    if (kFloorShapes[static_cast<size_t>(i)].diagnostic() != (i >= kFloorKernelCount)) return false;
  return true;
}(), "the floor shapes first, then the diagnostic ones");
int floor_shape_index(const std::string& name);  // -1 if unknown

// One struct, compiled by the host compiler here and, as text, by NVRTC (plain
// C types of equal size on both sides). Strides are in elements.
#define BENCH_SHARED_CODE(text_name, ...) \
  __VA_ARGS__                             \
  inline constexpr const char text_name[] = #__VA_ARGS__;

BENCH_SHARED_CODE(kFloorParamsText, struct FloorParams {
  const unsigned short* x;
  const unsigned short* raw_gate;
  const unsigned short* raw_beta;
  const unsigned short* output_gate;
  unsigned short* output;
  unsigned short* conv_state;
  void* state;
  const int* state_indices;
  const int* query_start_loc;
  const int* num_accepted;
  long long x_row, gate_row, beta_row, ogate_row, out_row;
  long long conv_slot, conv_chan, conv_tap;
  long long state_slot;
  int heads, items, tokens, conv_ds;
  int spin_cycles;  // > 0: each thread spins this many clock cycles after its state loads land, before its stores
};)

// The NVRTC source of every floor kernel (entry names: floor_<op>_<state>_<shape>).
// max_tokens bounds the packed op's T (register arrays are sized by it).
std::string floor_source(int max_tokens);
std::string floor_entry(Op op, StateDtype state, int shape);

// The floor parameters of a decode call; checks the 16-byte alignment the kernel's
// vector accesses need (the bench's own buffers always have it).
Result<FloorParams> floor_params(const Cell& c, const kdajit_decode_args_t& a);

class FloorKernels {
 public:
  // Loads the module and finds every entry; occupancy sizes the persistent grids.
  // smem_per_sm: the SM's shared memory (sizes the diagnostic shapes' padding).
  Status load(const std::string& cubin, int sms, int smem_per_sm, int max_tokens);
  Status launch(int shape, const Cell& c, const FloorParams& p, cudaStream_t s) const;
  int registers(Op op, StateDtype state, int shape) const;
  int max_tokens() const { return max_tokens_; }

 private:
  struct Entry {
    CUfunction fn = nullptr;
    int resident_ctas = 0;  // per GPU (occupancy x SMs)
    int registers = 0;
    unsigned pad_bytes = 0;  // dynamic shared memory of a diagnostic shape
    std::string error;       // why a diagnostic shape has no function (fn null)
  };
  static Status hold_occupancy(Entry& e, const FloorShape& shape, int smem_per_sm);
  static int index(Op op, StateDtype state, int shape);
  Module module_;
  std::array<Entry, 4 * kFloorShapeCount> entries_{};
  int max_tokens_ = 0;
};

}  // namespace kdajit::bench
