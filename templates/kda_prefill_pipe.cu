// Route pipe16 of the chunked ops (docs/DESIGN.md, "Chunks of 16 on one CTA
// per (sequence, head)", step (2)): route rowcta16's CTA per (sequence, head)
// over chunks of 16 tokens, its 512 threads in two roles. Warps 0-7, the
// producers, run steps 1-4 of the CTA's chunks, one after the other across
// its sequences, each into the next slot of a ring of kSlots in shared memory
// (the layout of route twopass's unit: IntraSmem's put_* functions). Warps
// 8-15, the consumer, two warpgroups of 64 value rows each, hold the state in
// their accumulators and run step 5 and step 6 of each chunk from its slot.
// So the producers' work on the next chunks overlaps the consumer's state
// pass and norm, and nothing of a chunk leaves the chip but its output rows.
//
// Slot s has a full and an empty mbarrier of 256 arrivals each. Chunk i of the
// CTA (counted over its sequences) goes to slot i mod kSlots; its phase
// parity is (i / kSlots) & 1. A producer thread waits for the slot's empty
// phase of the previous round (parity ^ 1, which a fresh barrier passes),
// writes its part with ordinary stores, orders them before the async proxy
// (wgmma reads the slot through it) and arrives on full. A consumer thread
// waits on full, runs step 5 from the slot, and arrives on empty once the
// warpgroup's wgmma have completed (its last read of the slot's unit). The
// roles' own barriers are named barriers of 256 threads (ProducerSync,
// ConsumerSync); after the prologue no barrier spans the CTA.
//
// The producers also write the output rows no live sequence computes (zeros)
// and, for the prefill op, the conv windows after each sequence's last chunk;
// the consumer loads and stores the state and writes the chunks' output rows.
// Both walk the same sequences and the same chunks, so the ring's phases stay
// in step across sequences.
#define KDA_PIPE 1
#if KDA_THREADS != 512
#error "route pipe16 launches 512 threads: two roles of 256"
#endif
#undef KDA_THREADS
#define KDA_THREADS 256  // the steps' thread count: each role's
#include "kda_prefill.cu"

namespace kda {
namespace prefill {

using ProducerSync = NamedSync<1>;
using ConsumerSync = NamedSync<2>;

// Dynamic shared memory: the producers' buffers (IntraSmem's layout), the
// ring, and the consumer's OB, sums, norm weight, then the mbarriers. A slot
// is a unit (what step 5 reads) and, for the prefill op, the chunk's output
// gate rows (bf16 [kC][kD]), which the consumer copies in itself before it
// waits for the unit, so that step 6 waits on nothing global.
enum : int {
  kSlots = 3,
  kSlotGate = kUnitBytes,
  kSlotBytes = kSlotGate + (kChunk ? 0 : kC * kD * 2),
  kPOffRing = (kIntraSmemBytes + 127) / 128 * 128,
  kPOffOb = kPOffRing + kSlots * kSlotBytes,            // bf16 [kC][kLdOb]: round_bf16(o)
  kPOffWarpSum = kPOffOb + kC * kLdOb * 2,              // f32 [kSWarps][kC]: each consumer warp's Σ ob²
  kPOffSum = kPOffWarpSum + kSWarps * kC * 4,           // f32 [2][kC]: each token's Σ ob², by chunk parity
  kPOffNormW = kPOffSum + 2 * kC * 4,                   // f32 [kD]: norm_weight
  kPOffBars = (kPOffNormW + kD * 4 + 7) / 8 * 8,        // u64 [2][kSlots]: full, then empty
  // The producers' two input sets (chunk i stages into set i & 1): the conv's
  // buffers m of q, k, v (x's rows land there; the chunk op's q, k, v), the
  // stage (raw gates, then for the prefill op the three x rows before the
  // chunk; the chunk op's gates may be f32) and the raw β words.
  kInMq = 0,
  kInMk = kInMq + kC * kD * 2,
  kInMv = kInMk + kC * kD * 2,
  kInStage = kInMv + kC * kD * 2,
  kInStageBytes = kChunk ? kC * kD * 4 : kStageHistOff + 3 * kChans * 2,
  kInBeta = kInStage + kInStageBytes,
  kInBytes = (kInBeta + kC * 4 + 127) / 128 * 128,
  kPOffIn = (kPOffBars + 2 * kSlots * 8 + 127) / 128 * 128,
  kPOffPart = kPOffIn + 2 * kInBytes,                  // f32 [kWarps][2][kC][kC]: step 3's partial sums
  kPipeSmemBytes = kPOffPart + kWarps * 2 * kC * kC * 4,
};
static_assert(kC == 16 && kSplit == 1 && kVRows == kD, "route pipe16: chunks of 16, all 128 value rows on the CTA");
static_assert(kSlotBytes % 128 == 0 && kPOffOb % 16 == 0, "slots and OB 16-byte aligned");
static_assert(kPipeSmemBytes <= KDA_SMEM_BYTES, "the pipe16 layout must fit the launch's dynamic shared memory");

__device__ __forceinline__ unsigned char* ring_slot(unsigned char* smem, int s) {
  return smem + kPOffRing + s * kSlotBytes;
}
__device__ __forceinline__ unsigned long long* full_bar(unsigned char* smem, int s) {
  return reinterpret_cast<unsigned long long*>(smem + kPOffBars) + s;
}
__device__ __forceinline__ unsigned long long* empty_bar(unsigned char* smem, int s) {
  return reinterpret_cast<unsigned long long*>(smem + kPOffBars) + kSlots + s;
}

// The producers' view: IntraSmem's buffers and its stores into a slot, the
// chunk's inputs in one of the two input sets (staged there during the
// previous chunk when `staged`, else loaded by step 1 as the fused routes
// load them: conv_chunk or load_chunk, then gates_chunk), step 3's one block
// over every warp (factored_block_split). T's rows are 16 floats (IntraSmem's swizzle is for 64):
// rows r with r & 2 swap their halves, so that apply_inverse's float2 reads
// of rows g = 0..3 (a half-warp) fall in distinct banks.
struct PipeProducer : IntraSmem {
  unsigned in_off;  // the chunk's input set, bytes into the shared memory
  bool staged;      // whether the set holds the chunk's inputs (the pointers and strides allow the copies)
  __device__ unsigned char* in() const { return base + in_off; }
  using Sync = ProducerSync;
  static constexpr bool kStagedInputs = true;
  static constexpr bool kPrefetched = true;
  static constexpr bool kSplitBlock = true;
  static constexpr bool kRowTasks = false;
  static constexpr bool kLateOperands = false;
  __device__ unsigned short* mq() const { return reinterpret_cast<unsigned short*>(in() + kInMq); }
  __device__ unsigned short* mk() const { return reinterpret_cast<unsigned short*>(in() + kInMk); }
  __device__ unsigned short* mv() const { return reinterpret_cast<unsigned short*>(in() + kInMv); }
  __device__ unsigned short* stage() const { return reinterpret_cast<unsigned short*>(in() + kInStage); }
  __device__ unsigned* beta_words() const { return reinterpret_cast<unsigned*>(in() + kInBeta); }
  __device__ float* partials() const { return reinterpret_cast<float*>(base + kPOffPart); }
  __device__ int t_at(int r, int c) const { return r * kC + (c ^ ((r & 2) << 2)); }
};
__device__ __forceinline__ unsigned input_set(unsigned chunk) { return kPOffIn + (chunk & 1) * kInBytes; }

// The consumer's view of a chunk: its slot (what step 5 reads, in the unit's
// layout: U^T rows of kC) and the consumer's own buffers.
struct PipeSlot {
  unsigned char* base;
  unsigned char* slot;
  __device__ float* W() const { return reinterpret_cast<float*>(slot + kUnitW); }
  __device__ float* UT() const { return reinterpret_cast<float*>(slot + kUnitUT); }
  __device__ float* Qg() const { return reinterpret_cast<float*>(slot + kUnitQg); }
  __device__ float* KdT() const { return reinterpret_cast<float*>(slot + kUnitKdT); }
  __device__ float* A() const { return reinterpret_cast<float*>(slot + kUnitA); }
  __device__ float* gammaC() const { return reinterpret_cast<float*>(slot + kUnitGammaC); }
  static constexpr int kLdUT = kC;
  __device__ unsigned short* ob() const { return reinterpret_cast<unsigned short*>(base + kPOffOb); }
  __device__ float* warp_sum() const { return reinterpret_cast<float*>(base + kPOffWarpSum); }
  __device__ float* cluster_sum() const { return reinterpret_cast<float*>(base + kPOffSum); }
  __device__ float* normw() const { return reinterpret_cast<float*>(base + kPOffNormW); }
  static constexpr bool kGateRows = true;
  __device__ const unsigned short* gate_rows() const { return reinterpret_cast<const unsigned short*>(slot + kSlotGate); }
};

// The prefill op's output gate rows row0 .. row0 + L - 1 of head h into a
// slot (rows past L are not read), by the consumer thread `tid` (0 .. 255):
// by 16-byte cp.async copies, a piece a thread, when the tensor's pointer and
// row stride allow, else element by element. The caller waits for them
// (cp_async_wait_all) before the barrier ahead of the norm; the slot's
// previous gate rows were last read before the barrier that ended the
// consumer's previous chunk.
__device__ __forceinline__ void copy_gate_rows(const KdaParams& p, unsigned char* slot, int h, long long row0, int L,
                                               int tid) {
  unsigned short* dst = reinterpret_cast<unsigned short*>(slot + kSlotGate);
  const kda_bf16_bits* src = p.output_gate + row0 * p.ogate_row_stride + h * kD;
  if (((reinterpret_cast<unsigned long long>(p.output_gate) & 15) | (p.ogate_row_stride & 7)) == 0) {
    enum : int { kPieces = kD / 8 };
    static_assert(kC * kPieces == kThreads, "one 16-byte piece a consumer thread");
    const int t = tid / kPieces, c = 8 * (tid % kPieces);
    cp_async_16_or_zero(dst + t * kD + c, src + (t < L ? t : 0) * p.ogate_row_stride + c, t < L);
    return;
  }
  for (int i = tid; i < L * kD; i += kThreads) dst[i] = src[i / kD * p.ogate_row_stride + i % kD];
}

// Sequence n's rows, slot, whether it computes them, and whether it starts
// from its slot's state (both roles read them alike).
struct PipeSequence {
  int q0, q1, slot;
  bool live, initial;
};
__device__ __forceinline__ PipeSequence pipe_sequence(const KdaParams& p, int n) {
  PipeSequence s;
  s.q0 = p.query_start_loc[n];
  s.q1 = p.query_start_loc[n + 1];
  s.slot = kChunk ? n : p.state_indices[n];  // the chunk op's sequence n has dense state n
  s.live = sequence_live(p, s.q0, s.q1, s.slot);
  s.initial = kChunk ? p.state != nullptr : p.has_initial_state == nullptr || p.has_initial_state[n] != 0;
  return s;
}

// The CTA's chunk after (n, c0) in the producers' walk: the next chunk of
// sequence n, else the first of the next live sequence with tokens. False
// when there is none.
__device__ __forceinline__ bool next_chunk(const KdaParams& p, int& n, PipeSequence& s, long long& c0) {
  c0 += kC;
  while (!s.live || c0 >= s.q1 - s.q0) {
    n += gridDim.y;
    if (n >= p.num_seqs) return false;
    s = pipe_sequence(p, n);
    c0 = 0;
  }
  return true;
}

// Chunk (s, c0)'s inputs into `set` by cp.async (the caller commits the group).
__device__ __forceinline__ void stage_inputs(const KdaParams& p, unsigned char* smem, unsigned set, int h,
                                             const PipeSequence& s, long long c0) {
  const PipeProducer sm{{smem, nullptr}, set, true};
  const int L = chunk_len(s.q1 - s.q0, c0);
  if constexpr (kChunk) stage_chunk_inputs(p, sm, h, s.q0 + c0, L);
  else stage_conv_inputs(p, sm, h, s.q0, c0, L, s.initial, static_cast<long long>(s.slot) * p.conv_slot_stride);
}

// Warps 0-7: steps 1-4 of every chunk of the CTA's sequences into the ring,
// the zero rows, and (prefill op) the conv windows. While chunk i computes,
// the next chunk's inputs are in flight into the other input set (a
// cp.async group committed after chunk i's own).
__device__ __forceinline__ void pipe_produce(const KdaParams& p, unsigned char* smem, int h) {
  const GateConstants gate = gate_constants(p, h);
  // What no chunk computes: the rows before the first and after the last
  // sequence, the rows of sequences that are not live, the out-of-range slot
  // count, the conv windows of live sequences without tokens.
  for (int n = blockIdx.y; n < p.num_seqs; n += gridDim.y) {
    const PipeSequence s = pipe_sequence(p, n);
    if (n == 0) zero_output(p, h, 0, s.q0, 0);
    if (n == p.num_seqs - 1) zero_output(p, h, s.q1, p.rows, 0);
    if (!kChunk && s.slot >= p.num_slots && h == 0 && threadIdx.x == 0 && p.oob_counter != nullptr)
      atomicAdd(p.oob_counter, 1);
    if (!s.live) zero_output(p, h, s.q0, s.q1, 0);
    else if (!kChunk && s.q1 == s.q0)
      conv_state_out(p, h, 0, 0, s.q0, 0, s.initial, static_cast<long long>(s.slot) * p.conv_slot_stride);
  }
  if (static_cast<int>(blockIdx.y) >= p.num_seqs) return;
  const bool stageable = kChunk ? chunk_inputs_stageable(p) : inputs_stageable(p);
  int n = blockIdx.y;
  PipeSequence s = pipe_sequence(p, n);
  long long c0 = -kC;
  bool have = next_chunk(p, n, s, c0);
  if (have && stageable) stage_inputs(p, smem, input_set(0), h, s, c0);
  cp_async_commit();
  for (unsigned chunk = 0; have; ++chunk) {  // chunk: the CTA's chunks so far
    const int i = static_cast<int>(chunk % kSlots);
    const unsigned parity = (chunk / kSlots) & 1;
    const long long len = s.q1 - s.q0, cbase = static_cast<long long>(s.slot) * p.conv_slot_stride;
    const int L = chunk_len(len, c0);
    mbar_wait(empty_bar(smem, i), parity ^ 1);
    // The next chunk's set was chunk - 1's: every producer passed the barrier
    // at the end of its steps. (The walk's next position is found again
    // after this chunk: kept across the steps, it spilled.)
    if (stageable) {
      int n1 = n;
      PipeSequence s1 = s;
      long long c1 = c0;
      if (next_chunk(p, n1, s1, c1)) stage_inputs(p, smem, input_set(chunk + 1), h, s1, c1);
    }
    cp_async_commit();
    const PipeProducer sm{{smem, ring_slot(smem, i)}, input_set(chunk), stageable};
    intra_chunk(p, sm, h, 0, s.q0, c0, L, s.initial, cbase, gate);
    fence_proxy_async();  // step 5 reads the slot through the async proxy (wgmma)
    mbar_arrive(full_bar(smem, i));
    // Every read of the conv window (the sequence's first chunk, staged or
    // not) is behind this role's barriers.
    if (!kChunk && c0 + kC >= len) conv_state_out(p, h, 0, 0, s.q0, len, s.initial, cbase);
    have = next_chunk(p, n, s, c0);
  }
  cp_async_wait_all();
}

// Warps 8-15 (tid = threadIdx.x - 256): the state pass and the output of
// every chunk, the state in and out of the slot.
// The consumer's thread index and first value row, formed from a fresh
// thread index where they are used: kept in registers across its loops
// (with the state's 64), they and the values made from them spilled.
__device__ __forceinline__ unsigned consumer_tid() { return static_cast<unsigned>(fresh_tid()) - kThreads; }
__device__ __forceinline__ int consumer_rows() { return 16 * static_cast<int>(consumer_tid() >> 5); }

__device__ __forceinline__ void pipe_consume(const KdaParams& p, unsigned char* smem, int h) {
  if (!kChunk && threadIdx.x - kThreads < kD)
    reinterpret_cast<float*>(smem + kPOffNormW)[threadIdx.x - kThreads] = p.norm_weight[threadIdx.x - kThreads];
  unsigned chunk = 0;
  for (int n = blockIdx.y; n < p.num_seqs; n += gridDim.y) {
    const PipeSequence s = pipe_sequence(p, n);
    if (!s.live) continue;
    StateTile st;
    if (s.initial) {
      state_load(p, s.slot, h, consumer_rows(), st, fresh_tid() & 31);
    } else {
#pragma unroll
      for (int nt = 0; nt < kD / 8; ++nt) st.s[nt][0] = st.s[nt][1] = st.s[nt][2] = st.s[nt][3] = 0.f;
    }
    const int len = s.q1 - s.q0;
    for (int c0 = 0; c0 < len; c0 += kC, ++chunk) {
      const int i = static_cast<int>(chunk % kSlots), L = chunk_len(len, c0);
      const long long row0 = static_cast<long long>(s.q0) + c0;
      if constexpr (!kChunk) copy_gate_rows(p, ring_slot(smem, i), h, row0, L, static_cast<int>(consumer_tid()));
      mbar_wait(full_bar(smem, i), (chunk / kSlots) & 1);
      const PipeSlot sm{smem, ring_slot(smem, i)};
      state_pass_own(sm, st, consumer_rows());
      mbar_arrive(empty_bar(smem, i));  // the unit has no reader left (the wgmma waited for)
      if constexpr (!kChunk) cp_async_wait_all();  // this thread's gate rows
      ConsumerSync::sync();  // OB, the warps' sums and the gate rows
      if constexpr (kChunk) plain_output(p, sm, h, 0, 0, kVRows, row0, L, consumer_tid());
      else norm_output<ConsumerSync>(p, sm, h, 0, 0, row0, L, static_cast<int>(chunk & 1), consumer_tid());
      ConsumerSync::sync();  // OB and the gate rows are the next chunk's
    }
    if constexpr (kChunk) {
      if (p.final_state != nullptr)
        state_store(p, p.final_state, p.final_slot_stride, s.slot, h, consumer_rows(), st, fresh_tid() & 31);
    } else {
      state_store(p, p.state, p.state_slot_stride, s.slot, h, consumer_rows(), st, fresh_tid() & 31);
    }
  }
}

// The registers of a thread of each role: 128 each at launch (512 threads,
// the whole register file), then the producers give some to the consumer,
// whose 64 state values per thread leave its step 5 and output no room at
// 128 (ptxas spilled 60-116 bytes there), where the architecture allows it
// (setmaxnreg: sm_90a, sm_100a, sm_103a). The prefill op's producers (the
// conv) keep 120; the chunk op's consumer, which also walks the dense final
// states, spilled 36 bytes at 136 and none at 144 (ptxas, sm_90a and
// sm_100a; at sm_103a without setmaxnreg, 144 bytes).
enum : int { kProducerRegs = kChunk ? 112 : 120, kConsumerRegs = kChunk ? 144 : 136 };
static_assert(kProducerRegs + kConsumerRegs == 2 * 65536 / (2 * kThreads), "the roles share the register file");
template <bool kInc, int kRegs>
__device__ __forceinline__ void set_max_registers() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL)
  if constexpr (kInc) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
  else asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

}  // namespace prefill
}  // namespace kda

// Grid (H, wave): CTA y takes sequences y, y + wave, .. of head blockIdx.x;
// one CTA per SM (512 threads, 128 registers each at launch).
extern "C" __global__ void __launch_bounds__(2 * KDA_THREADS, 1) KDA_PREFILL_ENTRY(const __grid_constant__ KdaParams p) {
  extern __shared__ __align__(16) unsigned char kda_smem[];
  using namespace kda::prefill;
  kda::pdl_wait();
  if (threadIdx.x < 2 * kSlots)
    kda::mbar_init(reinterpret_cast<unsigned long long*>(kda_smem + kPOffBars) + threadIdx.x, kda::kThreads);
  __syncthreads();
  if (threadIdx.x < kda::kThreads) {
    set_max_registers<false, kProducerRegs>();
    pipe_produce(p, kda_smem, blockIdx.x);
  } else {
    set_max_registers<true, kConsumerRegs>();
    pipe_consume(p, kda_smem, blockIdx.x);
  }
}
