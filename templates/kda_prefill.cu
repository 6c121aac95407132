// kda_prefill: the chunked prefill of N packed sequences (docs/CONTRACT.md
// §10; the design, with the algebra, is docs/DESIGN.md "Prefill").
//
// Launch: grid (H, KDA_SPLIT * wave), cluster (1, KDA_SPLIT, 1) for
// KDA_SPLIT > 1, block 256 threads, KDA_SMEM_BYTES of dynamic shared memory,
// one CTA per SM. The CTA (cluster rank r) at blockIdx.y / KDA_SPLIT handles
// sequences n, n + wave, ... of head blockIdx.x and owns value rows
// v0 = r * 128 / KDA_SPLIT .. v0 + kVRows - 1 of their state, output and v
// conv channels. It walks a sequence's chunks of kC = 64 tokens in order
// (route rowcta16: kC = 16, one sub-chunk: A and M one block, T its forward
// substitution); per chunk:
//   1. conv + SiLU of its q, k and v channels (rounding point 1), the q/k L2
//      norm scales, the gates' cumulative log decay G (inclusive, per column),
//      beta;
//   2. Qg = q̂ ∘ Γ, Kd = k̂ ∘ Γ_C / Γ (transposed), Γ_C;
//   3. A_ts = Σ_k q̂_tk k̂_sk e^{G_tk - G_sk} (s <= t) and
//      M_ts = β_t Σ_k k̂_tk k̂_sk e^{G_tk - G_sk} (s < t): the diagonal 16 x 16
//      blocks with one exponential per element, the others factored through the
//      boundary B_i before the row's sub-chunk (both factors <= 1) on the
//      tensor cores;
//   4. W = (I + M)^-1 diag(β) (K̂ ∘ Γ) and U = (I + M)^-1 diag(β) V by forward
//      substitution, one column per thread;
//   5. the state pass, each warp on 16 value rows of the state S (rows v,
//      columns k) held in tensor-core accumulators for the whole sequence:
//      Δ^T = U^T - S W^T, O^T = S Qg^T + Δ^T A^T, S <- S diag(Γ_C) + Δ^T Kd
//      (tf32 products, f32 accumulation);
//   6. the gated RMSNorm of the chunk's outputs (sums over the 128 values
//      cross the cluster through distributed shared memory) and the stores.
// After the last chunk the state goes back to the slot (rounding point 2 for
// bf16 state) and the last 3 inputs of every channel to conv taps 0..2.
// Every exponential the kernel forms has a non-positive argument.
//
// The chunk op (KDA_CHUNK 1, CONTRACT §11) runs the same chunks on FLA
// chunk_kda's tensors: step 1 loads q, k and v as given (no conv; the L2 norm
// and beta's sigmoid as chunk_flags say, q scaled by p.scale), sequence n
// starts from dense state n of p.state (or zero) and ends in p.final_state,
// and step 6 stores round_bf16(o) without the norm. Nothing of the conv state,
// the norm weight or the output gate is read.

#ifndef KDA_T
#define KDA_T 64  // hole: the chunk size (the key's t field for the prefill op)
#endif
#ifndef KDA_CHUNK
#define KDA_CHUNK 0  // hole: 1 for the chunk op
#endif
#ifndef KDA_SMEM_BYTES
#define KDA_SMEM_BYTES 232448  // hole: dynamic shared memory of a launch
#endif
#ifndef KDA_TWOPASS
#define KDA_TWOPASS 0  // route twopass (kda_prefill_twopass.cu): the intra-chunk kernel and a workspace
#endif
#ifndef KDA_PIPE
#define KDA_PIPE 0  // route pipe16 (kda_prefill_pipe.cu): its own entry, producer and consumer warps
#endif
#ifndef KDA_WGMMA
#define KDA_WGMMA 0  // hole: 1 where step 5 runs on wgmma (sm_90a): route twopass at P <= 2, rowcta
#endif

// One program for every head count: H is the grid's x dimension (gridDim.x),
// never a hole (kda_primitives.cuh). Likewise for both state dtypes and conv
// layouts: KdaParams::state_bf16 and the conv strides say which (they touch
// only the state's load and store and the conv history, once per sequence).
#define KDA_HEADS_FROM_GRID 1
#define KDA_STORAGE_FROM_PARAMS 1

#include "kda_params.h"
#include "kda_primitives.cuh"

namespace kda {
namespace prefill {

enum : int {
  kC = KDA_T,                    // tokens per chunk
  kSub = 16,                     // sub-chunk: the diagonal blocks of A and M
  kSubs = kC / kSub,
  kVRows = kD / kSplit,          // value rows of this CTA
  kSWarps = kVRows / 16,         // warps of the state pass (16 value rows each)
  kChans = 2 * kD + kVRows,      // conv channels of this CTA: q, k, its v slice
  kConvRounds = (kChans + kThreads - 1) / kThreads,
  kLdW = kD + 8,                 // the allocation's row stride (floats) of W and Qg (stored at cm_at)
  kLdT = kC + 8,                 // row stride (floats) of UT [v][t]; the allocation's of KdT and A (at cm_at)
  kLdOb = kVRows + 8,            // row stride (bf16) of OB [t][v]
  kSolveCols = kD + kVRows,      // columns of the forward substitution: W's, then U's
};
constexpr bool kChunk = KDA_CHUNK != 0;
constexpr bool kTwopass = KDA_TWOPASS != 0;
constexpr bool kWgmma = KDA_WGMMA != 0;
static_assert(kC == 64 || (kC == 16 && !kTwopass && kSplit == 1), "chunks of 64 tokens, or of 16 on route rowcta");
static_assert(kThreads == 256, "the prefill kernel runs 8 warps");
static_assert(static_cast<int>(kSolveCols) <= static_cast<int>(kThreads), "one substitution column per thread");

// Dynamic shared memory, byte offsets. Region 1 holds the chunk's conv outputs
// and G during steps 1-4, then W and U^T (written after every thread has read
// the former) during step 5.
enum : int {
  kOffMq = 0,                                  // bf16 [kC][kD]: m of q, element (t, c) at qk_at(t, c)
  kOffMk = kOffMq + kC * kD * 2,               // bf16 [kC][kD]: m of k, at qk_at
  kOffMv = kOffMk + kC * kD * 2,               // bf16 [kC][kVRows]: m of this CTA's v, at v_at
  kOffG = kOffMv + kC * kVRows * 2,            // f32 [kC][kD]: cumulative log decay, at g_at
  kEndInputs = kOffG + kC * kD * 4,
  kOffW = 0,                                   // f32 [kC][kD] at cm_at (the allocation: kC rows of kLdW)
  kOffUT = kOffW + kC * kLdW * 4,              // f32 [kVRows][kLdT]
  kEndSolved = kOffUT + kVRows * kLdT * 4,
  kRegion1 = kEndInputs > kEndSolved ? kEndInputs : kEndSolved,
  kOffQg = kRegion1,                           // f32 [kC][kD] at cm_at: q̂ ∘ Γ (tf32-rounded)
  kOffKdT = kOffQg + kC * kLdW * 4,            // f32 [kD][kC] at cm_at: (k̂ ∘ Γ_C / Γ)^T (tf32-rounded)
  kOffA = kOffKdT + kD * kLdT * 4,             // f32 [kC][kC] at cm_at: A (tf32-rounded, zero above the diagonal)
  kOffM = kOffA + kC * kLdT * 4,               // f32 [kC][kC]: M (strictly lower)
  kOffOb = kOffM + kC * kC * 4,                // bf16 [kC][kLdOb]: round_bf16(o) of this CTA's values (steps 5, 6)
  kOffT = kOffOb,                              // f32 [kC][kLdT]: (I + M)^-1 (step 4), over OB
  kObT = kC * kLdOb * 2 > kC * kLdT * 4 ? kC * kLdOb * 2 : kC * kLdT * 4,
  kOffRq = kOffOb + kObT,                      // f32 [kC]: q scale 1 / |q| / sqrt(128)
  kOffRk = kOffRq + kC * 4,                    // f32 [kC]: k scale 1 / |k|
  kOffBeta = kOffRk + kC * 4,                  // f32 [kC]: β (0 past the sequence)
  kOffGammaC = kOffBeta + kC * 4,              // f32 [kD]: Γ_C = e^{G of the chunk's last row}
  kOffNormW = kOffGammaC + kD * 4,             // f32 [kD]: norm_weight
  kOffWarpSum = kOffNormW + kD * 4,            // f32 [kSWarps][kC]: each warp's Σ ob² per token
  kOffClusterSum = kOffWarpSum + kSWarps * kC * 4,  // f32 [2][kSplit][kC]: each rank's Σ ob², by chunk parity
  kOffUnitBar = kOffClusterSum + 2 * kSplit * kC * 4,  // u64: the mbarrier of route twopass's unit copies
  kSmemBytes = kOffUnitBar + 8,
};
static_assert(kSmemBytes <= KDA_SMEM_BYTES, "the prefill layout must fit the launch's dynamic shared memory");
static_assert(kOffOb % 16 == 0 && kOffRq % 16 == 0 && kLdOb % 8 == 0, "16-byte aligned regions and OB rows");

// Step 5's B operands (W and Q̂ ∘ Γ [t][k], KdT [k][s], A [t][s]; kCols
// columns, the contraction index) in shared memory and in route twopass's
// unit: wgmma's canonical K-major layout without swizzle, core matrices of 8
// rows x 4 columns as 128 contiguous bytes, the kCols / 4 core matrices of
// a row block in a row, row block after row block. Within each group of 8
// columns, slot i holds column 2i (i < 4) or 2(i - 4) + 1 (i >= 4): an
// accumulator tile's pair of columns 2q, 2q + 1 is an A fragment's q, q + 4,
// so the B fragment of lane (g, q) is slot q and slot q + 4 of row g: one
// 4-byte load from each of two core matrices, 32 lanes on 32 banks.
// The barrier of the threads that run steps 1-4 and of those that run steps 5
// and 6: every thread of the CTA (bar.sync 0) in the kernels where each
// thread does both, and named barriers of 256 threads on route pipe16, whose
// warps 0-7 run steps 1-4 and warps 8-15 steps 5-6 (ProducerSync and
// ConsumerSync, kda_prefill_pipe.cu).
struct CtaSync {
  __device__ static void sync() { __syncthreads(); }
  __device__ static bool sync_and(bool p) { return __syncthreads_and(p) != 0; }
};
template <int kId>
struct NamedSync {
  __device__ static void sync() { asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(static_cast<int>(kThreads)) : "memory"); }
  __device__ static bool sync_and(bool p) {
    int r;
    asm volatile(
        "{\n.reg .pred a, b;\nsetp.ne.b32 a, %1, 0;\nbar.red.and.pred b, %2, %3, a;\nselp.b32 %0, 1, 0, b;\n}\n"
        : "=r"(r)
        : "r"(static_cast<int>(p)), "n"(kId), "n"(static_cast<int>(kThreads))
        : "memory");
    return r != 0;
  }
};

template <int kCols>
__device__ __forceinline__ int cm_at(int r, int c) {
  const int slot = (c & ~7) | ((c & 1) << 2) | ((c & 7) >> 1);
  return ((r >> 3) * (kCols / 4) + (slot >> 2)) * 32 + (r & 7) * 4 + (slot & 3);
}
struct Smem {
  unsigned char* base;
  __device__ unsigned short* mq() const { return reinterpret_cast<unsigned short*>(base + kOffMq); }
  __device__ unsigned short* mk() const { return reinterpret_cast<unsigned short*>(base + kOffMk); }
  __device__ unsigned short* mv() const { return reinterpret_cast<unsigned short*>(base + kOffMv); }
  __device__ float* G() const { return reinterpret_cast<float*>(base + kOffG); }
  __device__ float* W() const { return reinterpret_cast<float*>(base + kOffW); }
  __device__ float* UT() const { return reinterpret_cast<float*>(base + kOffUT); }
  __device__ float* Qg() const { return reinterpret_cast<float*>(base + kOffQg); }
  __device__ float* KdT() const { return reinterpret_cast<float*>(base + kOffKdT); }
  __device__ float* A() const { return reinterpret_cast<float*>(base + kOffA); }
  __device__ float* M() const { return reinterpret_cast<float*>(base + kOffM); }
  __device__ float* T() const { return reinterpret_cast<float*>(base + kOffT); }
  __device__ unsigned short* ob() const { return reinterpret_cast<unsigned short*>(base + kOffOb); }
  __device__ float* rq() const { return reinterpret_cast<float*>(base + kOffRq); }
  __device__ float* rk() const { return reinterpret_cast<float*>(base + kOffRk); }
  __device__ float* beta() const { return reinterpret_cast<float*>(base + kOffBeta); }
  __device__ float* gammaC() const { return reinterpret_cast<float*>(base + kOffGammaC); }
  __device__ float* normw() const { return reinterpret_cast<float*>(base + kOffNormW); }
  __device__ float* warp_sum() const { return reinterpret_cast<float*>(base + kOffWarpSum); }
  __device__ float* cluster_sum() const { return reinterpret_cast<float*>(base + kOffClusterSum); }
  using Sync = CtaSync;
  // Steps 1-4's results stay in shared memory for step 5 (IntraSmem: into the unit).
  static constexpr bool kStagedInputs = false;  // step 1 loads its inputs as it goes (conv_chunk)
  static constexpr bool kPrefetched = false;  // route pipe16's producers: the next chunk's inputs staged during this one
  static constexpr bool kSplitBlock = false;  // route pipe16's producers: step 3's one block over every warp
  static constexpr bool kSolvedInRegion1 = true;  // W and U^T overwrite region 1 (apply_inverse's barrier)
  static constexpr bool kRowTasks = false;  // step 3 a block a warp task (factored_blocks): the state tiles are live
  static constexpr bool kLateOperands = false;  // step 2 by every thread before step 3
  static constexpr bool kGateFtz = false;  // the bounded gate's sigmoid as sigmoid(): sigmoid_ftz spilled (chunk rowcta 44 bytes)
  static constexpr bool kGateRows = false;  // step 6 reads the output gate from global memory
  __device__ void put_qg(int t, int k, float x) const { Qg()[cm_at<kD>(t, k)] = x; }
  __device__ void put_kdt4(int k, int t0, float4 x) const {
    float* d = KdT();
    d[cm_at<kC>(k, t0)] = x.x;
    d[cm_at<kC>(k, t0 + 1)] = x.y;
    d[cm_at<kC>(k, t0 + 2)] = x.z;
    d[cm_at<kC>(k, t0 + 3)] = x.w;
  }
  __device__ void put_gamma_c(int k, float x) const { gammaC()[k] = x; }
  __device__ void put_a(int t, int s, float x) const { A()[cm_at<kC>(t, s)] = x; }
  __device__ void put_w(int t, int c, float x) const { W()[cm_at<kD>(t, c)] = x; }
  __device__ void put_ut(int v, int t, float x) const { UT()[v * kLdT + t] = x; }
  __device__ int t_at(int r, int c) const { return r * kLdT + c; }  // (I + M)^-1 element (r, c)
  static constexpr int kLdUT = kLdT;  // U^T's row stride (floats)
  __device__ unsigned long long* unit_bar() const { return reinterpret_cast<unsigned long long*>(base + kOffUnitBar); }
};

// ---- tensor cores: mma.sync m16n8k8, tf32 operands, f32 accumulators ----
// Fragments (lane = 4 g + q): A (16 x 8) a0 (g, q), a1 (g+8, q), a2 (g, q+4),
// a3 (g+8, q+4); B (8 x 8) b0 (q, g), b1 (q+4, g); C (16 x 8) c0 (g, 2q),
// c1 (g, 2q+1), c2 (g+8, 2q), c3 (g+8, 2q+1). Every product below contracts
// over an index whose order does not matter, so logical k = q and q + 4 stand
// for physical columns 2q and 2q + 1 of each group of 8: an accumulator tile
// (c0..c3) is then an A fragment as it is (a0 = c0, a1 = c2, a2 = c1, a3 = c3),
// and step 5's B operands store their contraction index in that order (cm_at).
// Rounded to nearest even: one instruction (F2FP) on sm_90 and later, where
// cvt.rna (ties away from zero) takes three.
__device__ __forceinline__ unsigned to_tf32(float x) {
  unsigned u;
  asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
  return u;
}
__device__ __forceinline__ float tf32_round(float x) { return __uint_as_float(to_tf32(x)); }

__device__ __forceinline__ void mma_tf32(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// The B fragment of rows 8 nt .. and columns 8 kk .. of a cm_at array of kCols columns.
template <int kCols>
__device__ __forceinline__ void mma_b_cm(const float* m, int nt, int kk, int g, int q, unsigned& b0,
                                         unsigned& b1) {
  const float* cm = m + (nt * (kCols / 4) + 2 * kk) * 32 + 4 * g + q;
  b0 = __float_as_uint(cm[0]);
  b1 = __float_as_uint(cm[32]);
}

// ---- the prefill kernels' exponentials ----
// e^x as ex2.approx.ftz of x log2(e): __expf's approximation without the
// scaling around it that keeps a result below 2^-126 as a denormal (here it
// is zero). Every exponential the prefill kernels form is a decay factor
// (<= 1 or bounded, DESIGN "Prefill") or a sigmoid term, where such a result
// changes no rounded output: at most 2^-126 of a sum. The sigmoid divides by
// the approximate reciprocal, as kda_primitives' sigmoid does.
__device__ __forceinline__ float exp_ftz(float x) {
  const float t = x * 1.4426950408889634f;
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(t));
  return y;
}
__device__ __forceinline__ float rcp_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float sigmoid_ftz(float x) { return rcp_ftz(1.0f + exp_ftz(-x)); }

// Log decay gv (§2 step 4) of the gate logit g = raw_gate + dt_bias: <= 0.
template <bool kFtz = false>
__device__ __forceinline__ float gate_log(float g, float A, float lower_bound) {
#if KDA_GATE_SOFTPLUS
  (void)lower_bound;
  return -A * softplus(g);
#else
  return lower_bound * (kFtz ? sigmoid_ftz(A * g) : sigmoid(A * g));
#endif
}

// Element i of a bf16 tensor, or of an f32 one when `f32` (the chunk op's g and beta).
__device__ __forceinline__ float load_bf16_or_f32(const void* base, long long i, bool f32) {
  return f32 ? static_cast<const float*>(base)[i] : bf16_to_f32(static_cast<const unsigned short*>(base)[i]);
}

// Head channel (j * 128 + d) of local conv channel c of a CTA whose v slice starts at v0.
__device__ __forceinline__ int head_channel(int c, int v0) { return c < 2 * kD ? c : c + v0; }

// Where element (t, c) of the chunk's row arrays lies in shared memory: the
// bf16 q, k (qk_at, rows of kD) and v (v_at, rows of kVRows) conv outputs
// and G (g_at, f32 rows of kD). Their rows are whole multiples of 32 banks,
// and the tensor-core fragments read one column group of 8 rows (t & 7),
// apply_inverse 4 rows (2q or 2q + 1): each row's columns are XORed by a
// multiple of 8, which keeps every aligned group of 8 elements (the widest
// access, 16 bytes of bf16) together and sends those rows to distinct banks.
// bf16: XOR 8 (t & 7), 8 four-bank groups (fewer for a v row narrower than
// 64). f32: XOR 8 b(t) with b = (t ^ t / 4) & 3, 4 eight-bank groups, each
// taken by 2 of any 8 consecutive rows and by 1 of rows 0, 2, 4, 6 (or 1,
// 3, 5, 7) mod 8.
template <int kWidth>
__device__ __forceinline__ int m_at(int t, int c) {
  return t * kWidth + (c ^ ((t & (kWidth >= 64 ? 7 : kWidth / 8 - 1)) << 3));
}
__device__ __forceinline__ int qk_at(int t, int c) { return m_at<kD>(t, c); }
__device__ __forceinline__ int v_at(int t, int c) { return m_at<kVRows>(t, c); }
__device__ __forceinline__ int g_at(int t, int k) { return t * kD + (k ^ (((t ^ (t >> 2)) & 3) << 3)); }

// conv_state element of (channel c, tap t) in a slot: SD strides (1, 3*H*128), DS (K, 1).
__device__ __forceinline__ long long conv_offset(const KdaParams& p, int c, int t) {
  return c * p.conv_chan_stride + t * p.conv_tap_stride;
}

// Step 1: conv + SiLU of the CTA's channels over chunk rows row0 .. row0 +
// L - 1 (rows past L give zeros). The work is (group of kCh adjacent
// channels, segment of kSeg tokens) tasks spread evenly over the threads; a
// task reads its three history inputs itself (earlier rows of the sequence,
// or the slot's taps before its first token, or zeros without an initial
// state), so no window is carried between chunks, and it issues all its
// loads before the first use. With kCh = 2 a load, a conversion and a shared
// store serve both channels; conv_chunk takes it when x allows 4-byte loads
// of a channel pair and a row stride below 2^24 elements (32-bit offsets),
// which every contiguous x does, and one channel per task otherwise.
enum : int { kSeg = 16 };
template <int kCh> struct ConvWord { using Type = unsigned short; };  // kCh bf16 inputs of one row
template <> struct ConvWord<2> { using Type = unsigned; };
template <int kCh, class Stride, class S>
__device__ __forceinline__ void conv_tasks(const KdaParams& p, const S& sm, int h, int v0, long long q0, long long c0,
                                           int L, bool initial, long long cbase, Stride stride) {
  enum : int { kGroups = kChans / kCh, kTasks = kGroups * (kC / kSeg) };
  static_assert(kChans % kCh == 0 && kD % kCh == 0 && kVRows % kCh == 0, "a channel group lies in one of q, k, v");
  using Word = typename ConvWord<kCh>::Type;
  for (int task = threadIdx.x; task < kTasks; task += kThreads) {
    const int c = task % kGroups * kCh, ts = task / kGroups * kSeg;
    const int hc = head_channel(c, v0);
    const int j = hc / kD, d = hc % kD;
    const int col = j * grid_hidden() + h * kD + d;  // first channel of x and conv_state
    const unsigned short* xseg = p.x + (q0 + c0) * p.x_row_stride + col;  // the chunk's first row
    float w[kW][kCh];
#pragma unroll
    for (int i = 0; i < kW; ++i)
#pragma unroll
      for (int e = 0; e < kCh; ++e) w[i][e] = p.conv_weight[(j * kW + i) * grid_hidden() + h * kD + d + e];
    // Inputs ts - 3 .. ts + kSeg - 1 of the chunk; a row past L reads row L - 1
    // (a segment past the chunk's end writes only zeros), a row before the
    // sequence the slot's taps.
    Word xw[kSeg + 3];
#pragma unroll
    for (int i = 0; i < kSeg + 3; ++i) {
      const int t = ts - 3 + i < L - 1 ? ts - 3 + i : L - 1;
      if (i < 3 && c0 + t < 0) {
        Word v = 0;
        if (initial)
#pragma unroll
          for (int e = 0; e < kCh; ++e)
            v |= static_cast<Word>(p.conv_state[cbase + conv_offset(p, col + e, static_cast<int>(c0 + t + 3))]) << 16 * e;
        xw[i] = v;
      } else {
        xw[i] = *reinterpret_cast<const Word*>(xseg + t * stride);
      }
    }
    unsigned short* dst = j == 0 ? sm.mq() : j == 1 ? sm.mk() : sm.mv();
    float x[kSeg + 3][kCh];
#pragma unroll
    for (int i = 0; i < kSeg + 3; ++i)
#pragma unroll
      for (int e = 0; e < kCh; ++e) x[i][e] = bf16_to_f32(static_cast<unsigned short>(xw[i] >> 16 * e));
#pragma unroll
    for (int i = 0; i < kSeg; ++i) {
      float y[kCh];
#pragma unroll
      for (int e = 0; e < kCh; ++e) {
        float a = w[0][e] * x[i][e];
        a = fmaf(w[1][e], x[i + 1][e], a);
        a = fmaf(w[2][e], x[i + 2][e], a);
        a = fmaf(w[3][e], x[i + 3][e], a);
        y[e] = a * sigmoid_ftz(a);
      }
      const bool in = ts + i < L;
      const int at = j == 2 ? v_at(ts + i, d - v0) : qk_at(ts + i, d);
      if constexpr (kCh == 2) {
        *reinterpret_cast<unsigned*>(dst + at) = in ? pack_bf16x2(y[0], y[1]) : 0u;
      } else {
        dst[at] = in ? f32_to_bf16(y[0]) : static_cast<unsigned short>(0);
      }
    }
  }
}
template <class S>
__device__ __forceinline__ void conv_chunk(const KdaParams& p, const S& sm, int h, int v0, long long q0,
                                           long long c0, int L, bool initial, long long cbase) {
  const bool pairs = (reinterpret_cast<unsigned long long>(p.x) & 3) == 0 && (p.x_row_stride & 1) == 0 &&
                     p.x_row_stride < (1 << 24);
  if (pairs) conv_tasks<2>(p, sm, h, v0, q0, c0, L, initial, cbase, static_cast<int>(p.x_row_stride));
  else conv_tasks<1>(p, sm, h, v0, q0, c0, L, initial, cbase, p.x_row_stride);
}

// After a sequence's last chunk: the last 3 inputs of each channel to taps
// 0..2 (for a sequence shorter than 3, the older ones from its history). A
// split cluster computes every q and k channel on every rank; rank r writes
// the r-th share of them. Every read of the taps (the first chunk) is behind
// the chunks' barriers (cluster barriers for a split).
__device__ __forceinline__ void conv_state_out(const KdaParams& p, int h, int v0, int rank, long long q0, long long len,
                                               bool initial, long long cbase) {
  for (int c = threadIdx.x; c < kChans; c += kThreads) {
    if (c < 2 * kD && c / (2 * kD / kSplit) != rank) continue;
    const int hc = head_channel(c, v0);
    const int col = hc / kD * grid_hidden() + h * kD + hc % kD;
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const long long tok = len - 3 + i;
      // tap i takes token tok; before the first token, tap tok + 3 >= i of the history (read before it is written)
      const unsigned short v = tok >= 0 ? p.x[(q0 + tok) * p.x_row_stride + col]
                               : initial ? p.conv_state[cbase + conv_offset(p, col, static_cast<int>(tok + 3))]
                                         : static_cast<unsigned short>(0);
      p.conv_state[cbase + conv_offset(p, col, i)] = v;
    }
  }
}

// Whether q, k and v allow 16-byte copies of their rows: the pointers
// 16-byte aligned, the row strides whole 16 bytes.
__device__ __forceinline__ bool chunk_rows_copyable(const KdaParams& p) {
  return ((reinterpret_cast<unsigned long long>(p.q) | reinterpret_cast<unsigned long long>(p.k) |
           reinterpret_cast<unsigned long long>(p.v)) & 15) == 0 &&
         ((p.q_row_stride | p.k_row_stride | p.v_row_stride) & 7) == 0;
}
__device__ __forceinline__ void cp_async_16_or_zero(void* dst, const void* src, bool copy) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(copy ? 16 : 0)
               : "memory");
}
// The first index of a thread in the loops that issue a chunk's copies:
// route pipe16's producers read the thread index afresh (fresh_tid), so that
// the copies' addresses are formed where the copies are issued, once a
// chunk, instead of being hoisted out of the chunk loop (they spilled).
template <class S>
__device__ __forceinline__ int stage_tid() {
  if constexpr (S::kPrefetched) return fresh_tid();
  else return threadIdx.x;
}
// Route pipe16's producers stage the next chunk's inputs while they compute
// this one: its copies are a cp.async group of their own, committed after the
// group of this chunk's, and this chunk waits for every group but the newest.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_but_newest() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
// Route pipe16: token t's raw β by one 4-byte cp.async into word t of a
// stage (the aligned word that holds a bf16 β, which lies in the tensor when
// its pointer is 4-byte aligned, beta_stageable), read back by staged_beta.
__device__ __forceinline__ bool beta_stageable(const KdaParams& p) {
  return (reinterpret_cast<unsigned long long>(p.raw_beta) & 3) == 0;
}
__device__ __forceinline__ void stage_beta(const KdaParams& p, unsigned* words, int h, long long row0, int L,
                                           bool b_f32) {
  if (static_cast<int>(threadIdx.x) < L) {
    const long long at = (row0 + threadIdx.x) * p.beta_row_stride + h;
    const void* src = b_f32 ? static_cast<const void*>(reinterpret_cast<const float*>(p.raw_beta) + at)
                            : static_cast<const void*>(p.raw_beta + (at & ~1ll));
    unsigned* dst = words + threadIdx.x;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
  }
}
__device__ __forceinline__ float staged_beta(const KdaParams& p, const unsigned* words, int h, long long row0, int t,
                                             bool b_f32) {
  const unsigned w = words[t];
  if (b_f32) return __uint_as_float(w);
  return ((row0 + t) * p.beta_row_stride + h) & 1 ? bf16hi_to_f32(w) : bf16lo_to_f32(w);
}
// Issues the 16-byte copies of q, k and this CTA's v slice of chunk rows
// row0 .. row0 + L - 1 into the buffers the conv fills (rows past L zero);
// the caller waits for them (cp_async_wait_all) before the barrier that
// precedes their first reader.
template <class S>
__device__ __forceinline__ void copy_chunk_rows(const KdaParams& p, const S& sm, int h, int v0, long long row0, int L) {
  enum : int { kQK = kD / 8, kRow = 2 * kQK + kVRows / 8 };  // 16-byte pieces of a row
  for (int i = stage_tid<S>(); i < kC * kRow; i += kThreads) {
    const int t = i / kRow, r = i % kRow;
    const long long row = row0 + (t < L ? t : 0);
    const unsigned short* src;
    unsigned short* dst;
    if (r < kQK) {
      src = p.q + row * p.q_row_stride + h * kD + 8 * r;
      dst = sm.mq() + qk_at(t, 8 * r);
    } else if (r < 2 * kQK) {
      src = p.k + row * p.k_row_stride + h * kD + 8 * (r - kQK);
      dst = sm.mk() + qk_at(t, 8 * (r - kQK));
    } else {
      src = p.v + row * p.v_row_stride + h * kD + v0 + 8 * (r - 2 * kQK);
      dst = sm.mv() + v_at(t, 8 * (r - 2 * kQK));
    }
    cp_async_16_or_zero(dst, src, t < L);
  }
}

// Step 1 of the chunk op: q, k and this CTA's v slice of chunk rows row0 ..
// row0 + L - 1 into the buffers the conv fills (rows past L give zeros): in
// the fused routes by copy_chunk_rows when the rows allow it (one wait for
// the chunk), else element by element: element i of the chunk is (token i /
// kChans, channel i % kChans), a warp reads consecutive channels of one row,
// and every load of a batch is issued before its stores. Route twopass's
// kernels take the element path whenever they get here (its intra-chunk
// kernel stages aligned rows itself, load_gates_staged; its state pass
// computes a chunk only for a query_start_loc that is not non-decreasing),
// where the copies' code cost its state pass 8 more bytes of spills.
template <class S>
__device__ __forceinline__ void load_chunk(const KdaParams& p, const S& sm, int h, int v0, long long row0, int L) {
  if constexpr (!kTwopass) {
    if (chunk_rows_copyable(p)) {
      copy_chunk_rows(p, sm, h, v0, row0, L);
      cp_async_wait_all();
      return;
    }
  }
  enum : int { kPer = kC * kChans / kThreads, kBatch = 8 };
  static_assert(kC * kChans % kThreads == 0, "whole rounds of the chunk's elements");
  for (int jb = 0; jb < kPer; jb += kBatch) {
    unsigned short b[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = threadIdx.x + (jb + j) * kThreads, t = i / kChans, c = i % kChans;
      const long long row = row0 + (t < L ? t : 0);
      if (jb + j >= kPer) break;
      b[j] = c < kD       ? p.q[row * p.q_row_stride + h * kD + c]
             : c < 2 * kD ? p.k[row * p.k_row_stride + h * kD + c - kD]
                          : p.v[row * p.v_row_stride + h * kD + v0 + c - 2 * kD];
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = threadIdx.x + (jb + j) * kThreads, t = i / kChans, c = i % kChans;
      if (jb + j >= kPer) break;
      const unsigned short x = t < L ? b[j] : static_cast<unsigned short>(0);
      if (c < kD) sm.mq()[qk_at(t, c)] = x;
      else if (c < 2 * kD) sm.mk()[qk_at(t, c - kD)] = x;
      else sm.mv()[v_at(t, c - 2 * kD)] = x;
    }
  }
}

// Step 1: the q/k norm scales, per token: 1 / |q| / sqrt(128) and 1 / |k|
// for the prefill op; for the chunk op p.scale / |q| and 1 / |k| with the L2
// norm, else p.scale and 1.
template <class S>
__device__ __forceinline__ void norm_scales(const KdaParams& p, const S& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (kChunk && !(p.chunk_flags & KDA_CHUNK_QK_L2NORM)) {
    if (threadIdx.x < kC) {
      sm.rq()[threadIdx.x] = p.scale;
      sm.rk()[threadIdx.x] = 1.f;
    }
    return;
  }
  const float qscale = kChunk ? p.scale : 0.08838834764831845f;  // 1 / sqrt(128)
  if constexpr (S::kStagedInputs) {
    // The intra-chunk kernel and pipe16's producers (no state in registers):
    // two tokens a warp at a time, a half-warp each, 8 columns a lane (one
    // 16-byte load of q and of k), Σ q² and Σ k² summed over the half-warp
    // together (butterfly_sum: lanes 0-7 of the half end with Σ q², 8-15
    // with Σ k²). In the fused kernels, beside the state's registers, the
    // wider loads spilled (the chunk op's twopass and split4, 24-60 bytes).
    const int half = lane >> 4, c = 8 * (lane & 15);
    for (int t = 2 * warp + half; t < kC; t += 2 * kWarps) {
      const U4 qw = *reinterpret_cast<const U4*>(sm.mq() + qk_at(t, c));
      const U4 kw = *reinterpret_cast<const U4*>(sm.mk() + qk_at(t, c));
      const unsigned qs[4] = {qw.x, qw.y, qw.z, qw.w}, ks[4] = {kw.x, kw.y, kw.z, kw.w};
      float v[2] = {0.f, 0.f};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float q0 = bf16lo_to_f32(qs[i]), q1 = bf16hi_to_f32(qs[i]);
        const float k0 = bf16lo_to_f32(ks[i]), k1 = bf16hi_to_f32(ks[i]);
        v[0] = fmaf(q1, q1, fmaf(q0, q0, v[0]));
        v[1] = fmaf(k1, k1, fmaf(k0, k0, v[1]));
      }
      butterfly_sum<2, 8>(v, lane);
      if ((lane & 7) == 0) {
        if (lane & 8) sm.rk()[t] = rsqrtf(v[0] + 1e-6f);
        else sm.rq()[t] = rsqrtf(v[0] + 1e-6f) * qscale;
      }
    }
  } else {
    for (int t = warp; t < kC; t += kWarps) {
      const U2 qw = *reinterpret_cast<const U2*>(sm.mq() + qk_at(t, 4 * lane));
      const U2 kw = *reinterpret_cast<const U2*>(sm.mk() + qk_at(t, 4 * lane));
      const float q0 = bf16lo_to_f32(qw.x), q1 = bf16hi_to_f32(qw.x), q2 = bf16lo_to_f32(qw.y), q3 = bf16hi_to_f32(qw.y);
      const float k0 = bf16lo_to_f32(kw.x), k1 = bf16hi_to_f32(kw.x), k2 = bf16lo_to_f32(kw.y), k3 = bf16hi_to_f32(kw.y);
      const float sq = warp_sum(q0 * q0 + q1 * q1 + q2 * q2 + q3 * q3);
      const float sk = warp_sum(k0 * k0 + k1 * k1 + k2 * k2 + k3 * k3);
      if (lane == 0) {
        sm.rq()[t] = rsqrtf(sq + 1e-6f) * qscale;
        sm.rk()[t] = rsqrtf(sk + 1e-6f);
      }
    }
  }
}

// The gate's per-thread constants of head h: A = e^{A_log[h]} and the dt_bias
// of the thread's column (gates_chunk's k).
struct GateConstants {
  float A, dtb;
};
__device__ __forceinline__ GateConstants gate_constants(const KdaParams& p, int h) {
  return {__expf(p.A_log[h]), p.dt_bias != nullptr ? p.dt_bias[h * kD + (threadIdx.x & (kD - 1))] : 0.f};
}

// Step 1: G (inclusive cumulative log decay per column) and β; tokens past L
// have gv = 0 and β = 0, so they change nothing. Thread (k, half) sums its
// half of the chunk, then the second half adds the first half's total
// (conv_gates_staged sums in the same order). kStaged (the chunk op's
// load_gates_staged): the raw gates are rows of kD in sm.stage() (bf16, or f32
// with KDA_CHUNK_G_F32) and thread t < kC brings token t's raw β in raw_b.
template <bool kStaged = false, class S>
__device__ __forceinline__ void gates_chunk(const KdaParams& p, const S& sm, int h, long long row0, int L,
                                            const GateConstants& gate, float raw_b = 0.f) {
  const int k = threadIdx.x & (kD - 1), half = threadIdx.x / kD;
  float* G = sm.G();
  const bool g_f32 = kChunk && (p.chunk_flags & KDA_CHUNK_G_F32);
  float acc = 0.f;
  float gb[kC / 2];  // every load of the thread's half column first
#pragma unroll
  for (int i = 0; i < kC / 2; ++i) {
    const int t = half * (kC / 2) + i;
    if constexpr (kStaged) {
      gb[i] = g_f32 ? reinterpret_cast<const float*>(sm.stage())[t * kD + k] : bf16_to_f32(sm.stage()[t * kD + k]);
    } else {
      gb[i] = load_bf16_or_f32(p.raw_gate, (row0 + (t < L ? t : 0)) * p.gate_row_stride + h * kD + k, g_f32);
    }
  }
#pragma unroll
  for (int i = 0; i < kC / 2; ++i) {
    const int t = half * (kC / 2) + i;
    if (t < L) acc += gate_log<S::kGateFtz>(gb[i] + gate.dtb, gate.A, p.lower_bound);
    G[g_at(t, k)] = acc;
  }
  if (threadIdx.x < kC) {
    const int t = threadIdx.x;
    const bool b_f32 = kChunk && (p.chunk_flags & KDA_CHUNK_BETA_F32);
    const bool b_sigmoid = !kChunk || (p.chunk_flags & KDA_CHUNK_BETA_SIGMOID);
    float b = 0.f;
    if (t < L) {
      b = kStaged ? raw_b : load_bf16_or_f32(p.raw_beta, (row0 + t) * p.beta_row_stride + h, b_f32);
      if (b_sigmoid) b = sigmoid(b);
    }
    sm.beta()[t] = b;
  }
  S::Sync::sync();
  if (half == 1) {
    const float base = G[g_at(kC / 2 - 1, k)];
    for (int i = 0; i < kC / 2; ++i) G[g_at(kC / 2 + i, k)] += base;
  }
}

// Step 1 with the chunk's inputs staged (route twopass's intra-chunk kernel,
// the prefill op, when x and the raw gate allow 16-byte copies: the pointers
// 16-byte aligned, the row strides multiples of 8 elements). Every input of
// the chunk is copied into shared memory by cp.async in one batch, so the
// chunk waits on global memory once instead of once per round of conv tasks
// and again for the gates: x's q, k and v rows into the conv's own output
// buffers (at qk_at / v_at, which keep each 16-byte group of 8 channels
// whole; rows past L zero), the three rows before the chunk into a history
// buffer (x's rows, or the slot's taps for a sequence's first chunk, or
// zeros without an initial state), the raw gate rows beside it; the history
// and the gates lie over M and T, which step 1 does not use. Then warps 0-5
// run the conv in place, a channel pair a thread over the chunk's rows in
// order, while warps 6-7 sum G, a column pair a thread (about as many
// exponentials and products a thread as a conv thread's), and β. The
// arithmetic and the order of the sums are conv_tasks<2>'s and
// gates_chunk's, so the results are the same bits.
enum : int { kStageHistOff = kC * kD * 2 };  // bytes into the stage: the history after the raw gates
__device__ __forceinline__ bool inputs_stageable(const KdaParams& p) {
  return ((reinterpret_cast<unsigned long long>(p.x) | reinterpret_cast<unsigned long long>(p.raw_gate)) & 15) == 0 &&
         (p.x_row_stride & 7) == 0 && (p.gate_row_stride & 7) == 0 && p.x_row_stride < (1 << 24);
}
template <class S>
__device__ __forceinline__ void stage_conv_inputs(const KdaParams& p, const S& sm, int h, long long q0, long long c0,
                                                  int L, bool initial, long long cbase) {
  enum : int { kPieces = kD / 8, kRowPieces = 3 * kPieces };
  const long long row0 = q0 + c0;
  const int stride = static_cast<int>(p.x_row_stride);
  unsigned short* gstage = sm.stage();
  unsigned short* hist = sm.stage() + kStageHistOff / 2;  // bf16 [3][kChans]: rows -3 .. -1 of the chunk
  // By rows: item i is channels c .. c + 7 of row t of q, k, v and the raw
  // gate (four copies from two row addresses formed once).
  for (int i = stage_tid<S>(); i < kC * kPieces; i += kThreads) {
    const int t = i / kPieces, c = 8 * (i % kPieces), at = qk_at(t, c);
    const long long row = row0 + (t < L ? t : 0);
    const unsigned short* src = p.x + row * stride + h * kD + c;
    cp_async_16_or_zero(sm.mq() + at, src, t < L);
    cp_async_16_or_zero(sm.mk() + at, src + grid_hidden(), t < L);
    cp_async_16_or_zero(sm.mv() + at, src + 2 * grid_hidden(), t < L);
    cp_async_16_or_zero(gstage + t * kD + c, static_cast<const unsigned short*>(p.raw_gate) + row * p.gate_row_stride + h * kD + c,
                        t < L);
  }
  if (c0 > 0) {
    for (int i = stage_tid<S>(); i < 3 * kRowPieces; i += kThreads) {
      const int r = i / kRowPieces, j = i % kRowPieces / kPieces, c = 8 * (i % kPieces);
      cp_async_16_or_zero(hist + r * kChans + j * kD + c,
                          p.x + (row0 - 3 + r) * stride + j * grid_hidden() + h * kD + c, true);
    }
  } else {
    for (int i = stage_tid<S>(); i < 3 * kChans; i += kThreads) {
      const int r = i / kChans, c = i % kChans;
      const int col = c / kD * grid_hidden() + h * kD + c % kD;
      hist[r * kChans + c] = initial ? p.conv_state[cbase + conv_offset(p, col, r)] : static_cast<unsigned short>(0);
    }
  }
  if constexpr (S::kPrefetched) {
    if (beta_stageable(p)) stage_beta(p, sm.beta_words(), h, row0, L, false);
  }
}
template <class S>
__device__ __forceinline__ void conv_gates_from_stage(const KdaParams& p, const S& sm, int h, long long row0, int L,
                                                      const GateConstants& gate) {
  enum : int { kConvThreads = kChans / 2 };
  static_assert(kC == 16 || (S::kStagedInputs && kVRows == kD && kThreads - kConvThreads == kC && 2 * kC == kD),
                "a channel pair a conv thread; a column pair and a token a gate thread (route twopass: chunks of 64)");
  unsigned short* gstage = sm.stage();
  const unsigned short* hist = sm.stage() + kStageHistOff / 2;
  // While the copies land: thread c < kConvThreads loads the conv weights of
  // channels 2c, 2c + 1; thread kConvThreads + u the dt_bias of columns 2u,
  // 2u + 1 and the raw β of token u.
  const int c = 2 * threadIdx.x, u = threadIdx.x - kConvThreads;
  float w[kW][2];
  float dtb[2] = {0.f, 0.f}, beta = 0.f;
  if (threadIdx.x < kConvThreads) {
#pragma unroll
    for (int i = 0; i < kW; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) w[i][e] = p.conv_weight[(c / kD * kW + i) * grid_hidden() + h * kD + c % kD + e];
  } else {
    if (p.dt_bias != nullptr) {
      dtb[0] = p.dt_bias[h * kD + 2 * u];
      dtb[1] = p.dt_bias[h * kD + 2 * u + 1];
    }
    if (u < L) {
      if constexpr (S::kPrefetched) {
        beta = beta_stageable(p) ? 0.f : load_bf16_or_f32(p.raw_beta, (row0 + u) * p.beta_row_stride + h, false);
      } else {
        beta = load_bf16_or_f32(p.raw_beta, (row0 + u) * p.beta_row_stride + h, false);
      }
    }
  }
  if constexpr (S::kPrefetched) cp_async_wait_but_newest();  // the next chunk's copies are the newest group
  else cp_async_wait_all();
  S::Sync::sync();
  if (threadIdx.x < kConvThreads) {
    // Channels 2c, 2c + 1 over the whole chunk in place, each row read before
    // it is overwritten (no other thread touches the pair).
    const int j = c / kD, d = c % kD;
    unsigned short* m = j == 0 ? sm.mq() : j == 1 ? sm.mk() : sm.mv();
    float x[3][2];  // the three inputs before the next row
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const unsigned xw = *reinterpret_cast<const unsigned*>(hist + i * kChans + c);
      x[i][0] = bf16lo_to_f32(xw);
      x[i][1] = bf16hi_to_f32(xw);
    }
#pragma unroll 1
    for (int t0 = 0; t0 < kC; t0 += 8) {
      unsigned xw[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) xw[i] = *reinterpret_cast<const unsigned*>(m + qk_at(t0 + i, d));
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float xn[2] = {bf16lo_to_f32(xw[i]), bf16hi_to_f32(xw[i])};
        float y[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float a = w[0][e] * x[0][e];
          a = fmaf(w[1][e], x[1][e], a);
          a = fmaf(w[2][e], x[2][e], a);
          a = fmaf(w[3][e], xn[e], a);
          y[e] = a * sigmoid_ftz(a);
          x[0][e] = x[1][e];
          x[1][e] = x[2][e];
          x[2][e] = xn[e];
        }
        *reinterpret_cast<unsigned*>(m + qk_at(t0 + i, d)) = t0 + i < L ? pack_bf16x2(y[0], y[1]) : 0u;
      }
    }
  } else {
    // G of columns 2u, 2u + 1 over the chunk, summed as gates_chunk sums it
    // (tokens 0 .. 31 in order; tokens 32 .. 63 in order from zero, then plus
    // the sum at token 31), so the same bits; and β of token u.
    float* G = sm.G();
    float acc[2] = {0.f, 0.f}, base[2] = {0.f, 0.f};
#pragma unroll 8
    for (int t = 0; t < kC; ++t) {
      if (t == kC / 2) {
        base[0] = acc[0], base[1] = acc[1];
        acc[0] = acc[1] = 0.f;
      }
      const unsigned gw = *reinterpret_cast<const unsigned*>(gstage + t * kD + 2 * u);
      if (t < L) {
        acc[0] += gate_log<S::kGateFtz>(bf16lo_to_f32(gw) + dtb[0], gate.A, p.lower_bound);
        acc[1] += gate_log<S::kGateFtz>(bf16hi_to_f32(gw) + dtb[1], gate.A, p.lower_bound);
      }
      *reinterpret_cast<float2*>(G + g_at(t, 2 * u)) =
          t < kC / 2 ? make_float2(acc[0], acc[1]) : make_float2(acc[0] + base[0], acc[1] + base[1]);
    }
    if constexpr (S::kPrefetched) {
      // Staged by thread u (stage_beta), visible here after the barrier.
      if (u < L && beta_stageable(p)) beta = staged_beta(p, sm.beta_words(), h, row0, u, false);
    }
    // β has kC entries; at C = 16 (route pipe16) 64 gate threads run this.
    if (u < kC) sm.beta()[u] = u < L ? sigmoid(beta) : 0.f;
  }
}
template <class S>
__device__ __forceinline__ void conv_gates_staged(const KdaParams& p, const S& sm, int h, long long q0, long long c0,
                                                  int L, bool initial, long long cbase, const GateConstants& gate) {
  stage_conv_inputs(p, sm, h, q0, c0, L, initial, cbase);
  conv_gates_from_stage(p, sm, h, q0 + c0, L, gate);
}

// Step 1 of the chunk op with its inputs staged (route twopass's intra-chunk
// kernel, when q, k, v and g allow 16-byte copies: the pointers 16-byte
// aligned, the row strides whole 16-byte groups). Every input of the chunk
// is copied into shared memory by cp.async in one batch, so the chunk waits
// on global memory once instead of once per batch of load_chunk's 2-byte
// loads and again for the gates: q, k and v rows into the buffers the
// fused kernels' load_chunk fills (rows past L zero), the raw gate rows over
// M and T (bf16 16 KB, or f32 32 KB: all of both), each token's raw β into
// a register of thread t. Then gates_chunk from the staged rows: the same
// arithmetic in the same order as from global memory, so the same bits.
__device__ __forceinline__ bool chunk_inputs_stageable(const KdaParams& p) {
  const bool g_f32 = p.chunk_flags & KDA_CHUNK_G_F32;
  return chunk_rows_copyable(p) && (reinterpret_cast<unsigned long long>(p.raw_gate) & 15) == 0 &&
         (p.gate_row_stride & (g_f32 ? 3 : 7)) == 0;
}
template <class S>
__device__ __forceinline__ void stage_chunk_inputs(const KdaParams& p, const S& sm, int h, long long row0, int L) {
  static_assert(S::kStagedInputs && kVRows == kD, "the whole head's v rows");
  enum : int { kPieces = kD / 8 };
  const bool g_f32 = p.chunk_flags & KDA_CHUNK_G_F32;
  // By rows: item i is columns c .. c + 7 of row t of q, k, v and the raw
  // gate (one 16-byte piece of each, two of an f32 gate).
  for (int i = stage_tid<S>(); i < kC * kPieces; i += kThreads) {
    const int t = i / kPieces, c = 8 * (i % kPieces), at = qk_at(t, c);
    const long long row = row0 + (t < L ? t : 0);
    cp_async_16_or_zero(sm.mq() + at, p.q + row * p.q_row_stride + h * kD + c, t < L);
    cp_async_16_or_zero(sm.mk() + at, p.k + row * p.k_row_stride + h * kD + c, t < L);
    cp_async_16_or_zero(sm.mv() + at, p.v + row * p.v_row_stride + h * kD + c, t < L);
    const long long g = row * p.gate_row_stride + h * kD + c;
    if (g_f32) {
      float* dst = reinterpret_cast<float*>(sm.stage()) + t * kD + c;
      const float* src = reinterpret_cast<const float*>(p.raw_gate) + g;
      cp_async_16_or_zero(dst, src, t < L);
      cp_async_16_or_zero(dst + 4, src + 4, t < L);
    } else {
      cp_async_16_or_zero(sm.stage() + t * kD + c, p.raw_gate + g, t < L);
    }
  }
  if constexpr (S::kPrefetched) {
    if (beta_stageable(p)) stage_beta(p, sm.beta_words(), h, row0, L, p.chunk_flags & KDA_CHUNK_BETA_F32);
  }
}
template <class S>
__device__ __forceinline__ void load_gates_from_stage(const KdaParams& p, const S& sm, int h, long long row0, int L,
                                                      const GateConstants& gate) {
  const bool b_f32 = p.chunk_flags & KDA_CHUNK_BETA_F32;
  float raw_b = 0.f;
  const bool own = threadIdx.x < kC && static_cast<int>(threadIdx.x) < L;
  if constexpr (S::kPrefetched) {
    if (own && !beta_stageable(p)) raw_b = load_bf16_or_f32(p.raw_beta, (row0 + threadIdx.x) * p.beta_row_stride + h, b_f32);
    cp_async_wait_but_newest();  // the next chunk's copies are the newest group
    // Thread t staged token t's β itself (stage_beta).
    if (own && beta_stageable(p)) raw_b = staged_beta(p, sm.beta_words(), h, row0, threadIdx.x, b_f32);
  } else {
    if (own) raw_b = load_bf16_or_f32(p.raw_beta, (row0 + threadIdx.x) * p.beta_row_stride + h, b_f32);
    cp_async_wait_all();
  }
  S::Sync::sync();
  gates_chunk<true>(p, sm, h, row0, L, gate, raw_b);
}
template <class S>
__device__ __forceinline__ void load_gates_staged(const KdaParams& p, const S& sm, int h, long long row0, int L,
                                                  const GateConstants& gate) {
  stage_chunk_inputs(p, sm, h, row0, L);
  load_gates_from_stage(p, sm, h, row0, L, gate);
}

// Step 2: Qg, KdT and Γ_C on threads kFirst .. kThreads - 1 (the fused
// kernels: all; the intra-chunk kernel: warps 4-7, beside the inverse's
// diagonal blocks). Thread (k, r) takes column k of tokens t0 .. t0 + 3 for
// t0 = 4 r, + 4 R, .. (R rows of threads): Q̂ ∘ Γ's four elements and one
// float4 of (K̂ ∘ Γ_C / Γ)^T each.
template <int kFirst, class S>
__device__ __forceinline__ void scaled_operands(const S& sm) {
  static_assert((kThreads - kFirst) % kD == 0, "whole rows of kD threads");
  const float* G = sm.G();
  const unsigned u = threadIdx.x - kFirst;  // the caller's threads are kFirst ..
  const int k = u & (kD - 1);
  const float gl = G[g_at(kC - 1, k)];
  for (int t0 = u / kD * 4; t0 < kC; t0 += (kThreads - kFirst) / kD * 4) {
    const float4 rq4 = *reinterpret_cast<const float4*>(sm.rq() + t0);
    const float4 rk4 = *reinterpret_cast<const float4*>(sm.rk() + t0);
    const float rq[4] = {rq4.x, rq4.y, rq4.z, rq4.w}, rk[4] = {rk4.x, rk4.y, rk4.z, rk4.w};
    float kd[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = qk_at(t0 + e, k);
      const float g = G[g_at(t0 + e, k)];
      sm.put_qg(t0 + e, k, tf32_round(bf16_to_f32(sm.mq()[i]) * rq[e] * exp_ftz(g)));
      kd[e] = tf32_round(bf16_to_f32(sm.mk()[i]) * rk[e] * exp_ftz(gl - g));
    }
    sm.put_kdt4(k, t0, make_float4(kd[0], kd[1], kd[2], kd[3]));
  }
  if (u < kD) sm.put_gamma_c(u, exp_ftz(G[g_at(kC - 1, u)]));
}

// Step 3 for a strong decay, diagonal blocks: pairs (t, s) of one sub-chunk,
// s <= t, one exponential per element; the warp splits k over its lanes (4 each).
template <class S>
__device__ __forceinline__ void diagonal_blocks(const S& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* G = sm.G();
  for (int r = 0; r < kC / kWarps; ++r) {
    const int t = r * kWarps + warp;  // rows t and t + 8 alternate in the sub-chunk position: balanced
    const int s0 = t / kSub * kSub;
    const U2 qw = *reinterpret_cast<const U2*>(sm.mq() + qk_at(t, 4 * lane));
    const U2 kw = *reinterpret_cast<const U2*>(sm.mk() + qk_at(t, 4 * lane));
    const float4 gt = *reinterpret_cast<const float4*>(G + g_at(t, 4 * lane));
    const float qt[4] = {bf16lo_to_f32(qw.x), bf16hi_to_f32(qw.x), bf16lo_to_f32(qw.y), bf16hi_to_f32(qw.y)};
    const float kt[4] = {bf16lo_to_f32(kw.x), bf16hi_to_f32(kw.x), bf16lo_to_f32(kw.y), bf16hi_to_f32(kw.y)};
    const float gtv[4] = {gt.x, gt.y, gt.z, gt.w};
    const float rqt = sm.rq()[t], rkt = sm.rk()[t], bt = sm.beta()[t];
    for (int s = s0; s <= t; ++s) {
      const U2 sw = *reinterpret_cast<const U2*>(sm.mk() + qk_at(s, 4 * lane));
      const float4 gs = *reinterpret_cast<const float4*>(G + g_at(s, 4 * lane));
      const float ks[4] = {bf16lo_to_f32(sw.x), bf16hi_to_f32(sw.x), bf16lo_to_f32(sw.y), bf16hi_to_f32(sw.y)};
      const float gsv[4] = {gs.x, gs.y, gs.z, gs.w};
      float a = 0.f, m = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float e = ks[i] * exp_ftz(gtv[i] - gsv[i]);
        a = fmaf(qt[i], e, a);
        m = fmaf(kt[i], e, m);
      }
      a = warp_sum(a);
      m = warp_sum(m);
      if (lane == 0) {
        const float rks = sm.rk()[s];
        sm.put_a(t, s, tf32_round(a * rqt * rks));
        if (s < t) sm.M()[t * kC + s] = bt * m * rkt * rks;
      }
    }
    // Zeros above the diagonal inside the block (the A Δ product reads whole 8 x 8 tiles).
    if (lane > t - s0 && lane < kSub) sm.put_a(t, s0 + lane, 0.f);
  }
}

// Step 3 in one pass on the tensor cores, for a chunk whose gates decay
// little inside each sub-chunk: with R_i = G of row 16 i + 7 (the middle of
// sub-chunk i), every pair (t, s <= t) with t in sub-chunk i factors as
// e^{G_t - R_i} e^{R_i - G_s}. Across sub-chunks both factors are <= 1; inside
// one, |G - R_i| is at most the decay over 8 tokens, which
// factored_blocks_safe() bounds by kMaxHalfSpan, so no factor overflows or
// loses a term to the flush of a denormal. Otherwise (a strong decay inside
// a sub-chunk) the diagonal blocks take one exponential per element
// (diagonal_blocks) and the blocks below them are factored through the last
// row before sub-chunk i, where both factors are <= 1.
enum : int { kMaxHalfSpan = 60 };
template <class S>
__device__ __forceinline__ bool factored_blocks_safe(const S& sm) {
  const int k = threadIdx.x & (kD - 1), half = threadIdx.x / kD;
  const float* G = sm.G();
  bool ok = true;
#pragma unroll
  for (int b = kSubs == 1 ? half : 2 * half; b < (kSubs == 1 ? 1 : 2 * half + 2); ++b) {
    const float first = G[g_at(kSub * b, k)], mid = G[g_at(kSub * b + 7, k)], last = G[g_at(kSub * b + kSub - 1, k)];
    ok = ok && first - mid <= kMaxHalfSpan && mid - last <= kMaxHalfSpan;
  }
  return ok;
}

// Blocks (i, j0) .. (i, j0 + kBlocks - 1) (all j <= i) of A and M on one
// warp, every pair (t, s) factored through the reference row R (row `ref` of
// G): A_ts = rq_t rk_s Σ_k [q_tk e^{G_tk - R_k}] [k_sk e^{R_k - G_sk}],
// M_ts = β_t rk_t rk_s Σ_k [k_tk e^{G_tk - R_k}] [k_sk e^{R_k - G_sk}]. The
// t-side factors (A's and M's A fragments) are made once per k step for all
// the warp's blocks of the row. The caller picks R so that no factor
// overflows. Above the diagonal A is zero (the A Δ product reads whole 8 x 8
// tiles); M there is never read.
// kPartial (route pipe16's one block at C = 16, factored_block_split): the
// warp takes k steps 2w and 2w + 1 only and leaves its raw sums in
// sm.partials() (no scales, no tf32 rounding).
template <int kBlocks, bool kPartial = false, class S>
__device__ __forceinline__ void factored_row(const S& sm, int i, int j0, int ref) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const float* G = sm.G();
  const unsigned short* mq = sm.mq();
  const unsigned short* mk = sm.mk();
  const int t0 = kSub * i + g, t1 = t0 + 8;
  float ca[2 * kBlocks][4] = {}, cm[2 * kBlocks][4] = {};
  // Columns k, k + 1 of a row: one 4-byte load of the bf16 pair, one 8-byte
  // load of G. Every row the lane reads but R has t & 7 = g, so one column
  // XOR serves its bf16 rows (qk_at), and G's rows t0 and s of tile 0 share
  // theirs, t1 and tile 1's (8 rows further) that one ^ 16 (g_at).
  const int xb = g << 3, xg = ((g ^ (g >> 2)) & 3) << 3;
  const float* G0 = G + t0 * kD;
  const float* G1 = G + t1 * kD;
  const unsigned short* Q0 = mq + t0 * kD;
  const unsigned short* Q1 = mq + t1 * kD;
  const unsigned short* K0 = mk + t0 * kD;
  const unsigned short* K1 = mk + t1 * kD;
  auto pair_bf16 = [](const unsigned short* m, int c) { return *reinterpret_cast<const unsigned*>(m + c); };
  auto pair_f32 = [](const float* row, int c) { return *reinterpret_cast<const float2*>(row + c); };
  enum : int { kSteps = kPartial ? kD / 8 / kWarps : kD / 8 };
  const int kk0 = kPartial ? (threadIdx.x >> 5) * kSteps : 0;
#pragma unroll 4
  for (int kk = kk0; kk < kk0 + kSteps; ++kk) {
    const int k = 8 * kk + 2 * q, kb = k ^ xb, kg0 = k ^ xg, kg1 = kg0 ^ 16;
    const float2 r = *reinterpret_cast<const float2*>(G + g_at(ref, k));
    const float2 g0 = pair_f32(G0, kg0), g1 = pair_f32(G1, kg1);
    const float e00 = exp_ftz(g0.x - r.x), e01 = exp_ftz(g0.y - r.y);
    const float e10 = exp_ftz(g1.x - r.x), e11 = exp_ftz(g1.y - r.y);
    const unsigned q0w = pair_bf16(Q0, kb), q1w = pair_bf16(Q1, kb);
    const unsigned k0w = pair_bf16(K0, kb), k1w = pair_bf16(K1, kb);
    const unsigned qa0 = to_tf32(bf16lo_to_f32(q0w) * e00), qa2 = to_tf32(bf16hi_to_f32(q0w) * e01);
    const unsigned qa1 = to_tf32(bf16lo_to_f32(q1w) * e10), qa3 = to_tf32(bf16hi_to_f32(q1w) * e11);
    const unsigned ka0 = to_tf32(bf16lo_to_f32(k0w) * e00), ka2 = to_tf32(bf16hi_to_f32(k0w) * e01);
    const unsigned ka1 = to_tf32(bf16lo_to_f32(k1w) * e10), ka3 = to_tf32(bf16hi_to_f32(k1w) * e11);
#pragma unroll
    for (int nt = 0; nt < 2 * kBlocks; ++nt) {
      const int s = kSub * j0 + 8 * nt + g;
      const unsigned sw = pair_bf16(mk + s * kD, kb);
      const float2 gs = pair_f32(G + s * kD, nt % 2 == 0 ? kg0 : kg1);
      const unsigned kb0 = to_tf32(bf16lo_to_f32(sw) * exp_ftz(r.x - gs.x));
      const unsigned kb1 = to_tf32(bf16hi_to_f32(sw) * exp_ftz(r.y - gs.y));
      mma_tf32(ca[nt], qa0, qa1, qa2, qa3, kb0, kb1);
      mma_tf32(cm[nt], ka0, ka1, ka2, ka3, kb0, kb1);
    }
  }
  if constexpr (kPartial) {
    float* part = sm.partials() + (threadIdx.x >> 5) * 2 * kC * kC;  // [warp][A, M][t][s]
#pragma unroll
    for (int nt = 0; nt < 2 * kBlocks; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = e < 2 ? t0 : t1, s = kSub * j0 + 8 * nt + 2 * q + (e & 1);
        part[t * kC + s] = ca[nt][e];
        part[kC * kC + t * kC + s] = cm[nt][e];
      }
    return;
  }
  const float rq0 = sm.rq()[t0], rq1 = sm.rq()[t1], rk0 = sm.rk()[t0], rk1 = sm.rk()[t1];
  const float be0 = sm.beta()[t0], be1 = sm.beta()[t1];
#pragma unroll
  for (int nt = 0; nt < 2 * kBlocks; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int s = kSub * j0 + 8 * nt + 2 * q + e;
      const float rks = sm.rk()[s];
      sm.put_a(t0, s, s <= t0 ? tf32_round(ca[nt][e] * rq0 * rks) : 0.f);
      sm.put_a(t1, s, s <= t1 ? tf32_round(ca[nt][2 + e] * rq1 * rks) : 0.f);
      sm.M()[t0 * kC + s] = be0 * cm[nt][e] * rk0 * rks;
      sm.M()[t1 * kC + s] = be1 * cm[nt][2 + e] * rk1 * rks;
    }
}

// Route pipe16's one block (C = 16): its 16 k steps over the 8 warps, two
// each (factored_row<1, true>), then each of the block's 256 elements of A
// and of M summed over the warps in warp order by a thread, and scaled as
// factored_row scales them.
template <class S>
__device__ __forceinline__ void factored_block_split(const S& sm) {
  static_assert(!S::kSplitBlock || (kSubs == 1 && kThreads == kC * kC && kD / 8 % kWarps == 0),
                "a thread per element of the 16 x 16 block");
  factored_row<1, true>(sm, 0, 0, 7);
  S::Sync::sync();
  const int t = fresh_tid() / kC, s = fresh_tid() % kC;
  const float* part = sm.partials() + t * kC + s;
  float a = 0.f, m = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    a += part[w * 2 * kC * kC];
    m += part[w * 2 * kC * kC + kC * kC];
  }
  const float rks = sm.rk()[s];
  sm.put_a(t, s, s <= t ? tf32_round(a * sm.rq()[t] * rks) : 0.f);
  sm.M()[t * kC + s] = sm.beta()[t] * m * sm.rk()[t] * rks;
}


// The blocks (i, j <= i) of A and M through the middle of sub-chunk i (row
// 16 i + 7), or (`below_only`, for a strong decay) the blocks strictly below
// the diagonal through the last row before sub-chunk i (both factors <= 1
// there). In the fused kernels (the state tiles live in registers) one block
// a warp task, warp w taking blocks w, w + 8, ... in the order (0,0) (1,0)
// (1,1) (2,0) ... In the intra-chunk kernel (S::kRowTasks) the ten blocks are
// six warp tasks of a row's consecutive blocks, (3; 0, 1), (3; 2, 3),
// (2; 0, 1), (1; 0, 1), (2; 2), (0; 0), so that no warp makes more than three
// blocks' worth of factors (a row's t-side once, then two blocks' s-sides)
// where ten one-block tasks over eight warps gave two warps four (warps 6
// and 7 have none); the six below the diagonal stay one a warp. Route
// pipe16's one block (S::kSplitBlock): factored_block_split.
template <class S>
__device__ __forceinline__ void factored_blocks(const S& sm, bool below_only) {
  const int warp = threadIdx.x >> 5;
  if constexpr (S::kSplitBlock) {
    if (!below_only) {
      factored_block_split(sm);
      return;
    }
  }
  if constexpr (S::kRowTasks) {
    static_assert(kC == 16 || (kSubs == 4 && kWarps >= 6), "the row tasks are for four sub-chunks and six warps (route twopass: chunks of 64)");
    if (!below_only) {
      if (warp < 4) {
        const int i = warp < 2 ? 3 : 4 - warp;  // warps 0-3: rows 3, 3, 2, 1
        factored_row<2>(sm, i, warp == 1 ? 2 : 0, kSub * i + 7);
      } else if (warp < 6) {
        const int i = warp == 4 ? 2 : 0;
        factored_row<1>(sm, i, i, kSub * i + 7);
      }
      return;
    }
  }
  const int tasks = below_only ? kSubs * (kSubs - 1) / 2 : kSubs * (kSubs + 1) / 2;
  for (int task = warp; task < tasks; task += kWarps) {
    // The task-th block, row by row: row i holds i blocks below the diagonal (+1 with it).
    int i = below_only ? 1 : 0, first = 0;
    while (task >= first + (below_only ? i : i + 1)) {
      first += below_only ? i : i + 1;
      ++i;
    }
    const int j = task - first;
    factored_row<1>(sm, i, j, below_only ? kSub * i - 1 : kSub * i + 7);
  }
}

// Step 4a: T = (I + M)^-1, lower triangular, in 16 x 16 blocks by the block
// formula [[A, 0], [C, B]]^-1 = [[A^-1, 0], [-B^-1 C A^-1, B^-1]]: the
// diagonal blocks by forward substitution (one column per thread), then the
// 32 x 32 halves' lower-left blocks, then the lower-left 32 x 32 quarter. A
// product that is not yet a block of T goes to T's unused block above the
// diagonal at the transposed position. Block products run on the CUDA cores
// in f32 (block_product: a lane holds rows of one column).
// acc[e] += Σ_k X(row r0 + e of block row xi, column k of block column xm) T(16 ya + k, 16 yb + c),
// X = T (kXT) or M, c = lane % 16.
template <bool kXT, int kRows, class S>
__device__ __forceinline__ void block_product(const S& sm, float (&acc)[kRows], int r0, int xi, int xm, int ya, int yb) {
  const int c = threadIdx.x & 15;
  const float* T = sm.T();
  const float* M = sm.M();
#pragma unroll
  for (int kq = 0; kq < kSub; kq += 4) {
    float y[4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) y[kk] = T[sm.t_at(kSub * ya + kq + kk, kSub * yb + c)];
#pragma unroll
    for (int e = 0; e < kRows; ++e) {
      const int row = kSub * xi + r0 + e, col = kSub * xm + kq;
      const float4 x = *reinterpret_cast<const float4*>(kXT ? T + sm.t_at(row, col) : M + row * kC + col);
      acc[e] = fmaf(x.x, y[0], acc[e]);
      acc[e] = fmaf(x.y, y[1], acc[e]);
      acc[e] = fmaf(x.z, y[2], acc[e]);
      acc[e] = fmaf(x.w, y[3], acc[e]);
    }
  }
}
template <int kRows, class S>
__device__ __forceinline__ void block_put(const S& sm, const float (&acc)[kRows], int r0, int i, int j, float sign) {
  const int c = threadIdx.x & 15;
#pragma unroll
  for (int e = 0; e < kRows; ++e) sm.T()[sm.t_at(kSub * i + r0 + e, kSub * j + c)] = sign * acc[e];
}
// Column c of the inverse of the diagonal block at rows and columns base ..
// base + kSub - 1 of I + M, by forward substitution, into T (zeros above the
// diagonal).
template <class S>
__device__ __forceinline__ void invert_diagonal_column(const S& sm, int base, int c) {
  const float* M = sm.M();
  float x[kSub];
#pragma unroll
  for (int t = 0; t < kSub; ++t) {
    float acc = t == c ? 1.f : 0.f;
#pragma unroll
    for (int s = 0; s < t; ++s) acc = fmaf(-M[(base + t) * kC + base + s], x[s], acc);
    x[t] = acc;
  }
#pragma unroll
  for (int t = 0; t < kSub; ++t) sm.T()[sm.t_at(base + t, base + c)] = x[t];
}
template <class S>
__device__ __forceinline__ void invert_blocks(const S& sm) {
  static_assert(kSubs == 1 || (kSubs == 4 && kWarps == 8), "the block formula below is written for 4 x 4 blocks on 8 warps");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp < 2) {
    // Diagonal blocks 2w and 2w + 1 (lanes 0-15 and 16-31, a column each) ...
    invert_diagonal_column(sm, threadIdx.x / kSub * kSub, threadIdx.x % kSub);
    __syncwarp();
    // ... then T_ij = -T_ii M_ij T_jj for (i, j) = (2w + 1, 2w), M_ij T_jj in block (j, i).
    const int i = 2 * warp + 1, j = 2 * warp, r0 = (lane >> 4) * 8;
    float p[8] = {}, q[8] = {};
    block_product<false>(sm, p, r0, i, j, j, j);
    block_put(sm, p, r0, j, i, 1.f);
    __syncwarp();
    block_product<true>(sm, q, r0, i, i, j, i);
    block_put(sm, q, r0, i, j, -1.f);
  } else if constexpr (S::kLateOperands) {
    if (warp >= 4) scaled_operands<4 * 32>(sm);  // step 2 (it goes to the unit only) beside warps 0-1
  }
  S::Sync::sync();
  // The lower-left quarter, block (r, b) for r = 2, 3 and b = 0, 1 on warps
  // 2 (r - 2) + b and + 4 (rows 0-7 and 8-15 of the block): first
  // X_rb = Σ_{m=b}^{1} M_rm T_mb into block (b, r), then T_rb = -Σ_{m=2}^{r} T_rm X_mb.
  const int r = 2 + (warp >> 1 & 1), b = warp & 1, r0 = (warp >> 2) * 8 + (lane >> 4) * 4;
  float p[4] = {}, q[4] = {};
  for (int m = b; m < 2; ++m) block_product<false>(sm, p, r0, r, m, m, b);
  block_put(sm, p, r0, b, r, 1.f);
  S::Sync::sync();
  for (int m = 2; m <= r; ++m) block_product<true>(sm, q, r0, r, m, b, m);
  block_put(sm, q, r0, r, b, -1.f);
  S::Sync::sync();
}
// T = (I + M)^-1: by the block formula, or for chunks of 16 (one sub-chunk)
// the one diagonal block, a column per thread of the first 16.
template <class S>
__device__ __forceinline__ void invert(const S& sm) {
  if constexpr (kSubs == 1) {
    if (threadIdx.x < kSub) invert_diagonal_column(sm, 0, threadIdx.x);
    S::Sync::sync();
  } else {
    invert_blocks(sm);
  }
}

// Step 4b: [W | U] = T [diag(β) (K̂ ∘ Γ) | diag(β) V] on the tensor cores.
// Column tile nt (8 columns) belongs to warp nt % 8; the right-hand side is
// formed from region 1 as the B fragments are built, and W and U^T overwrite
// region 1 after a barrier.
// A warp's column tiles go in kPasses passes (two in the intra-chunk kernel,
// which writes W and U^T to the unit, not over the buffers it reads: half the
// accumulators live at once, T's fragments read twice).
template <class S>
__device__ __forceinline__ void apply_inverse(const S& sm) {
  enum : int { kNTiles = kSolveCols / 8, kAllPerWarp = (kNTiles + kWarps - 1) / kWarps, kMTiles = kC / 16 };
  enum : int { kPasses = S::kSolvedInRegion1 || kAllPerWarp % 2 != 0 ? 1 : 2, kPerWarp = kAllPerWarp / kPasses };
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const float* T = sm.T();
  const float* G = sm.G();
#pragma unroll 1
  for (int pass = 0; pass < kPasses; ++pass) {
    const int jt0 = pass * kPerWarp;  // the pass's first column tile of the warp
    float acc[kPerWarp][kMTiles][4];
#pragma unroll
    for (int j = 0; j < kPerWarp; ++j)
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) acc[j][mt][0] = acc[j][mt][1] = acc[j][mt][2] = acc[j][mt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kC / 8; ++ks) {
      const int s0 = 8 * ks + 2 * q;
      const float bs0 = sm.beta()[s0], bs1 = sm.beta()[s0 + 1];
      const float ks0 = bs0 * sm.rk()[s0], ks1 = bs1 * sm.rk()[s0 + 1];
      unsigned b[kPerWarp][2];
#pragma unroll
      for (int j = 0; j < kPerWarp; ++j) {
        const int c = 8 * (warp + kWarps * (jt0 + j)) + g;
        float v0 = 0.f, v1 = 0.f;
        if (c < kD) {
          v0 = ks0 * bf16_to_f32(sm.mk()[qk_at(s0, c)]) * exp_ftz(G[g_at(s0, c)]);
          v1 = ks1 * bf16_to_f32(sm.mk()[qk_at(s0 + 1, c)]) * exp_ftz(G[g_at(s0 + 1, c)]);
        } else if (c < kSolveCols) {
          v0 = bs0 * bf16_to_f32(sm.mv()[v_at(s0, c - kD)]);
          v1 = bs1 * bf16_to_f32(sm.mv()[v_at(s0 + 1, c - kD)]);
        }
        b[j][0] = to_tf32(v0);
        b[j][1] = to_tf32(v1);
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        if (ks > 2 * mt + 1) continue;  // above the diagonal: T is zero there
        const float2 lo = *reinterpret_cast<const float2*>(T + sm.t_at(16 * mt + g, s0));
        const float2 hi = *reinterpret_cast<const float2*>(T + sm.t_at(16 * mt + g + 8, s0));
        const unsigned a0 = to_tf32(lo.x), a2 = to_tf32(lo.y), a1 = to_tf32(hi.x), a3 = to_tf32(hi.y);
#pragma unroll
        for (int j = 0; j < kPerWarp; ++j) mma_tf32(acc[j][mt], a0, a1, a2, a3, b[j][0], b[j][1]);
      }
    }
    // Every read of mq, mk, mv and G is done: W and U^T overwrite them.
    if constexpr (S::kSolvedInRegion1) S::Sync::sync();
    // Into shared memory (region 1), an element a store. Into the unit (the
    // intra-chunk kernel), eight bytes a store: a tile of W as its pairs (t,
    // c0 .. c0 + 1); a tile of U^T with the lanes of rows g and g ^ 1 trading
    // halves (one shuffle per pair), the even one storing (v, t .. t + 1), the
    // odd one (v + 1, t - 1 .. t).
    const bool odd = g & 1;
#pragma unroll
    for (int j = 0; j < kPerWarp; ++j) {
      const int c0 = 8 * (warp + kWarps * (jt0 + j)) + 2 * q;
      if (c0 >= kSolveCols) continue;  // the same for every lane of the warp
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        const float* a = acc[j][mt];
        const int t = 16 * mt + g;
        if constexpr (S::kSolvedInRegion1) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int te = t + (e >= 2 ? 8 : 0), c = c0 + (e & 1);
            if (c < kD) sm.put_w(te, c, tf32_round(a[e]));
            else sm.put_ut(c - kD, te, a[e]);
          }
        } else if (c0 < kD) {
          sm.put_w2(t, c0, tf32_round(a[0]), tf32_round(a[1]));
          sm.put_w2(t + 8, c0, tf32_round(a[2]), tf32_round(a[3]));
        } else {
          const float r0 = __shfl_xor_sync(kFull, odd ? a[0] : a[1], 4);
          const float r1 = __shfl_xor_sync(kFull, odd ? a[2] : a[3], 4);
          const int v = c0 - kD + (odd ? 1 : 0), tt = odd ? t - 1 : t;
          sm.put_ut2(v, tt, odd ? r0 : a[0], odd ? a[1] : r0);
          sm.put_ut2(v, tt + 8, odd ? r1 : a[2], odd ? a[3] : r1);
        }
      }
    }
  }
}

// The state slice of one warp: 16 value rows x 128 columns as 16 accumulator
// tiles of 8 columns (rows g and g + 8, columns 8 nt + 2q and + 1).
struct StateTile {
  float s[kD / 8][4];
  // The tf32 A fragment (mma.sync m16n8k8's, wgmma m64k8's per warp) of
  // columns 8 kk .. 8 kk + 7 for the products over k: the accumulator's
  // registers 0, 2, 1, 3, since the B operands hold the contraction index
  // permuted to match (cm_at).
  __device__ void a_fragment(int kk, unsigned (&a)[4]) const {
    a[0] = to_tf32(s[kk][0]);
    a[1] = to_tf32(s[kk][2]);
    a[2] = to_tf32(s[kk][1]);
    a[3] = to_tf32(s[kk][3]);
  }
};

// A head's state is [v][k] (state_v_stride D, state_k_stride 1: the slot
// pool, and the chunk op with state_v_first) or [k][v] (D apart along k: FLA's
// layout). A thread holds columns k and k + 1 of its rows: one 8-byte (f32) or
// 4-byte (bf16) access when they are adjacent, two otherwise.
__device__ __forceinline__ long long state_elem(const KdaParams& p, long long slot_stride, int slot, int h, int v,
                                                int k) {
  return static_cast<long long>(slot) * slot_stride + static_cast<long long>(h) * kD * kD + v * p.state_v_stride +
         k * p.state_k_stride;
}

// The state's elements are bf16 (kBf16) or f32; KdaParams::state_bf16 picks
// the instance once per sequence. `lane` is threadIdx.x & 31 (route pipe16's
// consumer: from fresh_tid(), so that the element offsets of a runtime
// k stride are formed per sequence, not hoisted into registers across the
// sequence loop).
template <bool kBf16>
__device__ __forceinline__ void state_load_as(const KdaParams& p, int slot, int h, int vrow, StateTile& st, int lane) {
  const int g = lane >> 2, q = lane & 3;
  const bool pair = !kChunk || p.state_k_stride == 1;  // the prefill op's pool is [v][k]
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const long long e = state_elem(p, p.state_slot_stride, slot, h, vrow + g + 8 * hr, 8 * nt + 2 * q);
      float x0, x1;
      if constexpr (kBf16) {
        const unsigned short* base = static_cast<const unsigned short*>(p.state);
        if (pair) {
          const unsigned w = *reinterpret_cast<const unsigned*>(base + e);
          x0 = bf16lo_to_f32(w);
          x1 = bf16hi_to_f32(w);
        } else {
          x0 = bf16_to_f32(base[e]);
          x1 = bf16_to_f32(base[e + p.state_k_stride]);
        }
      } else {
        const float* base = static_cast<const float*>(p.state);
        if (pair) {
          const float2 v = *reinterpret_cast<const float2*>(base + e);
          x0 = v.x;
          x1 = v.y;
        } else {
          x0 = base[e];
          x1 = base[e + p.state_k_stride];
        }
      }
      st.s[nt][2 * hr] = x0;
      st.s[nt][2 * hr + 1] = x1;
    }
}
__device__ __forceinline__ void state_load(const KdaParams& p, int slot, int h, int vrow, StateTile& st,
                                           int lane = threadIdx.x & 31) {
  if (p.state_bf16) state_load_as<true>(p, slot, h, vrow, st, lane);
  else state_load_as<false>(p, slot, h, vrow, st, lane);
}

// Into `dst` (the slot pool for the prefill op, final_state for the chunk op),
// `slot_stride` elements between slots.
template <bool kBf16>
__device__ __forceinline__ void state_store_as(const KdaParams& p, void* dst, long long slot_stride, int slot, int h,
                                               int vrow, const StateTile& st, int lane) {
  const int g = lane >> 2, q = lane & 3;
  const bool pair = !kChunk || p.state_k_stride == 1;  // the prefill op's pool is [v][k]
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const long long e = state_elem(p, slot_stride, slot, h, vrow + g + 8 * hr, 8 * nt + 2 * q);
      const float x0 = st.s[nt][2 * hr], x1 = st.s[nt][2 * hr + 1];
      if constexpr (kBf16) {
        unsigned short* base = static_cast<unsigned short*>(dst);
        if (pair) {
          *reinterpret_cast<unsigned*>(base + e) = pack_bf16x2(x0, x1);
        } else {
          base[e] = f32_to_bf16(x0);
          base[e + p.state_k_stride] = f32_to_bf16(x1);
        }
      } else {
        float* base = static_cast<float*>(dst);
        if (pair) {
          *reinterpret_cast<float2*>(base + e) = make_float2(x0, x1);
        } else {
          base[e] = x0;
          base[e + p.state_k_stride] = x1;
        }
      }
    }
}
__device__ __forceinline__ void state_store(const KdaParams& p, void* dst, long long slot_stride, int slot, int h,
                                            int vrow, const StateTile& st, int lane = threadIdx.x & 31) {
  if (p.state_bf16) state_store_as<true>(p, dst, slot_stride, slot, h, vrow, st, lane);
  else state_store_as<false>(p, dst, slot_stride, slot, h, vrow, st, lane);
}

// Step 5 on one output tile nt (8 tokens) of the warp's value rows vl ..
// vl + 15: d = -U^T and o = 0, then per 8 columns kk of S (its A fragment
// a) d += S W^T and o += S Qg^T.
template <class S>
__device__ __forceinline__ void init_delta_out(const S& sm, float (&d)[4], float (&o)[4], int vl, int nt) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const float2 u0 = *reinterpret_cast<const float2*>(sm.UT() + (vl + g) * S::kLdUT + 8 * nt + 2 * q);
  const float2 u1 = *reinterpret_cast<const float2*>(sm.UT() + (vl + g + 8) * S::kLdUT + 8 * nt + 2 * q);
  d[0] = -u0.x;
  d[1] = -u0.y;
  d[2] = -u1.x;
  d[3] = -u1.y;
  o[0] = o[1] = o[2] = o[3] = 0.f;
}
// Δ^T as A fragments over s: the negated accumulators d of -Δ^T, tf32-rounded,
// each tile's columns 2q, 2q + 1 as the fragment's q, q + 4.
__device__ __forceinline__ void delta_fragments(const float (&d)[kC / 8][4], unsigned (&da)[kC / 8][4]) {
#pragma unroll
  for (int ks = 0; ks < kC / 8; ++ks) {
    da[ks][0] = to_tf32(-d[ks][0]);
    da[ks][1] = to_tf32(-d[ks][2]);
    da[ks][2] = to_tf32(-d[ks][1]);
    da[ks][3] = to_tf32(-d[ks][3]);
  }
}
// init_delta_out for every output tile of the warp's rows vl ..
template <class S>
__device__ __forceinline__ void init_delta_out_all(const S& sm, float (&d)[kC / 8][4], float (&o)[kC / 8][4], int vl) {
#pragma unroll
  for (int nt = 0; nt < kC / 8; ++nt) init_delta_out(sm, d[nt], o[nt], vl, nt);
}
template <class S>
__device__ __forceinline__ void add_state_products(const S& sm, float (&d)[4], float (&o)[4], const unsigned (&a)[4],
                                                   int nt, int kk) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  unsigned b0, b1;
  mma_b_cm<kD>(sm.W(), nt, kk, g, q, b0, b1);
  mma_tf32(d, a[0], a[1], a[2], a[3], b0, b1);
  mma_b_cm<kD>(sm.Qg(), nt, kk, g, q, b0, b1);
  mma_tf32(o, a[0], a[1], a[2], a[3], b0, b1);
}
// Step 5's products on one tile of the warp, with Δ^T's A fragments da over
// the chunk's s: o += Δ^T A^T for output tile nt (A is lower triangular:
// tiles ks <= nt), and c += Δ^T Kd for state column tile nt.
template <class S>
__device__ __forceinline__ void add_delta_a(const S& sm, float (&o)[4], const unsigned (&da)[kC / 8][4], int nt) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int ks = 0; ks < kC / 8; ++ks) {
    if (ks > nt) break;
    unsigned b0, b1;
    mma_b_cm<kC>(sm.A(), nt, ks, g, q, b0, b1);
    mma_tf32(o, da[ks][0], da[ks][1], da[ks][2], da[ks][3], b0, b1);
  }
}
template <class S>
__device__ __forceinline__ void add_delta_kd(const S& sm, float (&c)[4], const unsigned (&da)[kC / 8][4], int nt) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int ks = 0; ks < kC / 8; ++ks) {
    unsigned b0, b1;
    mma_b_cm<kC>(sm.KdT(), nt, ks, g, q, b0, b1);
    mma_tf32(c, da[ks][0], da[ks][1], da[ks][2], da[ks][3], b0, b1);
  }
}
// The state tile's column tile nt times Γ_C.
template <class S>
__device__ __forceinline__ void scale_by_gamma(const S& sm, float (&c)[4], int nt) {
  const int q = threadIdx.x & 3;
  const float2 gc = *reinterpret_cast<const float2*>(sm.gammaC() + 8 * nt + 2 * q);
  c[0] *= gc.x;
  c[1] *= gc.y;
  c[2] *= gc.x;
  c[3] *= gc.y;
}

// The end of step 5 for a warp's 16 value rows from vl (its o tiles: rows
// g and g + 8, tokens 8 nt + 2q and + 1): round_bf16(o) (rounding point 3)
// to OB, and, for the fused prefill routes, Σ ob² over the 16 rows per token
// (the chunk op has no norm; route twopass's norm kernel sums the rows).
template <class S>
__device__ __forceinline__ void store_output(const S& sm, const float (&o)[kC / 8][4], int vl) {
  const int lane = threadIdx.x & 31, warp = vl >> 4, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int nt = 0; nt < kC / 8; ++nt) {
    float part[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int t = 8 * nt + 2 * q + e;
      const unsigned short b_lo = f32_to_bf16(o[nt][e]), b_hi = f32_to_bf16(o[nt][2 + e]);
      sm.ob()[t * kLdOb + vl + g] = b_lo;
      sm.ob()[t * kLdOb + vl + g + 8] = b_hi;
      const float f_lo = bf16_to_f32(b_lo), f_hi = bf16_to_f32(b_hi);
      part[e] = f_lo * f_lo + f_hi * f_hi;
    }
    if constexpr (!kChunk && !kTwopass) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = part[e];
        v += __shfl_xor_sync(kFull, v, 4);
        v += __shfl_xor_sync(kFull, v, 8);
        v += __shfl_xor_sync(kFull, v, 16);
        if (g == 0) sm.warp_sum()[warp * kC + 8 * nt + 2 * q + e] = v;
      }
    }
  }
}

// Step 5 for the warp of local value rows vl .. vl + 15 (vl = 16 w for warp w
// < kSWarps; route pipe16: its consumer warp's): updates the state tile,
// writes round_bf16(o) of its rows to OB and its Σ ob² per token.
template <class S>
__device__ __forceinline__ void state_pass(const S& sm, StateTile& st, int vl) {
  // d = S W^T - U^T = -Δ^T and o = S Qg^T, over k.
  float d[kC / 8][4], o[kC / 8][4];
  init_delta_out_all(sm, d, o, vl);
#pragma unroll
  for (int kk = 0; kk < kD / 8; ++kk) {
    unsigned a[4];
    st.a_fragment(kk, a);
#pragma unroll
    for (int nt = 0; nt < kC / 8; ++nt) add_state_products(sm, d[nt], o[nt], a, nt, kk);
  }
  unsigned da[kC / 8][4];
  delta_fragments(d, da);
  // o += Δ^T A^T.
#pragma unroll
  for (int nt = 0; nt < kC / 8; ++nt) add_delta_a(sm, o[nt], da, nt);
  // S <- S diag(Γ_C) + Δ^T Kd.
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt) {
    scale_by_gamma(sm, st.s[nt], nt);
    add_delta_kd(sm, st.s[nt], da, nt);
  }
  store_output(sm, o, vl);
}

#if KDA_WGMMA
// ---- Step 5 at P <= 2 on wgmma (docs/DESIGN.md, "Step 5 at P <= 2 on wgmma") ----
// The warpgroup's m64nN f32 accumulators and its m64k8 tf32 A fragments from
// registers are, per warp, mma.sync m16n8k8's: d[j][e] is (row 16 w + g + 8
// (e / 2), column 8 j + 2q + e % 2) of the warpgroup's tile, so a StateTile
// is the m64n128 accumulator of its warpgroup's 64 rows. B comes from a
// cm_at array by a descriptor: no swizzle, leading byte offset 128 (the next
// 4 columns), stride byte offset `sbo` (the next 8 rows).
__device__ __forceinline__ unsigned long long cm_desc(const float* m, unsigned sbo) {
  const unsigned long long addr = __cvta_generic_to_shared(m);
  return ((addr & 0x3FFFFull) >> 4) | (8ull << 16) | (static_cast<unsigned long long>(sbo >> 4) << 32);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Until at most kPending of the committed groups are still running (their
// A registers and accumulators are the warpgroup's again after it).
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Pins an accumulator's registers at this point of the program: the
// compiler may not move a read of them above it (the wait before it does not
// name them, so a read of the last wgmma's output could otherwise be
// scheduled before the wait; ptxas then serializes every wgmma, C7514).
template <int kN>
__device__ __forceinline__ void pin_accumulator(float (&d)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(d[i][j])::"memory");
}
// d += a (rows x 8 columns of the contraction) x B (8 x n by desc), tf32 products, f32 sums.
__device__ __forceinline__ void wgmma_n64(float (&d)[8][4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                          unsigned long long desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}
__device__ __forceinline__ void wgmma_n128(float (&d)[16][4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                          unsigned long long desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}

__device__ __forceinline__ void wgmma_n16(float (&d)[2][4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                          unsigned long long desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}
// d += a x B over the chunk's tokens (n = kC: 8 tiles of 8 columns, or 2).
template <int kN>
__device__ __forceinline__ void wgmma_tokens(float (&d)[kN][4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             unsigned long long desc) {
  static_assert(kN == 8 || kN == 2, "chunks of 64 or 16 tokens");
  if constexpr (kN == 8) wgmma_n64(d, a0, a1, a2, a3, desc);
  else wgmma_n16(d, a0, a1, a2, a3, desc);
}

// Step 5 for the warpgroup of the warp of local value rows vl .. (its 4
// warps: 64 rows), the products of state_pass on wgmma: B read once per
// warpgroup from W, Q̂ ∘ Γ, A and KdT (cm_at), A operands from registers
// (the state tile, then Δ^T), d and o as m64n64 (m64n16) accumulators. Writes
// round_bf16(o) of the warp's rows to OB (route twopass: no Σ ob²).
template <class S>
__device__ __forceinline__ void state_pass_wg(const S& sm, StateTile& st, int vl) {
  float d[kC / 8][4], o[kC / 8][4];
  init_delta_out_all(sm, d, o, vl);
  // d = S W^T - U^T = -Δ^T and o = S Qg^T, over k: a group per 8 columns
  // of k, at most two in flight (each holds its 4 A registers until done).
#pragma unroll
  for (int kk = 0; kk < kD / 8; ++kk) {
    unsigned a[4];
    st.a_fragment(kk, a);
    wgmma_fence();
    wgmma_tokens(d, a[0], a[1], a[2], a[3], cm_desc(sm.W() + 64 * kk, kD / 4 * 128));
    wgmma_tokens(o, a[0], a[1], a[2], a[3], cm_desc(sm.Qg() + 64 * kk, kD / 4 * 128));
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  pin_accumulator(d);
  pin_accumulator(o);
  // S diag(Γ_C).
  unsigned da[kC / 8][4];
  delta_fragments(d, da);
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt) scale_by_gamma(sm, st.s[nt], nt);
  // o += Δ^T A^T (A is zero above its diagonal); S += Δ^T Kd.
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kC / 8; ++ks)
    wgmma_tokens(o, da[ks][0], da[ks][1], da[ks][2], da[ks][3], cm_desc(sm.A() + 64 * ks, kC / 4 * 128));
#pragma unroll
  for (int ks = 0; ks < kC / 8; ++ks)
    wgmma_n128(st.s, da[ks][0], da[ks][1], da[ks][2], da[ks][3], cm_desc(sm.KdT() + 64 * ks, kC / 4 * 128));
  wgmma_commit();
  wgmma_wait<0>();
  pin_accumulator(o);
  pin_accumulator(st.s);
  store_output(sm, o, vl);
}
#endif

// Step 5 on the warps that hold the CTA's state rows: on wgmma where the
// program has it (route twopass at P <= 2, rowcta; at P = 2 one of the two
// warpgroups holds rows, and state_warp is the same for the 4 warps of a
// warpgroup), else on mma.sync.
template <class S>
__device__ __forceinline__ void state_pass_own(const S& sm, StateTile& st, int vl) {
#if KDA_WGMMA
  state_pass_wg(sm, st, vl);
#else
  state_pass(sm, st, vl);
#endif
}

// Route twopass with P = 4 or 8 CTAs per (sequence, head) (kWg = P): the
// CTA's 128 / P value rows are 8 / P groups of 16 (group `grp` of the CTA,
// first value row vl), and the kWg warps of a group share its step 5. Each holds
// the group's whole state tile (as state_pass does) and computes the output
// and Δ^T tiles nt = sub, sub + kWg, ..; Δ^T goes through shared memory (DT)
// to every warp of the group; each scales its whole tile by Γ_C and stores
// Δ^T Kd of its column tiles sub, sub + kWg, .. (SS), which state_reload()
// adds to every warp's tile after the caller's barrier. DT lies past W and
// U^T in region 1, SS over M (both free in step 5). The products and their
// tf32 operands are state_pass's; the update adds Δ^T Kd to S diag(Γ_C)
// after summing it instead of accumulating onto it.
enum : int {
  kLdDT = kC + 8,                        // row stride (floats) of DT [v][t]
  kOffDT = kEndSolved,                   // f32 [8 / P][16][kLdDT]: Δ^T of each group (tf32-rounded)
  kOffSS = kOffM,                        // f32 [8 / P][16][kD]: each group's state, columns swizzled
};
static_assert(!kTwopass || (kOffDT % 16 == 0 && kOffDT + 2 * 16 * kLdDT * 4 <= kRegion1), "DT of two groups fits past U^T");
static_assert(!kTwopass || 2 * 16 * kD * 4 <= kC * kC * 4, "SS of two groups fits over M");
// SS element (r, c) of a group: 8-column group c / 8 XORed with r mod 8, so
// that a warp's pairs (g, 8 nt + 2q) fall in distinct banks.
__device__ __forceinline__ int ss_index(int r, int c) { return r * kD + (c ^ ((r & 7) << 3)); }

// `after_delta()` runs after the barrier that publishes Δ^T, when W, Q̂ ∘ Γ
// and U^T have no reader left (the next unit's first copies).
template <int kWg, class AfterDelta>
__device__ __forceinline__ void state_pass_shared(const Smem& sm, StateTile& st, int vl, int grp, int sub,
                                                  AfterDelta after_delta) {
  enum : int { kTiles = kC / 8 / kWg, kCols = kD / 8 / kWg };
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  float* DT = reinterpret_cast<float*>(sm.base + kOffDT) + grp * 16 * kLdDT;
  float* SS = reinterpret_cast<float*>(sm.base + kOffSS) + grp * 16 * kD;
  // d = S W^T - U^T = -Δ^T and o = S Qg^T of this warp's tiles, over k.
  float d[kTiles][4], o[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) init_delta_out(sm, d[j], o[j], vl, sub + kWg * j);
#pragma unroll
  for (int kk = 0; kk < kD / 8; ++kk) {
    unsigned a[4];
    st.a_fragment(kk, a);
#pragma unroll
    for (int j = 0; j < kTiles; ++j) add_state_products(sm, d[j], o[j], a, sub + kWg * j, kk);
  }
  // Δ^T (tf32-rounded, as state_pass's fragments) to DT, for every warp of the group.
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int nt = sub + kWg * j;
    *reinterpret_cast<float2*>(DT + g * kLdDT + 8 * nt + 2 * q) =
        make_float2(tf32_round(-d[j][0]), tf32_round(-d[j][1]));
    *reinterpret_cast<float2*>(DT + (g + 8) * kLdDT + 8 * nt + 2 * q) =
        make_float2(tf32_round(-d[j][2]), tf32_round(-d[j][3]));
  }
  __syncthreads();
  after_delta();
  unsigned da[kC / 8][4];
#pragma unroll
  for (int ks = 0; ks < kC / 8; ++ks) {
    const float2 lo = *reinterpret_cast<const float2*>(DT + g * kLdDT + 8 * ks + 2 * q);
    const float2 hi = *reinterpret_cast<const float2*>(DT + (g + 8) * kLdDT + 8 * ks + 2 * q);
    da[ks][0] = __float_as_uint(lo.x);
    da[ks][1] = __float_as_uint(hi.x);
    da[ks][2] = __float_as_uint(lo.y);
    da[ks][3] = __float_as_uint(hi.y);
  }
  // o += Δ^T A^T.
#pragma unroll
  for (int j = 0; j < kTiles; ++j) add_delta_a(sm, o[j], da, sub + kWg * j);
  // S <- S diag(Γ_C) + Δ^T Kd: the scaling on the whole tile, Δ^T Kd of this
  // warp's column tiles to SS.
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt) scale_by_gamma(sm, st.s[nt], nt);
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
    const int ct = sub + kWg * j;
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    add_delta_kd(sm, c, da, ct);
    *reinterpret_cast<float2*>(SS + ss_index(g, 8 * ct + 2 * q)) = make_float2(c[0], c[1]);
    *reinterpret_cast<float2*>(SS + ss_index(g + 8, 8 * ct + 2 * q)) = make_float2(c[2], c[3]);
  }
  // round_bf16(o) (rounding point 3) to OB.
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int nt = sub + kWg * j;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int t = 8 * nt + 2 * q + e;
      sm.ob()[t * kLdOb + vl + g] = f32_to_bf16(o[j][e]);
      sm.ob()[t * kLdOb + vl + g + 8] = f32_to_bf16(o[j][2 + e]);
    }
  }
}
// After the barrier that follows state_pass_shared: Δ^T Kd of every column
// tile added to the warp's scaled tile.
__device__ __forceinline__ void state_reload(const Smem& sm, StateTile& st, int grp) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const float* SS = reinterpret_cast<const float*>(sm.base + kOffSS) + grp * 16 * kD;
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt) {
    const float2 lo = *reinterpret_cast<const float2*>(SS + ss_index(g, 8 * nt + 2 * q));
    const float2 hi = *reinterpret_cast<const float2*>(SS + ss_index(g + 8, 8 * nt + 2 * q));
    st.s[nt][0] += lo.x;
    st.s[nt][1] += lo.y;
    st.s[nt][2] += hi.x;
    st.s[nt][3] += hi.y;
  }
}

// Step 6: the Σ ob² of each token over the 128 values (this CTA's warps, then
// the cluster's ranks), then y = ob / sqrt(mean + eps) * w * σ(gate) to the
// output rows of the chunk. `parity` alternates per chunk (the cluster buffer).
// `tid` is the thread's index among the kThreads that run it (threadIdx.x;
// route pipe16: its consumer's), Sync their barrier.
template <class Sync, class S>
__device__ __forceinline__ void norm_output(const KdaParams& p, const S& sm, int h, int v0, int rank,
                                            long long row0, int L, int parity, unsigned tid) {
  float* csum = sm.cluster_sum() + parity * kSplit * kC;
  if (tid < kC) {
    const int t = tid;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kSWarps; ++w) s += sm.warp_sum()[w * kC + t];
    if constexpr (kSplit == 1) {
      csum[t] = s;
    } else {
#pragma unroll
      for (int r = 0; r < kSplit; ++r) store_cluster_f32(csum + rank * kC + t, r, s);
    }
  }
  if constexpr (kSplit > 1) {
    cluster_arrive();
    cluster_wait();
  } else {
    Sync::sync();
  }
  // The output-gate loads in batches of up to 16, each issued before its first use.
  constexpr int kPer = kC * kVRows / kThreads, kBatch = kPer < 16 ? kPer : 16;
  for (int jb = 0; jb < kPer; jb += kBatch) {
    unsigned short ogb[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = tid + (jb + j) * kThreads, t = i / kVRows, vv = i % kVRows;
      if constexpr (S::kGateRows) ogb[j] = sm.gate_rows()[t * kD + v0 + vv];  // route pipe16: copied by the consumer
      else ogb[j] = p.output_gate[(row0 + (t < L ? t : 0)) * p.ogate_row_stride + h * kD + v0 + vv];
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = tid + (jb + j) * kThreads, t = i / kVRows, vv = i % kVRows;
      if (t >= L) continue;
      float tot = 0.f;
#pragma unroll
      for (int r = 0; r < kSplit; ++r) tot += csum[r * kC + t];
      const float rs = rsqrtf(tot * (1.0f / kD) + p.norm_eps);
      const float y = bf16_to_f32(sm.ob()[t * kLdOb + vv]) * rs * sm.normw()[v0 + vv] * sigmoid_ftz(bf16_to_f32(ogb[j]));
      p.output[(row0 + t) * p.out_row_stride + h * kD + v0 + vv] = f32_to_bf16(y);
    }
  }
}

// Step 6 of the chunk op: round_bf16(o) of the chunk's rows as they are,
// this CTA's values [c0, c1) (route twopass: its state rows' share; also the
// prefill op's input to its norm kernel, norm_rows). With 16-byte output
// rows (the pointer and the row stride; c0, c1 and v0 are multiples of 8,
// and c1 - c0 a power of two up to kVRows) a thread moves 8 values a store,
// groups = (c1 - c0) / 8 threads a row; else one value a store. `tid` as
// norm_output's.
template <class S>
__device__ __forceinline__ void plain_output(const KdaParams& p, const S& sm, int h, int v0, int c0, int c1,
                                             long long row0, int L, unsigned tid) {
  const int cols = c1 - c0;
  if (((reinterpret_cast<unsigned long long>(p.output) & 15) | (p.out_row_stride & 7)) == 0) {
    const int groups = cols / 8, g = tid & (groups - 1);
    kda_bf16_bits* out = p.output + h * kD + v0 + c0 + 8 * g;
    const unsigned short* ob = sm.ob() + c0 + 8 * g;
    for (int t = tid / groups; t < L; t += kThreads / groups)
      *reinterpret_cast<U4*>(out + (row0 + t) * p.out_row_stride) = *reinterpret_cast<const U4*>(ob + t * kLdOb);
    return;
  }
  for (int i = tid; i < L * cols; i += kThreads) {
    const int t = i / cols, vv = c0 + i % cols;
    p.output[(row0 + t) * p.out_row_stride + h * kD + v0 + vv] = sm.ob()[t * kLdOb + vv];
  }
}

// Output values [v0, v0 + kVRows) of head h for rows [r0, r1), clamped to the call's rows.
__device__ __forceinline__ void zero_output(const KdaParams& p, int h, long long r0, long long r1, int v0) {
  r0 = r0 < 0 ? 0 : r0;
  r1 = r1 > p.rows ? p.rows : r1;
  zero_rows(p, h, r0, r1, v0, kVRows);
}

// Steps 1-4 of the chunk of rows row0 = q0 + c0 .. row0 + L - 1: on return
// (after a barrier) W, U^T, Qg, KdT, A and Γ_C are in shared memory.
template <class S>
__device__ __forceinline__ void intra_chunk(const KdaParams& p, const S& sm, int h, int v0, long long q0,
                                            long long c0, int L, bool initial, long long cbase,
                                            const GateConstants& gate) {
  const long long row0 = q0 + c0;
  bool staged = false;
  if constexpr (S::kPrefetched) {  // route pipe16: the producers staged the chunk's inputs already, if they could
    staged = sm.staged;
    if (staged) {
      if constexpr (kChunk) load_gates_from_stage(p, sm, h, row0, L, gate);
      else conv_gates_from_stage(p, sm, h, row0, L, gate);
    }
  } else if constexpr (S::kStagedInputs && kVRows == kD) {  // route twopass (P = 1 here)
    if constexpr (kChunk) {
      staged = chunk_inputs_stageable(p);
      if (staged) load_gates_staged(p, sm, h, row0, L, gate);  // contains a barrier after step 1's stores
    } else {
      staged = inputs_stageable(p);
      if (staged) conv_gates_staged(p, sm, h, q0, c0, L, initial, cbase, gate);
    }
  }
  if (!staged) {
    if constexpr (kChunk) load_chunk(p, sm, h, v0, row0, L);
    else conv_chunk(p, sm, h, v0, q0, c0, L, initial, cbase);
    gates_chunk(p, sm, h, row0, L, gate);  // contains a barrier after step 1's stores
  }
  S::Sync::sync();
  const bool safe = factored_blocks_safe(sm);
  norm_scales(p, sm);
  const bool factored = S::Sync::sync_and(safe);
  if constexpr (!S::kLateOperands) scaled_operands<0>(sm);  // else in invert()
  if (factored) {
    factored_blocks(sm, false);
  } else {
    diagonal_blocks(sm);
    factored_blocks(sm, true);
  }
  S::Sync::sync();
  invert(sm);
  apply_inverse(sm);
  S::Sync::sync();
}

// ---- Route twopass (docs/DESIGN.md, "Route twopass") ----
// The intra-chunk kernel runs steps 1-4 of every chunk of the call at once,
// one CTA per (unit, head), and leaves each chunk's results in its unit of
// p.workspace; the state pass kernel (sequence() below) walks the chunks and
// copies them in instead of computing them. Chunk j of sequence n is unit
// unit_base(n) + j with unit_base(n) = n + floor(qsl[n] / C): for a
// non-decreasing query_start_loc every chunk of every live sequence has a
// unit of its own among the N + ceil(T_total / C) units. A unit starts with
// the (n, j) it holds, written by the intra-chunk kernel on every call for
// every unit ((-1, -1): none); the pass kernel computes a chunk whose unit does
// not hold it (a query_start_loc that is not non-decreasing) itself, so the
// route computes every call as the fused ones do.
enum : int {
  kUnitW = 16,                             // f32 [kC][kD] at cm_at; bytes 0..7: the (n, j) it holds
  kUnitUT = kUnitW + kC * kD * 4,          // f32 [kD][kC]
  kUnitQg = kUnitUT + kD * kC * 4,         // f32 [kC][kD] at cm_at
  kUnitKdT = kUnitQg + kC * kD * 4,        // f32 [kD][kC] at cm_at
  kUnitA = kUnitKdT + kD * kC * 4,         // f32 [kC][kC] at cm_at
  kUnitGammaC = kUnitA + kC * kC * 4,      // f32 [kD]
  kUnitBytes = (kUnitGammaC + kD * 4 + 127) / 128 * 128,
};
#if KDA_TWOPASS
static_assert(kUnitBytes == KDA_UNIT_BYTES, "the unit layout must match the runtime's workspace size (routes.hpp)");
static_assert(kSplit == 1, "route twopass runs one CTA per (sequence, head)");
#endif

__device__ __forceinline__ long long unit_count(const KdaParams& p) {
  return static_cast<long long>(p.num_seqs) + (p.rows + kC - 1) / kC;
}
__device__ __forceinline__ long long unit_base(const KdaParams& p, int n) {
  long long q = p.query_start_loc[n];
  q = q < 0 ? 0 : q > p.rows ? p.rows : q;
  return n + q / kC;
}
__device__ __forceinline__ unsigned char* unit_ptr(const KdaParams& p, long long u, int h) {
  return p.workspace + (u * gridDim.x + h) * static_cast<long long>(kUnitBytes);
}
// Bytes 8..11 of unit 0 of head 0: the call's flag, set when the state pass
// kernel computes a chunk whose unit does not hold it (norm_rows).
__device__ __forceinline__ int* twopass_flag(const KdaParams& p) { return reinterpret_cast<int*>(p.workspace) + 2; }
// Whether unit u of head h holds chunk j of sequence n (read by every thread).
__device__ __forceinline__ bool unit_holds(const KdaParams& p, long long u, int h, int n, long long j) {
  if (u < 0 || u >= unit_count(p)) return false;
  const int* tag = reinterpret_cast<const int*>(unit_ptr(p, u, h));
  return tag[0] == n && tag[1] == j;
}

// The intra-chunk kernel's shared memory: only what steps 1-4 read (115,456
// bytes: two CTAs per SM). What step 5 reads goes to the unit from the
// registers that compute it (put_*), so region 1 never holds W and U^T and
// nothing holds Qg, (K̂ ∘ Γ_C / Γ)^T or A. T swizzles its columns, since its
// rows are 64 floats (32 banks twice) with no room for padding.
enum : int {
  kIOffMq = 0,                            // bf16 [kC][kD]: m of q, element (t, c) at qk_at(t, c)
  kIOffMk = kIOffMq + kC * kD * 2,        // bf16 [kC][kD]: m of k, at qk_at
  kIOffMv = kIOffMk + kC * kD * 2,        // bf16 [kC][kVRows]: m of v, at v_at
  kIOffG = kIOffMv + kC * kVRows * 2,     // f32 [kC][kD]: cumulative log decay, at g_at
  kIOffM = kIOffG + kC * kD * 4,          // f32 [kC][kC]: M (strictly lower)
  kIOffT = kIOffM + kC * kC * 4,          // f32 [kC][kC]: (I + M)^-1, element (r, c) at t_at(r, c)
  kIOffRq = kIOffT + kC * kC * 4,         // f32 [kC]: q scale
  kIOffRk = kIOffRq + kC * 4,             // f32 [kC]: k scale
  kIOffBeta = kIOffRk + kC * 4,           // f32 [kC]: β
  kIntraSmemBytes = kIOffBeta + kC * 4,
};
static_assert(!kTwopass || kIOffM + kStageHistOff + 3 * kChans * 2 <= kIOffRq, "step 1's staged gates and history fit over M and T");
static_assert(!kTwopass || kIOffM + kC * kD * 4 <= kIOffRq, "the chunk op's staged f32 raw gates fit over M and T");
#if KDA_TWOPASS
static_assert(kIntraSmemBytes <= KDA_INTRA_SMEM_BYTES, "the intra-chunk layout must fit its launch's shared memory");
#endif

struct IntraSmem {
  unsigned char* base;
  unsigned char* unit;  // the unit this CTA fills
  __device__ unsigned short* mq() const { return reinterpret_cast<unsigned short*>(base + kIOffMq); }
  __device__ unsigned short* mk() const { return reinterpret_cast<unsigned short*>(base + kIOffMk); }
  __device__ unsigned short* mv() const { return reinterpret_cast<unsigned short*>(base + kIOffMv); }
  __device__ float* G() const { return reinterpret_cast<float*>(base + kIOffG); }
  __device__ float* M() const { return reinterpret_cast<float*>(base + kIOffM); }
  __device__ float* T() const { return reinterpret_cast<float*>(base + kIOffT); }
  __device__ float* rq() const { return reinterpret_cast<float*>(base + kIOffRq); }
  __device__ float* rk() const { return reinterpret_cast<float*>(base + kIOffRk); }
  __device__ float* beta() const { return reinterpret_cast<float*>(base + kIOffBeta); }
  // Step 1 copies the chunk's raw gates and the three x rows before it here,
  // over M and T (conv_gates_staged).
  static constexpr bool kStagedInputs = true;
  static constexpr bool kPrefetched = false;
  static constexpr bool kSplitBlock = false;
  using Sync = CtaSync;
  __device__ unsigned short* stage() const { return reinterpret_cast<unsigned short*>(base + kIOffM); }
  static constexpr bool kSolvedInRegion1 = false;
  static constexpr bool kRowTasks = true;  // step 3 in tasks of a row's blocks (factored_blocks)
  static constexpr bool kLateOperands = true;  // step 2 on warps 4-7 during the inverse's diagonal blocks
  static constexpr bool kGateFtz = true;  // the bounded gate's sigmoid as sigmoid_ftz (ex2 and rcp, .ftz)
  __device__ float* out(int off) const { return reinterpret_cast<float*>(unit + off); }
  __device__ void put_qg(int t, int k, float x) const { out(kUnitQg)[cm_at<kD>(t, k)] = x; }
  // Columns t0 .. t0 + 3 of row k (t0 a multiple of 4): cm_at puts the even
  // ones in a float2 (slots t0 % 8 / 2 ..) and the odd ones in the float2 32
  // floats on.
  __device__ void put_kdt4(int k, int t0, float4 x) const {
    float* cm = out(kUnitKdT) + cm_at<kC>(k, t0);
    *reinterpret_cast<float2*>(cm) = make_float2(x.x, x.z);
    *reinterpret_cast<float2*>(cm + 32) = make_float2(x.y, x.w);
  }
  __device__ void put_gamma_c(int k, float x) const { out(kUnitGammaC)[k] = x; }
  __device__ void put_a(int t, int s, float x) const { out(kUnitA)[cm_at<kC>(t, s)] = x; }
  // Elements (t, c), (t, c + 1) of W (c even: slots q and q + 4 of cm_at, 4
  // bytes each) and (v, t), (v, t + 1) of U^T (t even: 8 bytes).
  __device__ void put_w2(int t, int c, float x0, float x1) const {
    float* w = out(kUnitW) + cm_at<kD>(t, c);
    w[0] = x0;
    w[32] = x1;
  }
  __device__ void put_ut2(int v, int t, float x0, float x1) const {
    *reinterpret_cast<float2*>(out(kUnitUT) + v * kC + t) = make_float2(x0, x1);
  }
  // Row r's columns XOR 8 (r & 7): apply_inverse's float2 reads of rows g and
  // columns 8 ks + 2q fall in distinct banks per half-warp.
  __device__ int t_at(int r, int c) const { return r * kC + (c ^ ((r & 7) << 3)); }
};
// The state pass kernel's copies of a unit into the buffers step 5 reads (of
// U^T, the CTA's value rows [vlo, vhi)), by the bulk copy engine, a piece
// per thread: a row of U^T, or kCopyFloats of W, Q̂ ∘ Γ, KdT or A, whose
// layout (cm_at) is the same in the unit and in shared memory; in two parts:
// what d and o read first (W, U^T, Q̂ ∘ Γ), then the rest. Both complete one
// phase of sm.unit_bar(), whose bytes the first part announces; every thread
// of the CTA calls both parts, after the barrier that ends the buffers' last
// reads (each issuing thread orders those reads before its copy with a proxy
// fence).
// A piece of A is 8 rows (row block tb) by 16 columns (sub-chunk j); those
// with j > tb / 2, strictly above the diagonal sub-chunk blocks, the kernels
// never write (A is zero there): they are not copied, and the state pass
// zeroes them in its shared memory once (zero_a_upper), since step 5 on
// wgmma reads every element of A.
enum : int {
  kCopyFloats = 128,
  kCmPieces = kC * kD / kCopyFloats,
  kAPieces = (kC / 16) * (kC / 16 + 1),  // pieces with j <= tb / 2: 2 (1 + 2 + 3 + 4)
};
static_assert(!kTwopass || (kC == 64 && kCopyFloats == 128 && kAPieces == 20), "A's lower pieces as counted");
static_assert(2 * kCmPieces + kD <= kThreads && kCmPieces + kAPieces + 1 <= kThreads, "one piece of a part per thread");
__device__ __forceinline__ unsigned unit_copy_bytes(int vlo, int vhi) {
  return (2 * kC * kD + kD * kC + kAPieces * kCopyFloats + kD + (vhi - vlo) * kC) * 4;
}
// Lower piece i of A (0 <= i < kAPieces): its row block tb and sub-chunk j.
__device__ __forceinline__ int a_piece(int i) {
  int tb = 0;
  while (i >= tb / 2 + 1) i -= tb / 2 + 1, ++tb;
  return tb * (kC / 16) + i;  // the piece's index in A (4 pieces a row block)
}
__device__ __forceinline__ void zero_a_upper(const Smem& sm) {
  for (int e = threadIdx.x; e < kC * kC; e += kThreads) {
    const int piece = e / kCopyFloats, tb = piece / (kC / 16), j = piece % (kC / 16);
    if (j > tb / 2) sm.A()[e] = 0.f;
  }
}
__device__ __forceinline__ void unit_row_copy(float* dst, const unsigned char* unit, int off, int cols,
                                              unsigned long long* bar) {
  fence_proxy_async();
  bulk_copy_to_smem(dst, unit + off, cols * 4, bar);
}
__device__ __forceinline__ void load_unit_first(const Smem& sm, const unsigned char* unit, int vlo, int vhi) {
  unsigned long long* bar = sm.unit_bar();
  if (threadIdx.x == 0) mbar_arrive_expect_tx(bar, unit_copy_bytes(vlo, vhi));
  const int r = threadIdx.x, rows = vhi - vlo;  // W's pieces, U^T's rows [vlo, vhi), Q̂ ∘ Γ's pieces
  constexpr int f = kCopyFloats;
  if (r < kCmPieces) unit_row_copy(sm.W() + r * f, unit, kUnitW + r * f * 4, f, bar);
  else if (r < kCmPieces + rows)
    unit_row_copy(sm.UT() + (vlo + r - kCmPieces) * kLdT, unit, kUnitUT + (vlo + r - kCmPieces) * kC * 4, kC, bar);
  else if (r < 2 * kCmPieces + rows)
    unit_row_copy(sm.Qg() + (r - kCmPieces - rows) * f, unit, kUnitQg + (r - kCmPieces - rows) * f * 4, f, bar);
}
__device__ __forceinline__ void load_unit_rest(const Smem& sm, const unsigned char* unit) {
  unsigned long long* bar = sm.unit_bar();
  const int r = threadIdx.x;  // KdT's pieces, A's, Γ_C
  constexpr int f = kCopyFloats;
  if (r < kCmPieces) unit_row_copy(sm.KdT() + r * f, unit, kUnitKdT + r * f * 4, f, bar);
  else if (r < kCmPieces + kAPieces) {
    const int piece = a_piece(r - kCmPieces);
    unit_row_copy(sm.A() + piece * f, unit, kUnitA + piece * f * 4, f, bar);
  }
  else if (r == kCmPieces + kAPieces) unit_row_copy(sm.gammaC(), unit, kUnitGammaC, kD, bar);
}
__device__ __forceinline__ void load_unit_async(const Smem& sm, const unsigned char* unit, int vlo, int vhi) {
  load_unit_first(sm, unit, vlo, vhi);
  load_unit_rest(sm, unit);
}

// The rows of the chunk that starts c0 rows into a sequence of len rows (in
// the callers' own integer types: the consumer's int arithmetic stays 32-bit).
template <class I, class J>
__device__ __forceinline__ int chunk_len(I len, J c0) {
  return static_cast<int>(len - c0 < kC ? len - c0 : kC);
}
// Whether sequence n computes its rows (a well-formed, non-empty range and a
// valid slot; the chunk op: a well-formed range, empty ones included, whose
// final state is its initial one).
__device__ __forceinline__ bool sequence_live(const KdaParams& p, int q0, int q1, int slot) {
  return kChunk ? 0 <= q0 && q0 <= q1 && q1 <= p.rows
                : 0 <= q0 && q0 < q1 && q1 <= p.rows && slot_valid(slot, p.num_slots);
}

// The intra-chunk kernel on head h: units u = blockIdx.y, + gridDim.y, ..;
// the sequence of a unit is the last n with unit_base(n) <= u (a binary
// search over query_start_loc).
__device__ __forceinline__ void intra_units(const KdaParams& p, unsigned char* smem, int h) {
  const long long units = unit_count(p);
  const GateConstants gate = gate_constants(p, h);
  for (long long u = blockIdx.y; u < units; u += gridDim.y) {
    unsigned char* unit = unit_ptr(p, u, h);
    const IntraSmem sm{smem, unit};
    int n = -1, q0 = 0, q1 = 0, slot = 0;
    long long j = -1;
    if (p.num_seqs > 0) {
      int lo = 0, hi = p.num_seqs - 1;
      while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (unit_base(p, mid) <= u) lo = mid;
        else hi = mid - 1;
      }
      q0 = p.query_start_loc[lo];
      q1 = p.query_start_loc[lo + 1];
      slot = kChunk ? lo : p.state_indices[lo];
      j = u - unit_base(p, lo);
      if (sequence_live(p, q0, q1, slot) && j >= 0 && j * kC < static_cast<long long>(q1) - q0) n = lo;
    }
    // The tag first: its readers (the state pass and norm kernels) run after this kernel.
    if (threadIdx.x == 0) {
      int* tag = reinterpret_cast<int*>(unit);
      tag[0] = n;
      tag[1] = n >= 0 ? static_cast<int>(j) : -1;
      if (u == 0 && h == 0) tag[2] = 0;  // the call's flag (norm_rows): no chunk without its unit yet
    }
    if (n >= 0) {
      const bool initial = kChunk ? p.state != nullptr : p.has_initial_state == nullptr || p.has_initial_state[n] != 0;
      const long long c0 = j * kC, len = static_cast<long long>(q1) - q0;
      const int L = chunk_len(len, c0);
      intra_chunk(p, sm, h, 0, q0, c0, L, initial, static_cast<long long>(slot) * p.conv_slot_stride, gate);
    }
    __syncthreads();  // every thread is done with this unit's buffers
  }
}

// One sequence on this CTA. Route twopass runs gridDim.z CTAs per (sequence,
// head) without a cluster: CTA z holds the state rows of the warps w with
// w * gridDim.z / 8 == z (value rows [vlo, vhi)); its steps 1-4 are the intra-
// chunk kernel's (or its own over all 128 value rows), and the norm is the
// norm kernel's, so nothing else crosses value rows.
__device__ __forceinline__ void sequence(const KdaParams& p, const Smem& sm, int n, int h, int rank) {
  const int v0 = rank * kVRows;
  const int part = kTwopass ? static_cast<int>(blockIdx.z) : 0, parts = kTwopass ? static_cast<int>(gridDim.z) : 1;
  const int vlo = 16 * ((part * kSWarps + parts - 1) / parts), vhi = 16 * (((part + 1) * kSWarps + parts - 1) / parts);
  const bool lead = rank == 0 && part == 0;  // the (sequence, head)'s zero rows and its count
  const int q0 = p.query_start_loc[n], q1 = p.query_start_loc[n + 1];
  // The chunk op's sequence n has dense state n and no slot.
  const int slot = kChunk ? n : p.state_indices[n];
  if (part == 0) {
    if (n == 0) zero_output(p, h, 0, q0, v0);
    if (n == p.num_seqs - 1) zero_output(p, h, q1, p.rows, v0);
  }
  if (!kChunk && slot >= p.num_slots && h == 0 && lead && threadIdx.x == 0 && p.oob_counter != nullptr)
    atomicAdd(p.oob_counter, 1);
  // A sequence computes its rows when it is live: a well-formed, non-empty
  // range and a valid slot (the chunk op: a well-formed range, empty ones
  // included, whose final state is its initial one). Otherwise its range,
  // clamped to the call's rows, is zeros; with the rows before qsl[0] and
  // after qsl[N] that covers every row no live sequence computes (an ascending
  // path from qsl[0] to qsl[N] steps over every row between them).
  const bool live = sequence_live(p, q0, q1, slot);
  if (!live) {
    if (part == 0) zero_output(p, h, q0, q1, v0);
    return;
  }
  const bool initial =
      kChunk ? p.state != nullptr : p.has_initial_state == nullptr || p.has_initial_state[n] != 0;
  const long long len = q1 - q0;

  // Per-thread constants: the gate's (gate_constants()); norm_weight into
  // shared memory (the fused routes' step 6).
  const int warp = threadIdx.x >> 5;
  const long long cbase = static_cast<long long>(slot) * p.conv_slot_stride;
  const GateConstants gate = gate_constants(p, h);
  if (!kChunk && !kTwopass && threadIdx.x < kD) sm.normw()[threadIdx.x] = p.norm_weight[threadIdx.x];

  StateTile st;
  // Route twopass at P = 4 or 8: kWg = P warps share each 16-row group's step 5
  // (state_pass_shared; `grp` the group in the CTA, `sub` the warp in it).
  const int wg = kTwopass && (parts == 4 || parts == 8) ? parts : 1;
  const int grp = warp / wg, sub = warp % wg;
  const bool state_warp = kTwopass ? wg > 1 || (16 * warp >= vlo && 16 * warp < vhi) : warp < kSWarps;
  const bool store_warp = state_warp && sub == 0;  // one warp of each group writes the state back
  const int vrow = wg > 1 ? vlo + 16 * grp : v0 + 16 * warp;
  if (state_warp) {
    if (initial) {
      state_load(p, slot, h, vrow, st);
    } else {
#pragma unroll
      for (int nt = 0; nt < kD / 8; ++nt) st.s[nt][0] = st.s[nt][1] = st.s[nt][2] = st.s[nt][3] = 0.f;
    }
  }

  int parity = 0;
  // Route twopass: whether the current chunk's unit holds it (its copy then
  // already issued, during the previous chunk's output), and the parity of
  // the unit copies' next phase. The mbarrier starts afresh for each
  // sequence: no copy of the previous one is in flight (its last chunk had
  // none, and every thread has passed the barrier after it).
  bool loaded = false;
  unsigned unit_phase = 0;
  if (kTwopass && threadIdx.x == 0) {
    mbar_init(sm.unit_bar());
    mbar_init_fence();
  }
  if constexpr (kTwopass || kWgmma) {
    // A's pieces above the diagonal sub-chunk blocks, which no step writes
    // and no unit copies: zero for step 5 on wgmma, which reads all of A.
    zero_a_upper(sm);
    fence_proxy_async();
    __syncthreads();
  }
  if constexpr (kTwopass) {
    loaded = len > 0 && unit_holds(p, unit_base(p, n), h, n, 0);
    if (loaded) load_unit_async(sm, unit_ptr(p, unit_base(p, n), h), vlo, vhi);
  }
  for (long long c0 = 0; c0 < len; c0 += kC) {
    const long long row0 = q0 + c0;
    const int L = chunk_len(len, c0);
    if (kTwopass && part == 0 && threadIdx.x == 0 && c0 + kC < len) {
      // The next chunk's unit into the L2 while this one computes: its copies
      // after step 5 (P CTAs of this head) then wait on the L2, not on HBM.
      const long long u = unit_base(p, n) + c0 / kC + 1;
      if (u < unit_count(p)) prefetch_l2(unit_ptr(p, u, h), kUnitBytes);
    }
    if (kTwopass && loaded) {
      mbar_wait(sm.unit_bar(), unit_phase);  // this thread sees every byte of the unit
      unit_phase ^= 1;
    } else {
      intra_chunk(p, sm, h, v0, q0, c0, L, initial, cbase, gate);
      // Route twopass: a later unit's bulk copies overwrite what this thread
      // just wrote, ordered before them by this fence and the barriers in
      // between. On wgmma: step 5 reads W, Q̂ ∘ Γ, A and KdT through the
      // async proxy, after every thread's fence and a barrier.
      if constexpr (kTwopass || kWgmma) fence_proxy_async();
      if (kTwopass && threadIdx.x == 0) *twopass_flag(p) = 1;  // a chunk without its unit: the norm kernel walks
      if constexpr (kWgmma) __syncthreads();
    }
    // Route twopass: the next chunk's unit, when it holds that chunk. At P = 4
    // or 8 its first part is copied as soon as step 5 has published Δ^T.
    const unsigned char* next = nullptr;
    if constexpr (kTwopass) {
      const long long u = unit_base(p, n) + c0 / kC + 1;
      if (c0 + kC < len && unit_holds(p, u, h, n, c0 / kC + 1)) next = unit_ptr(p, u, h);
    }
    const auto first_part = [&] {
      if (next != nullptr) load_unit_first(sm, next, vlo, vhi);
    };
    if constexpr (kTwopass) {
      if (wg == 8) state_pass_shared<8>(sm, st, vrow, grp, sub, first_part);
      else if (wg == 4) state_pass_shared<4>(sm, st, vrow, grp, sub, first_part);
      else if (state_warp) state_pass_own(sm, st, 16 * warp);
    } else if (state_warp) {
      state_pass_own(sm, st, 16 * warp);
    }
    __syncthreads();
    if constexpr (kTwopass) {
      if (wg > 1) state_reload(sm, st, grp);
      // Step 5 is done with the buffers the next unit fills; the output reads none of them.
      loaded = next != nullptr;
      if (loaded && wg > 1) load_unit_rest(sm, next);
      else if (loaded) load_unit_async(sm, next, vlo, vhi);
      plain_output(p, sm, h, 0, vlo, vhi, row0, L, threadIdx.x);
    } else if constexpr (kChunk) {
      plain_output(p, sm, h, v0, 0, kVRows, row0, L, threadIdx.x);
    } else {
      norm_output<CtaSync>(p, sm, h, v0, rank, row0, L, parity, threadIdx.x);
    }
    __syncthreads();  // OB, the sums and region 1 are reused by the next chunk
    parity ^= 1;
  }

  if constexpr (kChunk) {
    if (store_warp && p.final_state != nullptr) state_store(p, p.final_state, p.final_slot_stride, slot, h, vrow, st);
  } else {
    if (store_warp) state_store(p, p.state, p.state_slot_stride, slot, h, vrow, st);
    // Route twopass: the norm kernel writes the conv window, after every read of it.
    if constexpr (!kTwopass) conv_state_out(p, h, v0, rank, q0, len, initial, cbase);
  }
}

// Route twopass, prefill op: the norm kernel. The state pass kernel stored
// round_bf16(o) of every live sequence's rows (plain_output); this kernel, in
// stream order after it, turns each such row of head h into y = o / sqrt(mean
// o² + eps) * w * σ(gate) (step 6 for every row at once, a warp per row, lane
// l on values 4 l .. 4 l + 3), and writes each live sequence's conv window,
// after the intra-chunk kernel and the state pass kernel's steps 1-4 have
// read it. Its grid is the intra-chunk kernel's: CTA y takes units y, y +
// gridDim.y, .., and each unit's tag (written by the intra-chunk kernel of
// this call) names the chunk (n, j) whose rows it normalizes, warp w its rows
// w, w + 8, ..; the CTA holding a sequence's last chunk writes its window.
// That covers every live sequence's rows exactly when every chunk has its
// unit. When one has not (a query_start_loc that is not non-decreasing), the
// state pass kernel sets the call's flag (unit 0 of head 0, bytes 8..11, which
// the intra-chunk kernel clears) and this kernel walks the sequences instead:
// CTA y takes rows q0 + 8 y + w + 8 k gridDim.y of each live sequence and the
// window of sequences n = y mod gridDim.y, the sequences read kNormStage at a
// time into shared memory.
enum : int { kNormStage = kThreads, kNormBatch = 4 };
// Rows r, r + step, .. below r1 of head h on one warp, the loads of
// kNormBatch rows issued before the first is used.
__device__ __forceinline__ void norm_warp_rows(const KdaParams& p, int h, long long r, long long r1, long long step,
                                               const float (&w)[4], bool vec) {
  const int v = 4 * (threadIdx.x & 31);
  for (; r < r1; r += kNormBatch * step) {
    float o[kNormBatch][4], g[kNormBatch][4];
#pragma unroll
    for (int b = 0; b < kNormBatch; ++b) {
      const long long rb = r + b * step < r1 ? r + b * step : r;  // past r1: row r again, not stored
      const kda_bf16_bits* out = p.output + rb * p.out_row_stride + h * kD + v;
      const kda_bf16_bits* og = p.output_gate + rb * p.ogate_row_stride + h * kD + v;
      if (vec) {
        const U2 a = *reinterpret_cast<const U2*>(out), c = *reinterpret_cast<const U2*>(og);
        o[b][0] = bf16lo_to_f32(a.x), o[b][1] = bf16hi_to_f32(a.x), o[b][2] = bf16lo_to_f32(a.y),
        o[b][3] = bf16hi_to_f32(a.y);
        g[b][0] = bf16lo_to_f32(c.x), g[b][1] = bf16hi_to_f32(c.x), g[b][2] = bf16lo_to_f32(c.y),
        g[b][3] = bf16hi_to_f32(c.y);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[b][e] = bf16_to_f32(out[e]), g[b][e] = bf16_to_f32(og[e]);
      }
    }
#pragma unroll
    for (int b = 0; b < kNormBatch; ++b) {
      if (r + b * step >= r1) break;  // the same for every lane
      kda_bf16_bits* out = p.output + (r + b * step) * p.out_row_stride + h * kD + v;
      const float rs = rsqrtf(
          warp_sum(o[b][0] * o[b][0] + o[b][1] * o[b][1] + o[b][2] * o[b][2] + o[b][3] * o[b][3]) * (1.0f / kD) +
          p.norm_eps);
      float y[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) y[e] = o[b][e] * rs * w[e] * sigmoid_ftz(g[b][e]);
      if (vec) {
        *reinterpret_cast<U2*>(out) = U2{pack_bf16x2(y[0], y[1]), pack_bf16x2(y[2], y[3])};
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) out[e] = f32_to_bf16(y[e]);
      }
    }
  }
}
__device__ __forceinline__ void norm_window(const KdaParams& p, int h, int n, int q0, int q1, int slot) {
  const bool initial = p.has_initial_state == nullptr || p.has_initial_state[n] != 0;
  conv_state_out(p, h, 0, 0, q0, static_cast<long long>(q1) - q0, initial,
                 static_cast<long long>(slot) * p.conv_slot_stride);
}
__device__ __forceinline__ void norm_rows(const KdaParams& p, int h) {
  __shared__ int qsl[kNormStage + 1], slots[kNormStage];
  const int warp = threadIdx.x >> 5, v = 4 * (threadIdx.x & 31);
  const bool vec = ((reinterpret_cast<unsigned long long>(p.output) |
                     reinterpret_cast<unsigned long long>(p.output_gate) |
                     static_cast<unsigned long long>(p.out_row_stride) * 2 |
                     static_cast<unsigned long long>(p.ogate_row_stride) * 2) &
                    7) == 0;
  float w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = p.norm_weight[v + i];
  if (*twopass_flag(p) == 0) {
    const long long units = unit_count(p);
    for (long long u = blockIdx.y; u < units; u += gridDim.y) {
      const int* tag = reinterpret_cast<const int*>(unit_ptr(p, u, h));
      const int n = tag[0];
      if (n < 0) continue;  // the tag is the same for every thread
      const int q0 = p.query_start_loc[n], q1 = p.query_start_loc[n + 1];
      const long long r0 = q0 + static_cast<long long>(tag[1]) * kC, r1 = r0 + kC < q1 ? r0 + kC : q1;
      norm_warp_rows(p, h, r0 + warp, r1, kWarps, w, vec);
      if (r1 == q1) norm_window(p, h, n, q0, q1, p.state_indices[n]);
    }
    return;
  }
  const long long step = static_cast<long long>(gridDim.y) * kWarps;
  int owner = 0;  // the CTA that writes sequence n's conv window: n mod gridDim.y
  for (int n0 = 0; n0 < p.num_seqs; n0 += kNormStage) {
    const int count = p.num_seqs - n0 < kNormStage ? p.num_seqs - n0 : kNormStage;
    __syncthreads();  // the previous stage's reads are done
    if (static_cast<int>(threadIdx.x) <= count) qsl[threadIdx.x] = p.query_start_loc[n0 + threadIdx.x];
    if (static_cast<int>(threadIdx.x) < count) slots[threadIdx.x] = p.state_indices[n0 + threadIdx.x];
    if (threadIdx.x == 0 && count == kNormStage) qsl[kNormStage] = p.query_start_loc[n0 + kNormStage];
    __syncthreads();
    for (int i = 0; i < count; ++i) {
      const int n = n0 + i;
      const int q0 = qsl[i], q1 = qsl[i + 1];
      const int slot = slots[i];
      const bool window = owner == static_cast<int>(blockIdx.y);
      if (++owner == static_cast<int>(gridDim.y)) owner = 0;
      if (!sequence_live(p, q0, q1, slot)) continue;
      norm_warp_rows(p, h, q0 + static_cast<long long>(blockIdx.y) * kWarps + warp, q1, step, w, vec);
      if (window) norm_window(p, h, n, q0, q1, slot);
    }
  }
}

}  // namespace prefill
}  // namespace kda

#if KDA_CHUNK
#define KDA_PREFILL_ENTRY kda_chunk
#else
#define KDA_PREFILL_ENTRY kda_prefill
#endif
#if !KDA_PIPE
extern "C" __global__ void __launch_bounds__(KDA_THREADS, 1) KDA_PREFILL_ENTRY(const __grid_constant__ KdaParams p) {
  extern __shared__ __align__(16) unsigned char kda_smem[];
  const kda::prefill::Smem sm{kda_smem};
  const int h = blockIdx.x;
  const int rank = KDA_SPLIT > 1 ? kda::cluster_rank() : 0;
  const int wave = gridDim.y / KDA_SPLIT;
  kda::pdl_wait();
  if (KDA_SPLIT > 1) {
    // Every rank of the cluster runs before any rank stores into its shared memory.
    kda::cluster_arrive_relaxed();
    kda::cluster_wait();
  }
  for (int n = blockIdx.y / KDA_SPLIT; n < p.num_seqs; n += wave) {
    kda::prefill::sequence(p, sm, n, h, rank);
    __syncthreads();
  }
}
#endif

#if KDA_TWOPASS
#if KDA_CHUNK
#define KDA_INTRA_ENTRY kda_chunk_intra
#else
#define KDA_INTRA_ENTRY kda_prefill_intra
#endif
// Route twopass, launched before KDA_PREFILL_ENTRY on the same stream: grid
// (H, min(units, 65535)), the same block, KDA_INTRA_SMEM_BYTES of dynamic
// shared memory, two CTAs per SM.
extern "C" __global__ void __launch_bounds__(KDA_THREADS, 2) KDA_INTRA_ENTRY(const __grid_constant__ KdaParams p) {
  extern __shared__ __align__(16) unsigned char kda_smem[];
  kda::pdl_wait();
  kda::prefill::intra_units(p, kda_smem, blockIdx.x);
}
#if !KDA_CHUNK
// Route twopass, prefill op: launched after kda_prefill on the same stream:
// grid (H, min(ceil(T_total / 32), 65535)), the same block, no dynamic shared
// memory.
extern "C" __global__ void __launch_bounds__(KDA_THREADS) kda_prefill_norm(const __grid_constant__ KdaParams p) {
  kda::pdl_wait();
  kda::prefill::norm_rows(p, blockIdx.x);
}
#endif
#endif
