// A shared-memory state stage of route stream: one (slot, head) state slice,
// filled by the bulk copy engine and counted on an mbarrier; the pipeline of
// kda_pipeline.cuh keeps KDA_STAGES of them.
#ifndef KDAJIT_KDA_STATE_STAGE_CUH
#define KDAJIT_KDA_STATE_STAGE_CUH

#ifndef KDA_STAGES
#define KDA_STAGES 1  // hole: shared-memory state stages (items in flight ahead), 1 or 2
#endif

#include "kda_params.h"
#include "kda_head.cuh"

namespace kda {

enum : int {
  kStages = KDA_STAGES,
  kSliceBytes = kVRows * kD * kStateBytes,  // one (slot, head) state slice, contiguous in the pool
  kSliceUnits = kSliceBytes / 16,
  kCopyChunks = 4,  // bulk copies per slice (issued back to back by one thread)
};
static_assert(kStages == 1 || kStages == 2, "KDA_STAGES must be 1 or 2");
static_assert(kSplit == 1, "a stage holds a whole slice");
static_assert(kSliceBytes % (16 * kCopyChunks) == 0, "bulk copies move multiples of 16 bytes");

// Thread 0: requests the slice of (slot, h) into `stage`, counted on `bar`. The
// caller made every earlier read of `stage` CTA-wide (a barrier) and waited
// for the stage's previous copy.
__device__ __forceinline__ void request_slice(const KdaParams& p, int slot, int h, U4* stage,
                                              unsigned long long* bar) {
  const char* src = static_cast<const char*>(p.state) +
                    (static_cast<long long>(slot) * p.state_slot_stride + static_cast<long long>(h) * kD * kD) *
                        kStateBytes;
  fence_proxy_async();
  mbar_arrive_expect_tx(bar, kSliceBytes);
  constexpr int kChunk = kSliceBytes / kCopyChunks;
#pragma unroll
  for (int c = 0; c < kCopyChunks; ++c)
    bulk_copy_to_smem(reinterpret_cast<char*>(stage) + c * kChunk, src + c * kChunk, kChunk, bar);
}

}  // namespace kda

#endif  // KDAJIT_KDA_STATE_STAGE_CUH
