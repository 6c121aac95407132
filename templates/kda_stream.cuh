// The technique of route stream for the packed op: a persistent grid whose
// CTAs walk work items while the bulk copy engine streams the state slices of
// their next items into shared memory (docs/DESIGN.md, "Route stream"). The
// single op's stream runs the pipeline of kda_pipeline.cuh instead, which also
// stages every input ahead; for the packed op that measured 2-7% slower (its
// per-token inputs make the copies' address work outweigh the wait it saves).
//
// Why: in rowcta each CTA loads its slice, computes, then stores, so with two
// CTAs per SM the DRAM idles through the compute phases; with bf16 state (half
// the bytes for the same math) that left the op 25-40% above the memory floor.
// Here the slice of item j + KDA_STAGES is in flight while item j computes.
//
// Launch: grid (G, 1, 1), G = min(items, occupancy x SMs) (route table), block
// KDA_THREADS, dynamic shared memory KDA_STAGES x one slice (the route table;
// the launcher opts in above 48 KiB). CTA b handles items b, b + G, ...
//
// Per item j of a CTA (stage j % KDA_STAGES): its source slot was read
// KDA_STAGES items earlier, and if valid, thread 0 armed the stage's mbarrier
// with the slice's bytes and issued the copies then. The item waits on that
// barrier at phase B, reads its slice into registers, and after a CTA barrier
// (the stage is free) thread 0 requests the slice of item j + KDA_STAGES into
// it. An item that needs no state (null slot, not live) passes its stage on at
// once. Every requested copy is waited for, so none is in flight at exit.
#ifndef KDAJIT_KDA_STREAM_CUH
#define KDAJIT_KDA_STREAM_CUH

#include "kda_params.h"
#include "kda_head.cuh"
#include "kda_state_stage.cuh"

namespace kda {

// The state source of one item (kda_decode_head()): its stage, and what to
// request into the stage once every thread has read it (next_slot 0: nothing).
template <class Work>
struct StagedState {
  const KdaParams* p;
  const Work* work;
  U4* stage;
  unsigned long long* bar;
  unsigned parity;
  int next_slot;
  long long next_item;
  bool fetched = false;

  // Thread 0, after a CTA barrier that followed every read of the stage.
  __device__ __forceinline__ void pass_on() const {
    if (threadIdx.x == 0 && slot_valid(next_slot, p->num_slots))
      request_slice(*p, next_slot, work->head(next_item), stage, bar);
  }

  __device__ __forceinline__ void issue(const KdaParams&, int, int, int, int, int, U4 (&)[kRowsPerLane]) const {}
  __device__ __forceinline__ void fetch(int warp, int lane, U4 (&raw)[kRowsPerLane]) {
    mbar_wait(bar, parity);
    const U4* src = stage + slice_unit(warp, lane);
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) raw[i] = src[i * kSliceRowStride];
    __syncthreads();  // the stage is free
    pass_on();
    fetched = true;
  }
};

// Walks this CTA's items. Work (one per op):
//   long long items(p)                   the launch's items
//   int head(i)                          the head of item i (its slice's head)
//   int source_slot(p, i)                the state slot item i reads, or 0 when it needs none
//   void run(p, i, slot, in)             item i, calling in.fetch() exactly when slot is valid
template <class Work>
__device__ __forceinline__ void stream_items(const KdaParams& p, Work& work, U4* stages, unsigned long long* bars) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < kStages; ++k) mbar_init(&bars[k]);
    mbar_init_fence();
  }
  __syncthreads();
  pdl_wait();  // everything below may read what the previous kernel wrote

  const long long items = work.items(p);
  const long long step = gridDim.x;
  auto slot_of = [&](long long i) { return i < items ? work.source_slot(p, i) : 0; };
  // ring[k]: source slot of this CTA's item j + k (the current item is j).
  int ring[kStages + 1];
#pragma unroll
  for (int k = 0; k < kStages; ++k) {
    const long long i = blockIdx.x + k * step;
    ring[k] = slot_of(i);
    const StagedState<Work> first{&p, &work, stages + k * kSliceUnits, &bars[k], 0u, ring[k], i};
    first.pass_on();
  }
  unsigned phases = 0;  // bit k: parity of stage k's next completion
  int st = 0;           // stage of the current item
  for (long long i = blockIdx.x; i < items; i += step) {
    const long long ahead = i + kStages * step;
    ring[kStages] = slot_of(ahead);
    StagedState<Work> in{&p, &work, stages + st * kSliceUnits, &bars[st], (phases >> st) & 1u, ring[kStages], ahead};
    const bool requested = slot_valid(ring[0], p.num_slots);
    work.run(p, i, ring[0], in);
    if (!in.fetched) {
      // No state needed (or, defensively, a requested slice the item did not
      // read): the stage is idle once its copy, if any, has landed.
      if (requested) {
        mbar_wait(in.bar, in.parity);
        __syncthreads();  // every thread saw this phase complete before the barrier is armed again
      }
      in.pass_on();
    }
    if (requested) phases ^= 1u << st;
#pragma unroll
    for (int k = 0; k < kStages; ++k) ring[k] = ring[k + 1];
    st = kStages == 1 ? 0 : st ^ 1;
    __syncthreads();  // the next item reuses the shared memory
  }
}

}  // namespace kda

#endif  // KDAJIT_KDA_STREAM_CUH
