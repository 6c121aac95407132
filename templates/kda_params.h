// The kernel parameter block: the ABI between the host launcher (runtime/) and
// the generated kernels (templates/). This file is compiled both by the host
// compiler and, embedded, by NVRTC, so it uses plain C types only.
// Strides are in elements. Passed by value as the kernel's only parameter.
#ifndef KDAJIT_KDA_PARAMS_H
#define KDAJIT_KDA_PARAMS_H

#ifdef __CUDACC_RTC__
typedef long long kda_i64;
typedef unsigned long long kda_u64;
typedef int kda_i32;
typedef unsigned short kda_bf16_bits;
#else
#include <stdint.h>
typedef int64_t kda_i64;
typedef uint64_t kda_u64;
typedef int32_t kda_i32;
typedef uint16_t kda_bf16_bits;
#endif

struct KdaParams {
  const kda_bf16_bits* x;           // [R, 3*H*D]
  const float* conv_weight;         // [3, W, H*D]
  kda_bf16_bits* conv_state;        // [S, 3*H*D, K] (SD or DS per the key)
  const kda_bf16_bits* raw_gate;    // [R, H, D]
  const kda_bf16_bits* raw_beta;    // [R, H]
  const float* A_log;               // [H]
  const float* dt_bias;             // [H*D]
  const kda_i32* state_indices;     // single: [R]; packed: [N, T]; prefill: [N]
  void* state;                      // [S, H, D, D] f32 or bf16
  const kda_bf16_bits* output_gate; // [R, H, D]
  const float* norm_weight;         // [D]
  kda_bf16_bits* output;            // [R, H, D]
  const kda_i32* query_start_loc;   // packed, prefill: [N + 1]
  const kda_i32* num_accepted;      // packed: [N]
  kda_i32* oob_counter;             // optional: += out-of-range slots seen
  const kda_i32* has_initial_state; // prefill: [N] or null (every sequence starts from its slot)

  kda_i64 x_row_stride;
  kda_i64 conv_slot_stride;
  kda_i64 gate_row_stride;
  kda_i64 beta_row_stride;
  kda_i64 state_slot_stride;
  kda_i64 ogate_row_stride;
  kda_i64 out_row_stride;

  kda_i32 rows;       // R
  kda_i32 num_seqs;   // N (packed)
  kda_i32 num_slots;  // S
  float lower_bound;
  float norm_eps;
  kda_i32 conv_taps;  // K: conv_state taps per channel (decode has K = T + 2 built in; prefill reads conv_chan_stride)

  // The chunk op (CONTRACT §11) also reads raw_gate (g: bf16, or f32 with
  // KDA_CHUNK_G_F32), raw_beta (beta, likewise), A_log, dt_bias (null: no
  // bias), state (initial states [N, H, D, D], null: zero; slot n is sequence
  // n, state_slot_stride apart), output, query_start_loc (cu_seqlens), rows,
  // num_seqs, lower_bound and the strides named alike. The prefill op sets
  // state_v_stride = D, state_k_stride = 1 and leaves the rest zero.
  const kda_bf16_bits* q;           // [R, H, D]
  const kda_bf16_bits* k;           // [R, H, D]
  const kda_bf16_bits* v;           // [R, H, D]
  void* final_state;                // [N, H, D, D] or null (not written)
  kda_i64 q_row_stride;
  kda_i64 k_row_stride;
  kda_i64 v_row_stride;
  kda_i64 final_slot_stride;
  kda_i64 state_v_stride;           // elements between value rows of a head's state: D ([v][k]) or 1 ([k][v])
  kda_i64 state_k_stride;           // elements between key columns: 1 or D
  float scale;                      // q's scale
  kda_i32 chunk_flags;              // KDA_CHUNK_* bits

  // H, read by the programs whose launch grid is not per head (the decode
  // ops' route stream); the decode and prefill ops set it.
  kda_i32 heads;
  // The chunked ops' program serves both state dtypes and conv layouts (the
  // decode programs have them built in, KDA_STATE_BF16 and KDA_CONV_DS):
  kda_i32 state_bf16;               // prefill, chunk: 1 when state (and final_state) are bf16, 0 f32
  kda_i64 conv_chan_stride;         // prefill: conv_state elements between channels (SD 1, DS K)
  kda_i64 conv_tap_stride;          // prefill: between taps (SD 3*H*D, DS 1)
  // The chunked ops' route twopass: the intra-chunk results of every chunk
  // (templates/kda_prefill.cu, "Route twopass"), KDA_UNIT_BYTES per (unit,
  // head); null on every other route.
  unsigned char* workspace;
  // ceil(2^63 / H) (kda_heads_multiplier): route stream divides its work item
  // i into (row or sequence) i / H and head i % H by it (kda_pipeline.cuh,
  // HeadSplit); the decode ops set it. Last, so that no other field moves.
  kda_u64 heads_mul;
};

#ifndef __CUDACC_RTC__
// KdaParams::heads_mul of H >= 1: ceil(2^63 / H).
static inline kda_u64 kda_heads_multiplier(kda_i32 heads) {
  return (((kda_u64)1 << 63) - 1) / (kda_u64)heads + 1;
}
#endif

// chunk_flags of the chunk op.
#define KDA_CHUNK_QK_L2NORM 1  // q and k divided by sqrt(sum x^2 + 1e-6)
#define KDA_CHUNK_BETA_SIGMOID 2  // beta = sigmoid(beta); else beta as given
#define KDA_CHUNK_G_F32 4  // g is f32 (else bf16)
#define KDA_CHUNK_BETA_F32 8  // beta is f32 (else bf16)

#endif  // KDAJIT_KDA_PARAMS_H
