// The CUDA device code of the prefill template (templates/kda_prefill.cu, both
// ops) on the CPU, for the emulation tests: every thread of a CTA is a fiber
// (ucontext) of one host thread, scheduled until it waits, so that
// __syncthreads, the warp shuffles, mma.sync, wgmma, the cluster barrier and
// the mbarrier are ordinary waits. A cluster's CTAs run together, each with its own shared
// memory, which a store to a peer rank reaches. emulate_source.py rewrites the
// generated kernel source (kdajit show) onto the names below: each inline PTX
// statement the template uses becomes a call here.
//
// What it checks: the kernel's algorithm, indexing and barriers against the
// f64 reference with IEEE f32 arithmetic (mma products rounded to tf32 as the
// tensor cores take them, accumulated in f32). What it cannot: timing races
// the barriers do not order, the hardware's approximate exponentials and
// fused multiply-adds, anything of the memory model past program order.
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) alignas(n)
// A kernel's static shared arrays (the prefill norm kernel's, launched
// without a cluster) are one per process: the emulation runs the CTAs of
// such a launch one at a time.
#define __shared__ static

namespace kdajit::emu {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

// A thread's cp.async copy in flight: its bytes as read at the issue (the
// source is an input, which no thread writes), landing in shared memory later.
struct AsyncCopy {
  void* dst;
  unsigned char bytes[16];
  unsigned n;
  bool at_wait;  // lands only at the wait that covers it (else at a random round before it, or there)
};

struct Cta;
struct Fiber {
  ucontext_t ctx{};
  Dim3 tid;
  Cta* cta = nullptr;
  bool done = false;
  long long cluster_phase = 0;  // cluster barriers this fiber has arrived at
  // The thread's cp.async copies in flight: those not yet committed, then
  // its committed groups, oldest first.
  std::vector<AsyncCopy> async_open;
  std::vector<std::vector<AsyncCopy>> async_groups;
};

struct Warp {
  long long gen = 0;  // completed exchanges
  int count = 0;
  float f[2][32]{};
  unsigned u[2][32][6]{};
};

// A warpgroup's exchange of wgmma's A fragments (4 registers a thread).
struct WarpGroup {
  long long gen = 0;
  int count = 0;
  unsigned a[2][128][4]{};
};

// A named barrier (bar.sync id, n; bar.red.and): n arrivals a generation.
struct NamedBarrier {
  long long gen = 0;
  int count = 0, acc = 1, result = 1;
};

struct Cta {
  Dim3 block;
  int rank = 0;
  std::vector<unsigned char> smem;
  NamedBarrier named[16];  // 0: __syncthreads
  Warp warps[16];
  WarpGroup groups[4];
};

// The fiber running now.
Fiber* current();
// Gives the host thread back to the scheduler until the next round.
void yield();

// The grid's dimensions of the launch being emulated.
extern Dim3 grid_dim;

// Warps first..last of every CTA (none: first > last, the default) are held
// back in 7 of 8 scheduler rounds instead of 1 in 4: they run far behind the
// others, as a slow role of a warp-specialized kernel would.
void set_slow_warps(int first, int last);

// Runs `entry` for the CTAs of one cluster (`cluster` CTAs at blocks
// (x, y0 .. y0 + cluster - 1, z), ranks 0..cluster-1) with `threads` threads
// and `smem_bytes` of dynamic shared memory each, filled with `poison` first.
void run_cluster(const std::function<void()>& entry, unsigned x, unsigned y0, unsigned z, int cluster, int threads,
                 size_t smem_bytes, unsigned char poison);

// ---- what the rewritten source calls ----
int barrier_and(int pred);
// bar.sync / bar.red.and.pred `id`, `count` threads (a multiple of 32): the
// AND of their predicates once the count has arrived.
int named_barrier(int id, int count, int pred);
float shfl_xor(float v, int off);
void warp_sync();  // __syncwarp(): the 32 lanes of the caller's warp meet
void mma_m16n8k8_tf32(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1);
// wgmma.mma_async m64n{n}k8 f32 += tf32 x tf32, A from registers, B by a
// no-swizzle descriptor into this CTA's shared memory; d holds the thread's
// n / 2 accumulators (d[4 j + e]: row 16 w + g + 8 (e / 2), column 8 j + 2q
// + e % 2 of its warpgroup's tile). The warpgroup's 128 threads meet first.
void wgmma_tf32(float* d, int n, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned long long desc);
// A shared-memory window address: the byte's offset in this CTA's dynamic shared memory.
unsigned long long shared_window(const void* p);
unsigned tf32_rn(float x);
unsigned short bf16_rn(float x);
int cluster_rank();
void cluster_arrive();
void cluster_wait();
// The byte of `local` (this CTA's shared memory) in the CTA of `rank`.
void* cluster_peer(void* local, int rank);
// A CTA-local mbarrier (at `bar` in its shared memory): a phase completes when
// its arrivals have come and its transaction bytes are all counted. A copy by
// the bulk copy engine lands at the start of a later scheduler round, at
// random, and then counts its bytes.
void mbar_init(void* bar, unsigned arrivals);
void mbar_arrive_expect_tx(void* bar, unsigned bytes);
void mbar_wait(void* bar, unsigned parity);
void bulk_copy(void* dst, const void* src, unsigned bytes, void* bar);
// cp.async of `bytes` (4, 8 or 16) from src (nullptr: zeros) to this CTA's
// shared memory: half the copies (at random) land at the start of a later
// scheduler round, at random, so that a copy that overwrites what a thread
// still reads shows; the other half only at the wait that covers it, so that
// a read before that wait sees the buffer's old bytes however long ago the
// copy was issued. cp_async_commit closes the thread's open group;
// cp_async_wait(n) lands every copy of its committed groups but the newest
// n (cp.async.wait_all: commit, then n = 0). A thread that exits with a copy
// in flight ends the process.
void cp_async(void* dst, const void* src, unsigned bytes);
void cp_async_commit();
void cp_async_wait(int n);
unsigned char* dynamic_smem();
// A PTX statement the rewrite does not know, reached: ends the process with its text.
[[noreturn]] void unsupported(const char* ptx);

// The emulated kernels, by key name (each generated file registers its own).
using Entry = void (*)(const void* params);
bool register_kernel(const char* key, Entry entry, size_t params_bytes);
// The kernel of `key`, or nullptr; `params_bytes` is its KdaParams' size.
Entry find_kernel(const std::string& key, size_t* params_bytes);

}  // namespace kdajit::emu

#define threadIdx (::kdajit::emu::current()->tid)
#define blockIdx (::kdajit::emu::current()->cta->block)
#define gridDim (::kdajit::emu::grid_dim)

struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline void __syncthreads() { ::kdajit::emu::barrier_and(1); }
inline int __syncthreads_and(int p) { return ::kdajit::emu::barrier_and(p); }
inline float __shfl_xor_sync(unsigned, float v, int off) { return ::kdajit::emu::shfl_xor(v, off); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::kdajit::emu::warp_sync(); }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float log1pf(float x) { return std::log1p(x); }
inline unsigned long long __cvta_generic_to_shared(const void* p) { return ::kdajit::emu::shared_window(p); }
inline int atomicAdd(int* p, int v) {  // one host thread: plain
  const int old = *p;
  *p += v;
  return old;
}
