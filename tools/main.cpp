#include <cstdio>
#include <exception>
#include <string>

#include <fmt/format.h>

#include "cli_env.hpp"
#include "cli_output.hpp"
#include "commands.hpp"
#include "kdajit/kdajit_version.h"

namespace {

// The verbs by name, for "unknown verb" (CLI11 would say "A subcommand is required").
std::string verb_list(CLI::App& app) {
  std::string out;
  for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (!out.empty()) out += ", ";
    out += sub->get_name();
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kdajit::cli;
  CLI::App app{"kdajit: generate, JIT-compile, cache and launch fused KDA decode and prefill kernels"};
  app.set_version_flag("--version", std::string("kdajit ") + KDAJIT_VERSION_STRING);
  app.require_subcommand(1);
  add_keys_command(app);
  add_compile_commands(app);
  add_cache_commands(app);
  add_env_command(app);
  add_selfcheck_command(app);
  add_routes_command(app);
  add_tune_command(app);
  // Every verb sees one environment, read and checked before it runs: a malformed
  // KDAJIT_* value is the same error (exit 2) whatever the verb.
  app.parse_complete_callback([] { load_environment(); });

  if (argc < 2) {
    print_error(fmt::format("expected a verb: {} (kdajit --help)", verb_list(app)));
    return kExitUsage;
  }
  if (std::string first = argv[1]; first.size() > 1 && first[0] == '-') {
    // Options before the verb: only --help and --version; CLI11 would say "A
    // subcommand is required" for anything else.
    const std::string name = first.substr(0, first.find('='));
    if (name != "-h" && name != "--help" && name != "--version") {
      print_error(fmt::format("unknown option '{}' before the verb; expected a verb first: {} (kdajit --help)",
                              quote(first, 60), verb_list(app)));
      return kExitUsage;
    }
  } else if (!first.empty() && first[0] != '-') {
    bool known = false;
    for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) known = known || sub->check_name(first);
    if (!known) {
      print_error(fmt::format("unknown verb '{}'; expected one of: {}", quote(first, 60), verb_list(app)));
      return kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(fmt::format("{} (kdajit {} --help)", e.what(), argc > 1 ? quote(argv[1], 40) : std::string()));
    return kExitUsage;
  } catch (const Failure& e) {
    if (!e.message.empty()) print_error(e.message, e.detail);
    return e.code;
  } catch (const std::exception& e) {
    print_error(e.what());
    return kExitFailure;
  }
  return kExitOk;
}
