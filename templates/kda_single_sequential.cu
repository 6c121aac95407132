// kda_single_decode, route sequential: one CTA per head applies the rows in
// row order, so rows that share a slot see the previous row's state and conv
// update (state_indices_mode repeated_positive, docs/CONTRACT.md §3).
//
// Launch: grid (H, 1), block KDA_THREADS, static shared memory only. Exact
// because kda_decode_head keeps every state element and conv tap with one
// thread on every call, and the CTA barrier orders one row's writes before the
// next row's reads.

#ifndef KDA_T
#define KDA_T 1  // hole: tokens per row; the single op has exactly 1
#endif

#include "kda_params.h"
#include "kda_single_row.cuh"

static_assert(KDA_T == 1 && KDA_SPLIT == 1, "kda_single_decode (sequential) is the T = 1 op on one CTA per head");

extern "C" __global__ void __launch_bounds__(KDA_THREADS, KDA_MIN_CTAS_PER_SM)
    kda_single_decode(const __grid_constant__ KdaParams p) {
  __shared__ kda::Smem<1> sm;
  const int h = blockIdx.x;
  kda::pdl_wait();
  for (int r = 0; r < p.rows; ++r) {
    kda::single_row(p, sm, h, r, p.state_indices[r]);
    __syncthreads();  // this row's state, conv and shared-memory use end before the next row
  }
}
