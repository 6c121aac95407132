// kda_packed_decode, route rowcta: fused KDA decode of up to T tokens per
// sequence (draft verify, docs/CONTRACT.md §4), one CTA per (sequence, head).
//
// Launch: grid (H, Y, Z) with Y*Z >= max(N, R) (Y <= 65535), block KDA_THREADS,
// static shared memory only.
// CTA (h, i) has two independent jobs:
//  - i < N: sequence i of head h (its rows, its conv slot, its checkpoints);
//  - i < R and i >= query_start_loc[N]: output row i of head h is a tail row,
//    written as zeros.
// All metadata is read here on the device, so a captured CUDA graph replays
// correctly with other metadata of the same shapes.
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

#ifndef KDA_T
#define KDA_T 4  // hole: tokens per sequence T (1..16)
#endif

#include "kda_params.h"
#include "kda_head.cuh"

namespace kda {

// Work item i of head h: sequence i (if i < N) and tail row i (if i < R).
// Every branch is uniform across the CTA (it depends on i and metadata only).
__device__ __forceinline__ void packed_item(const KdaParams& p, Smem<kTokens>& sm, int h, int i) {
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
  kda_decode_head<TT>(p, sm, h, start, static_cast<int>(L), cs, a - 1, src, slot_lane, 0);
}

}  // namespace kda

extern "C" __global__ void __launch_bounds__(KDA_THREADS, KDA_MIN_CTAS_PER_SM)
    kda_packed_decode(const __grid_constant__ KdaParams p) {
  __shared__ kda::Smem<kda::kTokens> sm;
  // Item i = blockIdx.y + gridDim.y * blockIdx.z: grid z carries what exceeds the
  // 65535 limit of grid y (a loop over items here costs registers and spills).
  // In 64 bits: the last grid-z slice overshoots max(N, R) <= 2^31 - 1, and
  // those CTAs' index must not wrap into a valid one.
  const long long i = blockIdx.y + static_cast<long long>(gridDim.y) * blockIdx.z;
  const int items = p.num_seqs > p.rows ? p.num_seqs : p.rows;
  kda::pdl_wait();
  if (i < items) kda::packed_item(p, sm, blockIdx.x, static_cast<int>(i));
}
