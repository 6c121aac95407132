// Reading bytes that nobody vouches for (manifests, meta.json of a shared root):
// the size and the JSON nesting are bounded before anything is parsed, and a FIFO
// or a device never blocks or streams forever.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kdajit/error.hpp"

namespace kdajit {

inline constexpr int kMaxJsonDepth = 64;

// The contents of the regular file at `path` (links followed), at most max_bytes.
// A FIFO, device, directory or larger file is an Error{invalid_argument} whose
// message starts with `what` (e.g. "--manifest m.json") and says what was found.
Result<std::string> read_regular_file(const std::string& path, size_t max_bytes, std::string_view what);

// JSON nested at most max_depth arrays/objects deep. Errors say where, with any
// echoed input made printable; they never dump the (possibly huge) value.
Result<nlohmann::json> parse_json_bounded(std::string_view text, int max_depth = kMaxJsonDepth);

}  // namespace kdajit
