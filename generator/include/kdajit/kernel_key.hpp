// The kernel key: the single source of truth for one kernel specialization.
// The generator, the cache, the route selector, the CLI and the tests all take it.
//
// Each field's spelling lives in one table (KeyField<E> below, kKeyLayout for the
// order and prefixes): key names, JSON, parsers, error messages and CLI help are
// all made from those tables.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "kdajit/error.hpp"

namespace kdajit {

enum class Op : uint8_t { single, packed, prefill, chunk };
enum class StateDtype : uint8_t { f32, bf16 };
enum class ConvLayout : uint8_t { sd, ds };
enum class Gate : uint8_t { bounded, softplus };
// One value per row of the route table (kdajit/routes.def), in its order.
enum class Route : uint8_t {
#define ROUTE(name, ...) name,
#include "kdajit/routes.def"
#undef ROUTE
};
// One value per row of the arch table (kdajit/arches.def), in its order.
enum class Arch : uint8_t {
#define ARCH(name, ...) name,
#include "kdajit/arches.def"
#undef ARCH
};

inline constexpr int kHeadDim = 128;  // D
inline constexpr int kConvWidth = 4;  // W
inline constexpr int kMaxHeads = 128;
inline constexpr int kMaxTokens = 16;  // T of the packed op
// The chunk size C of the prefill op, which its keys carry in the t field.
inline constexpr int kPrefillChunk = 64;

// The spelling table of one enum field: its name (in JSON, messages and CLI help)
// and the canonical spelling of every value, in enum order.
template <class E>
struct KeyField;
template <>
struct KeyField<Op> {
  static constexpr std::string_view name = "op";
  static constexpr std::array<std::string_view, 4> values = {"single", "packed", "prefill", "chunk"};
};
template <>
struct KeyField<StateDtype> {
  static constexpr std::string_view name = "state";
  static constexpr std::array<std::string_view, 2> values = {"f32", "bf16"};
};
template <>
struct KeyField<ConvLayout> {
  static constexpr std::string_view name = "conv";
  static constexpr std::array<std::string_view, 2> values = {"sd", "ds"};
};
template <>
struct KeyField<Gate> {
  static constexpr std::string_view name = "gate";
  static constexpr std::array<std::string_view, 2> values = {"bounded", "softplus"};
};
template <>
struct KeyField<Route> {
  static constexpr std::string_view name = "route";
  static constexpr auto values = std::to_array<std::string_view>({
#define ROUTE(name, ...) #name,
#include "kdajit/routes.def"
#undef ROUTE
  });
};
template <>
struct KeyField<Arch> {
  static constexpr std::string_view name = "arch";
  static constexpr auto values = std::to_array<std::string_view>({
#define ARCH(name, ...) #name,
#include "kdajit/arches.def"
#undef ARCH
  });
};

template <class E>
concept KeyEnum = requires { KeyField<E>::values; };

template <KeyEnum E>
constexpr bool in_range(E v) {
  return static_cast<size_t>(v) < KeyField<E>::values.size();
}
template <KeyEnum E>
constexpr std::string_view to_string(E v) {
  return in_range(v) ? KeyField<E>::values[static_cast<size_t>(v)] : std::string_view("?");
}
// Every value of a field, in enum order.
template <KeyEnum E>
constexpr std::array<E, KeyField<E>::values.size()> all_values() {
  std::array<E, KeyField<E>::values.size()> out{};
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<E>(i);
  return out;
}
// Which routes of an op compile their program for one head count (KDA_HEADS,
// an optional hole of the templates): a bit per Route, per Op. Without the hole
// a program reads H at run time (the launch grid's x, or route stream's
// parameter block), so keys that differ only in heads generate the same source:
// one program, compiled once (docs/DESIGN.md, "Keys that generate one source
// are one program"). Where reading H at run time measured slower (H100 A/B,
// docs/notes/decode-heads-ab.md) the hole stays: the single op's grid routes
// (split2 and split4 10-19% slower at 16-1024 rows, rowcta up to 7.5% at 16).
// Route stream of both ops reads H at run time and divides by it through a
// host-computed multiplier (KdaParams::heads_mul), where a 64-bit division
// measured 0.4-1.9% slower at N >= 16 and 4-6% at N = 1.
constexpr uint32_t route_bit(Route r) { return 1u << static_cast<unsigned>(r); }
static_assert(KeyField<Route>::values.size() <= 32, "a bit per route");
inline constexpr std::array<uint32_t, 4> kOpRoutesWithHeadsInProgram = {~0u & ~route_bit(Route::stream), 0u, 0u, 0u};
static_assert(kOpRoutesWithHeadsInProgram.size() == KeyField<Op>::values.size(), "one entry per Op");
constexpr bool heads_in_program(Op op, Route route) {
  return (kOpRoutesWithHeadsInProgram[static_cast<size_t>(op)] & route_bit(route)) != 0;
}
// Whether an op's program is compiled for one state dtype and conv layout
// (KDA_STATE_BF16, KDA_CONV_DS), per Op. The chunked ops' template reads both
// from the kernel parameters (KdaParams::state_bf16, the conv strides): they
// touch only the state's load and store and the conv history, once per
// sequence, so their keys that differ only in state, conv or heads are one
// program.
inline constexpr std::array<bool, 4> kOpStorageInProgram = {true, true, false, false};
static_assert(kOpStorageInProgram.size() == KeyField<Op>::values.size(), "one entry per Op");
constexpr bool storage_in_program(Op op) { return kOpStorageInProgram[static_cast<size_t>(op)]; }
// The two decode ops (kdajit_decode_args_t), for what serves only them.
inline constexpr std::array<Op, 2> kDecodeOps = {Op::single, Op::packed};
// The chunked ops: prefill (conv, delta rule and norm over a slot pool, §10)
// and chunk (its delta rule alone on FLA chunk_kda's tensors, §11). One
// kernel template serves both; their keys carry the chunk size as t.
constexpr bool chunked(Op op) { return op == Op::prefill || op == Op::chunk; }
// "single|packed|prefill|chunk": the allowed spellings, for messages and help.
template <KeyEnum E>
std::string choices(std::string_view sep = "|") {
  std::string s;
  for (auto v : KeyField<E>::values) s.append(s.empty() ? "" : sep).append(v);
  return s;
}
// The canonical spelling of one value; errors name the field and list the choices.
template <KeyEnum E>
Result<E> parse_field(std::string_view s) {
  for (size_t i = 0; i < KeyField<E>::values.size(); ++i)
    if (KeyField<E>::values[i] == s) return static_cast<E>(i);
  return invalid_argument("kernel key field '" + std::string(KeyField<E>::name) + "': expected one of " +
                          choices<E>() + ", got '" + std::string(s) + "'");
}
inline Result<Arch> parse_arch(std::string_view s) { return parse_field<Arch>(s); }

// The eight fields of a key name, in order: JSON name, prefix in the name, and
// for the two integer fields their range (t: the union over the ops; validate()
// holds each op to its own: 1, 1..kMaxTokens, kPrefillChunk).
struct KeyFieldLayout {
  std::string_view json_name;
  std::string_view prefix;
  int lo = 0, hi = 0;  // integer fields only (hi > 0)
};
inline constexpr std::array<KeyFieldLayout, 8> kKeyLayout = {{{"op", "kda_"},
                                                                {"heads", "h", 1, kMaxHeads},
                                                                {"state", "state_"},
                                                                {"conv", "conv_"},
                                                                {"t", "t", 1, kPrefillChunk},
                                                                {"gate", "gate_"},
                                                                {"route", "route_"},
                                                                {"arch", ""}}};

// One row of the arch table (kdajit/arches.def).
struct ArchSpec {
  Arch arch;
  int compute_capability;  // x 10: 90 for sm_90 and sm_90a
  int reference_sm_count;  // the SM count routes are chosen for when there is no device
  std::string_view reference_part;
  int max_smem_per_block;  // bytes of shared memory a block may opt into
};
inline constexpr ArchSpec kArches[] = {
#define ARCH(name, cc, sms, part, smem) {Arch::name, cc, sms, part, smem},
#include "kdajit/arches.def"
#undef ARCH
};
const ArchSpec& arch_spec(Arch a);
// The arch the tools build for when neither a flag, KDAJIT_ARCH nor a GPU names
// one: Hopper's plain target, which every Hopper GPU runs.
inline constexpr Arch kDefaultArch = Arch::sm_90;

// Compute capability of an arch (e.g. 90 for sm_90a) and the reverse for a
// device: the first row of that capability (9.0 -> sm_90).
int arch_compute_capability(Arch a);
Result<Arch> arch_for_compute_capability(int major, int minor);

struct KernelKey {
  Op op = Op::single;
  int heads = 64;
  StateDtype state = StateDtype::f32;
  ConvLayout conv = ConvLayout::sd;
  int tokens = 1;  // T (single 1, packed 1..16); the chunked ops: the chunk size kPrefillChunk
  Gate gate = Gate::bounded;
  Route route = Route::rowcta;
  Arch arch = Arch::sm_90;

  friend bool operator==(const KernelKey&, const KernelKey&) = default;
  friend auto operator<=>(const KernelKey&, const KernelKey&) = default;
};

// Every field in range and the combination possible (t == 1 for single,
// 1..kMaxTokens for packed, kPrefillChunk for the chunked ops; conv sd for the
// chunk op, which has no conv; the route serves the op, ...).
Status validate(const KernelKey& key);

// `kda_single.h64.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90`
std::string key_name(const KernelKey& key);
// The name of the key's program (the generated source's first line): the key
// name, with `*` for each field the program is not compiled for (the chunked
// ops: `kda_prefill.h*.state_*.conv_*.t64.gate_bounded.route_rowcta.sm_90`).
std::string program_name(const KernelKey& key);
// The one key parser: a key name, or (key_from_json) the same fields as JSON.
Result<KernelKey> parse_key(std::string_view name);
nlohmann::json key_to_json(const KernelKey& key);
// Strict: unknown fields, missing fields and bad values are errors naming the field.
Result<KernelKey> key_from_json(const nlohmann::json& j);
// The shape of a key name, spelled from the tables ("kda_<single|packed>.h<1..128>...").
std::string key_name_shape();

// A 64-bit hash for in-memory maps.
struct KernelKeyHash {
  size_t operator()(const KernelKey& k) const noexcept;
};

}  // namespace kdajit
