#include "kdajit/kernel_key.hpp"

#include <charconv>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>

namespace kdajit {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::ok: return "ok";
    case ErrorCode::invalid_argument: return "invalid argument";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::compile_failed: return "compile failed";
    case ErrorCode::cuda: return "CUDA error";
    case ErrorCode::cache: return "cache error";
    case ErrorCode::jit_disabled: return "JIT disabled";
    case ErrorCode::capture: return "stream capture";
    case ErrorCode::io: return "I/O error";
    case ErrorCode::internal: return "internal error";
  }
  return "unknown error";
}

namespace {

// One table per enum: the canonical spellings in enum order.
constexpr std::array<std::string_view, 2> kOps = {"single", "packed"};
constexpr std::array<std::string_view, 2> kDtypes = {"f32", "bf16"};
constexpr std::array<std::string_view, 2> kLayouts = {"sd", "ds"};
constexpr std::array<std::string_view, 2> kGates = {"bounded", "softplus"};
constexpr std::array<std::string_view, 1> kRoutes = {"rowcta"};
constexpr std::array<std::string_view, 5> kArchs = {"sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a"};

template <class E, size_t N>
Result<E> parse_enum(std::string_view field, const std::array<std::string_view, N>& names,
                     std::string_view s) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  return invalid_argument(fmt::format("kernel key field '{}': expected one of {}, got '{}'", field,
                                      fmt::join(names, "|"), s));
}

Result<int> parse_int_field(std::string_view field, std::string_view s, int lo, int hi) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi)
    return invalid_argument(
        fmt::format("kernel key field '{}': expected an integer in {}..{}, got '{}'", field, lo, hi, s));
  return v;
}

}  // namespace

std::string_view to_string(Op v) { return kOps.at(static_cast<size_t>(v)); }
std::string_view to_string(StateDtype v) { return kDtypes.at(static_cast<size_t>(v)); }
std::string_view to_string(ConvLayout v) { return kLayouts.at(static_cast<size_t>(v)); }
std::string_view to_string(Gate v) { return kGates.at(static_cast<size_t>(v)); }
std::string_view to_string(Route v) { return kRoutes.at(static_cast<size_t>(v)); }
std::string_view to_string(Arch v) { return kArchs.at(static_cast<size_t>(v)); }

Result<Op> parse_op(std::string_view s) { return parse_enum<Op>("op", kOps, s); }
Result<StateDtype> parse_state_dtype(std::string_view s) { return parse_enum<StateDtype>("state", kDtypes, s); }
Result<ConvLayout> parse_conv_layout(std::string_view s) { return parse_enum<ConvLayout>("conv", kLayouts, s); }
Result<Gate> parse_gate(std::string_view s) { return parse_enum<Gate>("gate", kGates, s); }
Result<Route> parse_route(std::string_view s) { return parse_enum<Route>("route", kRoutes, s); }
Result<Arch> parse_arch(std::string_view s) { return parse_enum<Arch>("arch", kArchs, s); }

int arch_compute_capability(Arch a) {
  switch (a) {
    case Arch::sm_90:
    case Arch::sm_90a: return 90;
    case Arch::sm_100a: return 100;
    case Arch::sm_103a: return 103;
    case Arch::sm_120a: return 120;
  }
  return 0;
}

Result<Arch> arch_for_compute_capability(int major, int minor) {
  switch (major * 10 + minor) {
    case 90: return Arch::sm_90;
    case 100: return Arch::sm_100a;
    case 103: return Arch::sm_103a;
    case 120: return Arch::sm_120a;
    default:
      return Error(ErrorCode::unsupported,
                   fmt::format("device: compute capability {}.{} is not supported; expected one of 9.0, "
                               "10.0, 10.3, 12.0",
                               major, minor));
  }
}

Status validate(const KernelKey& k) {
  if (static_cast<size_t>(k.op) >= kOps.size()) return invalid_argument("kernel key field 'op': expected one of single|packed");
  if (static_cast<size_t>(k.state) >= kDtypes.size()) return invalid_argument("kernel key field 'state': expected one of f32|bf16");
  if (static_cast<size_t>(k.conv) >= kLayouts.size()) return invalid_argument("kernel key field 'conv': expected one of sd|ds");
  if (static_cast<size_t>(k.gate) >= kGates.size()) return invalid_argument("kernel key field 'gate': expected one of bounded|softplus");
  if (static_cast<size_t>(k.route) >= kRoutes.size()) return invalid_argument("kernel key field 'route': expected one of rowcta");
  if (static_cast<size_t>(k.arch) >= kArchs.size())
    return invalid_argument("kernel key field 'arch': expected one of sm_90|sm_90a|sm_100a|sm_103a|sm_120a");
  if (k.heads < 1 || k.heads > kMaxHeads)
    return invalid_argument(fmt::format("kernel key field 'heads': expected an integer in 1..{}, got {}", kMaxHeads, k.heads));
  if (k.op == Op::single && k.tokens != 1)
    return invalid_argument(fmt::format("kernel key field 't': expected 1 for op single, got {}", k.tokens));
  if (k.tokens < 1 || k.tokens > kMaxTokens)
    return invalid_argument(fmt::format("kernel key field 't': expected an integer in 1..{}, got {}", kMaxTokens, k.tokens));
  return {};
}

std::string key_name(const KernelKey& k) {
  return fmt::format("kda_{}.h{}.state_{}.conv_{}.t{}.gate_{}.route_{}.{}", to_string(k.op), k.heads,
                     to_string(k.state), to_string(k.conv), k.tokens, to_string(k.gate), to_string(k.route),
                     to_string(k.arch));
}

Result<KernelKey> parse_key(std::string_view name) {
  // Split on '.'; exactly eight parts, each with its field's prefix.
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  constexpr std::string_view kShape =
      "kda_<single|packed>.h<1..128>.state_<f32|bf16>.conv_<sd|ds>.t<1..16>.gate_<bounded|softplus>."
      "route_<rowcta>.<sm_90|sm_90a|sm_100a|sm_103a|sm_120a>";
  if (parts.size() != 8)
    return invalid_argument(fmt::format("kernel key name '{}': expected 8 dot-separated fields {}", name, kShape));
  auto field = [&](size_t i, std::string_view prefix, std::string_view what) -> Result<std::string_view> {
    if (parts[i].substr(0, prefix.size()) != prefix)
      return invalid_argument(fmt::format("kernel key field '{}': expected it to start with '{}', got '{}' (shape: {})",
                                          what, prefix, parts[i], kShape));
    return parts[i].substr(prefix.size());
  };
  KernelKey k;
  KDAJIT_TRY_ASSIGN(auto op, field(0, "kda_", "op"));
  KDAJIT_TRY_ASSIGN(k.op, parse_op(op));
  KDAJIT_TRY_ASSIGN(auto h, field(1, "h", "heads"));
  KDAJIT_TRY_ASSIGN(k.heads, parse_int_field("heads", h, 1, kMaxHeads));
  KDAJIT_TRY_ASSIGN(auto st, field(2, "state_", "state"));
  KDAJIT_TRY_ASSIGN(k.state, parse_state_dtype(st));
  KDAJIT_TRY_ASSIGN(auto cv, field(3, "conv_", "conv"));
  KDAJIT_TRY_ASSIGN(k.conv, parse_conv_layout(cv));
  KDAJIT_TRY_ASSIGN(auto t, field(4, "t", "t"));
  KDAJIT_TRY_ASSIGN(k.tokens, parse_int_field("t", t, 1, kMaxTokens));
  KDAJIT_TRY_ASSIGN(auto g, field(5, "gate_", "gate"));
  KDAJIT_TRY_ASSIGN(k.gate, parse_gate(g));
  KDAJIT_TRY_ASSIGN(auto r, field(6, "route_", "route"));
  KDAJIT_TRY_ASSIGN(k.route, parse_route(r));
  KDAJIT_TRY_ASSIGN(k.arch, parse_arch(parts[7]));
  KDAJIT_TRY(validate(k));
  return k;
}

nlohmann::json key_to_json(const KernelKey& k) {
  return nlohmann::json{{"op", to_string(k.op)},       {"heads", k.heads},
                        {"state", to_string(k.state)}, {"conv", to_string(k.conv)},
                        {"t", k.tokens},               {"gate", to_string(k.gate)},
                        {"route", to_string(k.route)}, {"arch", to_string(k.arch)}};
}

Result<KernelKey> key_from_json(const nlohmann::json& j) {
  static constexpr std::array<std::string_view, 8> kFields = {"op", "heads", "state", "conv", "t", "gate", "route", "arch"};
  if (!j.is_object()) return invalid_argument("kernel key: expected a JSON object with fields op, heads, state, conv, t, gate, route, arch");
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (auto f : kFields) known = known || it.key() == f;
    if (!known)
      return invalid_argument(fmt::format("kernel key: unknown field '{}'; expected only {}", it.key(), fmt::join(kFields, ", ")));
  }
  for (auto f : kFields)
    if (!j.contains(f)) return invalid_argument(fmt::format("kernel key field '{}': missing", f));
  auto str = [&](std::string_view f) -> Result<std::string> {
    const auto& v = j.at(std::string(f));
    if (!v.is_string()) return invalid_argument(fmt::format("kernel key field '{}': expected a string, got {}", f, v.dump()));
    return v.get<std::string>();
  };
  auto integer = [&](std::string_view f, int lo, int hi) -> Result<int> {
    const auto& v = j.at(std::string(f));
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      return invalid_argument(fmt::format("kernel key field '{}': expected an integer in {}..{}, got {}", f, lo, hi, v.dump()));
    return static_cast<int>(v.get<int64_t>());
  };
  KernelKey k;
  KDAJIT_TRY_ASSIGN(auto op, str("op"));
  KDAJIT_TRY_ASSIGN(k.op, parse_op(op));
  KDAJIT_TRY_ASSIGN(k.heads, integer("heads", 1, kMaxHeads));
  KDAJIT_TRY_ASSIGN(auto st, str("state"));
  KDAJIT_TRY_ASSIGN(k.state, parse_state_dtype(st));
  KDAJIT_TRY_ASSIGN(auto cv, str("conv"));
  KDAJIT_TRY_ASSIGN(k.conv, parse_conv_layout(cv));
  KDAJIT_TRY_ASSIGN(k.tokens, integer("t", 1, kMaxTokens));
  KDAJIT_TRY_ASSIGN(auto g, str("gate"));
  KDAJIT_TRY_ASSIGN(k.gate, parse_gate(g));
  KDAJIT_TRY_ASSIGN(auto r, str("route"));
  KDAJIT_TRY_ASSIGN(k.route, parse_route(r));
  KDAJIT_TRY_ASSIGN(auto a, str("arch"));
  KDAJIT_TRY_ASSIGN(k.arch, parse_arch(a));
  KDAJIT_TRY(validate(k));
  return k;
}

std::string sha256_hex(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  std::string out;
  out.reserve(len * 2);
  for (unsigned i = 0; i < len; ++i) out += fmt::format("{:02x}", md[i]);
  return out;
}

std::string key_digest(const KernelKey& k) { return sha256_hex(key_name(k)); }

size_t KernelKeyHash::operator()(const KernelKey& k) const noexcept {
  // Pack every field into one word (heads < 256, tokens < 32), then mix.
  uint64_t x = static_cast<uint64_t>(k.op) | static_cast<uint64_t>(k.heads) << 4 |
               static_cast<uint64_t>(k.state) << 12 | static_cast<uint64_t>(k.conv) << 16 |
               static_cast<uint64_t>(k.tokens) << 20 | static_cast<uint64_t>(k.gate) << 28 |
               static_cast<uint64_t>(k.route) << 32 | static_cast<uint64_t>(k.arch) << 40;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return static_cast<size_t>(x);
}

}  // namespace kdajit
