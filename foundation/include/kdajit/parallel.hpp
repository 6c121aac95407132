// Runs fn(i) for i in [0, n) on up to `jobs` threads, each taking the next
// index when it is free (compiles differ in length, so no static split).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace kdajit {

template <class Fn>
void parallel_for(size_t n, unsigned jobs, Fn&& fn) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> pool;
  for (size_t t = 0; t < std::min<size_t>(std::max(1u, jobs), n); ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
}

}  // namespace kdajit
