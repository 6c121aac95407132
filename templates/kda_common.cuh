// Device building blocks of the fused KDA decode kernels (contract:
// shared/spec/kda-decode.md, design: shared/design/kernels.md).
//
// One CTA works on one (row, head) [single op] or one (sequence, head) [packed
// op]. kda_decode_head() is that work for up to KDA_T tokens of one sequence;
// the single op is the T = 1 case of it (spec 4: "T = 1 through the packed op
// equals the single-token op").
//
// NVRTC compiles this with no include path: no toolkit or std header here.
#ifndef KDAJIT_KDA_COMMON_CUH
#define KDAJIT_KDA_COMMON_CUH

#include "kda_params.h"

#ifndef KDA_HEADS
#define KDA_HEADS 64  // hole: heads H (1..128)
#endif
#ifndef KDA_STATE_BF16
#define KDA_STATE_BF16 0  // hole: state dtype, 0 = f32, 1 = bf16
#endif
#ifndef KDA_CONV_DS
#define KDA_CONV_DS 0  // hole: conv_state layout, 0 = SD (taps slow), 1 = DS (taps contiguous)
#endif
#ifndef KDA_GATE_SOFTPLUS
#define KDA_GATE_SOFTPLUS 0  // hole: gate, 0 = bounded, 1 = softplus (Kimi-Linear)
#endif
#ifndef KDA_THREADS
#define KDA_THREADS 256  // hole: threads per block (256, 512 or 1024)
#endif
// Occupancy floor for ptxas: two CTAs per SM (256 threads: <= 128 registers,
// 512 threads: <= 64), so one CTA's math overlaps the other's state traffic.
#define KDA_MIN_CTAS_PER_SM (KDA_THREADS >= 1024 ? 1 : 2)

#ifndef KDA_T
#error "KDA_T (tokens per sequence) must be defined before kda_common.cuh"
#endif

namespace kda {

// Compile-time constants are enumerators of one enum (so that they mix in
// arithmetic without enum-enum conversions): under NVRTC's -default-device a
// namespace-scope constexpr variable would also be emitted as a __device__ global.
//
// State tile: which part of the 128x128 [v][k] state a thread holds. f32: a
// row is 512 bytes, one 16-byte load per lane covers it (lane owns k =
// 4*lane..+3). bf16: a row is 256 bytes, 16 lanes cover it with 8 k each, so
// one warp instruction reads two adjacent rows (lane / 16 picks the row).
// Warp w owns rows w*kRowsPerWarp .. +kRowsPerWarp-1.
//
// Phase A: conv channel c = j*128 + d of the head (j = 0 q, 1 k, 2 v) belongs
// to thread c % kThreads in round c / kThreads; the staging of per-token
// inputs walks (t, c) and (t, k) pairs over all threads.
enum : int {
  kD = 128,  // head dim (k and v)
  kW = 4,    // conv width
  kHeads = KDA_HEADS,
  kHidden = kHeads * kD,
  kQkv = 3 * kHidden,
  kTokens = KDA_T,
  kTaps = kTokens + kW - 2,  // K: conv_state taps per channel
  kThreads = KDA_THREADS,
  kWarps = kThreads / 32,

  kStateBytes = KDA_STATE_BF16 ? 2 : 4,
  kLanesPerRow = KDA_STATE_BF16 ? 16 : 32,
  kKPerLane = kD / kLanesPerRow,      // 4 (f32) or 8 (bf16)
  kRowsPerWarp = kD / kWarps,         // 16 with 8 warps
  kRowsPerInstr = 32 / kLanesPerRow,  // 1 (f32) or 2 (bf16)
  kRowsPerLane = kRowsPerWarp / kRowsPerInstr,
  kSliceRowStride = kRowsPerInstr * kD * kStateBytes / 16,  // in 16-byte units, between a thread's rows

  // conv_state element of (channel c, tap t) in a slot: c*kConvChanStride + t*kConvTapStride.
  // SD: strides (1, qkv), taps slow; DS: strides (K, 1), taps contiguous.
  kConvChanStride = KDA_CONV_DS ? kTaps : 1,
  kConvTapStride = KDA_CONV_DS ? 1 : kQkv,
  kConvRounds = (3 * kD + kThreads - 1) / kThreads,
};
enum : unsigned { kFull = 0xffffffffu };

static_assert(kHeads >= 1 && kHeads <= 128, "KDA_HEADS must be in 1..128");
static_assert(kTokens >= 1 && kTokens <= 16, "KDA_T must be in 1..16");
// 128 threads would hold 128 state values per thread: far past the register budget.
static_assert(kThreads == 256 || kThreads == 512 || kThreads == 1024, "KDA_THREADS must be 256, 512 or 1024");
static_assert(kKPerLane * kStateBytes == 16, "one 16-byte access per lane and row");
static_assert(kRowsPerLane >= 2 && kRowsPerLane % 2 == 0, "the fused first butterfly step pairs rows");

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

// ---- scalar math: accurate expf/log1pf (no fast-math intrinsics) ----
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float softplus(float g) { return g > 20.0f ? g : log1pf(expf(g)); }

// decay_k = exp(gv) for the gate logit g = raw_gate + dt_bias (spec 2, step 4).
__device__ __forceinline__ float gate_decay(float g, float A, float lower_bound) {
#if KDA_GATE_SOFTPLUS
  (void)lower_bound;
  return expf(-A * softplus(g));
#else
  return expf(lower_bound * sigmoid(A * g));
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

__device__ __forceinline__ bool slot_valid(int s, int num_slots) { return s > 0 && s < num_slots; }

// Element offset of tap t of channel c inside one conv_state slot.
__device__ __forceinline__ int conv_tap_offset(int c, int t) { return c * kConvChanStride + t * kConvTapStride; }

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

// ---- shared memory of one CTA ----
// m holds the conv+SiLU outputs, which are bf16-exact (rounding point 1), so
// they are kept as bf16 bits; everything not rounded by the spec stays f32.
template <int TT>
struct Smem {
  float decay[TT][kD];      // g = raw_gate + dt_bias (A0), then decay_k (A1)
  float sig_ogate[TT][kD];  // output_gate (A0), then its sigmoid (A1)
  float delta[kD];          // delta_v of the current token (each warp its rows)
  float norm_w[kD];         // norm_weight
  float beta[TT];
  __align__(16) unsigned short m[TT][3 * kD];  // x (A0), then m = SiLU(conv) (A1): q | k | v, bf16 bits
  __align__(16) unsigned short ob[TT][kD];     // round_bf16(o), bf16 bits
};

// ---- state slice I/O: 16-byte accesses only ----
// Row i of this thread is v = warp*kRowsPerWarp + i*kRowsPerInstr + lane/kLanesPerRow,
// its k range starts at (lane % kLanesPerRow) * kKPerLane.
__device__ __forceinline__ int state_row(int warp, int lane, int i) {
  return warp * kRowsPerWarp + i * kRowsPerInstr + lane / kLanesPerRow;
}

// The thread's slice of head h of state slot `slot`, as raw 32-bit words.
// 16-byte accesses: the host must reject a state pointer or slot stride
// (in bytes) that is not a multiple of 16.
__device__ __forceinline__ U4* state_slice(const KdaParams& p, int slot, int h, int warp, int lane) {
  char* base = static_cast<char*>(p.state) +
               (static_cast<long long>(slot) * p.state_slot_stride +
                static_cast<long long>(h * kD + state_row(warp, lane, 0)) * kD + (lane % kLanesPerRow) * kKPerLane) *
                   kStateBytes;
  return reinterpret_cast<U4*>(base);
}

__device__ __forceinline__ void state_load(const KdaParams& p, int slot, int h, int warp, int lane,
                                           U4 (&raw)[kRowsPerLane]) {
  const U4* src = state_slice(p, slot, h, warp, lane);
#pragma unroll
  for (int i = 0; i < kRowsPerLane; ++i) raw[i] = src[i * kSliceRowStride];
}

__device__ __forceinline__ void state_unpack(const U4 (&raw)[kRowsPerLane], float (&s)[kRowsPerLane][kKPerLane]) {
#pragma unroll
  for (int i = 0; i < kRowsPerLane; ++i) {
    const unsigned w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#if KDA_STATE_BF16
      s[i][2 * j] = bf16lo_to_f32(w[j]);
      s[i][2 * j + 1] = bf16hi_to_f32(w[j]);
#else
      s[i][j] = __uint_as_float(w[j]);
#endif
    }
  }
}

// Stores the f32 carry; bf16 state is rounded here (rounding point 2).
__device__ __forceinline__ void state_store(const KdaParams& p, int slot, int h, int warp, int lane,
                                            const float (&s)[kRowsPerLane][kKPerLane]) {
  U4* dst = state_slice(p, slot, h, warp, lane);
#pragma unroll
  for (int i = 0; i < kRowsPerLane; ++i) {
    unsigned w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#if KDA_STATE_BF16
      w[j] = pack_bf16x2(s[i][2 * j], s[i][2 * j + 1]);
#else
      w[j] = __float_as_uint(s[i][j]);
#endif
    }
    dst[i * kSliceRowStride] = U4{w[0], w[1], w[2], w[3]};
  }
}

// ---- the work of one (sequence, head) ----
// h: head. row0, L: the sequence's rows row0 .. row0+L-1 (1 <= L <= TT, all < R).
// conv_slot, tap0: conv history = taps tap0..tap0+2 of conv_state[conv_slot].
// src_slot: state slot the recurrence starts from. ckpt_lane: lane t (< TT)
// holds the checkpoint slot of token t; S is stored there after token t when
// that slot is valid. All slots the caller passes as conv/src are valid.
//
// Ordering (single op, repeated slots): every state element and conv tap is
// read and written by the same thread with the same mapping on every call, and
// each call ends its shared-memory use before the caller's __syncthreads, so a
// CTA can walk rows that share a slot one after another.
template <int TT>
__device__ __forceinline__ void kda_decode_head(const KdaParams& p, Smem<TT>& sm, int h, long long row0, int L,
                                                int conv_slot, int tap0, int src_slot, int ckpt_lane) {
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;

  // Issue the whole state slice first; phase A runs while it is in flight.
  U4 raw[kRowsPerLane];
  state_load(p, src_slot, h, warp, lane, raw);

  // ---- phase A0: issue every other load; stage per-token inputs in smem ----
  // Loads and stores only (plus a few scalar ops), so the loads of all
  // tokens are in flight together while the code stays small for any T.
  const long long cbase = static_cast<long long>(conv_slot) * p.conv_slot_stride;
  unsigned short taps[kConvRounds][3];  // conv history of this thread's channels
  float wts[kConvRounds][kW];
#pragma unroll
  for (int r = 0; r < kConvRounds; ++r) {
    const int c = tid + r * kThreads;
    if (c < 3 * kD) {
      const int chan = (c / kD) * kHidden + h * kD + c % kD;  // j*hidden + h*D + d
#pragma unroll
      for (int w = 0; w < 3; ++w) taps[r][w] = p.conv_state[cbase + conv_tap_offset(chan, tap0 + w)];
#pragma unroll
      for (int w = 0; w < kW; ++w)  // weight [j][w][h*D + d] at (j*W + w)*hidden + h*D + d
        wts[r][w] = p.conv_weight[((c / kD) * kW + w) * kHidden + h * kD + c % kD];
    }
  }
#pragma unroll
  for (int r = 0; r < (TT * 3 * kD + kThreads - 1) / kThreads; ++r) {
    const int item = tid + r * kThreads;
    const int t = item / (3 * kD);
    const int c = item % (3 * kD);
    if (t < L) sm.m[t][c] = p.x[(row0 + t) * p.x_row_stride + (c / kD) * kHidden + h * kD + c % kD];
  }
  {
    // kThreads is a multiple of kD, so this thread always stages the same k.
    const int k = tid % kD;
    const float bias = p.dt_bias[h * kD + k];
#pragma unroll
    for (int r = 0; r < (TT * kD + kThreads - 1) / kThreads; ++r) {
      const int t = (tid + r * kThreads) / kD;
      if (t < L) {
        const long long row = row0 + t;
        sm.decay[t][k] = bf16_to_f32(p.raw_gate[row * p.gate_row_stride + h * kD + k]) + bias;  // g
        sm.sig_ogate[t][k] = bf16_to_f32(p.output_gate[row * p.ogate_row_stride + h * kD + k]);
      }
    }
  }
  if (tid < kD) sm.norm_w[tid] = p.norm_weight[tid];
  if (tid < L) sm.beta[tid] = sigmoid(bf16_to_f32(p.raw_beta[(row0 + tid) * p.beta_row_stride + h]));
  const float A = expf(p.A_log[h]);
  __syncthreads();

  // ---- phase A1: conv + SiLU per channel, gates per (t, k), in place ----
#pragma unroll
  for (int r = 0; r < kConvRounds; ++r) {
    const int c = tid + r * kThreads;
    if (c < 3 * kD) {
      const int chan = (c / kD) * kHidden + h * kD + c % kD;
      unsigned short* cs = p.conv_state + cbase;
      // The window slides one tap per token (step 1); the new window is written
      // back as positions 0..L+1 = (tap0+1, tap0+2, x_0 .. x_{L-1}); positions
      // above stay untouched. Every tap was read in A0, before any write.
      float h0 = bf16_to_f32(taps[r][0]), h1 = bf16_to_f32(taps[r][1]), h2 = bf16_to_f32(taps[r][2]);
      cs[conv_tap_offset(chan, 0)] = taps[r][1];
      cs[conv_tap_offset(chan, 1)] = taps[r][2];
#pragma unroll 2
      for (int t = 0; t < L; ++t) {
        const unsigned short xb = sm.m[t][c];
        const float x = bf16_to_f32(xb);
        float a = wts[r][0] * h0;
        a = fmaf(wts[r][1], h1, a);
        a = fmaf(wts[r][2], h2, a);
        a = fmaf(wts[r][3], x, a);
        sm.m[t][c] = f32_to_bf16(a * sigmoid(a));  // rounding point 1
        cs[conv_tap_offset(chan, t + 2)] = xb;
        h0 = h1;
        h1 = h2;
        h2 = x;
      }
    }
  }
  // Gate items start at the threads the conv leaves idle (thread (384 + i) % kThreads).
  for (int item = (tid + kThreads - (3 * kD) % kThreads) % kThreads; item < L * kD; item += kThreads) {
    const int t = item / kD;
    const int k = item % kD;
    sm.decay[t][k] = gate_decay(sm.decay[t][k], A, p.lower_bound);
    sm.sig_ogate[t][k] = sigmoid(sm.sig_ogate[t][k]);
  }
  __syncthreads();

  // ---- phase B: the delta rule, per token, each warp on its own rows ----
  // Nothing in registers is indexed by t, so the token loop stays rolled
  // (code size and compile time independent of T).
  float s[kRowsPerLane][kKPerLane];
  state_unpack(raw, s);
  const int k0 = (lane % kLanesPerRow) * kKPerLane;
  constexpr int kVals = 2 * kRowsPerLane;  // S'k and S'q of every row
  constexpr int kFinal = kVals >= kLanesPerRow ? kVals / kLanesPerRow : 1;
  const int glane = lane % kLanesPerRow;
#pragma unroll 1
  for (int t = 0; t < L; ++t) {
    const float beta = sm.beta[t];
    // This lane's k range of the raw (un-normalized) q and k and of decay.
    float mq[kKPerLane], mk[kKPerLane], dec[kKPerLane];
    load_bf16_vec(&sm.m[t][k0], mq);
    load_bf16_vec(&sm.m[t][kD + k0], mk);
#pragma unroll
    for (int j = 0; j < kKPerLane; ++j) dec[j] = sm.decay[t][k0 + j];
    // q.q, k.k and q.k over all 128 k: every lane group holds a full copy of
    // q and k, so each warp reduces them itself, no block barrier needed.
    float qq = 0.f, kk = 0.f, qk = 0.f;
#pragma unroll
    for (int j = 0; j < kKPerLane; ++j) {
      qq = fmaf(mq[j], mq[j], qq);
      kk = fmaf(mk[j], mk[j], kk);
      qk = fmaf(mq[j], mk[j], qk);
    }
#pragma unroll
    for (int off = kLanesPerRow / 2; off >= 1; off >>= 1) {
      qq += __shfl_xor_sync(kFull, qq, off);
      kk += __shfl_xor_sync(kFull, kk, off);
      qk += __shfl_xor_sync(kFull, qk, off);
    }
    // The dot products below use raw q and k; the norms scale them afterwards.
    const float rq = rsqrtf(qq + 1e-6f) * 0.08838834764831845f;  // l2norm * D^-1/2
    const float rk = rsqrtf(kk + 1e-6f);
    qk *= rq * rk;  // q.k of the normalized vectors

    // S' = S * decay, then per row the partial dot products S'k and S'q over
    // this lane's k: value 2i is S'k, value 2i+1 is S'q of row i. The first
    // butterfly step is fused in (rows i and i + kRowsPerLane/2 pair up there),
    // so only half of the values are ever live next to the state.
    float vals[kVals / 2];
    {
      constexpr int kHalfRows = kRowsPerLane / 2;
      const bool upper = (lane & (kLanesPerRow / 2)) != 0;
#pragma unroll
      for (int i = 0; i < kHalfRows; ++i) {
        float part[2][2];  // [row i | row i + kHalfRows][S'k | S'q]
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          float u = 0.f, w = 0.f;
#pragma unroll
          for (int j = 0; j < kKPerLane; ++j) {
            s[i + b * kHalfRows][j] *= dec[j];
            u = fmaf(s[i + b * kHalfRows][j], mk[j], u);
            w = fmaf(s[i + b * kHalfRows][j], mq[j], w);
          }
          part[b][0] = u;
          part[b][1] = w;
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float send = upper ? part[0][e] : part[1][e];
          const float keep = upper ? part[1][e] : part[0][e];
          vals[2 * i + e] = keep + __shfl_xor_sync(kFull, send, kLanesPerRow / 2);
        }
      }
    }
    butterfly_sum<kVals / 2, kLanesPerRow / 4>(vals, lane);

    // delta_v = beta (v_v - u_v), published to the warp through shared memory.
#pragma unroll
    for (int f = 0; f < kFinal; ++f) {
      const int idx = kVals >= kLanesPerRow ? glane * kFinal + f : glane / (kLanesPerRow / kVals);
      if ((idx & 1) == 0) {
        const int v = state_row(warp, lane, idx >> 1);
        sm.delta[v] = beta * (bf16_to_f32(sm.m[t][2 * kD + v]) - vals[f] * rk);
      }
    }
    __syncwarp();
    // o_v = S''q = S'q + delta_v (k.q); ob = round_bf16(o) (rounding point 3).
#pragma unroll
    for (int f = 0; f < kFinal; ++f) {
      const int idx = kVals >= kLanesPerRow ? glane * kFinal + f : glane / (kLanesPerRow / kVals);
      if ((idx & 1) == 1) {
        const int v = state_row(warp, lane, idx >> 1);
        sm.ob[t][v] = f32_to_bf16(fmaf(sm.delta[v], qk, vals[f] * rq));
      }
    }
    // S'' = S' + delta_v k_k.
#pragma unroll
    for (int j = 0; j < kKPerLane; ++j) mk[j] *= rk;
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {
      const float dv = sm.delta[state_row(warp, lane, i)];
#pragma unroll
      for (int j = 0; j < kKPerLane; ++j) s[i][j] = fmaf(dv, mk[j], s[i][j]);
    }
    __syncwarp();  // all lanes have read delta before the next token rewrites it

    const int ck = __shfl_sync(kFull, ckpt_lane, t);
    if (slot_valid(ck, p.num_slots)) state_store(p, ck, h, warp, lane, s);
  }
  __syncthreads();

  // ---- phase C: gated RMSNorm and output, one warp per token ----
#pragma unroll
  for (int round = 0; round < (TT + kWarps - 1) / kWarps; ++round) {
    const int t = warp + round * kWarps;
    if (t < L) {
      float ob[kD / 32];
      float ss = 0.f;
#pragma unroll
      for (int e = 0; e < kD / 32; ++e) {
        ob[e] = bf16_to_f32(sm.ob[t][lane + 32 * e]);
        ss = fmaf(ob[e], ob[e], ss);
      }
      ss = warp_sum(ss);
      const float rn = rsqrtf(ss * (1.0f / kD) + p.norm_eps);
      unsigned short* out = p.output + (row0 + t) * p.out_row_stride + h * kD;
#pragma unroll
      for (int e = 0; e < kD / 32; ++e) {
        const int v = lane + 32 * e;
        out[v] = f32_to_bf16(ob[e] * rn * sm.norm_w[v] * sm.sig_ogate[t][v]);  // rounding point 4
      }
    }
  }
}

// Zeros output rows [r0, r1) of head h (null slot, non-live sequence, tail rows).
__device__ __forceinline__ void zero_rows(const KdaParams& p, int h, long long r0, long long r1) {
  if (r1 <= r0) return;
  const long long n = (r1 - r0) * kD;
  for (long long i = threadIdx.x; i < n; i += kThreads)
    p.output[(r0 + i / kD) * p.out_row_stride + h * kD + (i % kD)] = 0;
}

}  // namespace kda

#endif  // KDAJIT_KDA_COMMON_CUH
