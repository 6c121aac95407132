// The f64 CPU reference of both KDA decode ops (docs/CONTRACT.md §2-§4).
//
// Every view's data is a HOST pointer. Arithmetic is f64; the spec's rounding
// points are applied exactly where it puts them:
//   1. m = round_bf16(conv + SiLU)
//   2. the state stored in its dtype (f32: nearest f32; bf16: nearest bf16)
//   3. ob = round_bf16(o) before the gated RMSNorm
//   4. output = round_bf16(y)
// The spec's "f32 carry" (packed op) is the unrounded f64 value here.
// Views are read and written through their shapes and strides only, so SD and
// DS conv layouts, padded row strides and free slot strides all work.
//
// Choices where the spec is silent (the GPU kernels must match them):
// - Packed op, bad metadata: a sequence is live only if 0 <= qsl[n] <= qsl[n+1] <= R,
//   0 < L <= T and cs, src are valid slots (1 <= slot < S). Every output row that
//   no live sequence computes (non-live sequences, rows outside [qsl[0], qsl[N]),
//   rows of sequences with L > T or L < 0) is written as zeros.
// - Packed op, new conv window: positions 0, 1 get old taps a and a+1 (the two
//   newest history taps), positions 2..L+1 the L new x values, so that the next
//   window with a' accepted tokens finds its 3-tap history at a'-1..a'+1.
//   Positions L+2..T+1 are not written.
// - Sequences (and rows of the single op) are applied in order, each seeing the
//   previous one's writes; this is what repeated_positive promises. Live packed
//   sequences sharing a written slot break the caller's promise; the reference
//   still gives the in-order result.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kdajit/error.hpp"
#include "kdajit/kdajit.h"

namespace kdajit::ref {

// Unrounded values seen by the reference, for error metrics.
struct Capture {
  std::vector<double> output;  // [R, H, D] y before rounding point 4; 0 for zero rows
};

// Validates args (dtypes, shapes, scalars; strides are trusted) and runs the op.
// Writes output, conv_state and state through the views.
Status single_decode(const kdajit_decode_args_t& args, Capture* capture = nullptr);
Status packed_decode(const kdajit_decode_args_t& args, Capture* capture = nullptr);
Status decode(kdajit_op_t op, const kdajit_decode_args_t& args, Capture* capture = nullptr);

// What one call writes, from its metadata (host views), by the rules above.
struct WritePlan {
  int64_t rows = 0, heads = 0, slots = 0, tokens = 1;
  std::vector<uint8_t> row_live;         // [R]: 1 = computed, 0 = written as zeros
  std::vector<uint8_t> state_written;    // [S]: 1 = some token's state is stored there
  std::vector<int32_t> conv_taps_written;  // [S]: taps 0..n-1 of that conv slot are written (0: untouched)
};
Result<WritePlan> plan_writes(kdajit_op_t op, const kdajit_decode_args_t& args);

// Element access through a view (ndim indices, in elements). f32, bf16 and
// int32 are read as f64; store rounds to the view's dtype (bf16: round_bf16).
size_t dtype_size(kdajit_dtype_t dtype);
int64_t element_offset_bytes(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx);
double load(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx);
void store(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx, double value);
uint16_t load_bits16(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx);
void store_bits16(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx, uint16_t bits);

}  // namespace kdajit::ref
