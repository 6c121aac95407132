// The bench's small helpers over kdajit's public API (kdajit/kdajit.hpp): a
// runtime's route options, the selected key and its route (kdajit/kernel_key.hpp's
// parser), an Outcome as text, and the parallel prewarm.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "kdajit/kdajit.hpp"
#include "kdajit/kernel_key.hpp"
#include "kdajit/parallel.hpp"
#include "kdajit/routes.hpp"

namespace kdajit::bench {

// The route options of one runtime (route "": the selector).
inline void set_route_options(RuntimeOptions& o, const std::string& route, bool use_tuning, bool pdl) {
  o.route = route;
  o.use_tuning = use_tuning;
  o.pdl = pdl;
}

// The canonical kernel key name the call would launch (validation + route selection only).
inline Outcome selected_key(Runtime& rt, kdajit_op_t op, const DecodeArgs& args, cudaStream_t stream,
                            std::string* key) {
  return rt.selected_key(op, args, reinterpret_cast<StreamHandle>(stream), key);
}

// An Outcome as one message, with its multi-line detail (e.g. a compile log) when it has one.
inline std::string outcome_text(const Outcome& o) {
  return o.detail.empty() ? o.message : o.message + "\n" + o.detail;
}

struct PrewarmResult {
  size_t keys = 0, failed = 0;
  double seconds = 0;
  std::vector<std::string> errors;  // "key: message"
};

// Compiles every key into `rt`'s kernel cache, `jobs` at a time (Runtime::prewarm
// is thread-safe). Never fails as a whole: a key that does not build is listed
// and its first decode call will report the error.
inline PrewarmResult prewarm(Runtime& rt, const std::vector<std::string>& keys, int jobs) {
  const auto t0 = std::chrono::steady_clock::now();
  PrewarmResult out;
  out.keys = keys.size();
  std::mutex mu;
  parallel_for(keys.size(), static_cast<unsigned>(std::max(1, jobs)), [&](size_t i) {
    const Outcome o = rt.prewarm(keys[i], /*compiled=*/nullptr);
    if (o) return;
    std::lock_guard<std::mutex> l(mu);
    ++out.failed;
    out.errors.push_back(keys[i] + ": " + o.message);
  });
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

// The route field of a key name ("...route_rowcta.sm_90" -> "rowcta"), read by the
// library's key parser; "" if the name does not parse.
inline std::string route_of_key(const std::string& key) {
  const auto k = parse_key(key);
  return k ? std::string(to_string(k->route)) : std::string();
}

}  // namespace kdajit::bench
