// The file-system half of the cache for one layer: entry directories, atomic
// publishing, verified and trust-checked loads, per-key locks, sweeping and
// eviction. Every path below the layer's root is opened relative to the root's
// descriptor without following links. Stateless apart from the root, so every
// method may be called from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kdajit/cache.hpp"
#include "safe_fs.hpp"

namespace kdajit::cache_detail {

// Bounds on what an entry's files may hold: a hostile entry cannot make a reader
// allocate without limit.
inline constexpr size_t kMaxCubinBytes = size_t{64} << 20;
inline constexpr size_t kMaxSourceBytes = size_t{16} << 20;
inline constexpr size_t kMaxMetaBytes = size_t{1} << 20;

// `<key name>.<hash[0:16]>`: the entry directory, lock and staging names.
std::string entry_stem(const KernelKey& key, std::string_view hash);

int64_t now_ns();

enum class LoadStatus { ok, absent, corrupt, untrusted };
struct LoadResult {
  LoadStatus status = LoadStatus::absent;
  std::string reason;                  // why corrupt or untrusted
  std::shared_ptr<CacheEntry> entry;   // when ok
};

// A staging directory tmp/<stem>.<random>; a crash leaves only this behind.
struct Staging {
  Fd tmp;            // <root>/tmp
  Fd dir;            // the staging directory
  std::string name;  // its name in tmp/
  bool empty() const { return name.empty(); }
};

class DiskStore {
 public:
  struct Options {
    bool create = true;    // create the root (and parents, 0700) when missing
    bool writable = true;  // false: never create or change anything
    std::chrono::seconds lock_patience = std::chrono::minutes(10);
  };
  // Opens the root and decides its state; creates nothing but a missing root (create).
  DiskStore(std::string root, const Options& options);

  const std::string& root() const { return root_; }
  LayerState state() const { return state_; }
  const std::string& reason() const { return reason_; }
  bool readable() const { return state_ == LayerState::read_write || state_ == LayerState::read_only; }

  std::string entry_dir(const KernelKey& key, std::string_view hash) const;

  // Why this user may not add entries to the layer now (the root's owner, mode and
  // mount decide); empty when it may.
  std::string unwritable_reason() const;
  // Whether the root is empty or holds one of kdajit's names (<arch>/, tmp/, locks/):
  // clear refuses a directory that is not a cache root.
  bool is_cache_root() const;
  // The one trust verdict on an entry, used by load(), list() (ls, env, verify) and
  // so by every verb: why <arch>/, the entry directory or one of its files could
  // have been written by someone other than this user or root (a link, another
  // owner, a group- or world-writable mode); empty when it could not. A missing or
  // broken path is not a trust matter (load() calls it corrupt).
  std::string distrust_entry(std::string_view arch, std::string_view name) const;

  // A verified, trust-checked read of the entry for (key, hash).
  LoadResult load(const KernelKey& key, std::string_view hash) const;

  // Waits until this process holds the key's lock; gives up after lock_patience
  // (the caller then builds without it: the rename keeps publishing safe).
  Result<KeyLock> lock(const KernelKey& key, std::string_view hash) const;

  // A fresh staging dir. Errors are Error{io}.
  Result<Staging> stage(const KernelKey& key, std::string_view hash) const;
  // Writes and flushes the entry's files into `staging`, then renames it into place.
  // An entry whose cubin was compiled for another key (kProgramCompiledForField)
  // links that key's kernel.cu and kernel.cubin where that entry is this user's
  // and holds the same bytes.
  // Returns the entry dir. On failure `staging` is removed and the error is
  // Error{io} for a failure of the file system (full, quota, read-only) and
  // Error{cache} for one scoped to this entry (an old entry or arch directory in
  // the way that is not ours).
  Result<std::string> publish(Staging& staging, const CacheEntry& entry) const;
  void discard(Staging& staging) const;

  // Stamps last_used of an entry this user owns (best effort).
  void touch(const KernelKey& key, std::string_view hash) const;

  std::vector<CacheEntryInfo> list(bool with_meta = true) const;  // eviction needs no meta
  std::vector<std::string> foreign() const;
  CacheVerifyResult verify(const CacheEntryInfo& info) const;
  // Makes the entry <arch>/<name> vanish with one rename, then deletes it. Refuses
  // (Error{cache}) what this user does not own.
  Status take_away(std::string_view arch, std::string_view name) const;
  // LRU eviction; never removes `keep` (an entry dir).
  CachePruneResult evict(uint64_t max_bytes, const std::string& keep) const;
  size_t sweep_tmp(std::chrono::seconds max_age) const;
  CachePruneResult clear() const;

 private:
  std::string path_of(std::string_view rel) const;
  // The entry directory of the key `entry`'s program was compiled for, opened
  // when it is this user's; an empty Fd otherwise.
  Fd program_entry(const CacheEntry& entry) const;
  // A row of list() for a link planted under an entry's or an <arch>/ name.
  bool is_link_row(const CacheEntryInfo& e) const;
  void open_root(const Options& options);

  std::string root_;
  std::chrono::seconds lock_patience_;
  Fd root_fd_;
  uid_t euid_ = 0;
  LayerState state_ = LayerState::missing;
  std::string reason_;
};

}  // namespace kdajit::cache_detail
