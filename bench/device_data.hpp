// The device buffers of one family of cells, filled on the device with random
// data of roughly the docs/CONTRACT.md §8 distributions (a counter-based hash, so the
// fill takes milliseconds even for gigabytes of state), and the decode
// arguments of each cell pointing at them.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
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

// The argument views (shapes, strides, scalars) of a family's largest cell;
// data pointers are null. Every slot live: S = rows (single) or N*T (packed)
// slots + the null slot 0 + 3 spares.
kdajit_decode_args_t layout_args(const Cell& shape);

// The arguments of a smaller cell of the family: the first rows / sequences.
kdajit_decode_args_t narrow_args(const Cell& c, const kdajit_decode_args_t& family_args);

// layout_args with stand-in data pointers (aligned, never dereferenced): enough
// for validation and route selection, which read no memory.
kdajit_decode_args_t stand_in_args(const Cell& shape);

class DeviceData {
 public:
  // Device bytes the family's buffers take.
  static size_t bytes_needed(const Cell& shape);
  // Allocates and fills (slots: a shuffled set of distinct live slots in 1..S-1;
  // packed: qsl = 0, T, 2T, ..., num_accepted random in 1..T); waits for the fill.
  static Result<std::unique_ptr<DeviceData>> create(const Cell& shape, const FillKernels& fill, cudaStream_t s,
                                                    uint64_t seed, double timeout_s);
  DeviceData(const DeviceData&) = delete;
  DeviceData& operator=(const DeviceData&) = delete;

  const kdajit_decode_args_t& args() const { return args_; }
  size_t bytes() const { return bytes_; }

 private:
  DeviceData() = default;
  kdajit_decode_args_t args_{};
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  size_t bytes_ = 0;
};

}  // namespace kdajit::bench
