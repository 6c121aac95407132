// kda_packed_decode: fused KDA decode of up to T tokens per sequence (draft
// verify, spec section 4), route rowcta: one CTA per (sequence, head).
//
// Launch: grid (H, max(N, R)), block KDA_THREADS, static shared memory only.
// CTA (h, i) has two independent jobs:
//  - i < N: sequence i of head h (its rows, its conv slot, its checkpoints);
//  - i < R and i >= query_start_loc[N]: output row i of head h is a tail row,
//    written as zeros.
// All metadata is read here on the device, so a captured CUDA graph replays
// correctly with other metadata of the same shapes.
//
// Interpretations (the spec leaves these open):
//  - Sequence n is well formed iff 0 <= L = qsl[n+1] - qsl[n] <= T, qsl[n] >= 0
//    and qsl[n+1] <= R. A malformed sequence is not live: its rows, clipped to
//    [0, R), are zeroed, and nothing else happens (its slots are not looked at).
//  - Rows below qsl[0] belong to no sequence and are not written.
//  - oob_counter (head 0 only): per well-formed sequence with L > 0, +1 for
//    every position t of state_indices[n, :] that the op uses (t = 0 conv,
//    t = a-1 source, t < L checkpoints; each position once) whose slot is >= S.
//    An empty sequence uses no slot and counts nothing.

#ifndef KDA_T
#define KDA_T 4  // hole: tokens per sequence T (1..16)
#endif

#include "kda_params.h"
#include "kda_common.cuh"

extern "C" __global__ void __launch_bounds__(KDA_THREADS, KDA_MIN_CTAS_PER_SM)
    kda_packed_decode(const __grid_constant__ KdaParams p) {
  constexpr int TT = kda::kTokens;
  __shared__ kda::Smem<TT> sm;
  const int h = blockIdx.x;
  const int i = blockIdx.y;
  const int lane = threadIdx.x & 31;

  // One round trip for all metadata: nothing below depends on a second load
  // except the state itself.
  const bool has_seq = i < p.num_seqs;
  long long start = 0, end = 0;
  int accepted = 1, slot_lane = 0;
  if (has_seq) {
    start = p.query_start_loc[i];
    end = p.query_start_loc[i + 1];
    accepted = p.num_accepted[i];
    if (lane < TT) slot_lane = p.state_indices[static_cast<long long>(i) * TT + lane];
  }
  if (i < p.rows && i >= p.query_start_loc[p.num_seqs]) kda::zero_rows(p, h, i, i + 1);
  if (!has_seq) return;

  const long long L = end - start;
  if (L < 0 || L > TT || start < 0 || end > p.rows) {
    kda::zero_rows(p, h, start > 0 ? start : 0, end < p.rows ? end : p.rows);
    return;
  }
  const int a = accepted < 1 ? 1 : (accepted > TT ? TT : accepted);
  const int cs = __shfl_sync(kda::kFull, slot_lane, 0);
  const int src = __shfl_sync(kda::kFull, slot_lane, a - 1);

  if (h == 0 && threadIdx.x < 32 && p.oob_counter != nullptr) {
    const bool referenced = L > 0 && lane < TT && (lane == 0 || lane == a - 1 || lane < L);
    const unsigned bad = __ballot_sync(kda::kFull, referenced && slot_lane >= p.num_slots);
    if (lane == 0 && bad != 0) atomicAdd(p.oob_counter, __popc(bad));
  }

  const bool live = L > 0 && kda::slot_valid(cs, p.num_slots) && kda::slot_valid(src, p.num_slots);
  if (!live) {
    kda::zero_rows(p, h, start, end);
    return;
  }
  // Conv history = taps a-1 .. a+1 of conv_state[cs]; recurrence from state[src];
  // token t checkpoints to state_indices[i, t].
  kda::kda_decode_head<TT>(p, sm, h, start, static_cast<int>(L), cs, a - 1, src, slot_lane);
}
