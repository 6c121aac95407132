// Device side of the GPU tests: Catch2 wrappers around the one upload/download
// helper (kdajit/device_problem.hpp), a runtime per route, the test stream and
// the device's arch.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "catch.hpp"
#include "kdajit/device_problem.hpp"
#include "kdajit/kdajit.hpp"
#include "kdajit/kernel_key.hpp"
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

// A runtime of these options; a test program without one cannot run, so it aborts.
inline std::unique_ptr<Runtime> make_runtime(const RuntimeOptions& opts) {
  std::unique_ptr<Runtime> r;
  Outcome o = Runtime::create(opts, &r);
  if (!o) {
    std::fprintf(stderr, "kdajit runtime: %s\n", o.message.c_str());
    std::abort();
  }
  return r;
}

// The selector's runtime (built-in bands: no tune table is consulted).
inline Runtime& runtime() {
  static std::unique_ptr<Runtime> rt = [] {
    RuntimeOptions opts;
    opts.use_tuning = false;
    return make_runtime(opts);
  }();
  return *rt;
}

// A runtime whose every call runs `route` (options.route): each route is tested
// on every shape, whatever the selector would pick.
inline Runtime& runtime_for(std::string_view route) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Runtime>, std::less<>> rts;
  std::lock_guard lock(mu);
  auto& rt = rts[std::string(route)];
  if (!rt) {
    RuntimeOptions opts;
    opts.route = std::string(route);
    rt = make_runtime(opts);
  }
  return *rt;
}
inline Runtime& runtime_for(Route route) { return runtime_for(to_string(route)); }

// One non-blocking stream for every call of the test program.
inline cudaStream_t stream() {
  static cudaStream_t s = [] {
    cudaStream_t st = nullptr;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    return st;
  }();
  return s;
}

// Device 0's arch (sm_90 where it cannot be read).
inline Arch device_arch() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return Arch::sm_90;
  auto a = arch_for_compute_capability(prop.major, prop.minor);
  return a ? *a : Arch::sm_90;
}

}  // namespace kdajit::test
