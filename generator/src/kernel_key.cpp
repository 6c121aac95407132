#include "kdajit/kernel_key.hpp"

#include <algorithm>
#include <charconv>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kdajit/printable.hpp"
#include "kdajit/routes.hpp"

namespace kdajit {

namespace {

// The value of the integer field `i` of kKeyLayout.
Result<int> parse_int_field(size_t i, std::string_view s) {
  const KeyFieldLayout& f = kKeyLayout[i];
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v < f.lo || v > f.hi)
    return invalid_argument(
        fmt::format("kernel key field '{}': expected an integer in {}..{}, got '{}'", f.json_name, f.lo, f.hi,
                    printable(s)));
  return v;
}

// The one parser behind parse_key and key_from_json: the eight field values as
// text, in kKeyLayout order.
Result<KernelKey> key_from_fields(const std::array<std::string_view, 8>& v) {
  KernelKey k;
  KDAJIT_TRY_ASSIGN(k.op, parse_field<Op>(v[0]));
  KDAJIT_TRY_ASSIGN(k.heads, parse_int_field(1, v[1]));
  KDAJIT_TRY_ASSIGN(k.state, parse_field<StateDtype>(v[2]));
  KDAJIT_TRY_ASSIGN(k.conv, parse_field<ConvLayout>(v[3]));
  KDAJIT_TRY_ASSIGN(k.tokens, parse_int_field(4, v[4]));
  KDAJIT_TRY_ASSIGN(k.gate, parse_field<Gate>(v[5]));
  KDAJIT_TRY_ASSIGN(k.route, parse_field<Route>(v[6]));
  KDAJIT_TRY_ASSIGN(k.arch, parse_field<Arch>(v[7]));
  KDAJIT_TRY(validate(k));
  return k;
}

template <KeyEnum E>
std::string field_shape() {
  return fmt::format("<{}>", choices<E>());
}

}  // namespace

const ArchSpec& arch_spec(Arch a) {
  const size_t i = static_cast<size_t>(a);
  return kArches[i < std::size(kArches) ? i : 0];
}

int arch_compute_capability(Arch a) { return in_range(a) ? arch_spec(a).compute_capability : 0; }

Result<Arch> arch_for_compute_capability(int major, int minor) {
  std::vector<std::string> known;
  for (const ArchSpec& a : kArches) {
    if (a.compute_capability == major * 10 + minor) return a.arch;
    const std::string cc = fmt::format("{}.{}", a.compute_capability / 10, a.compute_capability % 10);
    if (std::find(known.begin(), known.end(), cc) == known.end()) known.push_back(cc);
  }
  return Error(ErrorCode::unsupported, fmt::format("device: compute capability {}.{} is not supported; expected one of {}",
                                                   major, minor, fmt::join(known, ", ")));
}

Status validate(const KernelKey& k) {
  auto range = [](std::string_view field, std::string choices) {
    return invalid_argument(fmt::format("kernel key field '{}': expected one of {}", field, choices));
  };
  if (!in_range(k.op)) return range(KeyField<Op>::name, choices<Op>());
  if (!in_range(k.state)) return range(KeyField<StateDtype>::name, choices<StateDtype>());
  if (!in_range(k.conv)) return range(KeyField<ConvLayout>::name, choices<ConvLayout>());
  if (!in_range(k.gate)) return range(KeyField<Gate>::name, choices<Gate>());
  if (!in_range(k.route)) return range(KeyField<Route>::name, choices<Route>());
  if (!in_range(k.arch)) return range(KeyField<Arch>::name, choices<Arch>());
  if (k.heads < 1 || k.heads > kMaxHeads)
    return invalid_argument(fmt::format("kernel key field 'heads': expected an integer in 1..{}, got {}", kMaxHeads, k.heads));
  if (k.op == Op::single && k.tokens != 1)
    return invalid_argument(fmt::format("kernel key field 't': expected 1 for op single, got {}", k.tokens));
  if (chunked(k.op) && in_range(k.route) && k.tokens != route_chunk(k.route))
    return invalid_argument(fmt::format("kernel key field 't': expected {} (the chunk size) for op {} on route {}, got {}",
                                        route_chunk(k.route), to_string(k.op), to_string(k.route), k.tokens));
  if (k.op == Op::chunk && k.conv != ConvLayout::sd)
    return invalid_argument(fmt::format("kernel key field 'conv': expected sd for op chunk (it has no conv), got {}",
                                        to_string(k.conv)));
  if (k.op == Op::packed && (k.tokens < 1 || k.tokens > kMaxTokens))
    return invalid_argument(
        fmt::format("kernel key field 't': expected an integer in 1..{} for op packed, got {}", kMaxTokens, k.tokens));
  if (!route_spec(k.route).serves(k.op))
    return invalid_argument(fmt::format("kernel key field 'route': route {} does not serve op {}; routes of op {}: {}",
                                        to_string(k.route), to_string(k.op), to_string(k.op),
                                        fmt::join(route_names(k.op), "|")));
  const uint32_t smem = route_spec(k.route).dynamic_smem_bytes(k);
  const ArchSpec& arch = arch_spec(k.arch);
  if (smem > static_cast<uint32_t>(arch.max_smem_per_block))
    return Error(ErrorCode::unsupported,
                 fmt::format("kernel key field 'arch': op {} needs {} KiB of shared memory per block, {} offers {} KiB",
                             to_string(k.op), smem / 1024, to_string(k.arch), arch.max_smem_per_block / 1024));
  return {};
}

namespace {
// A key name from its fields as spelled (a program name spells some `*`).
std::string name_from(const KernelKey& k, std::string_view heads, std::string_view state, std::string_view conv) {
  return fmt::format("{}{}.{}{}.{}{}.{}{}.{}{}.{}{}.{}{}.{}{}", kKeyLayout[0].prefix, to_string(k.op),
                     kKeyLayout[1].prefix, heads, kKeyLayout[2].prefix, state, kKeyLayout[3].prefix, conv,
                     kKeyLayout[4].prefix, k.tokens, kKeyLayout[5].prefix, to_string(k.gate), kKeyLayout[6].prefix,
                     to_string(k.route), kKeyLayout[7].prefix, to_string(k.arch));
}
}  // namespace

std::string key_name(const KernelKey& k) {
  return name_from(k, std::to_string(k.heads), to_string(k.state), to_string(k.conv));
}

std::string program_name(const KernelKey& k) {
  // The key name with '*' for each field the program is not compiled for.
  const bool heads = heads_in_program(k.op, k.route), storage = storage_in_program(k.op);
  return name_from(k, heads ? std::to_string(k.heads) : "*", storage ? to_string(k.state) : "*",
                   storage ? to_string(k.conv) : "*");
}

std::string key_name_shape() {
  const std::array<std::string, 8> v = {field_shape<Op>(),
                                        fmt::format("<{}..{}>", kKeyLayout[1].lo, kKeyLayout[1].hi),
                                        field_shape<StateDtype>(),
                                        field_shape<ConvLayout>(),
                                        fmt::format("<{}..{}>", kKeyLayout[4].lo, kKeyLayout[4].hi),
                                        field_shape<Gate>(),
                                        field_shape<Route>(),
                                        field_shape<Arch>()};
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}{}", i ? "." : "", kKeyLayout[i].prefix, v[i]);
  return s;
}

Result<KernelKey> parse_key(std::string_view name) {
  // Exactly eight dot-separated parts, each with its field's prefix.
  std::array<std::string_view, 8> values;
  size_t start = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const size_t dot = name.find('.', start);
    const bool last = i + 1 == values.size();
    if ((dot == std::string_view::npos) != last)
      return invalid_argument(
          fmt::format("kernel key name '{}': expected 8 dot-separated fields {}", printable(name), key_name_shape()));
    std::string_view part = name.substr(start, last ? std::string_view::npos : dot - start);
    const std::string_view prefix = kKeyLayout[i].prefix;
    if (part.substr(0, prefix.size()) != prefix)
      return invalid_argument(fmt::format("kernel key field '{}': expected it to start with '{}', got '{}' (shape: {})",
                                          kKeyLayout[i].json_name, prefix, printable(part), key_name_shape()));
    values[i] = part.substr(prefix.size());
    start = dot + 1;
  }
  return key_from_fields(values);
}

nlohmann::json key_to_json(const KernelKey& k) {
  return nlohmann::json{{"op", to_string(k.op)},       {"heads", k.heads},
                        {"state", to_string(k.state)}, {"conv", to_string(k.conv)},
                        {"t", k.tokens},               {"gate", to_string(k.gate)},
                        {"route", to_string(k.route)}, {"arch", to_string(k.arch)}};
}

Result<KernelKey> key_from_json(const nlohmann::json& j) {
  std::vector<std::string_view> names;
  for (const auto& f : kKeyLayout) names.push_back(f.json_name);
  if (!j.is_object())
    return invalid_argument(fmt::format("kernel key: expected a JSON object with fields {}", fmt::join(names, ", ")));
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(names.begin(), names.end(), it.key()) == names.end())
      return invalid_argument(fmt::format("kernel key: unknown field '{}'; expected only {}", printable(it.key()), fmt::join(names, ", ")));
  // Each field as text, then the same parser as key names.
  std::array<std::string, 8> text;
  for (size_t i = 0; i < kKeyLayout.size(); ++i) {
    const KeyFieldLayout& f = kKeyLayout[i];
    auto it = j.find(std::string(f.json_name));
    if (it == j.end()) return invalid_argument(fmt::format("kernel key field '{}': missing", f.json_name));
    if (f.hi > 0) {
      if (!it->is_number_integer() || it->get<int64_t>() < f.lo || it->get<int64_t>() > f.hi)
        return invalid_argument(fmt::format("kernel key field '{}': expected an integer in {}..{}, got {}", f.json_name,
                                            f.lo, f.hi, it->dump()));
      text[i] = std::to_string(it->get<int64_t>());
    } else {
      if (!it->is_string())
        return invalid_argument(fmt::format("kernel key field '{}': expected a string, got {}", f.json_name, it->dump()));
      text[i] = it->get<std::string>();
    }
  }
  std::array<std::string_view, 8> values;
  for (size_t i = 0; i < text.size(); ++i) values[i] = text[i];
  return key_from_fields(values);
}

size_t KernelKeyHash::operator()(const KernelKey& k) const noexcept {
  // Pack every field into one word (heads < 256, tokens < 256), then mix.
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
