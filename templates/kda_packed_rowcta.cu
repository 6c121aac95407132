// kda_packed_decode, route rowcta: fused KDA decode of up to T tokens per
// sequence (draft verify, docs/CONTRACT.md §4), one CTA per (sequence, head).
//
// Launch: grid (H, Y, Z) with Y*Z >= n = max(N, ceil(R / T)) items (Y <= 65535),
// block KDA_THREADS, static shared memory only.
// CTA (h, i) has two independent jobs (kda_packed_item.cuh):
//  - i < N: sequence i of head h (its rows, its conv slot, its checkpoints);
//  - its tail-row candidates i, i + n, ...: the rows no sequence owns are
//    written as zeros.
// All metadata is read here on the device, so a captured CUDA graph replays
// correctly with other metadata of the same shapes. The item's rules (what is
// live, what is zeroed, what is counted): kda_packed_item.cuh.

#ifndef KDA_T
#define KDA_T 4  // hole: tokens per sequence T (1..16)
#endif

#include "kda_params.h"
#include "kda_packed_item.cuh"

extern "C" __global__ void __launch_bounds__(KDA_THREADS, KDA_MIN_CTAS_PER_SM)
    kda_packed_decode(const __grid_constant__ KdaParams p) {
  __shared__ kda::Smem<kda::kTokens> sm;
  // Item i = blockIdx.y + gridDim.y * blockIdx.z: grid z carries what exceeds the
  // 65535 limit of grid y (a loop over items here costs registers and spills).
  // In 64 bits: the last grid-z slice overshoots n <= 2^31 - 1, and those
  // CTAs' index must not wrap into a valid one.
  const long long i = blockIdx.y + static_cast<long long>(gridDim.y) * blockIdx.z;
  const int items = kda::packed_items(p);
  kda::pdl_wait();
  if (i < items) kda::packed_item(p, sm, blockIdx.x, static_cast<int>(i));
}
