// CUDA helpers of the decode benchmark: CUDA errors as kdajit::Status, waits
// that give up instead of hanging, a stream gate for back-to-back timing, and
// summary statistics.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kdajit/error.hpp"

namespace kdajit::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
inline double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return Error(ErrorCode::cuda, fmt::format("{}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e)));
}

// Returns the error of a failing CUDA runtime call from the enclosing function.
#define BENCH_CUDA(expr) KDAJIT_TRY(::kdajit::bench::cuda_status((expr), #expr))

// Set once a wait ran out of time: the GPU is presumed hung and nothing may
// wait on it again (the program then writes what it has and exits).
inline std::atomic<bool>& gpu_hung() {
  static std::atomic<bool> flag{false};
  return flag;
}

// Polls instead of cudaStreamSynchronize so that a hung kernel becomes an
// error after timeout_s rather than a process that never ends.
inline Status wait_stream(cudaStream_t s, double timeout_s, const char* what) {
  const auto t0 = Clock::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return {};
    if (e != cudaErrorNotReady) return cuda_status(e, what);
    if (seconds_since(t0) > timeout_s) {
      gpu_hung() = true;
      return Error(ErrorCode::cuda, fmt::format("{}: the GPU did not finish within {} s (hung?)", what, timeout_s));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// Holds a stream until the host has queued a batch of timed launches. Without
// it a GPU that catches up with the host times the host's launch latency
// between the start event and the graph, not the kernel. It opens by itself
// after kMaxHold, so a full launch queue (the host blocked in an enqueue) cannot
// deadlock; timed_out() tells the caller the batch was not held as intended.
class StreamGate {
 public:
  static constexpr double kMaxHoldSeconds = 2.0;

  Status close(cudaStream_t s) {
    return cuda_status(cudaLaunchHostFunc(s, &StreamGate::hold, this), "cudaLaunchHostFunc(stream gate)");
  }
  void open() { open_.store(true, std::memory_order_release); }
  bool timed_out() const { return timed_out_.load(std::memory_order_acquire); }

 private:
  // Runs on the driver's callback thread: no CUDA calls here.
  static void CUDART_CB hold(void* self) {
    auto* g = static_cast<StreamGate*>(self);
    const auto t0 = Clock::now();
    while (!g->open_.load(std::memory_order_acquire)) {
      if (seconds_since(t0) > kMaxHoldSeconds) {
        g->timed_out_.store(true, std::memory_order_release);
        return;
      }
      std::this_thread::yield();
    }
  }

  std::atomic<bool> open_{false};
  std::atomic<bool> timed_out_{false};
};

// One cudaMalloc'ed buffer, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }
  Status allocate(size_t bytes) {
    reset();
    BENCH_CUDA(cudaMalloc(&ptr_, bytes));
    bytes_ = bytes;
    return {};
  }
  void reset() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Pairs of timing events, created once and reused by every timed loop.
class EventPairs {
 public:
  EventPairs() = default;
  EventPairs(const EventPairs&) = delete;
  EventPairs& operator=(const EventPairs&) = delete;
  ~EventPairs() {
    for (cudaEvent_t e : start_) cudaEventDestroy(e);
    for (cudaEvent_t e : stop_) cudaEventDestroy(e);
  }
  Status create(int n) {
    for (int i = 0; i < n; ++i) {
      cudaEvent_t a = nullptr, b = nullptr;
      BENCH_CUDA(cudaEventCreate(&a));
      start_.push_back(a);
      BENCH_CUDA(cudaEventCreate(&b));
      stop_.push_back(b);
    }
    return {};
  }
  int size() const { return static_cast<int>(start_.size()); }
  cudaEvent_t start(int i) const { return start_[static_cast<size_t>(i)]; }
  cudaEvent_t stop(int i) const { return stop_[static_cast<size_t>(i)]; }
  // Microseconds between start(i) and stop(i), for i < n.
  Result<std::vector<double>> elapsed_us(int n) const {
    std::vector<double> us;
    us.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      float ms = 0.f;
      BENCH_CUDA(cudaEventElapsedTime(&ms, start(i), stop(i)));
      us.push_back(static_cast<double>(ms) * 1e3);
    }
    return us;
  }

 private:
  std::vector<cudaEvent_t> start_, stop_;
};

// Enqueues `iters` timed operations, each between its own event pair, in
// batches held by a StreamGate when `gated`: before(i) runs outside the events
// (e.g. an L2 flush), body(i) inside. Waits for the stream and returns the
// per-operation times in microseconds; gate_timeouts counts gates that opened
// by themselves.
template <class Before, class Body>
Result<std::vector<double>> time_on_stream(cudaStream_t s, const EventPairs& ev, int iters, double timeout_s,
                                           bool gated, int* gate_timeouts, Before&& before, Body&& body) {
  if (iters > ev.size())
    return Error(ErrorCode::internal,
                 fmt::format("time_on_stream: {} iterations but {} event pairs", iters, ev.size()));
  // Small batches keep the launch queue far from full while a gate holds it.
  constexpr int kBatch = 32;
  std::vector<std::unique_ptr<StreamGate>> gates;
  Status st;
  for (int i0 = 0; i0 < iters && st; i0 += kBatch) {
    StreamGate* gate = nullptr;
    if (gated) {
      gate = gates.emplace_back(std::make_unique<StreamGate>()).get();
      st = gate->close(s);
    }
    for (int i = i0; i < std::min(iters, i0 + kBatch) && st; ++i) {
      st = before(i);
      if (st) st = cuda_status(cudaEventRecord(ev.start(i), s), "cudaEventRecord(start)");
      if (st) st = body(i);
      if (st) st = cuda_status(cudaEventRecord(ev.stop(i), s), "cudaEventRecord(stop)");
    }
    if (gate) gate->open();
  }
  for (auto& g : gates) g->open();  // also after an error, so that the stream drains
  Status waited = wait_stream(s, timeout_s, "timed loop");
  if (!waited) {
    // A callback may still be about to read its gate: leak them rather than free them under it.
    for (auto& g : gates) (void)g.release();
    return std::move(waited).error();
  }
  if (!st) return std::move(st).error();
  for (auto& g : gates)
    if (g->timed_out()) ++*gate_timeouts;
  return ev.elapsed_us(iters);
}

struct Summary {
  size_t n = 0;
  double median = 0, min = 0, p10 = 0, p90 = 0, max = 0, mean = 0;
};

inline Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.n = v.size();
  auto at = [&](double q) { return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)]; };
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  s.min = v.front();
  s.max = v.back();
  s.p10 = at(0.10);
  s.p90 = at(0.90);
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

}  // namespace kdajit::bench
