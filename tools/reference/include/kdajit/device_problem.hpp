// Device copies of every buffer of a reference Problem, and decode arguments
// pointing at them: the one upload/download helper of `kdajit selfcheck`, the
// GPU tests and the benchmarks. Through kdajit's dlopen'ed driver API, so it
// needs no CUDA runtime; errors come back as values.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "kdajit/error.hpp"
#include "kdajit/kdajit.h"
#include "kdajit/problem.hpp"

namespace kdajit::ref {

class DeviceProblem {
 public:
  // Bytes of device memory upload() would allocate for p.
  static size_t device_bytes(Problem& p);

  // Allocates and copies every buffer of p in the current CUDA context (device
  // 0's primary context when none is current).
  static Result<std::unique_ptr<DeviceProblem>> upload(Problem& p);
  ~DeviceProblem();
  DeviceProblem(const DeviceProblem&) = delete;
  DeviceProblem& operator=(const DeviceProblem&) = delete;

  // Copies every buffer of p (same shapes as at upload) and the call's scalars
  // again; returns when the copies have landed (upload too), so that a launch
  // on any stream sees them.
  Status reupload(Problem& p);
  // Waits for the context's work, then copies the buffers the call writes into p.
  Status download(Problem& p) const;

  const kdajit_decode_args_t& args() const { return args_; }
  kdajit_decode_args_t& args() { return args_; }
  size_t bytes() const { return bytes_; }

 private:
  DeviceProblem() = default;
  struct Buffer {
    Tensor tensor;
    unsigned long long ptr;  // CUdeviceptr
    size_t size;
    bool written;
  };
  kdajit_decode_args_t args_{};
  std::vector<Buffer> buffers_;
  size_t bytes_ = 0;
};

}  // namespace kdajit::ref
