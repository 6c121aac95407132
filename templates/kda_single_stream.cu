// kda_single_decode, route stream: fused KDA decode, one token per row
// (docs/CONTRACT.md §2-§3); a persistent grid walks the (row, head) items and
// streams their state slices ahead into shared memory (kda_stream.cuh).
//
// Item i = row i / H, head i % H: consecutive CTAs share rows, so x, the gates
// and the output rows of a row are in flight together. Rows run concurrently,
// so the route is not for repeated slots (route sequential).

#ifndef KDA_T
#define KDA_T 1  // hole: tokens per row; the single op has exactly 1
#endif

#include "kda_params.h"
#include "kda_single_row.cuh"
#include "kda_stream.cuh"

static_assert(KDA_T == 1, "kda_single_decode (stream) is the T = 1 op");

namespace kda {

struct SingleWork {
  Smem<1>* sm;
  __device__ __forceinline__ long long items(const KdaParams& p) const {
    return static_cast<long long>(p.rows) * kHeads;
  }
  __device__ __forceinline__ int head(long long i) const { return static_cast<int>(i % kHeads); }
  __device__ __forceinline__ int source_slot(const KdaParams& p, long long i) const {
    return p.state_indices[i / kHeads];
  }
  __device__ __forceinline__ void prefetch_inputs(const KdaParams& p, long long i, int slot, int lane) const {
    const int parts = prefetch_row_inputs(p, i / kHeads, head(i), lane);
    if (lane >= parts) prefetch_conv_history(p, slot, 0, head(i), lane - parts);
  }
  __device__ __forceinline__ void run(const KdaParams& p, long long i, int slot, StagedState<SingleWork>& in) const {
    single_row(p, *sm, head(i), static_cast<int>(i / kHeads), slot, in);
  }
};

}  // namespace kda

extern "C" __global__ void __launch_bounds__(KDA_THREADS, KDA_MIN_CTAS_PER_SM)
    kda_single_decode(const __grid_constant__ KdaParams p) {
  __shared__ kda::Smem<1> sm;
  __shared__ unsigned long long bars[kda::kStages];
  extern __shared__ __align__(128) kda::U4 stages[];  // kStages slices
  kda::SingleWork work{&sm};
  kda::stream_items(p, work, stages, bars);
}
