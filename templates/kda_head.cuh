// The work of one (row or sequence, head) on one CTA, or on one CTA of a
// cluster of KDA_SPLIT that share the head's 128 value rows: the technique of
// the rowcta, sequential and split routes (docs/CONTRACT.md §2, §4; design
// notes in docs/DESIGN.md).
//
// kda_decode_head() does up to KDA_T tokens of one sequence; the single op is
// the T = 1 case of it (§4: "T = 1 through the packed op equals the
// single-token op").
//
// Value split (KDA_SPLIT = C > 1, both ops): cluster rank r owns value rows
// v0 = r*128/C .. v0 + 128/C - 1 of the state, the checkpoints, the output and
// the v channels of the conv. Every rank computes the q and k conv outputs (all
// 128 k are needed by every value row) but writes back only its share of their
// history, after a cluster barrier that follows every rank's reads. Each
// token's RMSNorm sum over the 128 values crosses the cluster through
// distributed shared memory.
//
// One file of ~580 lines on purpose: phases A0, A1, B and C of an item share
// one register tile, the staged inputs and the order of their loads, barriers
// and stores (the split's cluster exchange included); each phase is one
// function below, and the stream route reuses B and C from here.
#ifndef KDAJIT_KDA_HEAD_CUH
#define KDAJIT_KDA_HEAD_CUH

#include "kda_params.h"
#include "kda_primitives.cuh"

namespace kda {

// State tile: which part of the [v][k] state a thread holds. f32: a row is 512
// bytes, one 16-byte load per lane covers it (lane owns k = 4*lane..+3). bf16: a
// row is 256 bytes, 16 lanes cover it with 8 k each, so one warp instruction
// reads two adjacent rows (lane / 16 picks the row). Warp w owns rows
// v0 + w*kRowsPerWarp .. +kRowsPerWarp-1 of this CTA's kVRows.
//
// Conv: this CTA's channels are the 256 q and k channels of the head and its
// kVRows v channels; local channel c belongs to thread c % kThreads in round
// c / kThreads.
enum : int {
  kVRows = kD / kSplit,  // value rows of this CTA
  kStateBytes = KDA_STATE_BF16 ? 2 : 4,
  kLanesPerRow = KDA_STATE_BF16 ? 16 : 32,
  kKPerLane = kD / kLanesPerRow,      // 4 (f32) or 8 (bf16)
  kRowsPerWarp = kVRows / kWarps,     // 16 with 8 warps and no split
  kRowsPerInstr = 32 / kLanesPerRow,  // 1 (f32) or 2 (bf16)
  kRowsPerLane = kRowsPerWarp / kRowsPerInstr,
  kSliceRowStride = kRowsPerInstr * kD * kStateBytes / 16,  // in 16-byte units, between a thread's rows

  kChans = 2 * kD + kVRows,  // conv channels of this CTA
  kConvRounds = (kChans + kThreads - 1) / kThreads,
  kQkPerRank = 2 * kD / kSplit,  // q/k channels whose history one rank writes back
};

static_assert(kKPerLane * kStateBytes == 16, "one 16-byte access per lane and row");
static_assert(kRowsPerLane >= 2 && kRowsPerLane % 2 == 0, "the fused first butterfly step pairs rows");

// ---- shared memory of one CTA ----
// m holds the conv+SiLU outputs, which are bf16-exact (rounding point 1), so
// they are kept as bf16 bits; everything not rounded by the contract stays f32.
// Arrays over v are indexed by the absolute value row (a split CTA fills its slice).
template <int TT>
struct Smem {
  float decay[TT][kD];      // g = raw_gate + dt_bias (A0), then decay_k (A1)
  float sig_ogate[TT][kD];  // output_gate (A0), then its sigmoid (A1)
  float delta[kD];          // delta_v of the current token (each warp its rows)
  float norm_w[kD];         // norm_weight
  float beta[TT];
  float norm_part[TT][kSplit];  // split: each rank's sum of ob^2 per token, sent by that rank
  unsigned long long norm_bar;  // split: counts norm_part's arrivals (split_init, phase C)
  __align__(16) unsigned short m[TT][3 * kD];  // x (A0), then m = SiLU(conv) (A1): q | k | v, bf16 bits
  __align__(16) unsigned short ob[TT][kD];     // round_bf16(o), bf16 bits
};

// Split kernels, once before their first item: the mbarrier of the RMSNorm
// exchange (phase C), kThreads arrivals a phase. The init is released to the
// cluster before this thread's first cluster arrive (phase A1 of the first
// item), and no rank sends a partial before that barrier's wait.
template <int TT>
__device__ __forceinline__ void split_init(Smem<TT>& sm) {
  if (threadIdx.x == 0) {
    mbar_init(&sm.norm_bar, kThreads);
    mbar_init_fence();
  }
  __syncthreads();
}

// Channel of the head (j*128 + d, j = 0 q, 1 k, 2 v) of local conv channel c.
__device__ __forceinline__ int head_channel(int c, int v0) { return c < 2 * kD ? c : v0 + c; }

// ---- state slice I/O: 16-byte accesses only ----
// Row i of this thread is v = v0 + warp*kRowsPerWarp + i*kRowsPerInstr + lane/kLanesPerRow,
// its k range starts at (lane % kLanesPerRow) * kKPerLane.
__device__ __forceinline__ int state_row(int v0, int warp, int lane, int i) {
  return v0 + warp * kRowsPerWarp + i * kRowsPerInstr + lane / kLanesPerRow;
}

// The thread's slice of head h of state slot `slot`, as 16-byte units. The host
// rejects a state pointer or slot stride (in bytes) that is not a multiple of 16.
__device__ __forceinline__ U4* state_slice(const KdaParams& p, int slot, int h, int v0, int warp, int lane) {
  char* base = static_cast<char*>(p.state) +
               (static_cast<long long>(slot) * p.state_slot_stride +
                static_cast<long long>(h * kD + state_row(v0, warp, lane, 0)) * kD +
                (lane % kLanesPerRow) * kKPerLane) *
                   kStateBytes;
  return reinterpret_cast<U4*>(base);
}

__device__ __forceinline__ void state_load(const KdaParams& p, int slot, int h, int v0, int warp, int lane,
                                           U4 (&raw)[kRowsPerLane]) {
  const U4* src = state_slice(p, slot, h, v0, warp, lane);
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
__device__ __forceinline__ void state_store(const KdaParams& p, int slot, int h, int v0, int warp, int lane,
                                            const float (&s)[kRowsPerLane][kKPerLane]) {
  U4* dst = state_slice(p, slot, h, v0, warp, lane);
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

// The 16-byte unit of a thread's first row inside a [kVRows][kD] slice laid
// out as in global memory (a shared-memory stage holds one such slice).
__device__ __forceinline__ int slice_unit(int warp, int lane) {
  return ((warp * kRowsPerWarp + lane / kLanesPerRow) * kD + (lane % kLanesPerRow) * kKPerLane) * kStateBytes / 16;
}

// ---- the phases of one (sequence, head), shared by every route ----
// A: conv + SiLU per channel and the gates per (t, k) into Smem; B: the delta
// rule over the tokens on the state slice in registers; C: gated RMSNorm and
// the output. kda_decode_head() runs them in order on one CTA (rowcta,
// sequential, split); route stream pipelines them over items (kda_pipeline.cuh).

// Conv + SiLU of one channel over tokens 0..L-1 (§2 step 1) with history
// (h0, h1, h2) = its taps tap0..tap0+2 and weights w: x(t) gives token t's
// input bits, out(t, x bits, m bits) takes m_t = round_bf16(SiLU(conv))
// (rounding point 1). The window slides one tap per token.
template <class X, class Out>
__device__ __forceinline__ void conv_silu(const float (&w)[kW], float h0, float h1, float h2, int L, X&& x, Out&& out) {
#pragma unroll 2
  for (int t = 0; t < L; ++t) {
    const unsigned short xb = x(t);
    const float xt = bf16_to_f32(xb);
    float a = w[0] * h0;
    a = fmaf(w[1], h1, a);
    a = fmaf(w[2], h2, a);
    a = fmaf(w[3], xt, a);
    out(t, xb, f32_to_bf16(a * sigmoid(a)));
    h0 = h1;
    h1 = h2;
    h2 = xt;
  }
}

// Phase B: the delta rule, per token, each warp on its own rows of the state
// slice `raw` (this thread's part, as state_load() leaves it); token t's state
// is stored to slot ckpt(t) when that slot is valid (ckpt is called with the
// same t on every thread). Reads
// Smem's m, decay and beta, writes delta and ob. Nothing in registers is
// indexed by t, so the token loop stays rolled (code size and compile time
// independent of T).
template <int TT, class Ckpt>
__device__ __forceinline__ void head_delta_rule(const KdaParams& p, Smem<TT>& sm, int h, int L, Ckpt&& ckpt, int v0,
                                                const U4 (&raw)[kRowsPerLane]) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
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
        const int v = state_row(v0, warp, lane, idx >> 1);
        sm.delta[v] = beta * (bf16_to_f32(sm.m[t][2 * kD + v]) - vals[f] * rk);
      }
    }
    __syncwarp();
    // o_v = S''q = S'q + delta_v (k.q); ob = round_bf16(o) (rounding point 3).
#pragma unroll
    for (int f = 0; f < kFinal; ++f) {
      const int idx = kVals >= kLanesPerRow ? glane * kFinal + f : glane / (kLanesPerRow / kVals);
      if ((idx & 1) == 1) {
        const int v = state_row(v0, warp, lane, idx >> 1);
        sm.ob[t][v] = f32_to_bf16(fmaf(sm.delta[v], qk, vals[f] * rq));
      }
    }
    // S'' = S' + delta_v k_k.
#pragma unroll
    for (int j = 0; j < kKPerLane; ++j) mk[j] *= rk;
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {
      const float dv = sm.delta[state_row(v0, warp, lane, i)];
#pragma unroll
      for (int j = 0; j < kKPerLane; ++j) s[i][j] = fmaf(dv, mk[j], s[i][j]);
    }
    __syncwarp();  // all lanes have read delta before the next token rewrites it

    const int ck = ckpt(t);
    if (slot_valid(ck, p.num_slots)) state_store(p, ck, h, v0, warp, lane, s);
  }
}

// Phase C without a split: gated RMSNorm of each token's ob and the output
// rows row0 .. row0+L-1 of head h, warp w on tokens w, w + kWarps, ...
template <int TT>
__device__ __forceinline__ void head_norm_output(const KdaParams& p, const Smem<TT>& sm, int h, long long row0, int L) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
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

// ---- the work of one (sequence, head) on one CTA ----
// h: head. row0, L: the sequence's rows row0 .. row0+L-1 (1 <= L <= TT, all < R).
// conv_slot, tap0: conv history = taps tap0..tap0+2 of conv_state[conv_slot].
// src_slot: state slot the recurrence starts from. ckpt_lane: lane t (< TT)
// holds the checkpoint slot of token t; S is stored there after token t when
// that slot is valid. All slots the caller passes as conv/src are valid.
// rank: this CTA's cluster rank (0 without a split); every rank of a cluster
// calls this with the same arguments.
//
// Ordering (single op, repeated slots): every state element and conv tap is
// read and written by the same thread with the same mapping on every call, and
// each call ends its shared-memory use before the caller's __syncthreads, so a
// CTA can walk rows that share a slot one after another.
template <int TT>
__device__ __forceinline__ void kda_decode_head(const KdaParams& p, Smem<TT>& sm, int h, long long row0, int L,
                                                int conv_slot, int tap0, int src_slot, int ckpt_lane, int rank) {
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int v0 = rank * kVRows;

  // T >= 5: the whole state slice first; phase A runs while it is in flight.
  // (T <= 4: after the per-token inputs, below.)
  constexpr bool kInputsFirst = TT <= 4;
  U4 raw[kRowsPerLane];
  if constexpr (!kInputsFirst) state_load(p, src_slot, h, v0, warp, lane, raw);

  // ---- phase A0: issue every other load; stage per-token inputs in smem ----
  // Loads and stores only (plus a few scalar ops), so the loads of all
  // tokens are in flight together while the code stays small for any T.
  const long long cbase = static_cast<long long>(conv_slot) * p.conv_slot_stride;
  unsigned short taps[kConvRounds][3];  // conv history of this thread's channels
  float wts[kConvRounds][kW];
#pragma unroll
  for (int r = 0; r < kConvRounds; ++r) {
    const int c = tid + r * kThreads;
    if (c < kChans) {
      const int hc = head_channel(c, v0);
      const int chan = (hc / kD) * hidden(p) + h * kD + hc % kD;  // j*hidden + h*D + d
#pragma unroll
      for (int w = 0; w < 3; ++w) taps[r][w] = p.conv_state[cbase + conv_tap_offset(p, chan, tap0 + w)];
#pragma unroll
      for (int w = 0; w < kW; ++w)  // weight [j][w][h*D + d] at (j*W + w)*hidden + h*D + d
        wts[r][w] = p.conv_weight[((hc / kD) * kW + w) * hidden(p) + h * kD + hc % kD];
    }
  }
  // T <= 4: the per-token inputs into registers, then the state slice, then
  // their stores into Smem. The inputs are a few KB and phase A needs all of
  // them; the slice (32 or 64 KB per CTA) is not read before phase B. Issued
  // first, it holds the inputs behind it in the memory queues; issued after
  // the stores, it waits for the inputs (this order: rowcta 1-18% faster, the
  // split 6-16%). A thread past the last token loads token L-1 again and
  // stores nothing: the loads stay out of the stores' branches, which would
  // keep them behind the first store. T >= 5 keeps the slice first: held in
  // registers, its inputs spill at T = 7 with 512 threads, and T = 5..8 are
  // not timed this way.
  float A;  // exp(A_log)
  if constexpr (kInputsFirst) {
    constexpr int kXRounds = (TT * kChans + kThreads - 1) / kThreads;
    constexpr int kGateRounds = (TT * kD + kThreads - 1) / kThreads;
    unsigned short xin[kXRounds], gin[kGateRounds], ogin[kGateRounds];
#pragma unroll
    for (int r = 0; r < kXRounds; ++r) {
      const int item = tid + r * kThreads;
      const long long row = row0 + min(item / kChans, L - 1);
      const int hc = head_channel(item % kChans, v0);
      xin[r] = load_u16_in_order(&p.x[row * p.x_row_stride + (hc / kD) * hidden(p) + h * kD + hc % kD]);
    }
    // kThreads is a multiple of kD, so this thread always stages the same k.
    const int gk = tid % kD;
    const float bias = p.dt_bias[h * kD + gk];
#pragma unroll
    for (int r = 0; r < kGateRounds; ++r) {
      const long long row = row0 + min((tid + r * kThreads) / kD, L - 1);
      gin[r] = load_u16_in_order(&p.raw_gate[row * p.gate_row_stride + h * kD + gk]);
      ogin[r] = load_u16_in_order(&p.output_gate[row * p.ogate_row_stride + h * kD + gk]);
    }
    const float norm_w = tid < kD ? p.norm_weight[tid] : 0.f;
    const unsigned short beta_in = tid < L ? p.raw_beta[(row0 + tid) * p.beta_row_stride + h] : 0;
    const float A_log = p.A_log[h];
    state_load(p, src_slot, h, v0, warp, lane, raw);
#pragma unroll
    for (int r = 0; r < kXRounds; ++r) {
      const int item = tid + r * kThreads;
      const int t = item / kChans;
      store_shared_if(t < L, &sm.m[min(t, TT - 1)][head_channel(item % kChans, v0)], xin[r]);
    }
#pragma unroll
    for (int r = 0; r < kGateRounds; ++r) {
      const int t = (tid + r * kThreads) / kD;
      store_shared_if(t < L, &sm.decay[min(t, TT - 1)][gk], bf16_to_f32(gin[r]) + bias);  // g
      store_shared_if(t < L, &sm.sig_ogate[min(t, TT - 1)][gk], bf16_to_f32(ogin[r]));
    }
    store_shared_if(tid < kD, &sm.norm_w[tid % kD], norm_w);
    store_shared_if(tid < L, &sm.beta[min(tid, TT - 1)], sigmoid(bf16_to_f32(beta_in)));
    A = expf(A_log);
  } else {
#pragma unroll
    for (int r = 0; r < (TT * kChans + kThreads - 1) / kThreads; ++r) {
      const int item = tid + r * kThreads;
      const int t = item / kChans;
      const int hc = head_channel(item % kChans, v0);
      if (t < L) sm.m[t][hc] = p.x[(row0 + t) * p.x_row_stride + (hc / kD) * hidden(p) + h * kD + hc % kD];
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
    A = expf(p.A_log[h]);
  }
  __syncthreads();

  // ---- phase A1: conv + SiLU per channel, gates per (t, k), in place ----
  unsigned short last_x[kConvRounds];  // split: the newest tap, written after the cluster barrier
#pragma unroll
  for (int r = 0; r < kConvRounds; ++r) {
    const int c = tid + r * kThreads;
    last_x[r] = 0;
    if (c < kChans) {
      const int hc = head_channel(c, v0);
      const int chan = (hc / kD) * hidden(p) + h * kD + hc % kD;
      unsigned short* cs = p.conv_state + cbase;
      // The new window is written back as positions 0..L+1 = (tap0+1, tap0+2,
      // x_0 .. x_{L-1}); positions above stay untouched. Every tap was read in
      // A0, before any write.
      if constexpr (kSplit == 1) {
        cs[conv_tap_offset(p, chan, 0)] = taps[r][1];
        cs[conv_tap_offset(p, chan, 1)] = taps[r][2];
      }
      conv_silu(
          wts[r], bf16_to_f32(taps[r][0]), bf16_to_f32(taps[r][1]), bf16_to_f32(taps[r][2]), L,
          [&](int t) { return sm.m[t][hc]; },
          [&](int t, unsigned short xb, unsigned short m) {
            sm.m[t][hc] = m;
            if constexpr (kSplit == 1) cs[conv_tap_offset(p, chan, t + 2)] = xb;
            last_x[r] = xb;
          });
    }
  }
  // Split: every rank has read its taps; the barrier completes after phase B,
  // before any rank overwrites history another rank read. T <= 4: the arrive
  // is relaxed (a release would wait for the state slice, issued after the
  // inputs and still in flight): the taps' loads are complete here, since the
  // conv above consumed their values before this thread's shared stores of m,
  // which come before the arrive. T >= 5 (slice first, already landed) keeps
  // the release arrive and the exchange below (A/B: the relaxed arrive and
  // st.async exchange make split4 at T = 8 5% slower, T <= 4 3-6% faster).
  if constexpr (kSplit > 1) {
    if constexpr (kInputsFirst) cluster_arrive_relaxed();
    else cluster_arrive();
  }
  // Gate items start at the threads the conv leaves idle (thread (kChans + i) % kThreads).
  for (int item = (tid + kThreads - kChans % kThreads) % kThreads; item < L * kD; item += kThreads) {
    const int t = item / kD;
    const int k = item % kD;
    sm.decay[t][k] = gate_decay(sm.decay[t][k], A, p.lower_bound);
    sm.sig_ogate[t][k] = sigmoid(sm.sig_ogate[t][k]);
  }
  __syncthreads();

  // ---- phase B ----
  head_delta_rule<TT>(p, sm, h, L, [&](int t) { return __shfl_sync(kFull, ckpt_lane, t); }, v0, raw);
  // The next kernel on the stream may start its prologue (PDL; a no-op otherwise).
  pdl_launch_dependents();
  __syncthreads();

  // ---- phase C: gated RMSNorm and output ----
  if constexpr (kSplit == 1) {
    head_norm_output<TT>(p, sm, h, row0, L);
  } else {
    // Split: the conv history first (every rank read its taps before the
    // barrier that started after phase A1), then the RMSNorm sums: the warp of
    // token t sends its slice's sum of ob_t^2 into slot [t][rank] of every
    // rank, and each rank adds the kSplit partials in rank order (the same sum
    // everywhere). T <= 4: by st.async, counted on that rank's norm_bar; every
    // thread arrives on norm_bar, whose phase also waits for the L x kSplit
    // partials sent here, and the warps of the tokens wait for it, so a CTA
    // exits only after every partial sent to it has landed. The next item's
    // partials are sent after the next item's cluster barrier, which this CTA
    // reaches only after that wait (the __syncthreads between items). T >= 5:
    // by distributed shared-memory stores and a second cluster barrier.
    cluster_wait();
#pragma unroll
    for (int r = 0; r < kConvRounds; ++r) {
      const int c = tid + r * kThreads;
      if (c < kChans && (c >= 2 * kD || c / kQkPerRank == rank)) {
        const int hc = head_channel(c, v0);
        const int chan = (hc / kD) * hidden(p) + h * kD + hc % kD;
        unsigned short* cs = p.conv_state + cbase;
        // Positions 0..L+1 = (tap0+1, tap0+2, x_0 .. x_{L-1}); A1 overwrote
        // the staged x with m, so x_0 .. x_{L-2} are read again (L2 hits).
        cs[conv_tap_offset(p, chan, 0)] = taps[r][1];
        cs[conv_tap_offset(p, chan, 1)] = taps[r][2];
        for (int t = 0; t + 1 < L; ++t) cs[conv_tap_offset(p, chan, t + 2)] = p.x[(row0 + t) * p.x_row_stride + chan];
        cs[conv_tap_offset(p, chan, L + 1)] = last_x[r];
      }
    }
    constexpr int kPerLane = kVRows / 32;
    constexpr int kRounds = (TT + kWarps - 1) / kWarps;
    float ob[kRounds][kPerLane];
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      const int t = warp + round * kWarps;
      if (t < L) {
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
          ob[round][e] = bf16_to_f32(sm.ob[t][v0 + lane + 32 * e]);
          ss = fmaf(ob[round][e], ob[round][e], ss);
        }
        ss = warp_sum(ss);
        if (lane < kSplit) {
          if constexpr (kInputsFirst) store_async_cluster_f32(&sm.norm_part[t][rank], &sm.norm_bar, lane, ss);
          else store_cluster_f32(&sm.norm_part[t][rank], lane, ss);
        }
      }
    }
    if constexpr (kInputsFirst) {
      const unsigned long long phase = tid == 0 ? mbar_arrive_expect_tx_token(&sm.norm_bar, L * kSplit * 4)
                                                : mbar_arrive_token(&sm.norm_bar);
      if (warp < L) mbar_wait_token(&sm.norm_bar, phase);
    } else {
      cluster_arrive();
      cluster_wait();
    }
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      const int t = warp + round * kWarps;
      if (t < L) {
        float total = 0.f;
#pragma unroll
        for (int q = 0; q < kSplit; ++q) total += sm.norm_part[t][q];
        const float rn = rsqrtf(total * (1.0f / kD) + p.norm_eps);
        unsigned short* out = p.output + (row0 + t) * p.out_row_stride + h * kD;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
          const int v = v0 + lane + 32 * e;
          out[v] = f32_to_bf16(ob[round][e] * rn * sm.norm_w[v] * sm.sig_ogate[t][v]);  // rounding point 4
        }
      }
    }
  }
}

}  // namespace kda

#endif  // KDAJIT_KDA_HEAD_CUH
