// Text made safe to echo: every message that quotes input (a key from a
// manifest, a file name from a shared root, an environment value) goes through
// printable(), and every log line too, so no input forges a second line or
// drives the terminal.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kdajit {

// `s` made safe to echo on one line of a terminal or log: control bytes, DEL,
// backslashes and invalid UTF-8 become \n, \t, \x1b style escapes, and anything
// past `max_bytes` is cut and replaced by "...(N more bytes)".
std::string printable(std::string_view s, size_t max_bytes = 160);

}  // namespace kdajit
