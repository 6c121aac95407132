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

// A whole message made safe as one line (log lines, CLI errors): escapes like
// printable() but leaves backslashes alone, because the input a message quotes
// went through printable() already (a literal "\x1b" in the input shows as
// "\\x1b", an ESC as "\x1b"). Longer than `max_bytes`: the start and the end
// are kept around "...(N bytes cut)...", so the reason at the end survives a long path.
std::string printable_line(std::string_view s, size_t max_bytes = 4096);

}  // namespace kdajit
