#include "kdajit_internal.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

// The internal layout before the route API (runtime/internal/kdajit/runtime/*.hpp).
#if __has_include("kdajit/runtime/kernels.hpp") && __has_include("kdajit/runtime/validate.hpp")
#define KDAJIT_BENCH_OLD_INTERNALS 1
#include "kdajit/kernel_key.hpp"
#include "kdajit/log.hpp"
#include "kdajit/runtime/driver_api.hpp"
#include "kdajit/runtime/kernels.hpp"
#include "kdajit/runtime/validate.hpp"
#else
#define KDAJIT_BENCH_OLD_INTERNALS 0
#endif

namespace kdajit::bench {

#if KDAJIT_BENCH_OLD_INTERNALS

PrewarmResult prewarm_keys(const std::string& cache_dir, const std::vector<std::string>& key_names, int jobs,
                           bool verbose) {
  const auto t0 = std::chrono::steady_clock::now();
  PrewarmResult out;
  out.keys = key_names.size();
  set_log_level(verbose ? LogLevel::info : LogLevel::quiet);  // this copy of the internals only
  std::mutex mu;
  auto fail = [&](const std::string& key, const std::string& msg) {
    std::lock_guard<std::mutex> l(mu);
    ++out.failed;
    out.errors.push_back(fmt::format("{}: {}", key, msg.substr(0, msg.find('\n'))));
  };
  auto cache = open_kernel_cache(cache_dir);
  if (!cache) {
    for (const auto& k : key_names) fail(k, "open_kernel_cache: " + cache.error().message);
    return out;
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < key_names.size();) {
      auto key = parse_key(key_names[i]);
      if (!key) {
        fail(key_names[i], key.error().message);
        continue;
      }
      auto cubin = obtain_cubin(cache->get(), *key, /*allow_build=*/true);
      if (!cubin) fail(key_names[i], cubin.error().message);
    }
  };
  std::vector<std::thread> pool;
  const size_t n = std::min<size_t>(static_cast<size_t>(std::max(1, jobs)), key_names.size());
  for (size_t t = 0; t < n; ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

Outcome internal_selected_key(kdajit_op_t op, const DecodeArgs& args, int device, std::string* key) {
  auto call = validate_decode(op == KDAJIT_OP_SINGLE ? Op::single : Op::packed, args);
  if (!call) return make_outcome(static_cast<kdajit_status_t>(call.error().code), call.error().message);
  auto arch = local_arch(device);
  if (!arch) return make_outcome(static_cast<kdajit_status_t>(arch.error().code), arch.error().message);
  *key = key_name(key_for_call(*call, *arch));
  return {};
}

#else  // the public API has Runtime::prewarm and Runtime::selected_key: these are never called

PrewarmResult prewarm_keys(const std::string&, const std::vector<std::string>& key_names, int, bool) {
  PrewarmResult out;
  out.keys = key_names.size();
  out.failed = key_names.size();
  for (const auto& k : key_names) out.errors.push_back(k + ": no prewarm in this kdajit");
  return out;
}

Outcome internal_selected_key(kdajit_op_t, const DecodeArgs&, int, std::string*) {
  return make_outcome(KDAJIT_ERROR_UNSUPPORTED, "this kdajit has no Runtime::selected_key and the bench no internals for it");
}

#endif

}  // namespace kdajit::bench
