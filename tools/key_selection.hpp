// Which keys a verb works on: key names and JSON key objects given on the command
// line, model presets, manifests and pattern flags. Spellings and ranges come from
// kernel_key.hpp; nothing here lists a field's values by hand.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kdajit/error.hpp"
#include "kdajit/kernel_key.hpp"

namespace kdajit::cli {

// The key's JSON field names (as in `kdajit keys --json`).
const std::vector<std::string>& key_fields();
// The pattern flags of prewarm (every field but arch) and their help text.
std::vector<std::pair<std::string, std::string>> pattern_flag_help();

// A key name as typed by a user: bounded in length before anything echoes it.
Result<KernelKey> parse_key_text(std::string_view text, std::string_view what = "KEY");
// A key name, or a JSON key object when the text starts with '{'.
Result<KernelKey> parse_key_or_json(std::string_view text, std::string_view what = "KEY");

// `--heads 16,64 --t 2,3` -> the pattern {"heads":[16,64],"t":[2,3]}.
nlohmann::json flags_pattern(const std::map<std::string, std::vector<std::string>>& flags);
// The most keys one verb works on: more than every preset and real manifest needs
// (a whole model is a few hundred), few enough that expanding and checking them
// takes seconds. A pattern or manifest that expands past it is an error, not a
// run of hours (one 90-byte pattern can name 353,280 keys).
inline constexpr size_t kMaxKeys = 65536;
// The most keys a manifest may name counting repeats: bounds the work of a
// manifest whose entries name the same keys over and over.
inline constexpr size_t kMaxKeyMentions = 16 * kMaxKeys;

// Every key of a pattern (an object: each field a value or a list; heads required;
// t for packed keys only, 1..16 when missing; a missing arch is `default_arch`).
// A pattern of more than `max_keys` keys is an error, found without expanding it
// all (and *too_many, when given, is set).
Result<std::vector<KernelKey>> pattern_keys(const nlohmann::json& pattern, Arch default_arch,
                                            size_t max_keys = kMaxKeys, bool* too_many = nullptr);

struct ManifestKeys {
  std::vector<KernelKey> keys;
  // Entries (counted from 1) that name their own arch, and the archs they name:
  // --arch does not apply to them.
  std::vector<std::pair<size_t, std::vector<Arch>>> entries_with_arch;
};
// Reads a manifest (a JSON array of key names, key objects or patterns). Bounded:
// a regular file of at most kMaxManifestBytes, JSON at most kMaxJsonDepth deep, at
// most kMaxKeys distinct keys and kMaxKeyMentions counting repeats. Keys come
// out once each, in the order first named; an empty manifest is an error.
// Errors name the file, the entry (from 1) and the field.
inline constexpr size_t kMaxManifestBytes = size_t{4} << 20;
Result<ManifestKeys> manifest_keys(const std::string& path, Arch default_arch);

}  // namespace kdajit::cli
