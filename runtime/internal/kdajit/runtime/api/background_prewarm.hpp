// Background pre-warm: worker threads compile queued kernel keys into the
// runtime's cache while calls run on what is ready. A call that needs a key a
// worker is compiling waits on the cache's single flight for that key; nothing
// compiles twice.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "kdajit/kernel_key.hpp"

namespace kdajit {

class KernelCache;

class BackgroundPrewarm {
 public:
  explicit BackgroundPrewarm(KernelCache& cache) : cache_(cache) {}
  // Stops taking keys from the queue and joins the workers (a compile under way finishes).
  ~BackgroundPrewarm();

  // Queues `keys` and makes sure `threads` workers (at least 1) run.
  void submit(const std::vector<KernelKey>& keys, unsigned threads);
  // Blocks until the queue is empty and no worker compiles.
  void wait();

  uint64_t pending() const { return pending_.load(std::memory_order_relaxed); }
  uint64_t compiled() const { return compiled_.load(std::memory_order_relaxed); }
  uint64_t failed() const { return failed_.load(std::memory_order_relaxed); }

 private:
  void work();

  KernelCache& cache_;
  std::mutex mu_;
  std::condition_variable idle_;
  std::deque<KernelKey> queue_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
  std::atomic<uint64_t> pending_{0}, compiled_{0}, failed_{0};
};

}  // namespace kdajit
