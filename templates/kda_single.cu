// kda_single_decode: fused KDA decode, one token per row (spec sections 2-3),
// route rowcta: one CTA per (row, head).
//
// Launch: grid (H, gy), block KDA_THREADS, static shared memory only.
// CTA (h, y) handles rows y, y + gy, ... in order. gy = R gives one row per
// CTA; state_indices_mode repeated_positive launches gy = 1, so each head's CTA
// applies rows one after another and a repeated slot sees the previous row's
// state and conv updates (kda_decode_head keeps every element with one thread).

#ifndef KDA_T
#define KDA_T 1  // hole: tokens per row; the single op has exactly 1
#endif

#include "kda_params.h"
#include "kda_common.cuh"

static_assert(KDA_T == 1, "kda_single_decode is the T = 1 op");

extern "C" __global__ void __launch_bounds__(KDA_THREADS, KDA_MIN_CTAS_PER_SM)
    kda_single_decode(const __grid_constant__ KdaParams p) {
  __shared__ kda::Smem<1> sm;
  const int h = blockIdx.x;
  for (int r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const int s = p.state_indices[r];
    if (!kda::slot_valid(s, p.num_slots)) {
      // Null (s <= 0) or out of range (s >= S): zeros, no state or conv traffic.
      // Counted by head 0 only, so the counter counts rows.
      if (s >= p.num_slots && h == 0 && threadIdx.x == 0 && p.oob_counter != nullptr) atomicAdd(p.oob_counter, 1);
      kda::zero_rows(p, h, r, r + 1);
      continue;
    }
    // Conv history taps 0..2, state from and checkpoint to the same slot.
    kda::kda_decode_head<1>(p, sm, h, r, 1, s, 0, s, s);
    __syncthreads();  // the next row reuses the shared memory
  }
}
