// The bench's adapter to kdajit's route API, in one place. It compiles against
// the public C++ API both before and after the route options land:
//   RuntimeOptions::route / use_tuning / pdl, Runtime::selected_key and
//   kdajit/routes.hpp (route_table()) are used when present; without them the
//   only route is "rowcta" (what the selector always picks) and the selected key
//   comes from the library's internals (kdajit_internal.hpp).
//   Runtime::prewarm (public) compiles the keys of the run ahead of it; without it
//   the prewarm goes through the internals too.
// Once the new API is on main, the fallbacks can go: each is one branch here
// (and kdajit_internal.* with them).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kdajit/error.hpp"
#include "kdajit/kdajit.hpp"
#include "kdajit_internal.hpp"

#if __has_include("kdajit/routes.hpp")
#include "kdajit/routes.hpp"
#define KDAJIT_BENCH_HAS_ROUTE_TABLE 1
#else
#define KDAJIT_BENCH_HAS_ROUTE_TABLE 0
#endif

namespace kdajit::bench {

namespace api_detail {
template <class O>
constexpr bool has_route = requires(O o) { o.route = std::string(); };
template <class O>
constexpr bool has_tuning = requires(O o) { o.use_tuning = true; };
template <class O>
constexpr bool has_pdl = requires(O o) { o.pdl = true; };
template <class R>
constexpr bool has_selected_key = requires(R& r, const DecodeArgs& a, std::string* k) {
  { r.selected_key(KDAJIT_OP_SINGLE, a, StreamHandle{}, k) } -> std::same_as<Outcome>;
};
template <class R>
constexpr bool has_prewarm = requires(R& r, const std::string& k, bool* c) {
  { r.prewarm(k, c) } -> std::same_as<Outcome>;
};
// RouteSpec's name: a member function or a string_view member.
template <class S>
std::string_view spec_name(const S& s) {
  if constexpr (requires { s.name(); })
    return s.name();
  else
    return s.name;
}
}  // namespace api_detail

inline constexpr bool kHasRouteOption = api_detail::has_route<RuntimeOptions>;
inline constexpr bool kHasTuningOption = api_detail::has_tuning<RuntimeOptions>;
inline constexpr bool kHasPdlOption = api_detail::has_pdl<RuntimeOptions>;
inline constexpr bool kHasSelectedKey = api_detail::has_selected_key<Runtime>;
inline constexpr bool kHasPrewarm = api_detail::has_prewarm<Runtime>;
inline constexpr bool kHasRouteTable = KDAJIT_BENCH_HAS_ROUTE_TABLE != 0;

// The routes that serve `op`, in the library's order.
inline std::vector<std::string> route_names(kdajit_op_t op) {
#if KDAJIT_BENCH_HAS_ROUTE_TABLE
  std::vector<std::string> out;
  const Op o = op == KDAJIT_OP_SINGLE ? Op::single : Op::packed;
  for (const auto& r : route_table())
    if (r.serves(o)) out.emplace_back(api_detail::spec_name(r));
  return out;
#else
  (void)op;
  return {"rowcta"};
#endif
}

// The options of one runtime. An option this kdajit does not have is an error
// (unsupported) unless asking for it changes nothing: route "" or "rowcta" (the
// only route then), use_tuning with no tuning support, pdl = false.
template <class O = RuntimeOptions>
Status set_route_options(O& o, const std::string& route, bool use_tuning, bool pdl) {
  if constexpr (api_detail::has_route<O>) {
    o.route = route;
  } else if (!route.empty() && route != "rowcta") {
    return Error(ErrorCode::unsupported, "this kdajit has no RuntimeOptions::route (only route rowcta)");
  }
  if constexpr (api_detail::has_tuning<O>) o.use_tuning = use_tuning;
  else (void)use_tuning;
  if constexpr (api_detail::has_pdl<O>) {
    o.pdl = pdl;
  } else if (pdl) {
    return Error(ErrorCode::unsupported, "this kdajit has no RuntimeOptions::pdl");
  }
  return {};
}

// The canonical kernel key name the call would launch (validation + route selection only).
template <class R = Runtime>
Outcome selected_key(R& rt, kdajit_op_t op, const DecodeArgs& args, cudaStream_t stream, std::string* key) {
  if constexpr (api_detail::has_selected_key<R>) {
    return rt.selected_key(op, args, reinterpret_cast<StreamHandle>(stream), key);
  } else {
    (void)rt;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return make_outcome(KDAJIT_ERROR_CUDA, "cudaGetDevice failed");
    return internal_selected_key(op, args, device, key);
  }
}

// An Outcome as one message (with its multi-line detail, e.g. a compile log, when the API has one).
template <class O = Outcome>
std::string outcome_text(const O& o) {
  if constexpr (requires { o.detail; }) {
    if (!o.detail.empty()) return o.message + "\n" + o.detail;
  }
  return o.message;
}

// Compiles every key into `rt`'s kernel cache, `jobs` at a time (Runtime::prewarm
// is thread-safe); without Runtime::prewarm, through the internals.
template <class R = Runtime>
PrewarmResult prewarm(R& rt, const std::string& cache_dir, const std::vector<std::string>& keys, int jobs,
                      bool verbose) {
  if constexpr (api_detail::has_prewarm<R>) {
    (void)cache_dir;
    (void)verbose;
    const auto t0 = std::chrono::steady_clock::now();
    PrewarmResult out;
    out.keys = keys.size();
    std::mutex mu;
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < keys.size();) {
        bool compiled = false;
        const Outcome o = rt.prewarm(keys[i], &compiled);
        if (o) continue;
        std::lock_guard<std::mutex> l(mu);
        ++out.failed;
        out.errors.push_back(keys[i] + ": " + o.message);
      }
    };
    std::vector<std::thread> pool;
    for (size_t t = 0; t < std::min<size_t>(static_cast<size_t>(std::max(1, jobs)), keys.size()); ++t)
      pool.emplace_back(work);
    for (auto& t : pool) t.join();
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  } else {
    (void)rt;
    return prewarm_keys(cache_dir, keys, jobs, verbose);
  }
}

// The route field of a key name ("...route_rowcta.sm_90" -> "rowcta"); "" if none.
inline std::string route_of_key(const std::string& key) {
  const size_t at = key.find(".route_");
  if (at == std::string::npos) return "";
  const size_t from = at + 7, to = key.find('.', from);
  return key.substr(from, to == std::string::npos ? std::string::npos : to - from);
}

}  // namespace kdajit::bench
