// The kernel cache: an on-disk store of compiled kernels shared by every process
// on a host (or a fleet, on a network file system), and the in-memory map of one
// process. See docs/CACHE.md for the guarantees.
//
// The cache knows nothing about NVRTC or the driver: the caller hands it the
// hash of the build inputs and a BuildFn that compiles on a miss.
//
//   BuildPlan plan = plan_build(key);        // runtime: inputs + current_build_hash()
//   BuildFn build = [&] { return to_cache_build(plan.inputs, compile(plan.inputs)); };
//   auto found = cache.lookup(key, plan.hash, build, !capturing);   // (runtime/src/jit/obtain.cpp)
//   found->entry->cubin ...
//
// Layers: the root setting may be a ':'-separated list of directories. Lookups
// try them in order; the first trusted layer whose root this user owns and may
// write now (owner write bit set, not a read-only mount) takes new entries; the
// others are read-only. Every layer is verified and trust-checked the same way.
//
// On-disk layout under each layer:
//   <arch>/<key name>.<hash[0:16]>/{kernel.cu, kernel.cubin, meta.json, last_used}
//   tmp/<key name>.<hash[0:16]>.<random>/   an entry being written (swept by age)
//   tmp/gone.<random>/                      an entry being removed
//   locks/<key name>.<hash[0:16]>.lock      per-key flock() files
//
// Trust (docs/CACHE.md): a layer is used only if its root directory is owned by
// this user or root and not writable by group or others; an entry only if its
// directories and files are, too, and none of them is a symbolic link, on a
// read-only mount as anywhere else (one verdict for every reader and verb). Anything
// else is ignored with one warning: the kernel is rebuilt and kept in memory or
// written to the write layer. Paths under a layer are opened with O_NOFOLLOW
// relative to the layer's directory descriptor; nothing that kdajit's naming and
// ownership do not prove to be its own is ever deleted.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kdajit/env.hpp"
#include "kdajit/error.hpp"
#include "kdajit/kernel_key.hpp"

namespace kdajit {

// Bumped whenever the entry layout or the hash definition changes; part of the hash.
inline constexpr int kCacheSchemaVersion = 1;

// The library version compiled into the cache (KDAJIT_VERSION_STRING); part of the hash.
std::string_view cache_library_version();

// SHA-256 (lowercase hex) over every build input, each length-prefixed so that no
// two different input sets serialize to the same bytes.
std::string build_hash(int schema_version, std::string_view library_version, std::string_view source,
                       const std::vector<std::string>& options, Arch arch, std::string_view nvrtc_version);

// build_hash() with this build's schema and library version.
std::string current_build_hash(std::string_view source, const std::vector<std::string>& options, Arch arch,
                               std::string_view nvrtc_version);

// Meta field of an entry whose cubin a compile for another key produced: that
// key's name. Keys whose build inputs are identical (one hash) are one program
// (the prefill op's head counts); each still has its own entry.
inline constexpr const char* kProgramCompiledForField = "program_compiled_for";

// What one build produced. All of it is stored in the entry.
struct CacheBuild {
  std::string source;                // kernel.cu: the exact compiled source
  std::string cubin;                 // kernel.cubin
  std::vector<std::string> options;  // canonical NVRTC options (a hash input)
  std::string nvrtc_version;         // a hash input
  // Free-form metadata, a JSON object. The cache reads these fields when present:
  //   "registers" (int), "spill_bytes" (int), "smem_bytes" (int), "stack_bytes" (int),
  //   "compile_ms" (number; measured around the BuildFn when absent), "entry" (kernel name),
  //   kProgramCompiledForField (string; the cubin is that of another key's compile with the
  //   same build inputs: the log line says so, and compile_ms is that compile's).
  // Fields the cache writes itself (overwriting the build's): schema, library_version,
  // key, key_name, arch, hash, options, nvrtc_version, created, cubin_sha256,
  // cubin_bytes, source_sha256.
  nlohmann::json meta = nlohmann::json::object();
};

// Compiles one kernel. Called at most once per key per process at a time, and (with a
// writable root) by at most one process at a time.
using BuildFn = std::function<Result<CacheBuild>()>;

// One loaded entry. Immutable once returned; shared by every caller.
struct CacheEntry {
  KernelKey key;
  std::string name;  // key_name(key)
  std::string hash;  // full build hash
  std::string dir;   // entry directory; empty when the entry lives only in memory
  std::string source;
  std::string cubin;
  nlohmann::json meta;
};

struct CacheOptions {
  // A directory or a ':'-separated list of layers; empty: KDAJIT_CACHE_DIR / XDG /
  // HOME (env.hpp). Missing layers (and their parents) are created 0700.
  std::string root;
  std::optional<uint64_t> max_bytes;   // unset: KDAJIT_CACHE_MAX_BYTES; none there: no cap
  std::optional<bool> disable_jit;     // unset: KDAJIT_DISABLE_JIT
  bool create_root = true;             // false: a missing layer stays missing (verify, prune, clear)
  // false: nothing is created, written, stamped, swept or deleted (ls, explain, env,
  // prewarm --dry-run/--check); mode() still says what a writer would get.
  bool writable = true;
  // One `compiled <name> in <ms> ms (...)` line per build (prewarm prints its own).
  bool log_compiles = true;
  // Staging dirs under tmp/ older than this are leftovers of crashed writers and are
  // removed when the cache opens (a dir whose key lock is held is always kept).
  std::chrono::seconds tmp_max_age = std::chrono::hours(1);
  // How long to wait for another process's build of the same key. A dead holder's
  // lock is released by the OS at once; this bounds a live holder that is stuck.
  // After it, one warning and this process builds the key itself.
  std::chrono::seconds lock_patience = std::chrono::minutes(10);
};

enum class CacheMode {
  read_write,   // entries are read and published
  read_only,    // the root is readable but not writable: hits from disk, new kernels in memory
  memory_only,  // no usable root (unset, a regular file, not creatable): memory only
};
std::string_view to_string(CacheMode m);

// Where get_or_build's entry came from.
enum class CacheSource { memory, disk, built };

struct CacheLookup {
  std::shared_ptr<const CacheEntry> entry;
  CacheSource source = CacheSource::memory;
  // Built but not on disk (entry->dir empty): why, e.g. "the cache is memory only".
  std::string not_stored;
};

// One layer of the root setting, as opened.
enum class LayerState {
  read_write,  // the write layer: new entries go here (at most one)
  read_only,   // entries are read and verified; nothing is written
  missing,     // does not exist (and was not created)
  unusable,    // not a directory, unreadable, or could not be created
  untrusted,   // owned by another user or writable by others: never read
};
std::string_view to_string(LayerState s);

struct CacheLayer {
  std::string path;
  LayerState state = LayerState::missing;
  std::string reason;  // why not read_write (empty for the write layer)
};

// A read-only look for one entry (prewarm --dry-run / --check).
struct CacheProbe {
  enum class State { present, missing, unusable } state = State::missing;
  size_t layer = 0;    // where it was found (present)
  std::string dir;     // the entry directory (present), or where it would be written
  std::string reason;  // why an existing entry is unusable (corrupt, untrusted)
};

// One entry directory as found on disk (ls, verify, prune).
struct CacheEntryInfo {
  std::string dir;
  std::string dir_name;                 // <key name>.<hash[0:16]>
  std::optional<KernelKey> key;         // parsed from the directory name
  size_t layer = 0;                     // index into KernelCache::layers()
  uint64_t bytes = 0;                   // sum of the entry's file sizes
  uint64_t disk_bytes = 0;              // their share of the disk: a file of n hard links counts 1/n
                                        // (the keys of one program share its kernel.cu and kernel.cubin)
  int64_t last_used_ns = 0;             // unix ns; created time (or mtime) when never stamped
  std::optional<nlohmann::json> meta;   // absent when meta.json is missing, unparsable or untrusted
  bool stale = false;                   // meta names another schema or library version
  std::string untrusted;                // non-empty: why the entry is not trusted (never read)
};

struct CacheVerifyResult {
  bool ok = false;
  bool stale = false;      // valid, but built by another schema or library version: never hit
  bool untrusted = false;  // not ok because of its owner, mode or a link (never removed)
  std::string reason;      // why not ok
};

struct CachePruneResult {
  size_t removed = 0;
  uint64_t bytes_before = 0;
  uint64_t bytes_after = 0;
};

// Thread-safe. Never fails to open: a root it cannot use degrades to read_only or
// memory_only mode with one warning.
class KernelCache {
 public:
  // Reads the environment for the defaults (a malformed variable: one warning, and the
  // defaults of env.hpp for that reading).
  explicit KernelCache(CacheOptions options = {});
  // Uses `env` for the defaults (the runtime reads the environment once).
  KernelCache(CacheOptions options, const Environment& env);
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // The entry for `key` whose build inputs hash to `entry_hash` (current_build_hash()).
  // Order: memory, then disk (verified: a missing file, checksum mismatch, unparsable
  // meta.json or one naming another key or hash is a miss, with one warning, and the
  // entry is rebuilt and replaced), then `build`. Concurrent calls for one key share one
  // build; across processes a per-key flock() serializes builds, with a re-check after
  // acquiring it. After a build: one log line `compiled <name> in <ms> ms (...)`,
  // an atomic publish, and LRU eviction down to max_bytes.
  // Errors on a miss:
  //   allow_build == false (e.g. while a CUDA graph is captured), or another thread
  //     is compiling this key: Error{capture} "... pre-warm this key".
  //   KDAJIT_DISABLE_JIT=1: Error{jit_disabled} naming the key.
  //   The build's own error (e.g. compile_failed), unchanged.
  // A failure to write the entry is not an error: the entry is served from memory with
  // one warning. A failure of the file system (full disk, quota, read-only mount)
  // stops publishing for the process (read_only); a failure scoped to the entry (an
  // old entry that cannot be replaced) leaves other keys unaffected.
  Result<std::shared_ptr<const CacheEntry>> get_or_build(const KernelKey& key, std::string_view entry_hash,
                                                         const BuildFn& build, bool allow_build = true);
  // get_or_build() that also says where the entry came from (prewarm's summary).
  Result<CacheLookup> lookup(const KernelKey& key, std::string_view entry_hash, const BuildFn& build,
                             bool allow_build = true);

  // The entry this process already holds for `key` (any hash), or null. No I/O.
  std::shared_ptr<const CacheEntry> find_loaded(const KernelKey& key) const;

  // The write layer, else the first layer (empty when there is none).
  const std::string& root() const;
  const std::vector<CacheLayer>& layers() const;
  CacheMode mode() const;
  bool disable_jit() const;
  std::optional<uint64_t> max_bytes() const;
  // <root>/<arch>/<name>.<hash[0:16]> (where the entry would live).
  std::string entry_dir(const KernelKey& key, std::string_view entry_hash) const;
  // Whether a verified, trusted entry for (key, hash) exists in some layer. Reads only.
  CacheProbe probe(const KernelKey& key, std::string_view entry_hash) const;

  // Maintenance (the CLI). All are safe while other processes use the cache: entries
  // disappear with one rename, so a reader sees a whole entry or none. Removal only
  // ever happens in the write layer.
  std::vector<CacheEntryInfo> list_entries() const;  // every layer
  // Paths in a layer that are not kdajit's (other names, links, other file types):
  // reported, never touched.
  std::vector<std::string> foreign_paths() const;
  // Re-reads every file and re-hashes the build inputs stored in the entry.
  CacheVerifyResult verify_entry(const CacheEntryInfo& info) const;
  Status remove_entry(const CacheEntryInfo& info);
  // Removes least recently used entries until the total is at most max_bytes.
  CachePruneResult prune(uint64_t max_bytes);
  // Removes every entry, staging dir and lock file of the write layer; foreign files
  // are left alone.
  Result<CachePruneResult> clear();
  // Removes kdajit's own staging dirs older than max_age whose key lock is free;
  // returns how many.
  size_t sweep_tmp(std::chrono::seconds max_age);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdajit
