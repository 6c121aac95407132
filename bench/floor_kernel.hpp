// The memory-pattern floor: a kernel that moves exactly the bytes of one decode
// call (docs/CONTRACT.md §7) on the same device buffers, with no math, in a few launch
// shapes; the fastest shape per cell is the cell's floor (README: "The floor kernel").
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <array>
#include <string>

#include "driver_fns.hpp"
#include "grid.hpp"
#include "kdajit/error.hpp"
#include "kdajit/kdajit.h"

namespace kdajit::bench {

inline constexpr int kFloorMaxTokens = 16;  // T of the packed op the floor kernel can take

struct FloorShape {
  const char* name;
  int parts;    // CTAs per (item, head), each owning 128 / parts value rows of the state
  int threads;  // per CTA
  bool persistent;  // grid = resident CTAs, looping over the (item, head, part) work
};
inline constexpr std::array<FloorShape, 3> kFloorShapes = {{
    {"cta256", 1, 256, false},
    {"split4x128", 4, 128, false},
    {"persist4x128", 4, 128, true},
}};
inline constexpr int kFloorShapeCount = static_cast<int>(kFloorShapes.size());
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
};)

// The NVRTC source of every floor kernel (entry names: floor_<op>_<state>_<shape>).
// max_tokens bounds the packed op's T (register arrays are sized by it).
std::string floor_source(int max_tokens);
std::string floor_entry(kdajit_op_t op, kdajit_dtype_t state, int shape);

// The floor parameters of a decode call; checks the 16-byte alignment the kernel's
// vector accesses need (the bench's own buffers always have it).
Result<FloorParams> floor_params(const Cell& c, const kdajit_decode_args_t& a);

class FloorKernels {
 public:
  // Loads the module and finds every entry; occupancy sizes the persistent grids.
  Status load(const std::string& cubin, int sms, int max_tokens);
  Status launch(int shape, const Cell& c, const FloorParams& p, cudaStream_t s) const;
  int registers(kdajit_op_t op, kdajit_dtype_t state, int shape) const;
  int max_tokens() const { return max_tokens_; }

 private:
  struct Entry {
    CUfunction fn = nullptr;
    int resident_ctas = 0;  // per GPU (occupancy x SMs)
    int registers = 0;
  };
  static int index(kdajit_op_t op, kdajit_dtype_t state, int shape);
  Module module_;
  std::array<Entry, 4 * kFloorShapeCount> entries_{};
  int max_tokens_ = 0;
};

}  // namespace kdajit::bench
