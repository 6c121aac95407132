#include "kdajit/runtime/api/background_prewarm.hpp"

#include "kdajit/cache.hpp"
#include "kdajit/log.hpp"
#include "kdajit/runtime/jit/obtain.hpp"

namespace kdajit {

BackgroundPrewarm::~BackgroundPrewarm() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    pending_.fetch_sub(queue_.size(), std::memory_order_relaxed);
    queue_.clear();
  }
  for (auto& t : workers_) t.join();
}

void BackgroundPrewarm::submit(const std::vector<KernelKey>& keys, unsigned threads) {
  std::lock_guard lock(mu_);
  for (const auto& k : keys) queue_.push_back(k);
  pending_.fetch_add(keys.size(), std::memory_order_relaxed);
  while (workers_.size() < std::max(1u, threads)) workers_.emplace_back([this] { work(); });
}

void BackgroundPrewarm::wait() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [this] { return pending_.load(std::memory_order_relaxed) == 0; });
}

void BackgroundPrewarm::work() {
  for (;;) {
    KernelKey key;
    {
      std::lock_guard lock(mu_);
      if (stop_ || queue_.empty()) return;
      key = queue_.front();
      queue_.pop_front();
    }
    // obtain(): memory, then disk, then compile and publish; a key that a call
    // (or another worker) is building is waited for, not built again.
    auto r = obtain(cache_, key, /*allow_build=*/true);
    if (!r) {
      failed_.fetch_add(1, std::memory_order_relaxed);
      log_warning("background pre-warm of {} failed: {}", key_name(key), r.error().message);
    } else if (compiled_now(*r)) {
      compiled_.fetch_add(1, std::memory_order_relaxed);
    }
    std::lock_guard lock(mu_);
    if (pending_.fetch_sub(1, std::memory_order_relaxed) == 1) idle_.notify_all();
  }
}

}  // namespace kdajit
