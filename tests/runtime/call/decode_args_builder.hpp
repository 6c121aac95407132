// Builds well-formed decode arguments for a configuration, for the validation
// and support tests. Tensors are laid out from a base address: a real host
// buffer (so tests can check that validation wrote nothing) or a bare address
// that is never dereferenced (validation reads the args struct only).
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "catch.hpp"
#include "kdajit/kdajit.hpp"
#include "kdajit/kernel_key.hpp"

namespace kdajit::test {

struct CallConfig {
  Op op = Op::single;
  int heads = 2;  // H (0 or > 128 to build out-of-range calls)
  StateDtype state = StateDtype::f32;
  ConvLayout conv = ConvLayout::sd;
  int tokens = 1;  // T: sets conv_state's K = T + 2; packed: state_indices [N, T]
  Gate gate = Gate::bounded;
  int64_t rows = 3;   // R
  int64_t seqs = 2;   // N (packed)
  int64_t slots = 4;  // S
  // Padding added to the free strides, so that "free" is exercised.
  int64_t row_pad = 8;    // elements
  int64_t conv_pad = 4;   // elements (8 bytes)
  int64_t state_pad = 8;  // elements (16 bytes for bf16, 32 for f32)
};

// Hands out 256-byte aligned addresses from a base; counts the bytes used.
class Placer {
 public:
  explicit Placer(uintptr_t base) : base_(base) {}
  void* take(int64_t bytes) {
    offset_ = (offset_ + 255) / 256 * 256;
    void* p = reinterpret_cast<void*>(base_ + offset_);
    offset_ += static_cast<uintptr_t>(bytes > 0 ? bytes : 0);
    return p;
  }
  size_t used() const { return (offset_ + 255) / 256 * 256; }

 private:
  uintptr_t base_;
  uintptr_t offset_ = 0;
};

inline int64_t element_bytes(kdajit_dtype_t t) { return t == KDAJIT_DTYPE_BF16 ? 2 : 4; }

// A tensor view placed by `placer`, sized to cover its strided extent.
inline kdajit_tensor_t place(Placer& placer, kdajit_dtype_t dtype, std::initializer_list<int64_t> shape,
                             std::initializer_list<int64_t> strides) {
  kdajit_tensor_t t = tensor_view(nullptr, dtype, shape, strides);
  int64_t last = 0;
  bool empty = false;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] <= 0) empty = true;
    else last += (t.shape[d] - 1) * t.strides[d];
  }
  t.data = placer.take(empty ? 0 : (last + 1) * element_bytes(dtype));
  return t;
}

// The tensors and scalars both ops' args share, placed from `p` in the
// contract's order for a config with heads, state, conv, gate, slots and the
// paddings (R rows, K conv taps); place_indices places the op's own tensors
// that stand between dt_bias and state (state_indices, has_initial_state).
// Every other field is zero.
template <class Args, class Config, class PlaceIndices>
Args place_shared_args(const Config& c, Placer& p, int64_t R, int64_t K, PlaceIndices place_indices) {
  constexpr int64_t D = kHeadDim;
  const int64_t H = c.heads, S = c.slots;
  const int64_t hidden = H * D, qkv = 3 * hidden;
  const kdajit_dtype_t bf16 = KDAJIT_DTYPE_BF16, f32 = KDAJIT_DTYPE_F32;
  const kdajit_dtype_t st = c.state == StateDtype::f32 ? f32 : bf16;

  Args a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.x = place(p, bf16, {R, qkv}, {qkv + c.row_pad, 1});
  a.conv_weight = place(p, f32, {3, 4, hidden}, {4 * hidden, hidden, 1});
  const int64_t conv_slot = qkv * K + c.conv_pad;
  a.conv_state = c.conv == ConvLayout::sd ? place(p, bf16, {S, qkv, K}, {conv_slot, 1, qkv})
                                          : place(p, bf16, {S, qkv, K}, {conv_slot, K, 1});
  a.raw_gate = place(p, bf16, {R, H, D}, {hidden + c.row_pad, D, 1});
  a.raw_beta = place(p, bf16, {R, H}, {H + c.row_pad, 1});
  a.A_log = place(p, f32, {H}, {1});
  a.dt_bias = place(p, f32, {hidden}, {1});
  place_indices(a);
  a.state = place(p, st, {S, H, D, D}, {H * D * D + c.state_pad, D * D, D, 1});
  a.output_gate = place(p, bf16, {R, H, D}, {hidden + c.row_pad, D, 1});
  a.norm_weight = place(p, f32, {D}, {1});
  a.output = place(p, bf16, {R, H, D}, {hidden + c.row_pad, D, 1});
  a.gate = c.gate == Gate::bounded ? KDAJIT_GATE_BOUNDED : KDAJIT_GATE_SOFTPLUS;
  a.lower_bound = -5.0f;
  a.norm_eps = 1e-6f;
  a.oob_counter = nullptr;
  return a;
}

// Valid arguments for `c` (when c is inside the contract), placed from `base`.
inline kdajit_decode_args_t build_args(const CallConfig& c, uintptr_t base, size_t* bytes_used = nullptr) {
  const int64_t R = c.rows, N = c.seqs, T = c.tokens;
  const kdajit_dtype_t i32 = KDAJIT_DTYPE_INT32;
  Placer p(base);
  kdajit_decode_args_t a =
      place_shared_args<kdajit_decode_args_t>(c, p, R, T + 2, [&](kdajit_decode_args_t& args) {
        args.state_indices = c.op == Op::single ? place(p, i32, {R}, {1}) : place(p, i32, {N, T}, {T, 1});
      });
  if (c.op == Op::packed) {
    a.query_start_loc = place(p, i32, {N + 1}, {1});
    a.num_accepted_tokens = place(p, i32, {N}, {1});
  }
  a.state_indices_mode = KDAJIT_INDICES_UNIQUE_OR_NULL;
  if (bytes_used) *bytes_used = p.used();
  return a;
}

// A host buffer, 256-byte aligned, filled with a pattern, to place arguments in.
class HostArena {
 public:
  explicit HostArena(size_t bytes) : storage_(bytes + 256) {
    for (size_t i = 0; i < storage_.size(); ++i) storage_[i] = static_cast<unsigned char>(i * 131 + 7);
  }
  uintptr_t base() const { return (reinterpret_cast<uintptr_t>(storage_.data()) + 255) / 256 * 256; }
  const std::vector<unsigned char>& bytes() const { return storage_; }

 private:
  std::vector<unsigned char> storage_;
};

// A call placed in a real host buffer (sized by a dry run of Build), so that
// "wrote nothing" can be checked.
template <class Config, class Args, Args (*Build)(const Config&, uintptr_t, size_t*)>
struct HostPlacedCall {
  Config cfg;
  HostArena arena;
  Args args;
  explicit HostPlacedCall(const Config& c) : cfg(c), arena(bytes_for(c)), args(Build(c, arena.base(), nullptr)) {}

  static size_t bytes_for(const Config& c) {
    size_t n = 0;
    (void)Build(c, 0, &n);
    return n;
  }
  // validate(args), checking that neither the args struct nor the buffers changed.
  template <class Validate>
  auto validate_untouched(Validate validate) const {
    Args before;
    std::memcpy(&before, &args, sizeof before);
    const std::vector<unsigned char> bytes = arena.bytes();
    auto r = validate(args);
    CHECK(std::memcmp(&before, &args, sizeof before) == 0);
    CHECK(arena.bytes() == bytes);
    return r;
  }
};
using HostCall = HostPlacedCall<CallConfig, kdajit_decode_args_t, build_args>;

}  // namespace kdajit::test
