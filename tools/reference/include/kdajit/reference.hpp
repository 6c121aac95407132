// The f64 CPU reference of both KDA decode ops (docs/CONTRACT.md §2-§4) and of
// the prefill op (docs/DESIGN.md "Prefill": the decode math token after token).
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

// The prefill op's arguments: N sequences of any length packed in T_total
// rows, one slot per sequence. The tensors are the decode ops' except:
// state_indices [N] (a sequence's conv and state slot), has_initial_state [N]
// int32 (0: the sequence starts from zero state and zero conv history, its
// slot's contents are not read; an empty view, ndim 0 or shape [0]: every
// sequence has one), and
// conv_state [S, qkv, K] with any K in 3..18 (taps 0..2 are the history read
// and rewritten, so a pool shared with the packed op keeps its K = T + 2).
// Per sequence n, rows qsl[n] .. qsl[n+1] - 1 (L of them):
// - well formed: 0 <= qsl[n] <= qsl[n+1] <= T_total; live: well formed, L > 0
//   and a valid slot (1 <= s < S);
// - live: §2 for every token in order from the slot's state (or zeros), the
//   carry unrounded; after the last token the state is stored to the slot
//   (rounding point 2) and taps 0..2 become the last three of (history, x_0 ..
//   x_{L-1}) (raw bf16);
// - not live: its rows (inside [0, T_total)) are zeros, its slot untouched;
// - rows no sequence owns (below qsl[0], from qsl[N] on) are zeros.
struct PrefillArgs {
  kdajit_tensor_t x{}, conv_weight{}, conv_state{}, raw_gate{}, raw_beta{}, A_log{}, dt_bias{};
  kdajit_tensor_t state_indices{}, has_initial_state{};
  kdajit_tensor_t state{}, output_gate{}, norm_weight{}, output{}, query_start_loc{};
  kdajit_gate_t gate = KDAJIT_GATE_BOUNDED;
  float lower_bound = -5.f;
  float norm_eps = 1e-6f;
};
Status prefill(const PrefillArgs& args, Capture* capture = nullptr);

// The chunk op (kdajit_chunk_args_t with host views, docs/CONTRACT.md §11):
// the prefill's delta rule on q, k, v as given. Per sequence n, rows
// cu[n] .. cu[n+1] - 1, live when 0 <= cu[n] <= cu[n+1] <= T_total (length 0
// included): from initial_state[n] (or zeros), per token q̂ = scale q /
// sqrt(Σq² + 1e-6) and k̂ = k / sqrt(Σk² + 1e-6) (qk_l2norm; else scale q and
// k), the gate of §2 step 4 on g (+ dt_bias), beta = sigmoid(beta)
// (beta_sigmoid; else beta), §2 step 6, output round_bf16(o); after the last
// token final_state[n] (when given) gets the state in its dtype. Not live:
// its rows are zeros and final_state[n] is untouched; rows below cu[0] and
// from cu[N] on are zeros. Capture: o before rounding.
Status chunk(const kdajit_chunk_args_t& args, Capture* capture = nullptr);

// What one call writes, from its metadata (host views), by the rules above.
struct WritePlan {
  int64_t rows = 0, heads = 0, slots = 0, tokens = 1;
  std::vector<uint8_t> row_live;         // [R]: 1 = computed, 0 = written as zeros
  std::vector<uint8_t> state_written;    // [S]: 1 = some token's state is stored there
  std::vector<int32_t> conv_taps_written;  // [S]: taps 0..n-1 of that conv slot are written (0: untouched)
};
Result<WritePlan> plan_writes(kdajit_op_t op, const kdajit_decode_args_t& args);
// The same for a prefill call: its live sequences' rows, and their slots'
// state and conv taps 0..2 (conv_taps_written 3).
Result<WritePlan> plan_prefill_writes(const PrefillArgs& args);

// Element access through a view (ndim indices, in elements). f32, bf16 and
// int32 are read as f64; store rounds to the view's dtype (bf16: round_bf16).
size_t dtype_size(kdajit_dtype_t dtype);
int64_t element_offset_bytes(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx);
double load(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx);
void store(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx, double value);
uint16_t load_bits16(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx);
void store_bits16(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx, uint16_t bits);

}  // namespace kdajit::ref
