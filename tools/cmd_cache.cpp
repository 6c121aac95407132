#include "commands.hpp"
namespace kdajit::cli { void add_cache_commands(CLI::App&) {} }
