// The technique of route stream, both ops: a persistent grid whose CTAs walk
// work items in a software pipeline, so that no phase of an item waits on a
// global load (docs/DESIGN.md, "Route stream"). Generic over the op's Work
// (kda_single_stream.cu: a row's head; kda_packed_stream.cu: a sequence's head,
// up to T tokens).
//
// Why: in rowcta each CTA loads its slice and its inputs, computes, then
// stores, so with two CTAs per SM the DRAM idles through the compute phases and
// every item waits once for its inputs' round trip. Here three streams run
// ahead of the item a CTA computes:
//  - the state slice of item j + KDA_STAGES, by the bulk copy engine into a
//    shared-memory stage (KDA_STAGES of them, dynamic shared memory);
//  - the inputs of item j + 1 (x, gates, beta, conv history, the head's conv
//    weights, dt_bias, A_log) into StagedInputs, issued as soon as item j has
//    read its own (one buffer): the single op by cp.async from every warp,
//    after the L2 was asked for them an item earlier; the packed op (5T + 22
//    runs) by bulk copies, from the last warp on a walk of 4 or more items a
//    CTA, else from every warp (bulk_issuers), without L2 hints
//    (Work::kBulkInputs, kL2Hints);
//  - the metadata of item j + 3 (its slot; a sequence: its rows, accepted
//    tokens and slots), by cp.async into a ring, so that
//    every item's plan and addresses are in shared memory before anyone needs
//    them.
//
// Launch: grid (G, 1, 1), G = min(items, occupancy x SMs) (route table), block
// KDA_THREADS, dynamic shared memory KDA_STAGES x one slice (the route table;
// the launcher opts in above 48 KiB). CTA b handles items b, b + G, ...
//
// One item j (three CTA barriers):
//   B1  wait for this thread's copies (item j's inputs, item j+2's metadata)
//       and, with bulk inputs, for their mbarrier phase; barrier; request
//       item j+3's metadata; item j's edges (zeros, counters); phase A from
//       StagedInputs into Smem
//   B2  barrier; request item j+1's inputs and the L2 for item j+2's; wait for
//       the stage, phase B (the delta rule, state stores)
//   B3  barrier (every thread has read the stage and written ob); the last warp
//       requests item j+KDA_STAGES's slice into the stage; phase C (output)
// Phase C's reads of Smem end before that warp reaches the next B1, after which
// the next phase A rewrites Smem. With one stage (f32 state: 64 KiB slices) the
// stage is passed on right after it was read instead (one more barrier), so its
// copy has a whole item to land.
#ifndef KDAJIT_KDA_PIPELINE_CUH
#define KDAJIT_KDA_PIPELINE_CUH

#include "kda_params.h"
#include "kda_head.cuh"
#include "kda_state_stage.cuh"

namespace kda {

enum : int {
  kMetaRing = 4,  // metadata of items j .. j+3
  kMetaInts = 5 + kTokens,  // the larger of the ops' (kda_<op>_stream.cu)
  // Conv history of one item as staged: SD taps tap0..tap0+2 of each part
  // ([part][w][d]); DS every tap of each part's channels ([part][d][K]).
  kHistElems = KDA_CONV_DS ? 3 * kD * kTaps : 3 * 3 * kD,
};

// A work item i splits into (row or sequence) i / H and head i % H. With the
// hole H is a constant and the compiler folds both. Read at run time (p.heads)
// the quotient comes from the host's multiplier p.heads_mul = ceil(2^63 / H):
// floor(2i * heads_mul / 2^64) = floor(i / H) for every 0 <= i < 2^56 (the
// multiplier exceeds 2^63 / H by e / H with e < H <= 128, which moves 2i *
// heads_mul / 2^64 by less than i * e / (H * 2^63) < 1 / H), a few
// multiply-adds where a 64-bit division by a run-time value is a subroutine
// (docs/notes/decode-heads-ab.md).
struct HeadSplit {
  int heads;                    // H (head_count(p))
  unsigned long long heads_mul;  // p.heads_mul; unused with the hole
  __device__ __forceinline__ long long quot(long long i) const {
#ifdef KDA_HEADS
    return i / kHeads;
#else
    return static_cast<long long>(__umul64hi(static_cast<unsigned long long>(i) << 1, heads_mul));
#endif
  }
  __device__ __forceinline__ int rem(long long i) const {
#ifdef KDA_HEADS
    return static_cast<int>(i % kHeads);
#else
    return static_cast<int>(i - quot(i) * heads);
#endif
  }
};
__device__ __forceinline__ HeadSplit head_split(const KdaParams& p) { return HeadSplit{head_count(p), p.heads_mul}; }

// One item's inputs, copied from global memory ahead of its phase A.
struct StagedInputs {
  __align__(16) unsigned short x[kTokens][3 * kD];  // q | k | v of token t
  __align__(16) unsigned short gate[kTokens][kD];   // raw_gate
  __align__(16) unsigned short ogate[kTokens][kD];  // output_gate
  __align__(16) float weight[3][kW][kD];            // conv_weight of the head, [part][w][d]
  __align__(16) float bias[kD];                     // dt_bias of the head
  __align__(16) unsigned short hist[kHistElems];    // conv history (kHistElems)
  unsigned beta_word[kTokens];  // the 4-byte word holding raw_beta of token t (beta_half())
  float a_log;
};

struct StreamSmem {
  Smem<kTokens> head;  // phase A's outputs, delta, ob (kda_head.cuh)
  StagedInputs in;
  int meta[kMetaRing][kMetaInts];  // Work's metadata of items j .. j+3, ring slot = item ordinal % 4
  unsigned long long bars[kStages];
  unsigned long long in_bar;  // Work::kBulkInputs: the bulk copies of `in`, phase k = the CTA's item k
};
// Beta of every token and A_log come from threads of the last warp, which
// always issues (stage_inputs_cp_async, stage_inputs_bulk).
static_assert(kTokens < 32, "beta's and A_log's copies from the last warp");

// One contiguous run of an item's inputs: `bytes` (a multiple of 16) at
// global `src`, staged at shared `dst` (16-byte aligned).
struct InputRun {
  void* dst;
  const void* src;
  int bytes;
};
// The runs of one live item (head h, rows row0 .. row0+L-1, conv history taps
// tap0..tap0+2 of slot cs): per token x (q, k, v), raw_gate, output_gate; the
// head's 12 conv weight rows and dt_bias; the conv history (SD: one run per
// part and tap; DS: one run of every tap per part).
__device__ __forceinline__ int input_runs(int L) { return 5 * L + 13 + (KDA_CONV_DS ? 3 : 9); }
__device__ __forceinline__ InputRun input_run(const KdaParams& p, StagedInputs& in, int r, int h, long long row0, int L,
                                              int cs, int tap0) {
  if (r < 5 * L) {
    const int t = r / 5, k = r % 5;
    const long long row = row0 + t;
    if (k < 3) return {&in.x[t][k * kD], p.x + row * p.x_row_stride + k * hidden(p) + h * kD, 2 * kD};
    if (k == 3) return {in.gate[t], p.raw_gate + row * p.gate_row_stride + h * kD, 2 * kD};
    return {in.ogate[t], p.output_gate + row * p.ogate_row_stride + h * kD, 2 * kD};
  }
  r -= 5 * L;
  if (r < 3 * kW) return {in.weight[r / kW][r % kW], p.conv_weight + r * hidden(p) + h * kD, 4 * kD};
  if (r == 3 * kW) return {in.bias, p.dt_bias + h * kD, 4 * kD};
  r -= 3 * kW + 1;
  const unsigned short* hist = p.conv_state + static_cast<long long>(cs) * p.conv_slot_stride;
  if constexpr (KDA_CONV_DS)  // channels h*D .. h*D+127 of part r hold all their taps contiguously
    return {&in.hist[r * kD * kTaps], hist + conv_tap_offset(p, r * hidden(p) + h * kD, 0), 2 * kD * kTaps};
  else
    return {&in.hist[r * kD], hist + conv_tap_offset(p, (r / 3) * hidden(p) + h * kD, tap0 + r % 3), 2 * kD};
}

// One warp copies a run with cp.async, in the widest unit src's alignment
// allows (16, 8 or 4 bytes; a 2-byte-aligned run, which validation allows for
// row tensors, falls back to plain copies that wait for their loads).
__device__ __forceinline__ void warp_copy_run(const InputRun& u, int lane) {
  const unsigned a = static_cast<unsigned>(reinterpret_cast<unsigned long long>(u.src));
  char* d = static_cast<char*>(u.dst);
  const char* s = static_cast<const char*>(u.src);
  if ((a & 15u) == 0) {
    for (int c = lane; c < u.bytes / 16; c += 32) cp_async_16(d + 16 * c, s + 16 * c);
  } else if ((a & 7u) == 0) {
    for (int c = lane; c < u.bytes / 8; c += 32) cp_async_8(d + 8 * c, s + 8 * c);
  } else if ((a & 3u) == 0) {
    for (int c = lane; c < u.bytes / 4; c += 32) cp_async_4(d + 4 * c, s + 4 * c);
  } else {
    for (int c = lane; c < u.bytes / 2; c += 32)
      reinterpret_cast<unsigned short*>(d)[c] = reinterpret_cast<const unsigned short*>(s)[c];
  }
}

// raw_beta of (row, h) is staged as the aligned 4-byte word holding it: the
// word starting one element before it (its upper half) when it sits at 2 mod
// 4, else the word it starts (lower half), which holds the next element, still
// inside the row, when h + 1 < H. Else (the row's last head at 0 mod 4) the
// element alone is copied into the lower half.
__device__ __forceinline__ bool beta_half(const unsigned short* b) {
  return (reinterpret_cast<unsigned long long>(b) & 3u) != 0;
}
__device__ __forceinline__ void stage_beta(const KdaParams& p, unsigned* dst, const unsigned short* b, int h) {
  if (beta_half(b)) cp_async_4(dst, b - 1);
  else if (h + 1 < head_count(p)) cp_async_4(dst, b);
  else *dst = *b;
}

// Two ways to request one live item's inputs into `in`, the op's choice
// (Work::kBulkInputs; docs/DESIGN.md, "Route stream"). Either way beta and
// A_log are 4-byte cp.async copies (threads kThreads - 1 - t: beta of token t,
// then A_log), complete at the issuing thread's next cp_async_wait_all(), and
// the caller made every earlier read of `in` CTA-wide (a barrier).

// Every thread: warp w copies runs w, w + kWarps, ... with cp.async.
__device__ __forceinline__ void stage_inputs_cp_async(const KdaParams& p, StagedInputs& in, int h, long long row0, int L,
                                                      int cs, int tap0) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll 1
  for (int r = warp; r < input_runs(L); r += kWarps) warp_copy_run(input_run(p, in, r, h, row0, L, cs, tap0), lane);
  const int t = kThreads - 1 - static_cast<int>(threadIdx.x);
  if (t < L) stage_beta(p, &in.beta_word[t], p.raw_beta + (row0 + t) * p.beta_row_stride + h, h);
  if (t == kTokens) cp_async_4(&in.a_log, p.A_log + h);
}

// How many warps issue an item's bulk copies (the last ones; the arrivals of
// a phase of ss.in_bar). With 4 or more items a CTA, the last warp alone: its
// issue hides behind the other warps' work on a long walk (A/B: 1-2% faster
// than every warp for packed bf16 at N >= 128). On a
// shorter walk, every warp: one warp's serial issue (an ELECT / UBLKCP loop
// per lane) is on its critical path (every warp 1-2% faster at N = 8).
__device__ __forceinline__ int bulk_issuers(long long items) {
  return items >= 4ll * gridDim.x ? 1 : kWarps;
}

// The last `issuers` warps: lane r of issuing warp w issues run w + r issuers
// as one bulk copy, counted on `bar` (one arrival per issuing warp, with its
// bytes), when its source is 16-byte aligned; a warp copies its runs that are
// not (validation allows 2-byte-aligned rows) with cp.async. Beta and A_log
// come from the last warp's threads.
__device__ __forceinline__ void stage_inputs_bulk(const KdaParams& p, StagedInputs& in, unsigned long long* bar,
                                                  int issuers, int h, long long row0, int L, int cs, int tap0) {
  const int tid = fresh_tid();  // per item: beta's address is not kept across the walk
  const int warp = (tid >> 5) - (kWarps - issuers), lane = tid & 31;
  if (warp < 0) return;
  const int runs = input_runs(L);
  unsigned bulk = 0;  // this lane's bulk-copied bytes
  fence_proxy_async();  // the generic reads of `in` before the copy engine's writes
#pragma unroll 1
  for (int base = warp; base < runs; base += 32 * issuers) {
    const int r = base + lane * issuers;
    bool odd = false;
    if (r < runs) {
      const InputRun u = input_run(p, in, r, h, row0, L, cs, tap0);
      odd = (reinterpret_cast<unsigned long long>(u.src) & 15u) != 0;
      if (!odd) {
        bulk_copy_to_smem(u.dst, u.src, u.bytes, bar);
        bulk += u.bytes;
      }
    }
#pragma unroll 1
    for (unsigned m = __ballot_sync(kFull, odd); m != 0; m &= m - 1)
      warp_copy_run(input_run(p, in, base + (__ffs(m) - 1) * issuers, h, row0, L, cs, tap0), lane);
  }
  // The warp's arrival with its bulk bytes; the copies may complete before it
  // (the transaction count may go below zero), the phase only with it.
  bulk = __reduce_add_sync(kFull, bulk);
  if (lane == 0) mbar_arrive_expect_tx(bar, bulk);
  const int t = kThreads - 1 - tid;
  if (t < L) stage_beta(p, &in.beta_word[t], p.raw_beta + (row0 + t) * p.beta_row_stride + h, h);
  if (t == kTokens) cp_async_4(&in.a_log, p.A_log + h);
}

// Lane 0 of every warp: asks the L2 for the runs of one live item (a hint), so
// that their copies, an item later, read from the L2.
__device__ __forceinline__ void prefetch_inputs(const KdaParams& p, StagedInputs& in, int h, long long row0, int L, int cs,
                                                int tap0) {
  if ((threadIdx.x & 31) != 0) return;
#pragma unroll 1
  for (int r = threadIdx.x >> 5; r < input_runs(L); r += kWarps) {
    const InputRun u = input_run(p, in, r, h, row0, L, cs, tap0);
    prefetch_l2(u.src, u.bytes);
  }
}

// Tap tap0 + w of channel d of part j, as staged.
__device__ __forceinline__ unsigned short staged_tap(const StagedInputs& in, int j, int d, int tap0, int w) {
  if constexpr (KDA_CONV_DS) return in.hist[(j * kD + d) * kTaps + tap0 + w];
  else return in.hist[(j * 3 + w) * kD + d];
}

// Phase A of one live item from its staged inputs: conv + SiLU per channel (and
// the new conv window written back, positions 0..L+1 = taps tap0+1, tap0+2,
// x_0 .. x_{L-1}), the gates per (t, k), beta per token, into Smem.
__device__ __forceinline__ void staged_phase_a(const KdaParams& p, Smem<kTokens>& sm, const StagedInputs& in, int h,
                                               long long row0, int L, int cs, int tap0) {
  const int tid = threadIdx.x;
  unsigned short* hist = p.conv_state + static_cast<long long>(cs) * p.conv_slot_stride;
  for (int c = tid; c < 3 * kD; c += kThreads) {  // channel c = part j, dim d of the head
    const int j = c / kD, d = c % kD;
    const int chan = j * hidden(p) + h * kD + d;
    float w[kW];
#pragma unroll
    for (int i = 0; i < kW; ++i) w[i] = in.weight[j][i][d];
    const unsigned short t1 = staged_tap(in, j, d, tap0, 1), t2 = staged_tap(in, j, d, tap0, 2);
    hist[conv_tap_offset(p, chan, 0)] = t1;
    hist[conv_tap_offset(p, chan, 1)] = t2;
    conv_silu(
        w, bf16_to_f32(staged_tap(in, j, d, tap0, 0)), bf16_to_f32(t1), bf16_to_f32(t2), L,
        [&](int t) { return in.x[t][c]; },
        [&](int t, unsigned short xb, unsigned short m) {
          sm.m[t][c] = m;
          hist[conv_tap_offset(p, chan, t + 2)] = xb;
        });
  }
  const float A = expf(in.a_log);
  // Gate items start at the threads the conv leaves idle. The start comes from
  // a fresh thread index, so that its shared-memory addresses are formed here,
  // per item: kept from the walk's prologue, they would be more registers
  // across phase B, which the packed f32 keys at T = 2 and 4 spill (20 bytes).
  for (int item = (fresh_tid() + kThreads - (3 * kD) % kThreads) % kThreads; item < L * kD; item += kThreads) {
    const int t = item / kD;
    const int k = item % kD;
    sm.decay[t][k] = gate_decay(bf16_to_f32(in.gate[t][k]) + in.bias[k], A, p.lower_bound);
    sm.sig_ogate[t][k] = sigmoid(bf16_to_f32(in.ogate[t][k]));
  }
  if (tid < L) {
    const unsigned w = in.beta_word[tid];
    const bool hi = beta_half(p.raw_beta + (row0 + tid) * p.beta_row_stride + h);
    sm.beta[tid] = sigmoid(hi ? bf16hi_to_f32(w) : bf16lo_to_f32(w));
  }
}

// What a stream item is: its rows, its conv history and state source, whether
// it is decoded at all (live), from its metadata alone.
struct StreamPlan {
  long long row0;
  int L, cs, tap0, src;
  bool live;
};

// Every thread: item i (of `items`) its inputs, when it is live, into ss.in,
// the op's way. With bulk copies every item of the walk completes one phase
// of ss.in_bar (every issuing warp arrives; for a dead item with no bytes).
template <class Work>
__device__ __forceinline__ void stage_item_inputs(const KdaParams& p, const Work& work, StreamSmem& ss, long long i,
                                                  long long items, const int* m) {
  const StreamPlan q = work.plan(p, i, m);
  if constexpr (Work::kBulkInputs) {
    const int issuers = bulk_issuers(items);
    if (q.live) stage_inputs_bulk(p, ss.in, &ss.in_bar, issuers, work.head(i), q.row0, q.L, q.cs, q.tap0);
    else if ((threadIdx.x & 31) == 0 && (threadIdx.x >> 5) >= kWarps - issuers) mbar_arrive_expect_tx(&ss.in_bar, 0);
  } else if (q.live) {
    stage_inputs_cp_async(p, ss.in, work.head(i), q.row0, q.L, q.cs, q.tap0);
  }
}

// Every thread: the L2 hints for item i's inputs, when the op asks for them.
template <class Work>
__device__ __forceinline__ void prefetch_item_inputs(const KdaParams& p, const Work& work, StreamSmem& ss, long long i,
                                                     const int* m) {
  if constexpr (Work::kL2Hints) {
    const StreamPlan q = work.plan(p, i, m);
    if (q.live) prefetch_inputs(p, ss.in, work.head(i), q.row0, q.L, q.cs, q.tap0);
  }
}

// Walks this CTA's items. Work (one per op):
//   HeadSplit hs                            H and its multiplier (head_split(p): the grid is not per head)
//   long long items(p)                      the launch's items
//   int head(i)                             the head of item i
//   void load_meta(p, i, int* m)            cp.async of item i's metadata into m (kMetaInts ints)
//   StreamPlan plan(p, i, m)                item i's plan from its metadata
//   void edges(p, i, plan, m)               item i's zeros and counters (every thread, uniform)
//   int ckpt_slot(m, t)                     the checkpoint slot of token t (< T)
//   long long first_row(i, m)               a live item's first row (plan(p, i, m).row0)
//   bool kBulkInputs                        inputs by bulk copies (bulk_issuers' warps; else cp.async, every warp)
//   bool kL2Hints                           the L2 is asked for item j + 2's inputs
template <class Work>
__device__ __forceinline__ void stream_items(const KdaParams& p, const Work& work, StreamSmem& ss, U4* stages) {
  const int tid = threadIdx.x;
  if (tid == 0) {
#pragma unroll
    for (int k = 0; k < kStages; ++k) mbar_init(&ss.bars[k]);
    mbar_init(&ss.in_bar, bulk_issuers(work.items(p)));
    mbar_init_fence();
  }
  pdl_wait();  // everything below may read what the previous kernel wrote
  if (tid < kD) ss.head.norm_w[tid] = p.norm_weight[tid];

  const long long items = work.items(p);
  const int step = gridDim.x;
  const long long i0 = blockIdx.x;
  // Metadata of items 0..2 of this CTA, then their slices and item 0's inputs.
#pragma unroll
  for (int k = 0; k < 3; ++k)
    if (i0 + k * step < items) work.load_meta(p, i0 + k * step, ss.meta[k]);
  cp_async_wait_all();
  __syncthreads();
  // Item 0's inputs first, then the slices: requested first, the slices (32-64
  // KB each) hold item 0's few KB of inputs behind them (2-8% at N <= 32).
  if (i0 < items) stage_item_inputs(p, work, ss, i0, items, ss.meta[0]);
  if (tid == 0) {
#pragma unroll
    for (int k = 0; k < kStages; ++k) {
      const long long i = i0 + k * step;
      if (i < items) {
        const StreamPlan q = work.plan(p, i, ss.meta[k]);
        if (q.live) request_slice(p, q.src, work.head(i), stages + k * kSliceUnits, &ss.bars[k]);
      }
    }
  }
  if (i0 + step < items) prefetch_item_inputs(p, work, ss, i0 + step, ss.meta[1]);

  unsigned phases = 0;  // bit k: parity of stage k's next completion
  int st = 0;           // stage of the current item
  // ord: this item's ordinal in the CTA's walk (ring slot = ord % 4)
  for (int ord = 0;; ++ord) {
    const long long i = i0 + static_cast<long long>(ord) * step;
    if (i >= work.items(p)) break;
    const int* m = ss.meta[ord % kMetaRing];
    cp_async_wait_all();
    if constexpr (Work::kBulkInputs) mbar_wait(&ss.in_bar, ord & 1);
    __syncthreads();  // B1: item i's inputs and item i + 2 step's metadata are in place
    // Item i + 3 step's metadata into the ring slot of item i - step, which
    // every thread is done with.
    if (i + 3 * step < items) work.load_meta(p, i + 3 * step, ss.meta[(ord + 3) % kMetaRing]);
    // The plan is re-read from the ring after each barrier rather than kept in
    // registers across phase B (which needs every register it can get).
    int L;  // the item's rows when it is live, else 0
    {
      const StreamPlan q = work.plan(p, i, m);
      L = q.live ? q.L : 0;
      work.edges(p, i, q, m);
      if (q.live) staged_phase_a(p, ss.head, ss.in, work.head(i), q.row0, q.L, q.cs, q.tap0);
    }
    __syncthreads();  // B2: Smem holds item i's phase A; ss.in is free
    if (i + step < items) stage_item_inputs(p, work, ss, i + step, items, ss.meta[(ord + 1) % kMetaRing]);
    if (i + 2 * step < items) prefetch_item_inputs(p, work, ss, i + 2 * step, ss.meta[(ord + 2) % kMetaRing]);

    // The slice of item i + kStages step goes into this item's stage once
    // every thread has read it (warp kWarps - 1, lane 0), planned here so that
    // only its slot and head are live while the stage is read.
    int ahead_src = 0, ahead_head = 0;
    if (tid == kThreads - 32 && i + kStages * step < items) {
      const long long ahead = i + kStages * step;
      const StreamPlan qa = work.plan(p, ahead, ss.meta[(ord + kStages) % kMetaRing]);
      if (qa.live) ahead_src = qa.src;
      ahead_head = work.head(ahead);
    }
    auto pass_on = [&]() {
      if (slot_valid(ahead_src, p.num_slots))
        request_slice(p, ahead_src, ahead_head, stages + st * kSliceUnits, &ss.bars[st]);
    };
    if (L > 0) {
      mbar_wait(&ss.bars[st], (phases >> st) & 1u);
      phases ^= 1u << st;
      U4 raw[kRowsPerLane];
      // This thread's unit from a fresh thread index: kept from the prologue,
      // it would be one more register across the walk (the f32 keys at T = 5..7
      // spill then).
      const int t_now = fresh_tid();
      const U4* src = stages + st * kSliceUnits + slice_unit(t_now >> 5, t_now & 31);
#pragma unroll
      for (int r = 0; r < kRowsPerLane; ++r) raw[r] = src[r * kSliceRowStride];
      if constexpr (kStages == 1) {
        __syncthreads();  // the stage is free
        pass_on();
      }
      head_delta_rule<kTokens>(
          p, ss.head, work.head(i), L, [&](int t) { return work.ckpt_slot(ss.meta[ord % kMetaRing], t); }, 0, raw);
    } else if constexpr (kStages == 1) {
      __syncthreads();  // the same barrier count on every thread of every item
      pass_on();
    }
    // The next kernel on the stream may start its prologue (PDL; a no-op otherwise).
    pdl_launch_dependents();
    __syncthreads();  // B3: the stage has been read, ob is complete
    if constexpr (kStages == 2) pass_on();
    if (L > 0) head_norm_output<kTokens>(p, ss.head, work.head(i), work.first_row(i, ss.meta[ord % kMetaRing]), L);
    st = kStages == 1 ? 0 : st ^ 1;
  }
  cp_async_wait_all();  // nothing in flight at exit (every requested slice was waited for)
}

}  // namespace kda

#endif  // KDAJIT_KDA_PIPELINE_CUH
