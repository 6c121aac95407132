#include "commands.hpp"
namespace kdajit::cli { void add_compile_commands(CLI::App&) {} }
