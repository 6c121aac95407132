// kda_packed_decode, routes split2 and split4: the 128 value rows of one
// (sequence, head) over a cluster of KDA_SPLIT CTAs (docs/CONTRACT.md §4), for
// batches whose sequences x heads leave most SMs idle with one CTA each. A
// sequence's T tokens are a dependent chain on its CTA; the split shortens
// each link (a rank updates 128 / KDA_SPLIT value rows) and spreads the T
// checkpoint stores over KDA_SPLIT SMs.
//
// Launch: grid (H, KDA_SPLIT * gy), cluster (1, KDA_SPLIT, 1), block
// KDA_THREADS, static shared memory only. The cluster at blockIdx.y / KDA_SPLIT
// handles items c, c + gy, ... (item i: sequence i and its tail-row candidates,
// kda_packed_item.cuh); rank r owns value rows r*128/KDA_SPLIT .. of each.
// Every rank of a cluster takes the same branches (they depend on the item's
// metadata only), so the cluster barriers inside kda_decode_head always pair up.

#ifndef KDA_T
#define KDA_T 4  // hole: tokens per sequence T (1..16)
#endif
#ifndef KDA_SPLIT
#define KDA_SPLIT 2  // hole: CTAs per (sequence, head), 2 or 4
#endif

#include "kda_params.h"
#include "kda_packed_item.cuh"

static_assert(KDA_SPLIT > 1, "kda_packed_decode (split) runs over a cluster");

extern "C" __global__ void __launch_bounds__(KDA_THREADS, KDA_MIN_CTAS_PER_SM)
    kda_packed_decode(const __grid_constant__ KdaParams p) {
  __shared__ kda::Smem<kda::kTokens> sm;
  const int rank = kda::cluster_rank();
  const int clusters = gridDim.y / KDA_SPLIT;
  const int items = kda::packed_items(p);
  kda::split_init(sm);
  kda::pdl_wait();
  // In 64 bits: items <= 2^31 - 1, and i + clusters must not wrap.
  for (long long i = blockIdx.y / KDA_SPLIT; i < items; i += clusters) {
    kda::packed_item(p, sm, blockIdx.x, static_cast<int>(i), rank);
    __syncthreads();  // the next item reuses the shared memory
  }
}
