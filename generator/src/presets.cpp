#include "kdajit/presets.hpp"

#include <fmt/format.h>

#include "kdajit/routes.hpp"

namespace kdajit {

namespace {

constexpr std::array<std::string_view, 3> kPresets = {"glm-5.3-flash", "kimi-k3", "full"};

// heads x {f32, bf16} x {sd, ds} x (single? + packed T in [t_lo, t_hi] +
// prefill at t = kPrefillChunk) x gates x routes
std::vector<KernelKey> matrix(std::initializer_list<int> heads, bool single, int t_lo, int t_hi,
                              std::initializer_list<Gate> gates, Arch arch) {
  std::vector<KernelKey> out;
  auto add = [&](const KernelKey& family) {
    for (const KernelKey& k : keys_of_family(family)) out.push_back(k);
  };
  for (int h : heads)
    for (auto st : all_values<StateDtype>())
      for (auto cv : all_values<ConvLayout>())
        for (auto g : gates) {
          KernelKey k{Op::single, h, st, cv, 1, g, Route::rowcta, arch};
          if (single) add(k);
          k.op = Op::packed;
          for (k.tokens = t_lo; k.tokens <= t_hi; ++k.tokens) add(k);
          k.op = Op::prefill;
          k.tokens = kPrefillChunk;
          add(k);
        }
  return out;
}

}  // namespace

std::vector<KernelKey> keys_of_family(const KernelKey& family) {
  std::vector<KernelKey> out;
  for (const RouteSpec& r : route_table()) {
    if (!r.serves(family.op) || forced_only(r.route, family.op)) continue;
    KernelKey k = family;
    k.route = r.route;
    if (chunked(k.op)) k.tokens = route_chunk(r.route);
    if (validate(k).ok()) out.push_back(k);  // e.g. no prefill key where the arch lacks its shared memory
  }
  return out;
}

std::vector<std::string_view> preset_names() { return {kPresets.begin(), kPresets.end()}; }

Result<std::vector<KernelKey>> preset_keys(std::string_view preset, Arch arch) {
  // Heads are per rank: the model's heads sharded over TP 1/2/4/8.
  if (preset == "glm-5.3-flash") return matrix({64, 32, 16, 8}, true, 2, 4, {Gate::bounded}, arch);
  if (preset == "kimi-k3") return matrix({96, 48, 24, 12}, true, 2, 4, {Gate::bounded}, arch);
  if (preset == "full")
    return matrix({1, 8, 12, 16, 24, 32, 48, 64, 96, 128}, true, 1, 8, {Gate::bounded, Gate::softplus}, arch);
  return invalid_argument(fmt::format("preset: expected one of {}, got '{}'", fmt::join(kPresets, "|"), preset));
}

}  // namespace kdajit
