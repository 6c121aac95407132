// kda_single_decode, route rowcta: fused KDA decode, one token per row
// (docs/CONTRACT.md §2-§3), one CTA per (row, head).
//
// Launch: grid (H, gy), block KDA_THREADS, static shared memory only.
// CTA (h, y) handles rows y, y + gy, ... (gy = min(R, 65535)). Rows run
// concurrently, so the route is not for repeated slots (route sequential).

#ifndef KDA_T
#define KDA_T 1  // hole: tokens per row; the single op has exactly 1
#endif

#include "kda_params.h"
#include "kda_single_row.cuh"

static_assert(KDA_T == 1 && KDA_SPLIT == 1, "kda_single_decode (rowcta) is the T = 1 op on one CTA per (row, head)");

extern "C" __global__ void __launch_bounds__(KDA_THREADS, KDA_MIN_CTAS_PER_SM)
    kda_single_decode(const __grid_constant__ KdaParams p) {
  __shared__ kda::Smem<1> sm;
  kda::pdl_wait();  // everything below may read what the previous kernel wrote
  for (int r = blockIdx.y; r < p.rows; r += gridDim.y) {
    kda::single_row(p, sm, blockIdx.x, r, p.state_indices[r]);
    __syncthreads();  // the next row reuses the shared memory
  }
}
