#include "floor_kernel.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kdajit::bench {

namespace {

// The kernels. One (item, head) pair: item = row (single op) or sequence (packed
// op). Every read of the op is done once and every write once, with 16-byte
// accesses where the layout allows; the written values are values read (output:
// an xor of the token's inputs), and every load of tensor data is a volatile asm, so nothing can
// be dropped and nothing is computed.
//   metadata  single: the slot; packed: qsl[n], qsl[n+1], accepted[n], the T slots
//   state     the source slot's H-th 128x128 slice is loaded first (all loads of a
//             thread in flight at once) and stored to the checkpoint slots last
//   conv      SD (and DS for the single op): 16-byte vectors; taps a-1..a+1 read,
//             taps 0..L+1 written (tap0 = h1, tap1 = h2, tap 2+t = x of token t: the op's
//             own shift, so conv_state keeps valid values).
//             DS single: the 3-tap block is one contiguous run, read and written
//             back as is. DS packed: 2-byte accesses per channel and tap.
//   tokens    per token: raw_gate, output_gate (16 vectors), raw_beta (2 bytes),
//             x (read by the conv part, except DS single), output = an xor of them.
constexpr const char* kFloorBody = R"CUDA(
typedef unsigned short u16;
typedef unsigned int u32;
struct alignas(16) V16 { u32 x, y, z, w; };

__device__ __forceinline__ int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }
// 16-byte accesses as written: volatile asm keeps them vectorised and in program order.
__device__ __forceinline__ V16 ld16(const void* p) {
  V16 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ u16 ld2(const u16* p) {
  u16 v;
  asm volatile("ld.global.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void st16(void* p, V16 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ V16 vxor(V16 a, V16 b) { V16 r = {a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w}; return r; }

// conv_state, SD layout (channel stride 1, tap stride qkv): one column = 8 channels.
// Threads 0..COLS-1 move the history (taps a-1..a+1 in, taps 0 and 1 out); the
// new taps (tap 2+t = x of token t) go one (column, token) pair per thread, so no
// thread holds more than a few vectors. All loads are issued before any store.
template <int MAXT, int NT, int PARTS>
__device__ __forceinline__ void conv_sd(const FloorParams& p, int h, int part, int row0, int L, int a, int cs,
                                        long long hidden) {
  constexpr int COLS = 48 / PARTS;  // (q, k, v) x 16 columns of this head
  constexpr int PPT = (COLS * MAXT + NT - 1) / NT;  // (column, token) pairs per thread
  static_assert(COLS * PARTS == 48 && COLS <= NT, "conv columns");
  const int tid = threadIdx.x;
  u16* slot = p.conv_state + (long long)cs * p.conv_slot;
  auto channel = [&](int c) { const int col = part * COLS + c; return (col >> 4) * hidden + h * 128 + (col & 15) * 8; };
  const bool hist = tid < COLS;
  V16 h1, h2;
  if (hist) {
    const u16* base = slot + channel(tid);
    (void)ld16(base + (long long)(a - 1) * p.conv_tap);  // read (volatile: never dropped), then shifted out
    h1 = ld16(base + (long long)a * p.conv_tap);
    h2 = ld16(base + (long long)(a + 1) * p.conv_tap);
  }
  V16 xv[PPT];
#pragma unroll
  for (int k = 0; k < PPT; ++k) {
    const int q = k * NT + tid, t = q / COLS;
    if (t < L) xv[k] = ld16(p.x + (long long)(row0 + t) * p.x_row + channel(q % COLS));
  }
  if (hist) {
    u16* base = slot + channel(tid);
    st16(base, h1);
    st16(base + p.conv_tap, h2);
  }
#pragma unroll
  for (int k = 0; k < PPT; ++k) {
    const int q = k * NT + tid, t = q / COLS;
    if (t < L) st16(slot + channel(q % COLS) + (long long)(2 + t) * p.conv_tap, xv[k]);
  }
}

// conv_state, DS layout, single op (K = 3): a head's 3 x 128 channels x 3 taps are
// three contiguous runs of 768 bytes.
template <int NT, int PARTS>
__device__ __forceinline__ void conv_ds_single(const FloorParams& p, int h, int part, int cs, long long hidden) {
  constexpr int NVEC = 144 / PARTS;
  static_assert(NVEC * PARTS == 144 && NVEC <= NT, "conv vectors");
  const int tid = threadIdx.x;
  if (tid >= NVEC) return;
  const int q = part * NVEC + tid, j = q / 48, vi = q % 48;
  u16* at = p.conv_state + (long long)cs * p.conv_slot + (j * hidden + h * 128) * p.conv_chan + vi * 8;
  st16(at, ld16(at));
}

// conv_state, DS layout, packed op: per channel, taps a-1..a+1 read, 0..L+1 written.
template <int MAXT, int NT, int PARTS>
__device__ __forceinline__ void conv_ds_packed(const FloorParams& p, int h, int part, int row0, int L, int a, int cs,
                                               long long hidden) {
  constexpr int CH = 384 / PARTS;
  constexpr int CPT = (CH + NT - 1) / NT;  // channels per thread
  const int tid = threadIdx.x;
  u16 hv[CPT][3];
  u16 xs[CPT][MAXT];
#pragma unroll
  for (int k = 0; k < CPT; ++k) {
    const int cl = k * NT + tid;
    if (cl < CH) {
      const int cc = part * CH + cl;
      const long long ch = (cc >> 7) * hidden + h * 128 + (cc & 127);
      const u16* base = p.conv_state + (long long)cs * p.conv_slot + ch * p.conv_chan;
#pragma unroll
      for (int i = 0; i < 3; ++i) hv[k][i] = ld2(base + (long long)(a - 1 + i) * p.conv_tap);
#pragma unroll
      for (int t = 0; t < MAXT; ++t)
        if (t < L) xs[k][t] = ld2(p.x + (long long)(row0 + t) * p.x_row + ch);
    }
  }
#pragma unroll
  for (int k = 0; k < CPT; ++k) {
    const int cl = k * NT + tid;
    if (cl < CH) {
      const int cc = part * CH + cl;
      const long long ch = (cc >> 7) * hidden + h * 128 + (cc & 127);
      u16* base = p.conv_state + (long long)cs * p.conv_slot + ch * p.conv_chan;
      base[0] = hv[k][1];  // hv[k][0] was read and is shifted out
      base[p.conv_tap] = hv[k][2];
#pragma unroll
      for (int t = 0; t < MAXT; ++t)
        if (t < L) base[(long long)(2 + t) * p.conv_tap] = xs[k][t];
    }
  }
}

// Per token: raw_gate, output_gate, raw_beta (and x for DS single) in, output out.
// Threads are taken from the top of the CTA, away from the conv threads.
template <int NT, int PARTS>
__device__ __forceinline__ void tokens(const FloorParams& p, int h, int part, int row0, int L, bool x_here,
                                       long long hidden) {
  if (part != PARTS - 1) return;
  for (int pr = NT - 1 - (int)threadIdx.x; pr < L * 16; pr += NT) {
    const long long row = row0 + (pr >> 4);
    const long long off = h * 128 + (pr & 15) * 8;
    V16 o = vxor(ld16(p.raw_gate + row * p.gate_row + off), ld16(p.output_gate + row * p.ogate_row + off));
    u32 b = ld2(p.raw_beta + row * p.beta_row + h);
    b |= b << 16;
    if (x_here) {
#pragma unroll
      for (int j = 0; j < 3; ++j) o = vxor(o, ld16(p.x + row * p.x_row + j * hidden + off));
    }
    o.x ^= b;
    o.y ^= b;
    o.z ^= b;
    o.w ^= b;
    st16(p.output + row * p.out_row + off, o);
  }
}

template <int PACKED, int SB, int NT, int PARTS>
__device__ __forceinline__ void floor_item(const FloorParams& p, int n, int h, int part) {
  constexpr int MAXT = PACKED ? FLOOR_MAX_T : 1;
  constexpr int NV = 128 * 128 * SB / 16;  // 16-byte vectors of one head's state
  constexpr int NV_CTA = NV / PARTS;
  constexpr int NV_T = NV_CTA / NT;
  static_assert(NV_T * NT * PARTS == NV, "state split");
  const int tid = threadIdx.x;
  const int T = PACKED ? p.tokens : 1;
  const long long hidden = (long long)p.heads * 128;

  int row0 = n, L = 1, a = 1;
  if (PACKED) {
    row0 = p.query_start_loc[n];
    L = clampi(p.query_start_loc[n + 1] - row0, 0, T);
    a = clampi(p.num_accepted[n], 1, T);
    if (L == 0) return;
  }
  const int* si = p.state_indices + (long long)n * T;
  int ck[MAXT];
#pragma unroll
  for (int t = 0; t < MAXT; ++t) ck[t] = t < L ? si[t] : 0;
  const int src = PACKED ? si[a - 1] : ck[0];

  V16* st = reinterpret_cast<V16*>(p.state);
  const long long vslot = p.state_slot * SB / 16;
  const long long vbase = (long long)h * NV + part * NV_CTA + tid;
  V16 s[NV_T];
  {
    const V16* from = st + (long long)src * vslot + vbase;
#pragma unroll
    for (int i = 0; i < NV_T; ++i) s[i] = ld16(from + i * NT);
  }

  if (!p.conv_ds)
    conv_sd<MAXT, NT, PARTS>(p, h, part, row0, L, a, ck[0], hidden);
  else if (!PACKED)
    conv_ds_single<NT, PARTS>(p, h, part, ck[0], hidden);
  else
    conv_ds_packed<MAXT, NT, PARTS>(p, h, part, row0, L, a, ck[0], hidden);
  tokens<NT, PARTS>(p, h, part, row0, L, !PACKED && p.conv_ds, hidden);

  if (p.spin_cycles > 0) {
    // Diagnostic: a stand-in for the op's arithmetic between its loads and
    // its stores. The xor reads every loaded vector, so the spin starts when
    // the last of them has landed.
    u32 acc = 0;
#pragma unroll
    for (int i = 0; i < NV_T; ++i) acc ^= s[i].x;
    const long long end = clock64() + p.spin_cycles + (acc == 0x9e3779b9u ? 1 : 0);
    while (clock64() < end) {
    }
  }

#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
    if (t < L) {
      V16* to = st + (long long)ck[t] * vslot + vbase;
#pragma unroll
      for (int i = 0; i < NV_T; ++i) st16(to + i * NT, s[i]);
    }
  }
}

#define FLOOR_KERNELS(OP, PACKED, STATE, SB)                                                                    \
  extern "C" __global__ void __launch_bounds__(256) floor_##OP##_##STATE##_cta256(const FloorParams p) {      \
    floor_item<PACKED, SB, 256, 1>(p, blockIdx.y, blockIdx.x, 0);                                              \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(128) floor_##OP##_##STATE##_split4x128(const FloorParams p) {  \
    floor_item<PACKED, SB, 128, 4>(p, blockIdx.y, blockIdx.x >> 2, blockIdx.x & 3);                            \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(128) floor_##OP##_##STATE##_persist4x128(const FloorParams p) {  \
    const int total = p.items * p.heads * 4;                                                                   \
    for (int it = blockIdx.x; it < total; it += gridDim.x)                                                     \
      floor_item<PACKED, SB, 128, 4>(p, it / (p.heads * 4), (it >> 2) % p.heads, it & 3);                      \
  }

FLOOR_KERNELS(single, 0, f32, 4)
FLOOR_KERNELS(single, 0, bf16, 2)
FLOOR_KERNELS(packed, 1, f32, 4)
FLOOR_KERNELS(packed, 1, bf16, 2)
)CUDA";

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int floor_shape_index(const std::string& name) {
  for (int i = 0; i < kFloorShapeCount; ++i)
    if (name == kFloorShapes[static_cast<size_t>(i)].name) return i;
  return -1;
}

std::string floor_source(int max_tokens) {
  return fmt::format("// kdajit_bench floor kernels\n#define FLOOR_MAX_T {}\n{}\n{}", max_tokens, kFloorParamsText,
                     kFloorBody);
}

std::string floor_entry(Op op, StateDtype state, int shape) {
  return fmt::format("floor_{}_{}_{}", to_string(op), to_string(state), kFloorShapes[static_cast<size_t>(shape)].kernel);
}

Result<FloorParams> floor_params(const Cell& c, const kdajit_decode_args_t& a) {
  FloorParams p{};
  p.x = static_cast<const unsigned short*>(a.x.data);
  p.raw_gate = static_cast<const unsigned short*>(a.raw_gate.data);
  p.raw_beta = static_cast<const unsigned short*>(a.raw_beta.data);
  p.output_gate = static_cast<const unsigned short*>(a.output_gate.data);
  p.output = static_cast<unsigned short*>(a.output.data);
  p.conv_state = static_cast<unsigned short*>(a.conv_state.data);
  p.state = a.state.data;
  p.state_indices = static_cast<const int*>(a.state_indices.data);
  const bool packed = c.op == Op::packed;
  p.query_start_loc = packed ? static_cast<const int*>(a.query_start_loc.data) : nullptr;
  p.num_accepted = packed ? static_cast<const int*>(a.num_accepted_tokens.data) : nullptr;
  p.x_row = a.x.strides[0];
  p.gate_row = a.raw_gate.strides[0];
  p.beta_row = a.raw_beta.strides[0];
  p.ogate_row = a.output_gate.strides[0];
  p.out_row = a.output.strides[0];
  p.conv_slot = a.conv_state.strides[0];
  p.conv_chan = a.conv_state.strides[1];
  p.conv_tap = a.conv_state.strides[2];
  p.state_slot = a.state.strides[0];
  p.heads = c.heads;
  p.items = c.count;
  p.tokens = c.tokens;
  p.conv_ds = c.conv == ConvLayout::ds ? 1 : 0;
  const bool ok = aligned16(p.x) && aligned16(p.raw_gate) && aligned16(p.output_gate) && aligned16(p.output) &&
                  aligned16(p.conv_state) && aligned16(p.state) && p.x_row % 8 == 0 && p.gate_row % 8 == 0 &&
                  p.ogate_row % 8 == 0 && p.out_row % 8 == 0 && p.conv_slot % 8 == 0 &&
                  (p.conv_ds ? p.conv_tap == 1 : p.conv_chan == 1 && p.conv_tap % 8 == 0) &&
                  p.state_slot * state_elem_bytes(c.state) % 16 == 0;
  if (!ok)
    return Error(ErrorCode::internal, fmt::format("floor kernel: {}: the buffers or strides are not 16-byte aligned "
                                                  "(the floor kernel's vector accesses need it)",
                                                  cell_name(c)));
  if (c.tokens > kFloorMaxTokens)
    return Error(ErrorCode::internal, fmt::format("floor kernel: T = {} > {}", c.tokens, kFloorMaxTokens));
  return p;
}

int FloorKernels::index(Op op, StateDtype state, int shape) {
  return ((op == Op::packed ? 2 : 0) + (state == StateDtype::bf16 ? 1 : 0)) * kFloorShapeCount + shape;
}

Status FloorKernels::hold_occupancy(Entry& e, const FloorShape& shape, int smem_per_sm) {
  KDAJIT_TRY_ASSIGN(const DriverApi* f, driver());
  // Padding that lets ctas_per_sm CTAs share an SM and not one more (each CTA
  // also holds its static shared memory and 1 KiB the system reserves, so
  // ctas_per_sm + 1 pads alone overflow). The shapes of one kernel share its
  // function: its limit only grows.
  e.pad_bytes = static_cast<unsigned>(smem_per_sm / (shape.ctas_per_sm + 1) + 1);
  int limit = 0;
  BENCH_CU(*f, f->cuFuncGetAttribute(&limit, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, e.fn));
  if (limit < static_cast<int>(e.pad_bytes))
    BENCH_CU(*f, f->cuFuncSetAttribute(e.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(e.pad_bytes)));
  int per_sm = 0;
  BENCH_CU(*f, f->cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, e.fn, shape.threads, e.pad_bytes));
  if (per_sm < 1 || per_sm > shape.ctas_per_sm)
    return Error(ErrorCode::internal, fmt::format("{} CTAs per SM with {} bytes of padding, expected 1..{}", per_sm,
                                                  e.pad_bytes, shape.ctas_per_sm));
  return {};
}

Status FloorKernels::load(const std::string& cubin, int sms, int smem_per_sm, int max_tokens) {
  KDAJIT_TRY_ASSIGN(const DriverApi* f, driver());
  KDAJIT_TRY(module_.load(cubin));
  max_tokens_ = max_tokens;
  for (Op op : kDecodeOps)  // one floor per decode op
    for (StateDtype st : all_values<StateDtype>())
      for (int sh = 0; sh < kFloorShapeCount; ++sh) {
        Entry& e = entries_[static_cast<size_t>(index(op, st, sh))];
        const FloorShape& shape = kFloorShapes[static_cast<size_t>(sh)];
        const std::string name = floor_entry(op, st, sh);
        KDAJIT_TRY_ASSIGN(e.fn, module_.function(name.c_str()));
        if (shape.diagnostic()) {
          // A diagnostic shape that cannot be held to its occupancy here
          // fails its own launches, not the floor.
          if (Status held = hold_occupancy(e, shape, smem_per_sm); !held) {
            e.fn = nullptr;
            e.error = fmt::format("{} as {}: {}", name, shape.name, held.error().message);
            continue;
          }
        }
        int per_sm = 0;
        BENCH_CU(*f, f->cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, e.fn, shape.threads, e.pad_bytes));
        if (per_sm < 1) return Error(ErrorCode::cuda, fmt::format("{}: occupancy of 0 CTAs per SM", name));
        e.resident_ctas = per_sm * sms;
        BENCH_CU(*f, f->cuFuncGetAttribute(&e.registers, CU_FUNC_ATTRIBUTE_NUM_REGS, e.fn));
      }
  return {};
}

int FloorKernels::registers(Op op, StateDtype state, int shape) const {
  return entries_[static_cast<size_t>(index(op, state, shape))].registers;
}

Status FloorKernels::launch(int shape, const Cell& c, const FloorParams& p, cudaStream_t s) const {
  KDAJIT_TRY_ASSIGN(const DriverApi* f, driver());
  if (c.tokens > max_tokens_)
    return Error(ErrorCode::internal, fmt::format("floor kernel built for T <= {}, got T = {}", max_tokens_, c.tokens));
  const FloorShape& sh = kFloorShapes[static_cast<size_t>(shape)];
  const Entry& e = entries_[static_cast<size_t>(index(c.op, c.state, shape))];
  if (!e.fn) return Error(ErrorCode::cuda, e.error);
  CUlaunchConfig cfg{};
  cfg.blockDimX = static_cast<unsigned>(sh.threads);
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.gridDimZ = 1;
  if (sh.persistent) {
    const int64_t work = int64_t{p.items} * p.heads * sh.parts;
    cfg.gridDimX = static_cast<unsigned>(std::min<int64_t>(work, e.resident_ctas));
    cfg.gridDimY = 1;
  } else {
    if (p.items > 65535) return Error(ErrorCode::internal, fmt::format("floor kernel: {} items > 65535", p.items));
    cfg.gridDimX = static_cast<unsigned>(p.heads * sh.parts);
    cfg.gridDimY = static_cast<unsigned>(p.items);
  }
  cfg.sharedMemBytes = e.pad_bytes;
  cfg.hStream = reinterpret_cast<CUstream>(s);
  cfg.attrs = nullptr;
  cfg.numAttrs = 0;
  FloorParams copy = p;
  void* args[] = {&copy};
  BENCH_CU(*f, f->cuLaunchKernelEx(&cfg, e.fn, args, nullptr));
  return {};
}

}  // namespace kdajit::bench
