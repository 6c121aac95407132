#include <fmt/format.h>

#include "kdajit/cache.hpp"
#include "kdajit/sha256.hpp"
#include "kdajit/kdajit_version.h"

namespace kdajit {

std::string_view cache_library_version() { return KDAJIT_VERSION_STRING; }

std::string build_hash(int schema_version, std::string_view library_version, std::string_view source,
                       const std::vector<std::string>& options, Arch arch, std::string_view nvrtc_version) {
  // `name <length>:<bytes>\n` per field: unambiguous whatever bytes a field holds.
  std::string buf;
  buf.reserve(source.size() + 512);
  auto field = [&buf](std::string_view name, std::string_view bytes) {
    buf += fmt::format("{} {}:", name, bytes.size());
    buf.append(bytes);
    buf.push_back('\n');
  };
  field("kdajit-cache-schema", std::to_string(schema_version));
  field("library", library_version);
  field("arch", to_string(arch));
  field("nvrtc", nvrtc_version);
  field("options", std::to_string(options.size()));
  for (const auto& o : options) field("option", o);
  field("source", source);
  return sha256_hex(buf);
}

std::string current_build_hash(std::string_view source, const std::vector<std::string>& options, Arch arch,
                               std::string_view nvrtc_version) {
  return build_hash(kCacheSchemaVersion, cache_library_version(), source, options, arch, nvrtc_version);
}

std::string_view to_string(CacheMode m) {
  switch (m) {
    case CacheMode::read_write: return "read-write";
    case CacheMode::read_only: return "read-only";
    case CacheMode::memory_only: return "memory-only";
  }
  return "unknown";
}

std::string_view to_string(LayerState s) {
  switch (s) {
    case LayerState::read_write: return "read-write";
    case LayerState::read_only: return "read-only";
    case LayerState::missing: return "missing";
    case LayerState::unusable: return "unusable";
    case LayerState::untrusted: return "untrusted";
  }
  return "unknown";
}

}  // namespace kdajit
