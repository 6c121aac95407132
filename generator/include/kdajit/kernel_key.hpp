// The kernel key: the single source of truth for one kernel specialization.
// The generator, the cache, the route selector, the CLI and the tests all take it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kdajit/error.hpp"

namespace kdajit {

enum class Op : uint8_t { single, packed };
enum class StateDtype : uint8_t { f32, bf16 };
enum class ConvLayout : uint8_t { sd, ds };
enum class Gate : uint8_t { bounded, softplus };
enum class Route : uint8_t { rowcta };
enum class Arch : uint8_t { sm_90, sm_90a, sm_100a, sm_103a, sm_120a };

inline constexpr int kHeadDim = 128;  // D
inline constexpr int kConvWidth = 4;  // W
inline constexpr int kMaxHeads = 128;
inline constexpr int kMaxTokens = 16;  // T of the packed op

std::string_view to_string(Op v);
std::string_view to_string(StateDtype v);
std::string_view to_string(ConvLayout v);
std::string_view to_string(Gate v);
std::string_view to_string(Route v);
std::string_view to_string(Arch v);

// Parsers take the canonical spelling of one field value. Errors name the field
// and list the allowed values.
Result<Op> parse_op(std::string_view s);
Result<StateDtype> parse_state_dtype(std::string_view s);
Result<ConvLayout> parse_conv_layout(std::string_view s);
Result<Gate> parse_gate(std::string_view s);
Result<Route> parse_route(std::string_view s);
Result<Arch> parse_arch(std::string_view s);

// Compute capability of an arch (e.g. 90 for sm_90a) and the reverse for a
// device: sm_90 -> sm_90 (plain; sm_90a kernels run only where the a-features exist).
int arch_compute_capability(Arch a);
Result<Arch> arch_for_compute_capability(int major, int minor);

struct KernelKey {
  Op op = Op::single;
  int heads = 64;
  StateDtype state = StateDtype::f32;
  ConvLayout conv = ConvLayout::sd;
  int tokens = 1;  // T
  Gate gate = Gate::bounded;
  Route route = Route::rowcta;
  Arch arch = Arch::sm_90;

  friend bool operator==(const KernelKey&, const KernelKey&) = default;
  friend auto operator<=>(const KernelKey&, const KernelKey&) = default;
};

// Every field in range and the combination possible (T == 1 for single, ...).
Status validate(const KernelKey& key);

// `kda_single.h64.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90`
std::string key_name(const KernelKey& key);
Result<KernelKey> parse_key(std::string_view name);

nlohmann::json key_to_json(const KernelKey& key);
// Strict: unknown fields, missing fields and bad values are errors naming the field.
Result<KernelKey> key_from_json(const nlohmann::json& j);

// SHA-256 (lowercase hex) of the canonical name: stable across builds and hosts.
std::string key_digest(const KernelKey& key);

// A 64-bit hash for in-memory maps.
struct KernelKeyHash {
  size_t operator()(const KernelKey& k) const noexcept;
};

// Model presets.
std::vector<std::string_view> preset_names();
Result<std::vector<KernelKey>> preset_keys(std::string_view preset, Arch arch);
inline constexpr std::string_view kDefaultPreset = "glm-5.3-flash";

// Lowercase hex SHA-256 of arbitrary bytes (OpenSSL).
std::string sha256_hex(std::string_view bytes);

}  // namespace kdajit
