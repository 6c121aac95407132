#include "key_selection.hpp"

#include <algorithm>
#include <charconv>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>

#include "cli_output.hpp"
#include "kdajit/bounded_io.hpp"
#include "kdajit/routes.hpp"

namespace kdajit::cli {

namespace {

using nlohmann::json;

constexpr size_t kMaxKeyNameBytes = 200;

// The enum fields and their values, from the key's spelling tables (KeyField<E>).
struct EnumField {
  std::string_view name;
  std::vector<std::string> values;
};
template <KeyEnum E>
EnumField enum_field_of() {
  return {KeyField<E>::name, {KeyField<E>::values.begin(), KeyField<E>::values.end()}};
}
const std::vector<EnumField>& enum_fields() {
  static const std::vector<EnumField> fields = {enum_field_of<Op>(), enum_field_of<StateDtype>(),
                                                enum_field_of<ConvLayout>(), enum_field_of<Gate>(),
                                                enum_field_of<Route>(), enum_field_of<Arch>()};
  return fields;
}
const EnumField* enum_field(std::string_view name) {
  for (const auto& f : enum_fields())
    if (f.name == name) return &f;
  return nullptr;
}

// The key parsers say "kernel key field 'x': ..."; inside a pattern "field 'x': ..." reads better.
Error field_error(std::string_view field, const Error& e) {
  constexpr std::string_view kPrefix = "kernel key ";
  std::string msg = e.message;
  if (msg.rfind(kPrefix, 0) == 0) msg = msg.substr(kPrefix.size());
  else if (msg.rfind("field '", 0) != 0) msg = fmt::format("field '{}': {}", field, msg);
  return invalid_argument(msg);
}

std::string excerpt(const json& v) { return quote(v.dump(-1, ' ', false, json::error_handler_t::replace), 60); }

// One value of `field`, checked: an enum spelling, or an integer the key accepts.
Result<json> check_value(std::string_view field, const json& v) {
  if (const EnumField* f = enum_field(field)) {
    if (!v.is_string())
      return invalid_argument(fmt::format("field '{}': expected a string, got {}", field, excerpt(v)));
    const auto s = v.get<std::string>();
    if (std::find(f->values.begin(), f->values.end(), s) == f->values.end())
      return invalid_argument(
          fmt::format("field '{}': expected one of {}, got '{}'", field, fmt::join(f->values, "|"), quote(s)));
    return v;
  }
  // heads and t: the key's own validation says what is allowed (t on a packed
  // key, or the chunk size on a prefill key).
  KernelKey base;
  if (field == "t") {
    const bool chunk = v.is_number_integer() && v.get<int64_t>() == kPrefillChunk;  // t of the chunked ops
    base.op = chunk ? Op::prefill : Op::packed;
    base.tokens = chunk ? kPrefillChunk : 1;
  }
  json probe = key_to_json(base);
  if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) {
    probe[std::string(field)] = 0;  // out of range: the key's message names the range
    auto r = key_from_json(probe);
    std::string range = r ? std::string() : r.error().message;
    if (auto p = range.find("expected"); p != std::string::npos) range = range.substr(p);
    if (auto g = range.find(", got"); g != std::string::npos) range = range.substr(0, g);
    return invalid_argument(fmt::format("field '{}': {}, got {}", field, range.empty() ? "expected an integer" : range,
                                        excerpt(v)));
  }
  probe[std::string(field)] = v;
  auto r = key_from_json(probe);
  if (!r) return field_error(field, r.error());
  return v;
}

Result<std::vector<json>> field_values(std::string_view field, const json& v) {
  std::vector<json> out;
  auto one = [&](const json& x) -> Status {
    KDAJIT_TRY_ASSIGN(json checked, check_value(field, x));
    if (std::find(out.begin(), out.end(), checked) == out.end()) out.push_back(checked);
    return {};
  };
  if (v.is_array()) {
    if (v.empty()) return invalid_argument(fmt::format("field '{}': expected a value or a non-empty list, got []", field));
    for (const auto& x : v) KDAJIT_TRY(one(x));
  } else {
    KDAJIT_TRY(one(v));
  }
  return out;
}

}  // namespace

const std::vector<std::string>& key_fields() {
  // In key-name order (kKeyLayout), as `kdajit explain` prints them.
  static const std::vector<std::string> fields = [] {
    std::vector<std::string> f;
    for (const auto& l : kKeyLayout) f.emplace_back(l.json_name);
    return f;
  }();
  return fields;
}

std::vector<std::pair<std::string, std::string>> pattern_flag_help() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : key_fields()) {
    if (f == "arch") continue;
    if (const EnumField* e = enum_field(f)) out.emplace_back(f, fmt::format("{}", fmt::join(e->values, ",")));
    else if (f == "heads") out.emplace_back(f, fmt::format("head counts 1..{}, e.g. 16,64", kMaxHeads));
    else if (f == "t")
      out.emplace_back(f, fmt::format("packed tokens 1..{}, e.g. 2,3,4 (single keys take 1, prefill and chunk keys {})",
                                      kMaxTokens, kPrefillChunk));
    else out.emplace_back(f, "values");
  }
  return out;
}

Result<KernelKey> parse_key_text(std::string_view text, std::string_view what) {
  if (text.size() > kMaxKeyNameBytes)
    return invalid_argument(fmt::format("{}: expected a kernel key name (at most {} bytes), got '{}' ({} bytes)", what,
                                        kMaxKeyNameBytes, quote(text, 60), text.size()));
  auto k = parse_key(text);
  if (!k) return invalid_argument(k.error().message);
  return k;
}

Result<KernelKey> parse_key_or_json(std::string_view text, std::string_view what) {
  if (text.empty() || text.front() != '{') return parse_key_text(text, what);
  auto j = parse_json_bounded(text, 4);
  if (!j)
    return invalid_argument(fmt::format("{}: '{}' is neither a key name nor a JSON key object ({})", what,
                                        quote(text, 60), j.error().message));
  auto k = key_from_json(*j);
  if (!k) return invalid_argument(k.error().message);
  return k;
}

json flags_pattern(const std::map<std::string, std::vector<std::string>>& flags) {
  json p = json::object();
  for (const auto& [field, values] : flags) {
    if (values.empty()) continue;
    json list = json::array();
    const bool integer_field = !enum_field(field);
    for (const auto& v : values) {
      int64_t n = 0;
      auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (integer_field && !v.empty() && ec == std::errc() && ptr == v.data() + v.size()) list.push_back(n);
      else list.push_back(v);
    }
    p[field] = list;
  }
  return p;
}

Result<std::vector<KernelKey>> pattern_keys(const json& obj, Arch default_arch, size_t max_keys, bool* too_many_keys) {
  if (!obj.is_object())
    return invalid_argument(fmt::format("expected a key name (string) or a key pattern (object), got {}", excerpt(obj)));
  const auto& fields = key_fields();
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (std::find(fields.begin(), fields.end(), it.key()) == fields.end())
      return invalid_argument(
          fmt::format("unknown field '{}'; expected only {}", quote(it.key(), 40), fmt::join(fields, ", ")));
  if (!obj.contains("heads")) return invalid_argument("field 'heads': required in a pattern (a value or a list of head counts)");

  // Each field's values: given, or every value (t: 1..kMaxTokens for packed keys only).
  std::map<std::string, std::vector<json>> values;
  for (const auto& f : fields) {
    if (obj.contains(f)) {
      KDAJIT_TRY_ASSIGN(values[f], field_values(f, obj.at(f)));
    } else if (f == "arch") {
      values[f] = {json(to_string(default_arch))};
    } else if (f == "t") {
      for (int t = 1; t <= kMaxTokens; ++t) values[f].push_back(t);
    } else if (const EnumField* e = enum_field(f)) {
      for (const auto& v : e->values) values[f].push_back(v);
    }
  }
  const bool single_only = values["op"] == std::vector<json>{json(to_string(Op::single))};
  if (single_only && obj.contains("t") &&
      std::find(values["t"].begin(), values["t"].end(), json(1)) == values["t"].end())
    return invalid_argument(fmt::format("field 't': op single takes only t=1, got {}", excerpt(json(values["t"]))));
  // The chunked ops (prefill, chunk) take only t = the chunk size.
  const auto is_chunked = [](const json& op) { return op.is_string() && parse_field<Op>(op.get<std::string>()) &&
                                                      chunked(*parse_field<Op>(op.get<std::string>())); };
  const bool chunked_only = std::all_of(values["op"].begin(), values["op"].end(), is_chunked);
  const bool with_chunked = std::any_of(values["op"].begin(), values["op"].end(), is_chunked);
  if (chunked_only && obj.contains("t") &&
      std::find(values["t"].begin(), values["t"].end(), json(kPrefillChunk)) == values["t"].end()) {
    std::vector<std::string> ops;
    for (const auto& op : values["op"]) ops.push_back(op.get<std::string>());
    return invalid_argument(fmt::format("field 't': op {} takes only t={} (the chunk size), got {}",
                                        fmt::join(ops, "|"), kPrefillChunk, excerpt(json(values["t"]))));
  }

  // The cartesian product, counted like an odometer so that a pattern past
  // max_keys stops there.
  std::vector<std::string> product_fields;
  for (const auto& f : fields)
    if (f != "t") product_fields.push_back(f);
  std::vector<KernelKey> out;
  std::optional<Error> skipped;
  std::vector<size_t> pos(product_fields.size(), 0);
  const auto too_many = [&] {
    if (too_many_keys) *too_many_keys = true;
    return invalid_argument(fmt::format("the pattern expands to more than {} keys (the most one run takes); name fewer "
                                        "values, or split it over several runs",
                                        max_keys));
  };
  for (bool more = true; more;) {
    json p = json::object();
    for (size_t i = 0; i < product_fields.size(); ++i) p[product_fields[i]] = values[product_fields[i]][pos[i]];
    for (size_t i = product_fields.size(); i-- > 0;) {  // advance the odometer
      if (++pos[i] < values[product_fields[i]].size()) break;
      pos[i] = 0;
      if (i == 0) more = false;
    }
    const bool single = p["op"] == json(to_string(Op::single));
    const bool prefill = is_chunked(p["op"]);
    // The chunk op has no conv: its keys carry conv sd, and a pattern that did
    // not name the conv layout means that one.
    if (p["op"] == json(to_string(Op::chunk)) && !obj.contains("conv") && p["conv"] != json(to_string(ConvLayout::sd)))
      continue;
    // A route the pattern did not name is every route that serves the key's op
    // and that the selector may pick (a forced-only route only when named).
    const auto route = parse_field<Route>(p["route"].get<std::string>());
    if (!obj.contains("route")) {
      auto op = parse_field<Op>(p["op"].get<std::string>());
      if (op && route && (!route_spec(*route).serves(*op) || forced_only(*route, *op))) continue;
    }
    // Single keys take t=1 and chunked keys their route's chunk size whatever
    // the pattern says; a packed key skips the chunk size (named for the
    // chunked keys of the pattern).
    const int chunk = route ? route_chunk(*route) : kPrefillChunk;
    for (const auto& t : single ? std::vector<json>{json(1)} : prefill ? std::vector<json>{json(chunk)} : values["t"]) {
      if (!single && !prefill && t == json(kPrefillChunk) && with_chunked) continue;
      p["t"] = t;
      auto k = key_from_json(p);
      if (!k && k.error().code == ErrorCode::unsupported) {
        // A combination the arch cannot run (prefill's shared memory on sm_120a),
        // left out as the presets leave it out; an error only if nothing is left.
        skipped = k.error();
        continue;
      }
      if (!k) return field_error("t", k.error());
      if (out.size() == max_keys) return too_many();
      out.push_back(*k);
    }
  }
  if (out.empty() && skipped) return *skipped;
  return out;
}

Result<ManifestKeys> manifest_keys(const std::string& path, Arch default_arch) {
  const std::string where = quote(path);
  auto text = read_regular_file(path, kMaxManifestBytes, "--manifest " + where);
  if (!text) return std::move(text).error();
  auto doc = parse_json_bounded(*text);
  if (!doc) return invalid_argument(fmt::format("{}: not valid JSON: {}", where, doc.error().message));
  if (!doc->is_array())
    return invalid_argument(fmt::format(
        "{}: expected a JSON array of key names, key objects or key patterns, got a JSON {}", where, doc->type_name()));
  if (doc->empty()) return invalid_argument(fmt::format("{}: expected at least one key name, key object or pattern, got []", where));
  ManifestKeys out;
  // Deduplicated as they are expanded; bounded in distinct keys and in keys named.
  std::unordered_set<KernelKey, KernelKeyHash> seen;
  size_t mentions = 0;
  for (size_t i = 0; i < doc->size(); ++i) {
    const json& e = (*doc)[i];
    auto fail = [&](const Error& err) { return invalid_argument(fmt::format("{}: entry {}: {}", where, i + 1, err.message)); };
    auto add = [&](const KernelKey& k) -> Status {
      if (seen.insert(k).second) {
        if (out.keys.size() == kMaxKeys)
          return invalid_argument(fmt::format("the manifest expands to more than {} distinct keys (the most one run "
                                              "takes); split it over several runs",
                                              kMaxKeys));
        out.keys.push_back(k);
      }
      return {};
    };
    const auto too_many_mentions = [&] {
      return fail(invalid_argument(fmt::format("the manifest names more than {} keys counting repeats (at most {} "
                                               "distinct keys, {} named in all)",
                                               kMaxKeyMentions, kMaxKeys, kMaxKeyMentions)));
    };
    if (mentions >= kMaxKeyMentions) return too_many_mentions();
    if (e.is_string()) {
      auto k = parse_key_text(e.get<std::string>(), "key name");
      if (!k) return fail(k.error());
      ++mentions;
      if (Status s = add(*k); !s) return fail(s.error());
      out.entries_with_arch.push_back({i + 1, {k->arch}});
      continue;
    }
    const size_t budget = std::min(kMaxKeys, kMaxKeyMentions - mentions);
    bool too_many = false;
    auto keys = pattern_keys(e, default_arch, budget, &too_many);
    if (!keys && too_many && budget < kMaxKeys) return too_many_mentions();
    if (!keys) return fail(keys.error());
    mentions += keys->size();
    if (e.contains("arch")) {
      std::vector<Arch> archs;
      for (const auto& k : *keys)
        if (std::find(archs.begin(), archs.end(), k.arch) == archs.end()) archs.push_back(k.arch);
      out.entries_with_arch.push_back({i + 1, archs});
    }
    for (const auto& k : *keys)
      if (Status s = add(k); !s) return fail(s.error());
  }
  return out;
}

}  // namespace kdajit::cli
