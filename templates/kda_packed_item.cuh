// One work item of the packed op (draft verify, docs/CONTRACT.md §4): sequence
// i and tail row i of head h, on one CTA; shared by the packed routes.
//
// Interpretations (the contract's choices, docs/CONTRACT.md §4):
//  - Sequence n is well formed iff 0 <= L = qsl[n+1] - qsl[n] <= T, qsl[n] >= 0
//    and qsl[n+1] <= R. A malformed sequence is not live: its rows, clipped to
//    [0, R), are zeroed, and nothing else happens (its slots are not looked at).
//  - Rows below qsl[0] or from qsl[N] on belong to no sequence: zeros.
//  - oob_counter (head 0 only): per well-formed sequence with L > 0, +1 for
//    every position t of state_indices[n, :] that the op uses (t = 0 conv,
//    t = a-1 source, t < L checkpoints; each position once) whose slot is >= S.
//    An empty sequence uses no slot and counts nothing.
#ifndef KDAJIT_KDA_PACKED_ITEM_CUH
#define KDAJIT_KDA_PACKED_ITEM_CUH

#include "kda_params.h"
#include "kda_head.cuh"

namespace kda {

// The state slot sequence i's recurrence starts from when the sequence is live
// (well formed, L > 0, conv and source slots valid), else 0. The same rule as
// packed_item() below, for routes that request a live item's state early.
__device__ __forceinline__ int packed_source_slot(const KdaParams& p, int i) {
  if (i >= p.num_seqs) return 0;
  const long long start = p.query_start_loc[i], end = p.query_start_loc[i + 1];
  const long long L = end - start;
  if (L <= 0 || L > kTokens || start < 0 || end > p.rows) return 0;
  const int accepted = p.num_accepted[i];
  const int a = accepted < 1 ? 1 : (accepted > kTokens ? kTokens : accepted);
  const kda_i32* slots = p.state_indices + static_cast<long long>(i) * kTokens;
  const int cs = slots[0], src = slots[a - 1];
  return slot_valid(cs, p.num_slots) && slot_valid(src, p.num_slots) ? src : 0;
}

// Work item i of head h: sequence i (if i < N) and tail row i (if i < R).
// Every branch is uniform across the CTA (it depends on i and metadata only).
// state_in: where a live sequence's state comes from (kda_decode_head()).
template <class StateIn = GlobalState>
__device__ __forceinline__ void packed_item(const KdaParams& p, Smem<kTokens>& sm, int h, int i,
                                            StateIn&& state_in = StateIn{}) {
  constexpr int TT = kTokens;
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
  // Rows no sequence owns (before qsl[0] or from qsl[N] on) are zeros.
  if (i < p.rows && (i >= p.query_start_loc[p.num_seqs] || i < p.query_start_loc[0])) zero_rows(p, h, i, i + 1);
  if (!has_seq) return;

  const long long L = end - start;
  if (L < 0 || L > TT || start < 0 || end > p.rows) {
    zero_rows(p, h, start > 0 ? start : 0, end < p.rows ? end : p.rows);
    return;
  }
  const int a = accepted < 1 ? 1 : (accepted > TT ? TT : accepted);
  const int cs = __shfl_sync(kFull, slot_lane, 0);
  const int src = __shfl_sync(kFull, slot_lane, a - 1);

  if (h == 0 && threadIdx.x < 32 && p.oob_counter != nullptr) {
    const bool referenced = L > 0 && lane < TT && (lane == 0 || lane == a - 1 || lane < L);
    const unsigned bad = __ballot_sync(kFull, referenced && slot_lane >= p.num_slots);
    if (lane == 0 && bad != 0) atomicAdd(p.oob_counter, __popc(bad));
  }

  const bool live = L > 0 && slot_valid(cs, p.num_slots) && slot_valid(src, p.num_slots);
  if (!live) {
    zero_rows(p, h, start, end);
    return;
  }
  // Conv history = taps a-1 .. a+1 of conv_state[cs]; recurrence from state[src];
  // token t checkpoints to state_indices[i, t].
  kda_decode_head<TT>(p, sm, h, start, static_cast<int>(L), cs, a - 1, src, slot_lane, 0, state_in);
}

}  // namespace kda

#endif  // KDAJIT_KDA_PACKED_ITEM_CUH
