// The dense bf16 tensor-core rate of the device, for the prefill grid's
// tensor-core floor: a kernel of back-to-back mma.sync.m16n8k16 bf16 products
// with f32 accumulation on register operands (no memory traffic but one store
// per thread at the end), every SM full, timed with CUDA events.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "driver.hpp"
#include "kdajit/error.hpp"

namespace kdajit::bench {

// The NVRTC source (entry mma_bf16_rate). Needs sm_80 or later.
std::string mma_rate_source();
// Whether an arch ("sm_90", "sm_90a") has mma.sync with bf16 operands.
bool mma_bf16_supported(const std::string& arch);

class MmaRate {
 public:
  // The launch: kBlocksPerSm CTAs of kThreads threads per SM, each warp
  // kChains independent accumulator chains of `iters` products each.
  static constexpr int kThreads = 256;
  static constexpr int kBlocksPerSm = 4;
  static constexpr int kChains = 8;
  static constexpr int kIters = 16384;
  static constexpr int64_t kFlopPerMma = 2 * 16 * 8 * 16;  // m16n8k16

  Status load(const std::string& cubin, int sms);
  bool loaded() const { return fn_ != nullptr; }
  // FLOPs of one launch.
  int64_t flops() const;
  // One launch on s; out: kThreads * blocks floats (the sums that keep the products live).
  Status launch(void* out, cudaStream_t s) const;
  size_t out_bytes() const { return static_cast<size_t>(blocks_) * kThreads * sizeof(float); }

 private:
  Module module_;
  CUfunction fn_ = nullptr;
  int blocks_ = 0;
};

}  // namespace kdajit::bench
