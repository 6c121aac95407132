// Device side of the GPU tests: upload a reference Problem's buffers, run a
// kdajit call on them, download what the call writes.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "catch.hpp"
#include "kdajit/kdajit.hpp"
#include "kdajit/problem.hpp"

namespace kdajit::test {

#define KDAJIT_CUDA_CHECK(expr)                                                                   \
  do {                                                                                            \
    cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) FAIL(std::string(#expr) + ": " + cudaGetErrorString(e_));              \
  } while (0)

// Device copies of every buffer of a problem, and args pointing at them.
class DeviceProblem {
 public:
  explicit DeviceProblem(ref::Problem& p) : args_(p.args()) {
    for (auto& b : p.buffers()) {
      void* d = nullptr;
      REQUIRE(cudaMalloc(&d, b.bytes->size()) == cudaSuccess);
      ptrs_.push_back({b.tensor, d, b.bytes->size(), b.written});
      (args_.*b.view).data = d;
    }
    upload(p);
  }
  ~DeviceProblem() {
    for (auto& d : ptrs_) cudaFree(d.ptr);
  }
  DeviceProblem(const DeviceProblem&) = delete;
  DeviceProblem& operator=(const DeviceProblem&) = delete;

  // Copies every buffer of p (same shapes as the constructor's) to the device.
  void upload(ref::Problem& p) {
    for (auto& d : ptrs_) {
      const auto& bytes = p.bytes(d.tensor);
      REQUIRE(bytes.size() == d.size);
      REQUIRE(cudaMemcpy(d.ptr, bytes.data(), d.size, cudaMemcpyHostToDevice) == cudaSuccess);
    }
    // The call's scalars come from the problem too.
    const auto a = p.args();
    args_.norm_eps = a.norm_eps;
    args_.lower_bound = a.lower_bound;
    args_.gate = a.gate;
    args_.state_indices_mode = a.state_indices_mode;
  }
  // Copies the buffers the call writes back into p.
  void download(ref::Problem& p) {
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    for (auto& d : ptrs_)
      if (d.written)
        REQUIRE(cudaMemcpy(p.bytes(d.tensor).data(), d.ptr, d.size, cudaMemcpyDeviceToHost) == cudaSuccess);
  }
  const kdajit_decode_args_t& args() const { return args_; }
  kdajit_decode_args_t& args() { return args_; }

 private:
  struct Dev {
    ref::Tensor tensor;
    void* ptr;
    size_t size;
    bool written;
  };
  kdajit_decode_args_t args_;
  std::vector<Dev> ptrs_;
};

inline Outcome run_op(Runtime& rt, kdajit_op_t op, const kdajit_decode_args_t& args, cudaStream_t stream) {
  auto s = reinterpret_cast<kdajit_stream_t>(stream);
  return op == KDAJIT_OP_SINGLE ? rt.single_decode(args, s) : rt.packed_decode(args, s);
}

}  // namespace kdajit::test
