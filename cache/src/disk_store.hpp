// The file-system half of the cache: entry directories, atomic publishing,
// verified loads, per-key locks, sweeping and eviction. Stateless apart from
// the root, so every method may be called from any thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kdajit/cache.hpp"

namespace kdajit::cache_detail {

inline constexpr size_t kShortHashLen = 16;
inline constexpr const char* kSourceFile = "kernel.cu";
inline constexpr const char* kCubinFile = "kernel.cubin";
inline constexpr const char* kMetaFile = "meta.json";
inline constexpr const char* kLastUsedFile = "last_used";

// `<key name>.<hash[0:16]>`: the entry directory, lock and staging names.
std::string entry_stem(const KernelKey& key, std::string_view hash);

int64_t now_ns();

enum class LoadStatus { ok, absent, corrupt };
struct LoadResult {
  LoadStatus status = LoadStatus::absent;
  std::string reason;                  // why corrupt
  std::shared_ptr<CacheEntry> entry;   // when ok
};

// An exclusive flock() on a per-key file; the OS releases it if the holder dies.
class KeyLock {
 public:
  KeyLock() = default;
  explicit KeyLock(int fd);  // takes ownership of a descriptor holding the flock
  KeyLock(KeyLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  KeyLock& operator=(KeyLock&& o) noexcept;
  KeyLock(const KeyLock&) = delete;
  KeyLock& operator=(const KeyLock&) = delete;
  ~KeyLock();
  bool held() const { return fd_ >= 0; }
  void release();

 private:
  int fd_ = -1;
};

class DiskStore {
 public:
  explicit DiskStore(std::string root, std::chrono::seconds lock_patience = std::chrono::minutes(10))
      : root_(std::move(root)), lock_patience_(lock_patience) {}
  const std::string& root() const { return root_; }

  // Creates tmp/ and locks/ and proves a directory can be made there.
  Status probe_writable() const;

  std::string entry_dir(const KernelKey& key, std::string_view hash) const;

  // A verified read of the entry for (key, hash).
  LoadResult load(const KernelKey& key, std::string_view hash) const;

  // Waits until this process holds the key's lock; gives up after lock_patience
  // (the caller then builds without it: the rename keeps publishing safe).
  Result<KeyLock> lock(const KernelKey& key, std::string_view hash) const;

  // A fresh staging dir tmp/<stem>.<random>; a crash leaves only this behind.
  Result<std::string> stage(const KernelKey& key, std::string_view hash) const;
  // Writes and flushes the entry's files into `staging`, then renames it into place.
  // Returns the entry dir. On failure `staging` is removed.
  Result<std::string> publish(const std::string& staging, const CacheEntry& entry) const;
  void discard(const std::string& staging) const;

  // Stamps last_used (best effort: a read-only entry keeps its old stamp).
  void touch(const std::string& dir) const;

  std::vector<CacheEntryInfo> list(bool with_meta = true) const;  // eviction needs no meta
  std::vector<std::string> foreign() const;
  CacheVerifyResult verify(const CacheEntryInfo& info) const;
  // Makes the directory vanish with one rename, then deletes it.
  Status take_away(const std::string& dir) const;
  // LRU eviction; never removes `keep`.
  CachePruneResult evict(uint64_t max_bytes, const std::string& keep) const;
  size_t sweep_tmp(std::chrono::seconds max_age) const;
  Result<CachePruneResult> clear() const;

 private:
  std::string tmp_dir() const { return root_ + "/tmp"; }
  std::string locks_dir() const { return root_ + "/locks"; }
  std::string root_;
  std::chrono::seconds lock_patience_;
};

}  // namespace kdajit::cache_detail
