#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "kdajit/kernel_key.hpp"
#include "kdajit/presets.hpp"

namespace kdajit::cli {

void add_keys_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("keys", "Print the kernel keys of a model preset");
  struct Opts {
    std::string preset;
    std::string arch = "sm_90";
    bool json = false;
  };
  auto opts = std::make_shared<Opts>();
  cmd->add_option("--preset", opts->preset, fmt::format("{}", fmt::join(preset_names(), " | ")))->required();
  cmd->add_option("--arch", opts->arch, choices<Arch>(" | "))->capture_default_str();
  cmd->add_flag("--json", opts->json, "Print a JSON array of keys");
  cmd->callback([opts] {
    Arch arch = unwrap(parse_arch(opts->arch));
    auto keys = unwrap(preset_keys(opts->preset, arch));
    if (opts->json) {
      auto arr = nlohmann::json::array();
      for (const auto& k : keys) arr.push_back(key_to_json(k));
      fmt::print("{}\n", arr.dump(2));
    } else {
      for (const auto& k : keys) fmt::print("{}\n", key_name(k));
    }
  });
}

}  // namespace kdajit::cli
