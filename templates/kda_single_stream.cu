// kda_single_decode, route stream: fused KDA decode, one token per row
// (docs/CONTRACT.md §2-§3); a persistent grid walks the (row, head) items in a
// pipeline that streams their slots, inputs and state slices ahead into shared
// memory (kda_pipeline.cuh).
//
// Item i = row i / H, head i % H: consecutive CTAs share rows, so x, the gates
// and the output rows of a row are in flight together. Rows run concurrently,
// so the route is not for repeated slots (route sequential).

#ifndef KDA_T
#define KDA_T 1  // hole: tokens per row; the single op has exactly 1
#endif

// The grid is persistent, not per head: H is the parameter block's (p.heads,
// divided by through p.heads_mul).
#define KDA_HEADS_FROM_PARAMS 1

#include "kda_params.h"
#include "kda_single_row.cuh"
#include "kda_pipeline.cuh"

static_assert(KDA_T == 1, "kda_single_decode (stream) is the T = 1 op");

namespace kda {

// Metadata of item i: m[0] = state_indices[row] (its conv slot, state source
// and checkpoint).
struct SingleWork {
  HeadSplit hs;  // H and its multiplier (head_split())
  // Measured (A/B, docs/DESIGN.md "Route stream"): bulk copies from one warp
  // cost the single op up to 7% where a CTA has few items (one warp issues the
  // item's 27 runs one after another), and the L2 hints are worth 3-4%. From
  // every warp they still cost 1-3% at R <= 32 and gain nothing at R = 512.
  static constexpr bool kBulkInputs = false, kL2Hints = true;
  __device__ __forceinline__ long long items(const KdaParams& p) const {
    return static_cast<long long>(p.rows) * hs.heads;
  }
  __device__ __forceinline__ int head(long long i) const { return hs.rem(i); }
  __device__ __forceinline__ void load_meta(const KdaParams& p, long long i, int* m) const {
    if (threadIdx.x == 0) cp_async_4(m, p.state_indices + hs.quot(i));
  }
  __device__ __forceinline__ StreamPlan plan(const KdaParams& p, long long i, const int* m) const {
    const int s = m[0];
    return StreamPlan{hs.quot(i), 1, s, 0, s, slot_valid(s, p.num_slots)};
  }
  __device__ __forceinline__ void edges(const KdaParams& p, long long i, const StreamPlan& q, const int* m) const {
    if (!q.live) single_dead_row(p, head(i), static_cast<int>(hs.quot(i)), m[0]);
  }
  __device__ __forceinline__ int ckpt_slot(const int* m, int) const { return m[0]; }
  __device__ __forceinline__ long long first_row(long long i, const int*) const { return hs.quot(i); }
};

}  // namespace kda

extern "C" __global__ void __launch_bounds__(KDA_THREADS, KDA_MIN_CTAS_PER_SM)
    kda_single_decode(const __grid_constant__ KdaParams p) {
  __shared__ kda::StreamSmem ss;
  extern __shared__ __align__(128) kda::U4 stages[];  // kStages slices
  kda::stream_items(p, kda::SingleWork{kda::head_split(p)}, ss, stages);
}
