// What both grids of kdajit_bench share before their cells: the exit codes,
// the watchdog, opening and describing the device (the L2 flush buffer), and
// the baselines (the copy roofline, the host cost of a memset).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "measure.hpp"

namespace kdajit::bench {

// Exit codes (README): 0 all measured, 1 a kdajit or CUDA call failed,
// 2 usage error or no usable CUDA device, 3 time limit hit (partial results),
// 4 the GPU hung (a wait or the watchdog ran out of time).
enum ExitCode : int { kExitOk = 0, kExitFailed = 1, kExitUsage = 2, kExitTimeLimit = 3, kExitHung = 4 };

// Kills the process if the run outlives its hard limit: the last guard against
// a hang inside a CUDA call that no timeout of ours covers.
class Watchdog {
 public:
  explicit Watchdog(double seconds)
      : thread_([this, seconds] {
          std::unique_lock<std::mutex> l(m_);
          if (!cv_.wait_for(l, std::chrono::duration<double>(seconds), [this] { return done_; })) {
            std::fprintf(stderr, "kdajit_bench: watchdog: still running after %.0f s (a hung GPU or call); exiting\n",
                         seconds);
            std::fflush(nullptr);
            std::_Exit(kExitHung);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> l(m_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

// Opens the device; a machine without one is a usage error (exit 2), not a crash.
Status open_device(int device);
// Fills b.gpu, b.sms, b.smem_per_sm, b.arch and allocates the L2 flush buffer.
Status describe_device(Bench& b);
// D2D copy bandwidth, read + write bytes counted: the roofline. Then the host
// cost of a 4-byte cudaMemsetAsync, a launch-like baseline for the host column.
Status measure_baselines(Bench& b);

}  // namespace kdajit::bench
