// kda_packed_decode, route stream: fused KDA decode of up to T tokens per
// sequence (draft verify, docs/CONTRACT.md §4); a persistent grid walks the
// (item, head) work items and streams the source state slices of live
// sequences ahead into shared memory (kda_stream.cuh).
//
// Item n of head h is sequence n and its tail-row candidates, as in route
// rowcta (the rules: kda_packed_item.cuh); work item i = item i / H, head
// i % H, over packed_items() x H. All metadata is read on the device, so a captured CUDA graph
// replays correctly with other metadata of the same shapes.

#ifndef KDA_T
#define KDA_T 4  // hole: tokens per sequence T (1..16)
#endif

#include "kda_params.h"
#include "kda_packed_item.cuh"
#include "kda_stream.cuh"

namespace kda {

struct PackedWork {
  Smem<kTokens>* sm;
  __device__ __forceinline__ long long items(const KdaParams& p) const {
    return static_cast<long long>(packed_items(p)) * kHeads;
  }
  __device__ __forceinline__ int head(long long i) const { return static_cast<int>(i % kHeads); }
  __device__ __forceinline__ int source_slot(const KdaParams& p, long long i) const {
    return packed_source_slot(p, static_cast<int>(i / kHeads));
  }
  __device__ __forceinline__ void run(const KdaParams& p, long long i, int, StagedState<PackedWork>& in) const {
    packed_item(p, *sm, head(i), static_cast<int>(i / kHeads), 0, in);
  }
};

}  // namespace kda

extern "C" __global__ void __launch_bounds__(KDA_THREADS, KDA_MIN_CTAS_PER_SM)
    kda_packed_decode(const __grid_constant__ KdaParams p) {
  __shared__ kda::Smem<kda::kTokens> sm;
  __shared__ unsigned long long bars[kda::kStages];
  extern __shared__ __align__(128) kda::U4 stages[];  // kStages slices
  kda::PackedWork work{&sm};
  kda::stream_items(p, work, stages, bars);
}
