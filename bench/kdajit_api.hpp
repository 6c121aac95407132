// The bench's adapter to kdajit's route API, in one place. It compiles against
// the public C++ API both before and after the route options land:
//   RuntimeOptions::route / use_tuning / pdl, Runtime::selected_key and
//   kdajit/routes.hpp (route_table()) are used when present; without them the
//   only route is "rowcta" (what the selector always picks) and the selected key
//   comes from the library's internals (kdajit_internal.hpp).
// Once the new API is on main, the fallbacks can go: each is one branch here.
#pragma once

#include <cuda_runtime.h>

#include <concepts>
#include <string>
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
}  // namespace api_detail

inline constexpr bool kHasRouteOption = api_detail::has_route<RuntimeOptions>;
inline constexpr bool kHasTuningOption = api_detail::has_tuning<RuntimeOptions>;
inline constexpr bool kHasPdlOption = api_detail::has_pdl<RuntimeOptions>;
inline constexpr bool kHasSelectedKey = api_detail::has_selected_key<Runtime>;
inline constexpr bool kHasRouteTable = KDAJIT_BENCH_HAS_ROUTE_TABLE != 0;

// The routes that serve `op`, in the library's order.
inline std::vector<std::string> route_names(kdajit_op_t op) {
#if KDAJIT_BENCH_HAS_ROUTE_TABLE
  std::vector<std::string> out;
  const Op o = op == KDAJIT_OP_SINGLE ? Op::single : Op::packed;
  for (const auto& r : route_table())
    if (r.serves(o)) out.emplace_back(r.name);
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
    if (cudaGetDevice(&device) != cudaSuccess) return {KDAJIT_ERROR_CUDA, "cudaGetDevice failed"};
    return internal_selected_key(op, args, device, key);
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
