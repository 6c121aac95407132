// Device side of the GPU tests: Catch2 wrappers around the one upload/download
// helper (kdajit/device_problem.hpp) and a runtime per route.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <string>

#include "catch.hpp"
#include "kdajit/device_problem.hpp"
#include "kdajit/kdajit.hpp"
#include "kdajit/problem.hpp"

namespace kdajit::test {

#define KDAJIT_CUDA_CHECK(expr)                                                                   \
  do {                                                                                            \
    cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) FAIL(std::string(#expr) + ": " + cudaGetErrorString(e_));              \
  } while (0)

// Device copies of a problem; any failure fails the test case.
class DeviceProblem {
 public:
  explicit DeviceProblem(ref::Problem& p) {
    auto d = ref::DeviceProblem::upload(p);
    if (!d) FAIL("upload: " << d.error().message);
    dev_ = std::move(d).value();
  }
  void upload(ref::Problem& p) {
    Status s = dev_->reupload(p);
    if (!s) FAIL("reupload: " << s.error().message);
  }
  void download(ref::Problem& p) {
    Status s = dev_->download(p);
    if (!s) FAIL("download: " << s.error().message);
  }
  const kdajit_decode_args_t& args() const { return dev_->args(); }
  kdajit_decode_args_t& args() { return dev_->args(); }

 private:
  std::unique_ptr<ref::DeviceProblem> dev_;
};

inline Outcome run_op(Runtime& rt, kdajit_op_t op, const kdajit_decode_args_t& args, cudaStream_t stream) {
  auto s = reinterpret_cast<kdajit_stream_t>(stream);
  return op == KDAJIT_OP_SINGLE ? rt.single_decode(args, s) : rt.packed_decode(args, s);
}

}  // namespace kdajit::test
