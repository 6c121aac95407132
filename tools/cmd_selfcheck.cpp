#include "commands.hpp"
namespace kdajit::cli { void add_selfcheck_command(CLI::App&) {} }
