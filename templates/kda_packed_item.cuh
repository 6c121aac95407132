// One work item of the packed op (draft verify, docs/CONTRACT.md §4): sequence
// i and its share of the tail rows, of head h, on one CTA or on one cluster
// rank's value rows; shared by the packed routes.
//
// Items: n = max(N, ceil(R / T)), N when every sequence has T rows. Item i is
// sequence i (when i < N) and the row candidates i, i + n, ..., i + (T-1) n
// (< R): each of those that belongs to no sequence (below qsl[0] or from qsl[N]
// on) is zeroed by it. n T >= R, so every row is some item's candidate. (With
// max(N, R) items, one tail row each, a full window would launch T times the
// CTAs, nearly all of them with nothing to do.)
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

// The launch's items n (see above); the route table's grids use the same rule.
__device__ __forceinline__ int packed_items(const KdaParams& p) {
  const long long by_rows = (static_cast<long long>(p.rows) + kTokens - 1) / kTokens;
  return static_cast<int>(p.num_seqs > by_rows ? p.num_seqs : by_rows);
}

// What the rules above make of sequence i: a pure function of its metadata
// (start = qsl[i], end = qsl[i+1], accepted = num_accepted[i], slot(t) =
// state_indices[i, t]; read only when i < N), so that a route can plan an item
// before it runs it. slot() is called with the same t on every thread.
struct PackedPlan {
  bool has_seq;      // i < N
  bool well_formed;  // has_seq and the rule above
  bool live;         // well formed, L > 0, conv and source slots valid
  long long start, end;
  int L, a;          // rows; accepted tokens clamped to 1..T
  int cs, src;       // conv slot (t = 0) and source slot (t = a-1), when well formed and L > 0
};
template <class Slot>
__device__ __forceinline__ PackedPlan packed_plan(const KdaParams& p, int i, long long start, long long end,
                                                  int accepted, Slot&& slot) {
  PackedPlan q{};
  q.has_seq = i < p.num_seqs;
  q.start = start;
  q.end = end;
  const long long L = end - start;
  q.well_formed = q.has_seq && L >= 0 && L <= kTokens && start >= 0 && end <= p.rows;
  q.L = q.well_formed ? static_cast<int>(L) : 0;
  q.a = accepted < 1 ? 1 : (accepted > kTokens ? kTokens : accepted);
  if (q.well_formed && q.L > 0) {
    q.cs = slot(0);
    q.src = slot(q.a - 1);
    q.live = slot_valid(q.cs, p.num_slots) && slot_valid(q.src, p.num_slots);
  }
  return q;
}

// Everything item i of head h does besides the decode of a live sequence:
// zeros for its tail-row candidates that no sequence owns (n = packed_items(),
// qsl_first = qsl[0], qsl_last = qsl[N]),
// for a malformed sequence's clipped rows and for a sequence that is not live,
// and the out-of-range count (warp 0 of head 0, rank 0; slot(lane) is lane's
// slot). rank: this CTA's cluster rank, which zeros its own value rows (0
// without a split). Every branch is uniform across the CTA and the cluster.
template <class Slot>
__device__ __forceinline__ void packed_edges(const KdaParams& p, int h, int i, int n, const PackedPlan& q,
                                             int qsl_first, int qsl_last, Slot&& slot, int rank = 0) {
  const int v0 = rank * kVRows;
#pragma unroll 1
  for (int k = 0; k < kTokens; ++k) {
    const long long r = i + static_cast<long long>(k) * n;
    if (r < p.rows && (r >= qsl_last || r < qsl_first)) zero_rows(p, h, r, r + 1, v0, kVRows);
  }
  if (!q.has_seq) return;
  if (!q.well_formed) {
    zero_rows(p, h, q.start > 0 ? q.start : 0, q.end < p.rows ? q.end : p.rows, v0, kVRows);
    return;
  }
  if (h == 0 && rank == 0 && threadIdx.x < 32 && p.oob_counter != nullptr) {
    const int lane = threadIdx.x;
    const int s = slot(lane < kTokens ? lane : 0);
    const bool referenced = q.L > 0 && lane < kTokens && (lane == 0 || lane == q.a - 1 || lane < q.L);
    const unsigned bad = __ballot_sync(kFull, referenced && s >= p.num_slots);
    if (lane == 0 && bad != 0) atomicAdd(p.oob_counter, __popc(bad));
  }
  if (!q.live) zero_rows(p, h, q.start, q.end, v0, kVRows);
}

// Work item i of head h on one CTA, or on cluster rank `rank` of the CTAs that
// share it (every rank calls this with the same i).
__device__ __forceinline__ void packed_item(const KdaParams& p, Smem<kTokens>& sm, int h, int i, int rank = 0) {
  const int lane = threadIdx.x & 31;
  // One round trip for all metadata: nothing below depends on a second load
  // except the state itself.
  long long start = 0, end = 0;
  int accepted = 1, slot_lane = 0;
  if (i < p.num_seqs) {
    start = p.query_start_loc[i];
    end = p.query_start_loc[i + 1];
    accepted = p.num_accepted[i];
    if (lane < kTokens) slot_lane = p.state_indices[static_cast<long long>(i) * kTokens + lane];
  }
  const int qsl_first = p.query_start_loc[0], qsl_last = p.query_start_loc[p.num_seqs];
  auto slot = [&](int t) { return __shfl_sync(kFull, slot_lane, t); };
  const PackedPlan q = packed_plan(p, i, start, end, accepted, slot);
  packed_edges(p, h, i, packed_items(p), q, qsl_first, qsl_last, slot, rank);
  if (!q.live) return;
  // Conv history = taps a-1 .. a+1 of conv_state[cs]; recurrence from state[src];
  // token t checkpoints to state_indices[i, t].
  kda_decode_head<kTokens>(p, sm, h, q.start, q.L, q.cs, q.a - 1, q.src, slot_lane, rank);
}

}  // namespace kda

#endif  // KDAJIT_KDA_PACKED_ITEM_CUH
