#include <cstdio>
#include <exception>

#include "commands.hpp"
#include "kdajit/kdajit_version.h"


int main(int argc, char** argv) {
  CLI::App app{"kdajit: generate, JIT-compile, cache and launch fused KDA decode kernels"};
  app.set_version_flag("--version", std::string("kdajit ") + KDAJIT_VERSION_STRING);
  app.require_subcommand(1);
  kdajit::cli::add_keys_command(app);
  kdajit::cli::add_compile_commands(app);
  kdajit::cli::add_cache_commands(app);
  kdajit::cli::add_selfcheck_command(app);
  kdajit::cli::add_routes_command(app);
  kdajit::cli::add_tune_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kdajit::cli::Failure& e) {
    std::fprintf(stderr, "kdajit: error: %s\n", e.what());
    return e.code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kdajit: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
