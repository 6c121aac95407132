// The device buffers of one family of cells, filled on the device with random
// data of roughly the docs/CONTRACT.md §8 distributions (a counter-based hash, so the
// fill takes milliseconds even for gigabytes of state), and the decode
// arguments of each cell pointing at them.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bench_cuda.hpp"
#include "driver.hpp"
#include "grid.hpp"
#include "kdajit/kdajit.h"

namespace kdajit::bench {

// Elements and bytes of a dense view (bf16 2 bytes, f32 and int32 4); 0 for an empty one.
int64_t elements(const kdajit_tensor_t& t);
size_t tensor_bytes(const kdajit_tensor_t& t);

// The NVRTC source of fill_f32 / fill_bf16 (value = offset + scale * ~N(0,1)).
std::string fill_source();

class FillKernels {
 public:
  Status load(const std::string& cubin);
  Status fill(const kdajit_tensor_t& t, uint64_t seed, float scale, float offset, cudaStream_t s) const;

 private:
  Module module_;
  CUfunction f32_ = nullptr, bf16_ = nullptr;
};

// A view of `dtype` with these shapes and strides and no data yet (set when the
// buffers exist).
kdajit_tensor_t layout_view(kdajit_dtype_t dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> strides);

// A tensor of an argument struct (kdajit_decode_args_t, kdajit_prefill_args_t)
// with its fill: value = offset + scale * ~N(0,1); scale 0 (and offset 0): written
// by the host or zeroed. Both grids list every tensor of their call, in struct
// order, and the same distributions (docs/CONTRACT.md §8).
template <class Args>
struct TensorFill {
  kdajit_tensor_t Args::*field;
  float scale, offset;
};

// Gives each non-empty tensor of `tensors` a stand-in data pointer (aligned,
// never dereferenced, one 2^36 apart): enough for validation and route
// selection, which read no device memory.
template <class Args>
void set_stand_in_pointers(Args& a, std::span<const TensorFill<Args>> tensors) {
  uintptr_t at = uintptr_t{1} << 36;
  for (const TensorFill<Args>& t : tensors) {
    kdajit_tensor_t& v = a.*t.field;
    if (v.ndim > 0) v.data = reinterpret_cast<void*>(at);
    at += uintptr_t{1} << 36;
  }
}

// Device bytes of the tensors' dense views.
template <class Args>
size_t tensors_bytes(const Args& a, std::span<const TensorFill<Args>> tensors) {
  size_t n = 0;
  for (const TensorFill<Args>& t : tensors) n += tensor_bytes(a.*t.field);
  return n;
}

// The views and scalars both ops' argument structs share: `rows` rows (tokens)
// of H = `heads` heads, `slots` state slots, conv_state of `taps` taps in
// layout `conv`, the state in `state`; the bounded gate (lower bound -5),
// norm_eps 1e-6, no out-of-range counter. Data pointers null.
template <class Args>
void set_shared_views(Args& a, int64_t rows, int64_t heads, int64_t slots, int64_t taps, ConvLayout conv,
                      StateDtype state) {
  const int64_t H = heads, hidden = H * D, qkv = 3 * hidden, R = rows, S = slots, K = taps;
  a.x = layout_view(KDAJIT_DTYPE_BF16, {R, qkv}, {qkv, 1});
  a.conv_weight = layout_view(KDAJIT_DTYPE_F32, {3, 4, hidden}, {4 * hidden, hidden, 1});
  a.conv_state = conv == ConvLayout::sd ? layout_view(KDAJIT_DTYPE_BF16, {S, qkv, K}, {qkv * K, 1, qkv})
                                        : layout_view(KDAJIT_DTYPE_BF16, {S, qkv, K}, {qkv * K, K, 1});
  a.raw_gate = layout_view(KDAJIT_DTYPE_BF16, {R, H, D}, {hidden, D, 1});
  a.raw_beta = layout_view(KDAJIT_DTYPE_BF16, {R, H}, {H, 1});
  a.A_log = layout_view(KDAJIT_DTYPE_F32, {H}, {1});
  a.dt_bias = layout_view(KDAJIT_DTYPE_F32, {hidden}, {1});
  a.state = layout_view(c_dtype(state), {S, H, D, D}, {H * D * D, D * D, D, 1});
  a.output_gate = layout_view(KDAJIT_DTYPE_BF16, {R, H, D}, {hidden, D, 1});
  a.norm_weight = layout_view(KDAJIT_DTYPE_F32, {D}, {1});
  a.output = layout_view(KDAJIT_DTYPE_BF16, {R, H, D}, {hidden, D, 1});
  a.gate = KDAJIT_GATE_BOUNDED;
  a.lower_bound = -5.0f;
  a.norm_eps = 1e-6f;
  a.oob_counter = nullptr;
}

// The first `n` of the live slots 1..slots-1 shuffled by `rng`: distinct, one
// per row / sequence, never the null slot 0.
std::vector<int32_t> shuffled_slots(int64_t slots, size_t n, std::mt19937_64& rng);

// The device buffers behind an argument struct's tensors.
class TensorBuffers {
 public:
  // Allocates a buffer for each non-empty tensor and points it there, fills the
  // float ones on `s` (one hash stream per tensor, from `seed`) and zeroes the
  // output; the caller copies the metadata and waits.
  template <class Args>
  Status allocate_and_fill(Args& a, std::span<const TensorFill<Args>> tensors, const FillKernels& fill,
                           uint64_t seed, cudaStream_t s) {
    for (const TensorFill<Args>& t : tensors) KDAJIT_TRY(allocate(a.*t.field));
    uint64_t stream_id = 0;
    for (const TensorFill<Args>& t : tensors) {
      ++stream_id;
      if (t.scale != 0.0f) KDAJIT_TRY(fill.fill(a.*t.field, seed * 1000003u + stream_id, t.scale, t.offset, s));
    }
    BENCH_CUDA(cudaMemsetAsync(a.output.data, 0, tensor_bytes(a.output), s));
    return {};
  }
  size_t bytes() const { return bytes_; }

 private:
  Status allocate(kdajit_tensor_t& v);
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  size_t bytes_ = 0;
};

// The argument views (shapes, strides, scalars) of a family's largest cell;
// data pointers are null. Every slot live: S = rows (single) or N*T (packed)
// slots + the null slot 0 + 3 spares.
kdajit_decode_args_t layout_args(const Cell& shape);

// The arguments of a smaller cell of the family: the first rows / sequences.
kdajit_decode_args_t narrow_args(const Cell& c, const kdajit_decode_args_t& family_args);

// layout_args with stand-in data pointers (aligned, never dereferenced): enough
// for validation and route selection, which read no memory.
kdajit_decode_args_t stand_in_args(const Cell& shape);

// One call's arguments and the device buffers they point at; each grid's data
// class makes them (DeviceData here, PrefillData in prefill_data.hpp).
template <class Args>
class DeviceArgs {
 public:
  DeviceArgs(const DeviceArgs&) = delete;
  DeviceArgs& operator=(const DeviceArgs&) = delete;

  const Args& args() const { return args_; }
  size_t bytes() const { return buffers_.bytes(); }

 protected:
  DeviceArgs() = default;
  Args args_{};
  TensorBuffers buffers_;
};

class DeviceData : public DeviceArgs<kdajit_decode_args_t> {
 public:
  // Device bytes the family's buffers take.
  static size_t bytes_needed(const Cell& shape);
  // Allocates and fills (slots: a shuffled set of distinct live slots in 1..S-1;
  // packed: qsl = 0, T, 2T, ..., num_accepted random in 1..T); waits for the fill.
  static Result<std::unique_ptr<DeviceData>> create(const Cell& shape, const FillKernels& fill, cudaStream_t s,
                                                    uint64_t seed, double timeout_s);

 private:
  DeviceData() = default;
};

}  // namespace kdajit::bench
