// kdajit_tables_json(): the spelling tables, the arch table and the routes as
// one JSON object, built from the C++ tables (KeyField<E>, the route table,
// arch_compute_capability / arch_for_compute_capability), so that bindings in
// other languages (the Python package) read them instead of typing them again.
#include <new>
#include <string>

#include <nlohmann/json.hpp>

#include "kdajit/kdajit.h"
#include "kdajit/kdajit_version.h"
#include "kdajit/kernel_key.hpp"
#include "kdajit/log.hpp"
#include "kdajit/routes.hpp"

namespace kdajit {
namespace {

// The C enums of kdajit.h and the C++ key enums number their values alike.
static_assert(KDAJIT_OP_SINGLE == static_cast<int>(Op::single) && KDAJIT_OP_PACKED == static_cast<int>(Op::packed) &&
              KDAJIT_OP_PREFILL == static_cast<int>(Op::prefill) && KDAJIT_OP_CHUNK == static_cast<int>(Op::chunk));
static_assert(KDAJIT_DTYPE_F32 == static_cast<int>(StateDtype::f32) &&
              KDAJIT_DTYPE_BF16 == static_cast<int>(StateDtype::bf16));
static_assert(KDAJIT_CONV_SD == static_cast<int>(ConvLayout::sd) && KDAJIT_CONV_DS == static_cast<int>(ConvLayout::ds));
static_assert(KDAJIT_GATE_BOUNDED == static_cast<int>(Gate::bounded) &&
              KDAJIT_GATE_SOFTPLUS == static_cast<int>(Gate::softplus));
static_assert(KDAJIT_INDICES_UNIQUE_OR_NULL == static_cast<int>(IndicesMode::unique_or_null) &&
              KDAJIT_INDICES_POSITIVE_UNIQUE == static_cast<int>(IndicesMode::positive_unique) &&
              KDAJIT_INDICES_REPEATED_POSITIVE == static_cast<int>(IndicesMode::repeated_positive));
static_assert(KDAJIT_LOG_QUIET == static_cast<int>(LogLevel::quiet) &&
              KDAJIT_LOG_INFO == static_cast<int>(LogLevel::info) &&
              KDAJIT_LOG_DEBUG == static_cast<int>(LogLevel::debug));

template <KeyEnum E>
nlohmann::json spellings() {
  nlohmann::json out = nlohmann::json::object();
  for (E v : all_values<E>()) out[std::string(to_string(v))] = static_cast<int>(v);
  return out;
}

std::string build() {
  nlohmann::json dtype = spellings<StateDtype>();
  dtype["int32"] = KDAJIT_DTYPE_INT32;
  // The two enums that are not key fields, spelled as validation and KDAJIT_LOG spell them.
  nlohmann::json indices_mode = nlohmann::json::object();
  for (size_t i = 0; i < kIndicesModeNames.size(); ++i) indices_mode[std::string(kIndicesModeNames[i])] = static_cast<int>(i);
  const nlohmann::json log_level = {{"quiet", KDAJIT_LOG_QUIET}, {"info", KDAJIT_LOG_INFO}, {"debug", KDAJIT_LOG_DEBUG}};
  nlohmann::json status = nlohmann::json::object();
  for (int s = KDAJIT_OK; s <= KDAJIT_ERROR_INTERNAL; ++s) status[to_string(static_cast<ErrorCode>(s))] = s;

  nlohmann::json arches = nlohmann::json::array();
  nlohmann::json by_capability = nlohmann::json::object();
  for (Arch a : all_values<Arch>()) {
    const int cc = arch_compute_capability(a);
    arches.push_back({{"name", to_string(a)}, {"compute_capability", cc}});
    const int major = cc / 10, minor = cc % 10;
    if (auto chosen = arch_for_compute_capability(major, minor))
      by_capability[std::to_string(major) + "." + std::to_string(minor)] = to_string(*chosen);
  }
  nlohmann::json routes = nlohmann::json::array();
  for (const RouteSpec& r : route_table()) {
    nlohmann::json ops = nlohmann::json::array();
    for (Op op : all_values<Op>())
      if (r.serves(op)) ops.push_back(to_string(op));
    routes.push_back({{"name", r.name()}, {"ops", ops}});
  }
  const nlohmann::json tables = {
      {"version", KDAJIT_VERSION_STRING},
      {"enums",
       {{"op", spellings<Op>()},
        {"dtype", dtype},
        {"state_dtype", spellings<StateDtype>()},
        {"gate", spellings<Gate>()},
        {"conv_layout", spellings<ConvLayout>()},
        {"indices_mode", indices_mode},
        {"log_level", log_level},
        {"status", status}}},
      {"arches", arches},
      {"arch_for_compute_capability", by_capability},
      {"arch_without_device", to_string(kDefaultArch)},
      {"routes", routes},
      {"max_heads", kMaxHeads},
      {"max_tokens", kMaxTokens},
      {"prefill_chunk", kPrefillChunk},
  };
  return tables.dump();
}

}  // namespace
}  // namespace kdajit

extern "C" KDAJIT_API const char* kdajit_tables_json(void) {
  try {
    static const std::string text = kdajit::build();
    return text.c_str();
  } catch (...) {  // std::bad_alloc: the next call tries again
    return nullptr;
  }
}
