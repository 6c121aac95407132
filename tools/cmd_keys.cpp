#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_env.hpp"
#include "cli_output.hpp"
#include "commands.hpp"
#include "key_selection.hpp"
#include "kdajit/kernel_key.hpp"
#include "kdajit/presets.hpp"

namespace kdajit::cli {

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
}

}  // namespace kdajit::cli
