// Builds the benchmark's host problems on worker threads while the GPU thread
// measures the ones already built. Drawing the random state of a large problem
// takes tens of seconds on one core (~50-90 ns per element), so the problems
// are built in parallel, largest first, under a cap on the host memory held.
#pragma once

#include <fmt/format.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "bench_cuda.hpp"
#include "kdajit/problem.hpp"

namespace kdajit::bench {

class ProblemPool {
 public:
  struct Job {
    size_t id;  // the caller's index for this problem
    ref::ProblemSpec spec;
    size_t host_bytes;  // estimate of the host memory a built problem holds
  };
  struct Built {
    size_t id;
    Result<ref::Problem> problem;
    double seconds;
    size_t host_bytes;
  };

  // Jobs start in the order given (put the largest first). A job starts only
  // while the bytes held stay under host_cap, except when nothing is held.
  ProblemPool(std::vector<Job> jobs, int threads, size_t host_cap) : st_(std::make_shared<State>()) {
    st_->jobs = std::move(jobs);
    st_->started.assign(st_->jobs.size(), false);
    st_->cap = host_cap;
    for (int i = 0; i < threads; ++i) workers_.emplace_back(&ProblemPool::work, st_);
  }

  // Joins idle workers. A worker still inside Problem::make cannot be
  // interrupted: it is detached and keeps only the shared state alive.
  ~ProblemPool() {
    {
      std::lock_guard<std::mutex> l(st_->m);
      st_->stopping = true;
    }
    st_->cv.notify_all();
    const bool busy = this->busy();
    for (auto& w : workers_) {
      if (busy)
        w.detach();
      else
        w.join();
    }
  }
  ProblemPool(const ProblemPool&) = delete;
  ProblemPool& operator=(const ProblemPool&) = delete;

  // The next built problem; nullopt once every job was delivered or at the deadline.
  std::optional<Built> next(Clock::time_point deadline) {
    std::unique_lock<std::mutex> l(st_->m);
    for (;;) {
      if (!st_->done.empty()) {
        Built b = std::move(st_->done.front());
        st_->done.pop_front();
        ++st_->delivered;
        return b;
      }
      if (st_->delivered == st_->jobs.size()) return std::nullopt;
      if (st_->cv.wait_until(l, deadline) == std::cv_status::timeout && st_->done.empty()) return std::nullopt;
    }
  }

  // The consumer has freed a delivered problem's host memory.
  void release(size_t host_bytes) {
    {
      std::lock_guard<std::mutex> l(st_->m);
      st_->held -= std::min(st_->held, host_bytes);
    }
    st_->cv.notify_all();
  }

  // Stops starting new jobs (the ones running finish on their own).
  void stop() {
    {
      std::lock_guard<std::mutex> l(st_->m);
      st_->stopping = true;
    }
    st_->cv.notify_all();
  }

  // Some worker is inside Problem::make.
  bool busy() const {
    std::lock_guard<std::mutex> l(st_->m);
    return st_->running > 0;
  }

 private:
  struct State {
    mutable std::mutex m;
    std::condition_variable cv;
    std::vector<Job> jobs;
    std::vector<bool> started;
    std::deque<Built> done;
    size_t held = 0, cap = 0, delivered = 0;
    int running = 0;
    bool stopping = false;
  };

  static void work(std::shared_ptr<State> st) {
    std::unique_lock<std::mutex> l(st->m);
    for (;;) {
      if (st->stopping) return;
      size_t pick = st->jobs.size();
      bool all_started = true;
      for (size_t i = 0; i < st->jobs.size(); ++i) {
        if (st->started[i]) continue;
        all_started = false;
        if (st->held == 0 || st->held + st->jobs[i].host_bytes <= st->cap) {
          pick = i;
          break;
        }
      }
      if (all_started) return;
      if (pick == st->jobs.size()) {
        st->cv.wait(l);
        continue;
      }
      st->started[pick] = true;
      const Job job = st->jobs[pick];
      st->held += job.host_bytes;
      ++st->running;
      l.unlock();

      const auto t0 = Clock::now();
      std::optional<Result<ref::Problem>> made;
      try {
        made.emplace(ref::Problem::make(job.spec));
      } catch (const std::exception& e) {  // std::bad_alloc for a problem that does not fit
        made.emplace(Error(ErrorCode::internal, fmt::format("Problem::make: {}", e.what())));
      }
      const double secs = seconds_since(t0);

      l.lock();
      --st->running;
      st->done.push_back(Built{job.id, std::move(*made), secs, job.host_bytes});
      st->cv.notify_all();
    }
  }

  std::shared_ptr<State> st_;
  std::vector<std::thread> workers_;
};

}  // namespace kdajit::bench
