#include <array>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_env.hpp"
#include "cli_output.hpp"
#include "commands.hpp"
#include "key_selection.hpp"
#include "kdajit/kernel_key.hpp"
#include "kdajit/presets.hpp"

namespace kdajit::cli {

namespace {

template <KeyEnum E>
nlohmann::json spellings() {
  nlohmann::json a = nlohmann::json::array();
  for (std::string_view v : KeyField<E>::values) a.push_back(v);
  return a;
}

// The fields of a key name in order (kKeyLayout): name, prefix, and the
// spellings of an enum field (KeyField<E>) or the range of an integer one.
nlohmann::json key_fields_json() {
  const std::array<nlohmann::json, kKeyLayout.size()> values = {
      spellings<Op>(),   nullptr,           spellings<StateDtype>(), spellings<ConvLayout>(),
      nullptr,           spellings<Gate>(), spellings<Route>(),      spellings<Arch>()};
  nlohmann::json arr = nlohmann::json::array();
  for (size_t i = 0; i < kKeyLayout.size(); ++i) {
    const KeyFieldLayout& f = kKeyLayout[i];
    nlohmann::json j = {{"name", f.json_name}, {"prefix", f.prefix}};
    if (f.hi > 0) {
      j["min"] = f.lo;
      j["max"] = f.hi;
    } else {
      j["values"] = values[i];
    }
    arr.push_back(std::move(j));
  }
  return arr;
}

// `kdajit fields [--json]`: what a key name is made of, for scripts that read
// key names (bench/tune_vs_selector.py) without spelling the fields themselves.
void add_fields_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("fields", "Print the fields of a kernel key name: name, prefix, values or range");
  auto json_out = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json_out, "print a JSON array, one object per field in key-name order");
  cmd->callback([json_out] {
    const nlohmann::json fields = key_fields_json();
    if (*json_out) {
      fmt::print("{}\n", dump_json(fields));
      return;
    }
    fmt::print("{}\n", key_name_shape());
    for (const auto& f : fields) {
      const std::string values = f.contains("values")
                                     ? fmt::format("{}", fmt::join(f["values"].get<std::vector<std::string>>(), " | "))
                                     : fmt::format("{}..{}", f["min"].get<int>(), f["max"].get<int>());
      fmt::print("  {:<6} prefix '{}'  {}\n", f["name"].get<std::string>(), f["prefix"].get<std::string>(), values);
    }
  });
}

}  // namespace

void add_keys_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("keys", "Print the kernel keys of a model preset");
  struct Opts {
    std::string preset;
    std::string arch;
    bool json = false;
  };
  auto opts = std::make_shared<Opts>();
  cmd->add_option("--preset", opts->preset, fmt::format("{}", fmt::join(preset_names(), " | ")))->required();
  cmd->add_option("--arch", opts->arch,
                  fmt::format("{} (default: KDAJIT_ARCH, else the local GPU's, else {})", choices<Arch>(" | "),
                              to_string(kDefaultArch)));
  cmd->add_flag("--json", opts->json, "Print a JSON array of keys");
  cmd->callback([opts] {
    Arch arch = choose_arch(opts->arch).arch;
    auto keys = unwrap(preset_keys(opts->preset, arch));
    if (opts->json) {
      auto arr = nlohmann::json::array();
      for (const auto& k : keys) arr.push_back(key_to_json(k));
      fmt::print("{}\n", dump_json(arr));
    } else {
      for (const auto& k : keys) fmt::print("{}\n", key_name(k));
    }
  });
  add_fields_command(app);
}

}  // namespace kdajit::cli
