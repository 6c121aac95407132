// kda_packed_decode, route stream: fused KDA decode of up to T tokens per
// sequence (draft verify, docs/CONTRACT.md §4); a persistent grid walks the
// (item, head) work items in the software pipeline of kda_pipeline.cuh, which
// streams their metadata, inputs and source state slices ahead into shared
// memory.
//
// Item n of head h is sequence n and its tail-row candidates, as in route
// rowcta (the rules: kda_packed_item.cuh); work item i = item i / H, head
// i % H, over packed_items() x H. All metadata is read on the device, so a captured CUDA graph
// replays correctly with other metadata of the same shapes.

#ifndef KDA_T
#define KDA_T 4  // hole: tokens per sequence T (1..16)
#endif

// The grid is persistent, not per head: H is the parameter block's (p.heads,
// divided by through p.heads_mul).
#define KDA_HEADS_FROM_PARAMS 1

#include "kda_params.h"
#include "kda_packed_item.cuh"
#include "kda_pipeline.cuh"

namespace kda {

// Metadata of item i (sequence n = i / H), as staged: m[0] = qsl[0], m[1] =
// qsl[N] (the rows no sequence owns are outside them); when n < N also m[2] =
// qsl[n], m[3] = qsl[n+1], m[4] = num_accepted[n], m[5 + t] = state_indices[n, t].
struct PackedWork {
  HeadSplit hs;  // H and its multiplier (head_split())
  static_assert(kMetaInts >= 5 + kTokens, "the packed metadata of one item");
  // Measured (A/B, docs/DESIGN.md "Route stream"): with 5T + 22
  // runs per item, bulk copies (bulk_issuers' warps) and no L2 hints are
  // faster than cp.async with hints at N >= 32 (up to 4.5%: bf16, N >= 128).
  static constexpr bool kBulkInputs = true, kL2Hints = false;
  __device__ __forceinline__ long long items(const KdaParams& p) const {
    return static_cast<long long>(packed_items(p)) * hs.heads;
  }
  __device__ __forceinline__ int head(long long i) const { return hs.rem(i); }
  __device__ __forceinline__ int seq(long long i) const { return static_cast<int>(hs.quot(i)); }
  // Threads 0 .. 4 + T of warp 0, one 4-byte copy each.
  __device__ __forceinline__ void load_meta(const KdaParams& p, long long i, int* m) const {
    const int t = threadIdx.x, n = seq(i);
    if (t == 0) cp_async_4(&m[0], p.query_start_loc);
    if (t == 1) cp_async_4(&m[1], p.query_start_loc + p.num_seqs);
    if (n < p.num_seqs) {
      if (t == 2 || t == 3) cp_async_4(&m[t], p.query_start_loc + n + (t - 2));
      if (t == 4) cp_async_4(&m[4], p.num_accepted + n);
      if (t >= 5 && t < 5 + kTokens) cp_async_4(&m[t], p.state_indices + static_cast<long long>(n) * kTokens + (t - 5));
    }
  }
  __device__ __forceinline__ PackedPlan packed(const KdaParams& p, long long i, const int* m) const {
    const bool has = seq(i) < p.num_seqs;
    return packed_plan(p, seq(i), has ? m[2] : 0, has ? m[3] : 0, has ? m[4] : 1, [&](int t) { return m[5 + t]; });
  }
  __device__ __forceinline__ StreamPlan plan(const KdaParams& p, long long i, const int* m) const {
    const PackedPlan q = packed(p, i, m);
    return StreamPlan{q.start, q.L, q.cs, q.a - 1, q.src, q.live};
  }
  __device__ __forceinline__ void edges(const KdaParams& p, long long i, const StreamPlan&, const int* m) const {
    packed_edges(p, head(i), seq(i), packed_items(p), packed(p, i, m), m[0], m[1],
                 [&](int t) { return m[5 + t]; });
  }
  __device__ __forceinline__ int ckpt_slot(const int* m, int t) const { return m[5 + t]; }
  __device__ __forceinline__ long long first_row(long long, const int* m) const { return m[2]; }
};

}  // namespace kda

extern "C" __global__ void __launch_bounds__(KDA_THREADS, KDA_MIN_CTAS_PER_SM)
    kda_packed_decode(const __grid_constant__ KdaParams p) {
  __shared__ kda::StreamSmem ss;
  extern __shared__ __align__(128) kda::U4 stages[];  // kStages slices
  kda::stream_items(p, kda::PackedWork{kda::head_split(p)}, ss, stages);
}
