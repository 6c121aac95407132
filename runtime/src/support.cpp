// The static support query and the route selector: which kernel key serves a
// configuration, decided on the host without compiling or launching.
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nvrtc.h>

#include "kdajit/runtime/driver_api.hpp"
#include "kdajit/runtime/validate.hpp"

namespace kdajit {
namespace {

// The compute capabilities the linked NVRTC can target (e.g. 90, 100, 120),
// read once: a newer arch than the toolkit knows is unsupported, not a compile error.
const std::vector<int>& nvrtc_compute_capabilities() {
  static const std::vector<int> ccs = [] {
    std::vector<int> v;
    int n = 0;
    if (nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0) {
      v.resize(static_cast<size_t>(n));
      if (nvrtcGetSupportedArchs(v.data()) != NVRTC_SUCCESS) v.clear();
    }
    return v;
  }();
  return ccs;
}

constexpr std::string_view kArchList = "sm_90|sm_90a|sm_100a|sm_103a|sm_120a";

// "sm_<digits>" with an optional letter suffix: a real arch this build may not serve.
bool looks_like_arch(std::string_view s) {
  if (s.substr(0, 3) != "sm_" || s.size() < 4) return false;
  size_t i = 3;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  return i > 3 && (i == s.size() || (i + 1 == s.size() && std::isalpha(static_cast<unsigned char>(s[i]))));
}

Result<Arch> config_arch(const kdajit_config_t& c) {
  if (!c.arch) {
    auto local = local_arch(c.device);
    if (local) return *local;
    Error e = std::move(local).error();
    e.message = fmt::format("arch: NULL means the arch of device {}, which cannot be read: {}", c.device, e.message);
    return e;
  }
  std::string_view s = c.arch;
  auto arch = parse_arch(s);
  if (arch) return *arch;
  if (looks_like_arch(s))
    return Error(ErrorCode::unsupported,
                 fmt::format("arch: expected one of {} (the targets this build serves), got '{}'", kArchList, s));
  return invalid_argument(fmt::format("arch: expected one of {}, got '{}'", kArchList, s));
}

}  // namespace

Status check_arch_target(Arch arch) {
  const auto& ccs = nvrtc_compute_capabilities();
  int cc = arch_compute_capability(arch);
  for (int c : ccs)
    if (c == cc) return {};
  return Error(ErrorCode::unsupported,
               fmt::format("arch: {} (compute capability {}) is not a target of the linked NVRTC; it supports [{}]",
                           to_string(arch), cc, fmt::join(ccs, ", ")));
}

Status query_support(const kdajit_config_t& c) {
  if (c.op != KDAJIT_OP_SINGLE && c.op != KDAJIT_OP_PACKED)
    return invalid_argument(fmt::format("op: expected single|packed, got {}", static_cast<int>(c.op)));
  if (c.heads < 1)
    return invalid_argument(fmt::format("heads: expected H in 1..{}, got {}", kMaxHeads, c.heads));
  if (c.heads > kMaxHeads)
    return Error(ErrorCode::unsupported,
                 fmt::format("heads: expected H in 1..{} (the heads this build serves), got {}", kMaxHeads, c.heads));
  if (c.state_dtype != KDAJIT_DTYPE_F32 && c.state_dtype != KDAJIT_DTYPE_BF16)
    return invalid_argument(fmt::format("state_dtype: expected f32 or bf16, got {}",
                                        c.state_dtype == KDAJIT_DTYPE_INT32
                                            ? std::string("int32")
                                            : fmt::format("dtype({})", static_cast<int>(c.state_dtype))));
  if (c.conv_layout != KDAJIT_CONV_SD && c.conv_layout != KDAJIT_CONV_DS)
    return invalid_argument(fmt::format("conv_layout: expected sd|ds, got {}", static_cast<int>(c.conv_layout)));
  if (c.op == KDAJIT_OP_SINGLE && c.tokens != 1)
    return invalid_argument(fmt::format("tokens: expected T = 1 for the single op, got {}", c.tokens));
  if (c.tokens < 1)
    return invalid_argument(fmt::format("tokens: expected T in 1..{}, got {}", kMaxTokens, c.tokens));
  if (c.tokens > kMaxTokens)
    return Error(ErrorCode::unsupported,
                 fmt::format("tokens: expected T in 1..{} (the tokens this build serves), got {}", kMaxTokens, c.tokens));
  if (c.gate != KDAJIT_GATE_BOUNDED && c.gate != KDAJIT_GATE_SOFTPLUS)
    return invalid_argument(fmt::format("gate: expected bounded|softplus, got {}", static_cast<int>(c.gate)));
  KDAJIT_TRY_ASSIGN(Arch arch, config_arch(c));

  // The key a valid call with this configuration would run with; rowcta serves
  // every R, so the query need not know R.
  ValidatedCall call;
  call.op = c.op == KDAJIT_OP_SINGLE ? Op::single : Op::packed;
  call.heads = c.heads;
  call.tokens = c.tokens;
  call.state = c.state_dtype == KDAJIT_DTYPE_F32 ? StateDtype::f32 : StateDtype::bf16;
  call.conv = c.conv_layout == KDAJIT_CONV_SD ? ConvLayout::sd : ConvLayout::ds;
  call.gate = c.gate == KDAJIT_GATE_BOUNDED ? Gate::bounded : Gate::softplus;
  call.rows = 1;
  KDAJIT_TRY(validate(key_for_call(call, arch)));
  return check_arch_target(arch);
}

KernelKey key_for_call(const ValidatedCall& call, Arch arch) {
  KernelKey k;
  k.op = call.op;
  k.heads = call.heads;
  k.state = call.state;
  k.conv = call.conv;
  k.tokens = call.tokens;
  k.gate = call.gate;
  k.arch = arch;
  // The selector. Every call runs one CTA per (row or sequence, head) today.
  // Later routes plug in here, chosen from call.rows * call.heads against the
  // device's SM count: few rows -> a cluster split of the value rows;
  // many rows -> a persistent grid; call.mode == repeated_positive -> the
  // sequential route (rowcta runs rows concurrently, so it is exact only while
  // no two rows share a slot).
  k.route = Route::rowcta;
  return k;
}

}  // namespace kdajit
