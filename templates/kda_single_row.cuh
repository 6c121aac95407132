// One row of the single op (docs/CONTRACT.md §2-§3) on one CTA: the rule for
// null and out-of-range slots, shared by the single-op routes that give a
// (row, head) to one CTA (rowcta, sequential, stream).
#ifndef KDAJIT_KDA_SINGLE_ROW_CUH
#define KDAJIT_KDA_SINGLE_ROW_CUH

#include "kda_params.h"
#include "kda_head.cuh"

namespace kda {

// Row r of head h whose slot s = state_indices[r] is null (s <= 0) or out of
// range (s >= S): zeros and no state or conv traffic; an out-of-range slot is
// counted by head 0 only, so the counter counts rows.
__device__ __forceinline__ void single_dead_row(const KdaParams& p, int h, int r, int s) {
  if (s >= p.num_slots && h == 0 && threadIdx.x == 0 && p.oob_counter != nullptr) atomicAdd(p.oob_counter, 1);
  zero_rows(p, h, r, r + 1);
}

// Row r of head h with slot s: a valid slot is the conv history (taps 0..2),
// the state source and the checkpoint.
__device__ __forceinline__ void single_row(const KdaParams& p, Smem<1>& sm, int h, int r, int s) {
  if (!slot_valid(s, p.num_slots)) {
    single_dead_row(p, h, r, s);
    return;
  }
  kda_decode_head<1>(p, sm, h, r, 1, s, 0, s, s, 0);
}

}  // namespace kda

#endif  // KDAJIT_KDA_SINGLE_ROW_CUH
