// kda_single_decode, routes split2 and split4: the 128 value rows of one
// (row, head) over a cluster of KDA_SPLIT CTAs (docs/CONTRACT.md §2-§3), for
// batches whose rows x heads leave most SMs idle with one CTA each.
//
// Launch: grid (H, KDA_SPLIT * gy), cluster (1, KDA_SPLIT, 1), block
// KDA_THREADS, static shared memory only. The cluster at blockIdx.y / KDA_SPLIT
// handles rows c, c + gy, ...; rank r owns value rows r*128/KDA_SPLIT .. of each.
// Every rank of a cluster takes the same branches (they depend on the row and
// its slot only), so the cluster barriers inside kda_decode_head always pair up.

#ifndef KDA_T
#define KDA_T 1  // hole: tokens per row; the single op has exactly 1
#endif
#ifndef KDA_SPLIT
#define KDA_SPLIT 2  // hole: CTAs per (row, head), 2 or 4
#endif

#include "kda_params.h"
#include "kda_head.cuh"

static_assert(KDA_T == 1 && KDA_SPLIT > 1, "kda_single_decode (split) is the T = 1 op over a cluster");

extern "C" __global__ void __launch_bounds__(KDA_THREADS, KDA_MIN_CTAS_PER_SM)
    kda_single_decode(const __grid_constant__ KdaParams p) {
  __shared__ kda::Smem<1> sm;
  const int h = blockIdx.x;
  const int rank = kda::cluster_rank();
  const int rows_per_wave = gridDim.y / KDA_SPLIT;
  kda::split_init(sm);
  kda::pdl_wait();
  for (int r = blockIdx.y / KDA_SPLIT; r < p.rows; r += rows_per_wave) {
    const int s = p.state_indices[r];
    if (!kda::slot_valid(s, p.num_slots)) {
      // Counted once per row: rank 0 of head 0.
      if (s >= p.num_slots && h == 0 && rank == 0 && threadIdx.x == 0 && p.oob_counter != nullptr)
        atomicAdd(p.oob_counter, 1);
      kda::zero_rows(p, h, r, r + 1, rank * kda::kVRows, kda::kVRows);
      continue;
    }
    kda::kda_decode_head<1>(p, sm, h, r, 1, s, 0, s, s, rank);
    __syncthreads();  // the next row reuses the shared memory
  }
}
