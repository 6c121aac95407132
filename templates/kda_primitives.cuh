// Device primitives shared by every route of the fused KDA decode kernels
// (contract: docs/CONTRACT.md): the generator's holes and the constants they
// give, bf16 conversions, the scalar math of the gates, warp reductions, slot
// rules, PDL and thread-block-cluster helpers. No route technique here.
//
// NVRTC compiles this with no include path: no toolkit or std header here.
#ifndef KDAJIT_KDA_PRIMITIVES_CUH
#define KDAJIT_KDA_PRIMITIVES_CUH

#include "kda_params.h"

// The head count H: a hole (KDA_HEADS) of a program compiled for one head
// count (an (op, route) with heads_in_program(), kernel_key.hpp), else read at run time
// by head_count() below: from the launch grid, whose x is the head, or, where a
// template defines KDA_HEADS_FROM_PARAMS first (route stream: its persistent
// grid is not per head), from the parameter block. Without the hole a
// program's source is the same for every head count, and the constants derived
// from KDA_HEADS below do not exist in it. A template that defines
// KDA_HEADS_FROM_GRID never takes the hole.
//   KDA_HEADS: hole (optional): heads H (1..128)
#if defined(KDA_HEADS_FROM_GRID) && defined(KDA_HEADS)
#error "KDA_HEADS is defined for a template that reads the head count from the launch grid (KDA_HEADS_FROM_GRID)"
#endif
#if defined(KDA_HEADS_FROM_GRID) && defined(KDA_HEADS_FROM_PARAMS)
#error "a template reads the head count from the launch grid or from the parameter block, not both"
#endif
// Likewise the state dtype and conv layout: a template that reads them from
// KdaParams (state_bf16, conv_chan_stride, conv_tap_stride) defines
// KDA_STORAGE_FROM_PARAMS first, and KDA_STATE_BF16 / KDA_CONV_DS do not exist
// in it (a use in an #if reads 0: none of them may appear there).
#ifdef KDA_STORAGE_FROM_PARAMS
#if defined(KDA_STATE_BF16) || defined(KDA_CONV_DS)
#error "KDA_STATE_BF16 or KDA_CONV_DS is defined for a template that reads them from KdaParams (KDA_STORAGE_FROM_PARAMS)"
#endif
#else
#ifndef KDA_STATE_BF16
#define KDA_STATE_BF16 0  // hole: state dtype, 0 = f32, 1 = bf16
#endif
#ifndef KDA_CONV_DS
#define KDA_CONV_DS 0  // hole: conv_state layout, 0 = SD (taps slow), 1 = DS (taps contiguous)
#endif
#endif
#ifndef KDA_GATE_SOFTPLUS
#define KDA_GATE_SOFTPLUS 0  // hole: gate, 0 = bounded, 1 = softplus (Kimi-Linear)
#endif
#ifndef KDA_THREADS
#define KDA_THREADS 256  // hole: threads per block (256 or 512)
#endif
#ifndef KDA_SPLIT
#define KDA_SPLIT 1  // hole: CTAs per (row, head), a cluster along grid y (1, 2 or 4)
#endif
#ifndef KDA_T
#error "KDA_T (tokens per sequence) must be defined before kda_primitives.cuh"
#endif
// Occupancy floor for ptxas (the route's CTAs per SM): two by default (256
// threads: <= 128 registers, 512 threads: <= 64), so one CTA's math overlaps
// another's state traffic.
#ifndef KDA_MIN_CTAS_PER_SM
#define KDA_MIN_CTAS_PER_SM 2  // hole: CTAs per SM (1..4)
#endif

namespace kda {

// Compile-time constants are enumerators of one enum (so that they mix in
// arithmetic without enum-enum conversions): under NVRTC's -default-device a
// namespace-scope constexpr variable would also be emitted as a __device__ global.
enum : int {
  kD = 128,  // head dim (k and v)
  kW = 4,    // conv width
#ifdef KDA_HEADS
  kHeads = KDA_HEADS,
  kHidden = kHeads * kD,
  kQkv = 3 * kHidden,
#endif
  kTokens = KDA_T,
  kTaps = kTokens + kW - 2,  // K: conv_state taps per channel
  kThreads = KDA_THREADS,
  kWarps = kThreads / 32,
  kSplit = KDA_SPLIT,
#ifndef KDA_STORAGE_FROM_PARAMS

  // conv_state element of (channel c, tap t) in a slot: c*kConvChanStride + t*(tap stride).
  // SD: strides (1, 3*H*D), taps slow; DS: strides (K, 1), taps contiguous (conv_tap_offset()).
  kConvChanStride = KDA_CONV_DS ? kTaps : 1,
#endif
};
enum : unsigned { kFull = 0xffffffffu };

#if defined(KDA_HEADS)
static_assert(kHeads >= 1 && kHeads <= 128, "KDA_HEADS must be in 1..128");
#elif defined(KDA_HEADS_FROM_GRID)
// A use of kHeads, kHidden or kQkv in such a template is an error that names
// this type: there the grid's x dimension is H, and grid_hidden() is H * kD.
struct head_count_is_gridDim_x_in_this_program;
extern const head_count_is_gridDim_x_in_this_program kHeads, kHidden, kQkv;
#else
// Likewise without the hole: there H is head_count(p), and hidden(p) is H * kD.
struct head_count_is_head_count_p_in_this_program;
extern const head_count_is_head_count_p_in_this_program kHeads, kHidden, kQkv;
#endif
static_assert((kTokens >= 1 && kTokens <= 16) || kTokens == 64, "KDA_T must be in 1..16 (decode) or 64 (the prefill chunk)");
// 128 threads would hold 128 state values per thread: far past the register budget.
static_assert(kThreads == 256 || kThreads == 512, "KDA_THREADS must be 256 or 512");
static_assert(kSplit == 1 || kSplit == 2 || kSplit == 4 || kSplit == 8, "KDA_SPLIT must be 1, 2, 4 or 8");

struct __align__(16) U4 {
  unsigned x, y, z, w;
};
struct __align__(8) U2 {
  unsigned x, y;
};

// ---- bf16 <-> f32 ----
__device__ __forceinline__ float bf16_to_f32(unsigned short b) {
  return __uint_as_float(static_cast<unsigned>(b) << 16);
}
__device__ __forceinline__ float bf16lo_to_f32(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16hi_to_f32(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// Round to nearest even, as torch's .to(bfloat16) does.
__device__ __forceinline__ unsigned short f32_to_bf16(float f) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}
// Packs (lo, hi): lo goes to the lower address (bits 0..15).
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// N consecutive bf16 (N = 4 or 8, 8N-byte aligned) of shared memory -> f32.
template <int N>
__device__ __forceinline__ void load_bf16_vec(const unsigned short* src, float (&dst)[N]) {
  static_assert(N == 4 || N == 8, "8- or 16-byte vectors");
  unsigned w[N / 2];
  if constexpr (N == 4) {
    const U2 v = *reinterpret_cast<const U2*>(src);
    w[0] = v.x;
    w[1] = v.y;
  } else {
    const U4 v = *reinterpret_cast<const U4*>(src);
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
  }
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    dst[2 * i] = bf16lo_to_f32(w[i]);
    dst[2 * i + 1] = bf16hi_to_f32(w[i]);
  }
}

// ---- scalar math of the conv and the gates ----
// The per-token chain (SiLU of every conv channel, the gates of every k) is
// on each item's critical path, so the exponentials are the hardware's
// (__expf: ex2.approx after a multiply, about 2 + 1.2|x| ulp) and the sigmoid
// divides by the approximate reciprocal (__fdividef: 2 ulp; 1 / inf = 0, so
// sigmoid saturates to 0 and 1). Both stay far inside the tolerances of
// docs/CONTRACT.md §8 (1e-3 for an f32 state); accurate expf and an IEEE
// division measure 2-7% slower at N <= 8. log1pf stays
// accurate: softplus of a very negative logit is that small term itself.
__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

__device__ __forceinline__ float softplus(float g) { return g > 20.0f ? g : log1pf(__expf(g)); }

// decay_k = exp(gv) for the gate logit g = raw_gate + dt_bias (§2 step 4).
__device__ __forceinline__ float gate_decay(float g, float A, float lower_bound) {
#if KDA_GATE_SOFTPLUS
  (void)lower_bound;
  return __expf(-A * softplus(g));
#else
  return __expf(lower_bound * sigmoid(A * g));
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

__device__ __forceinline__ bool slot_valid(int s, int num_slots) { return s > 0 && s < num_slots; }

#ifndef KDA_HEADS_FROM_GRID
// The head count H: the hole, or the parameter block's (KDA_HEADS_FROM_PARAMS),
// or the launch grid's x dimension.
__device__ __forceinline__ int head_count(const KdaParams& p) {
#if defined(KDA_HEADS)
  (void)p;
  return kHeads;
#elif defined(KDA_HEADS_FROM_PARAMS)
  return p.heads;
#else
  // %nctaid.x through PTX, not gridDim.x: the compiled code differs, and with
  // gridDim.x the packed f32 split4 program at T = 4 (DS, softplus) spills 8
  // bytes at 128 registers; this way it takes 123 and spills none.
  (void)p;
  unsigned n;
  asm("mov.u32 %0, %%nctaid.x;" : "=r"(n));
  return static_cast<int>(n);
#endif
}
// The hidden size H * kD.
__device__ __forceinline__ int hidden(const KdaParams& p) { return head_count(p) * kD; }
#ifndef KDA_STORAGE_FROM_PARAMS
// Element offset of tap t of channel c inside one conv_state slot (a template
// that reads the layout from KdaParams has its own: conv_chan_stride, conv_tap_stride).
__device__ __forceinline__ int conv_tap_offset(const KdaParams& p, int c, int t) {
  return c * kConvChanStride + t * (KDA_CONV_DS ? 1 : 3 * hidden(p));
}
#endif
#else
// The hidden size H * kD of a program that reads H from the launch grid.
__device__ __forceinline__ int grid_hidden() { return static_cast<int>(gridDim.x) * kD; }
#endif

// ---- butterfly ("transpose") reduction ----
// Sums each of N values over a group of lanes (xor offsets OFF, OFF/2, .., 1)
// with N/2 + N/4 + .. shuffles instead of N*log2(group): at each step a lane
// keeps one half of its values (upper half where its OFF bit is set) and trades
// the other half with its partner. With N >= group size G, lane g of the group
// ends with values g*(N/G) .. g*(N/G) + N/G - 1 in v[0 .. N/G-1]; with N < G,
// it ends with value g / (G/N) in v[0].
template <int N, int OFF, int V>
__device__ __forceinline__ void butterfly_sum(float (&v)[V], int lane) {
  if constexpr (OFF >= 1) {
    if constexpr (N > 1) {
      constexpr int kHalf = N / 2;
      const bool upper = (lane & OFF) != 0;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[i + kHalf];
        const float keep = upper ? v[i + kHalf] : v[i];
        v[i] = keep + __shfl_xor_sync(kFull, send, OFF);
      }
      butterfly_sum<kHalf, OFF / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(kFull, v[0], OFF);
      butterfly_sum<1, OFF / 2>(v, lane);
    }
  }
}

// Zeros output values [v0, v0 + nv) of head h for rows [r0, r1) (null slot,
// non-live sequence, tail rows; a cluster rank zeros its own value rows).
__device__ __forceinline__ void zero_rows(const KdaParams& p, int h, long long r0, long long r1, int v0 = 0,
                                          int nv = kD) {
  if (r1 <= r0) return;
  const long long n = (r1 - r0) * nv;
  for (long long i = threadIdx.x; i < n; i += kThreads)
    p.output[(r0 + i / nv) * p.out_row_stride + h * kD + v0 + (i % nv)] = 0;
}

// ---- programmatic dependent launch (PDL) ----
// Without the launch attribute both are no-ops. wait: every read of memory a
// previous kernel on the stream may write comes after it. launch_dependents:
// the next kernel may start its prologue (it still waits for this grid to finish).
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" :::); }

// A shared-memory address as the 32-bit offset PTX shared-state spaces take.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Phase A0's loads and stores (kda_head.cuh): every input load is issued
// before the state slice and before the first store waits for its value. A
// plain load is not enough: when its only use is in a branch, ptxas sinks it
// into the branch, behind the first store. So the loads are issued where they
// are written (volatile) and the stores are single predicated instructions.
__device__ __forceinline__ unsigned short load_u16_in_order(const unsigned short* src) {
  unsigned short v;
  asm volatile("ld.global.u16 %0, [%1];" : "=h"(v) : "l"(src));
  return v;
}
__device__ __forceinline__ void store_shared_if(bool when, unsigned short* dst, unsigned short v) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p st.shared.u16 [%0], %1;\n\t}" ::"r"(smem_addr(dst)),
               "h"(v), "r"(static_cast<int>(when))
               : "memory");
}
__device__ __forceinline__ void store_shared_if(bool when, float* dst, float v) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t@p st.shared.f32 [%0], %1;\n\t}" ::"r"(smem_addr(dst)),
               "f"(v), "r"(static_cast<int>(when))
               : "memory");
}

// ---- thread-block clusters (routes with KDA_SPLIT > 1) ----
__device__ __forceinline__ int cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return static_cast<int>(r);
}
// The cluster barrier: every thread of every CTA of the cluster arrives and
// waits, alternating. A release arrive orders every earlier access of this
// thread (loads included) before the other CTAs' accesses after their wait,
// and so waits for all of them to complete: in-flight state loads and
// checkpoint stores too (ncu puts 15-24% of the split kernels' stall samples
// at N = 1 on that wait and the cluster barrier behind it). A relaxed
// arrive orders nothing; its callers say what they rely on instead.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// The shared::cluster address of `local`'s variable in the CTA of cluster
// rank `rank` (the same offset in that CTA's shared memory).
__device__ __forceinline__ unsigned cluster_peer_addr(const void* local, int rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(local)), "r"(rank));
  return remote;
}

// Stores v into the shared-memory float at `local` in the CTA of cluster rank `rank`.
__device__ __forceinline__ void store_cluster_f32(float* local, int rank, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(cluster_peer_addr(local, rank)), "f"(v) : "memory");
}

// threadIdx.x, read again at each use: the compiler can neither share nor
// hoist it, so values formed from it stay where they are used instead of
// living in a register (or the stack) across a loop. Route stream forms the
// per-item addresses of phase A and of the staging warp from it.
__device__ __forceinline__ int fresh_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// ---- mbarrier and the bulk copy engine (route stream) ----
// A CTA-local mbarrier that one thread arms with the byte count of the copies
// it issues; the copies complete it (complete_tx), every thread waits on its
// phase parity.
// `arrivals`: the arrivals that complete a phase (with its transaction bytes).
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned arrivals = 1) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the async proxy (the copy engine).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"  // labels inside { } are local to this copy of the asm
      "KDA_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra KDA_MBAR_WAIT;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// Orders this thread's earlier generic-proxy accesses of shared memory (the
// reads of a stage, made CTA-wide by a barrier before) before the async
// proxy's writes that follow.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global
// to this CTA's shared memory; completion is counted on `bar`.
__device__ __forceinline__ void bulk_copy_to_smem(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// Arrive on a CTA-local mbarrier: one of its phase's expected arrivals
// (release: this thread's shared-memory writes before it are seen by a thread
// that waits for the phase).
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Arrive on a CTA-local mbarrier (one of its expected arrivals) and return
// the phase's state token for mbar_wait_token(); with expect_tx the phase also
// waits for `bytes` more of complete_tx.
__device__ __forceinline__ unsigned long long mbar_arrive_token(unsigned long long* bar) {
  unsigned long long state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(smem_addr(bar)) : "memory");
  return state;
}
__device__ __forceinline__ unsigned long long mbar_arrive_expect_tx_token(unsigned long long* bar, unsigned bytes) {
  unsigned long long state;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;"
               : "=l"(state)
               : "r"(smem_addr(bar)), "r"(bytes)
               : "memory");
  return state;
}
// Waits until the phase the token came from has completed.
__device__ __forceinline__ void mbar_wait_token(unsigned long long* bar, unsigned long long state) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "KDA_MBAR_WAIT_TOKEN:\n"
      "mbarrier.try_wait.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra KDA_MBAR_WAIT_TOKEN;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "l"(state)
      : "memory");
}
// Stores v into the shared-memory float at `local` in the CTA of cluster rank
// `rank` and counts its 4 bytes on that CTA's mbarrier at `local_bar` (the same
// offsets there): the data is visible to whoever sees that phase complete, with
// no fence over this thread's other memory accesses.
__device__ __forceinline__ void store_async_cluster_f32(float* local, unsigned long long* local_bar, int rank, float v) {
  const unsigned remote = cluster_peer_addr(local, rank), remote_bar = cluster_peer_addr(local_bar, rank);
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(remote),
               "r"(__float_as_uint(v)), "r"(remote_bar)
               : "memory");
}

// ---- cp.async: per-thread asynchronous copies global -> shared (route stream) ----
// Each thread's copies complete at its next cp_async_wait_all(); a CTA barrier
// after that makes every thread's copies visible to the CTA.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Asks the L2 to fetch the bytes [ptr, ptr + bytes), widened to whole 16-byte
// units (which stay inside the pages of the first and last byte). A hint: no
// completion, no ordering, no effect on any result.
__device__ __forceinline__ void prefetch_l2(const void* ptr, unsigned bytes) {
  const unsigned long long a = reinterpret_cast<unsigned long long>(ptr);
  const unsigned long long lo = a & ~15ull, hi = (a + bytes + 15ull) & ~15ull;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(lo), "r"(static_cast<unsigned>(hi - lo)) : "memory");
}

}  // namespace kda

#endif  // KDAJIT_KDA_PRIMITIVES_CUH
