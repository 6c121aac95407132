// kda_single_decode: fused KDA decode, one token per row (spec sections 2-3),
// route rowcta: one CTA per (row, head).
//
// Two entry points of one module:
//  - kda_single_decode: grid (H, Y, Z) with Y*Z >= R (Y <= 65535), row
//    r = blockIdx.y + Y * blockIdx.z. No loop: a loop here keeps values live
//    across iterations and costs the registers that the bf16 kernel needs for
//    three CTAs per SM.
//  - kda_single_decode_in_order: grid (H, 1), for state_indices_mode
//    repeated_positive. Each head's CTA applies the rows one after another, so a
//    repeated slot sees the previous row's state and conv updates
//    (kda_decode_head keeps every element with one thread). Sequential by
//    design, so it is not tuned for occupancy.
// Block KDA_THREADS, static shared memory only.

#ifndef KDA_T
#define KDA_T 1  // hole: tokens per row; the single op has exactly 1
#endif

#include "kda_params.h"
#include "kda_common.cuh"

static_assert(KDA_T == 1, "kda_single_decode is the T = 1 op");

namespace kda {

// Row r of head h. Uniform across the CTA.
__device__ __forceinline__ void single_row(const KdaParams& p, Smem<1>& sm, int h, int r) {
  const int s = p.state_indices[r];
  if (!slot_valid(s, p.num_slots)) {
    // Null (s <= 0) or out of range (s >= S): zeros, no state or conv traffic.
    // Counted by head 0 only, so the counter counts rows.
    if (s >= p.num_slots && h == 0 && threadIdx.x == 0 && p.oob_counter != nullptr) atomicAdd(p.oob_counter, 1);
    zero_rows(p, h, r, r + 1);
    return;
  }
  // Conv history taps 0..2, state from and checkpoint to the same slot.
  kda_decode_head<1>(p, sm, h, r, 1, s, 0, s, s);
}

}  // namespace kda

extern "C" __global__ void __launch_bounds__(KDA_THREADS, KDA_MIN_CTAS_PER_SM)
    kda_single_decode(const __grid_constant__ KdaParams p) {
  __shared__ kda::Smem<1> sm;
  const int r = blockIdx.y + gridDim.y * blockIdx.z;
  if (r >= p.rows) return;
  kda::single_row(p, sm, blockIdx.x, r);
  // Not needed for correctness (the CTA ends here), but it keeps ptxas's
  // schedule of the bf16 kernel within 80 registers (4 bytes spill without it).
  __syncthreads();
}

extern "C" __global__ void __launch_bounds__(KDA_THREADS, 1)
    kda_single_decode_in_order(const __grid_constant__ KdaParams p) {
  __shared__ kda::Smem<1> sm;
  for (int r = 0; r < p.rows; ++r) {
    kda::single_row(p, sm, blockIdx.x, r);
    __syncthreads();  // the next row reuses the shared memory
  }
}
