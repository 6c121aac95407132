// Device copies of every buffer of a reference Problem, and decode arguments
// pointing at them. The upload pattern of tests/gpu/gpu_harness.hpp's
// DeviceProblem, without Catch2: failures come back as a Status.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "bench_cuda.hpp"
#include "kdajit/kdajit.h"
#include "kdajit/problem.hpp"

namespace kdajit::bench {

class DeviceProblem {
 public:
  // Bytes of device memory upload() would allocate for p.
  static size_t device_bytes(ref::Problem& p) {
    size_t n = 0;
    for (const auto& b : p.buffers()) n += b.bytes->size();
    return n;
  }

  static Result<std::unique_ptr<DeviceProblem>> upload(ref::Problem& p) {
    std::unique_ptr<DeviceProblem> dp(new DeviceProblem());
    dp->args_ = p.args();  // views and scalars; data pointers replaced below
    for (const auto& b : p.buffers()) {
      void* d = nullptr;
      BENCH_CUDA(cudaMalloc(&d, b.bytes->size()));
      dp->ptrs_.push_back(d);  // freed by the destructor, also on a later failure
      BENCH_CUDA(cudaMemcpy(d, b.bytes->data(), b.bytes->size(), cudaMemcpyHostToDevice));
      (dp->args_.*b.view).data = d;
      dp->bytes_ += b.bytes->size();
    }
    return dp;
  }

  ~DeviceProblem() {
    for (void* d : ptrs_) cudaFree(d);
  }
  DeviceProblem(const DeviceProblem&) = delete;
  DeviceProblem& operator=(const DeviceProblem&) = delete;

  const kdajit_decode_args_t& args() const { return args_; }
  size_t bytes() const { return bytes_; }

 private:
  DeviceProblem() = default;

  kdajit_decode_args_t args_{};
  std::vector<void*> ptrs_;
  size_t bytes_ = 0;
};

}  // namespace kdajit::bench
