// The file-system primitives a cache layer is built from, for roots that other
// users may share or plant things in: every path below a root is opened relative
// to a directory descriptor without following links and checked with fstat, owner
// and mode decide what is trusted, reads are bounded, writes are checked to the
// close, and nothing this user does not own is deleted. Also the names kdajit
// gives what it keeps in a root, and the per-key lock.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kdajit/cache.hpp"

namespace kdajit::cache_detail {

// An entry is the directory <arch>/<key name>.<hash[0:16]> holding these files.
inline constexpr size_t kShortHashLen = 16;
inline constexpr const char* kSourceFile = "kernel.cu";
inline constexpr const char* kCubinFile = "kernel.cubin";
inline constexpr const char* kMetaFile = "meta.json";
inline constexpr const char* kLastUsedFile = "last_used";

inline constexpr mode_t kPrivateDirMode = 0700;  // the root, its parents, tmp/, locks/
inline constexpr mode_t kEntryDirMode = 0755;    // <arch>/ and entries: the root's mode decides who may read
inline constexpr mode_t kEntryFileMode = 0644;

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

// An exclusive flock() on a per-key file; the OS releases it if the holder dies.
// A held lock's descriptor is closed in a child after fork(), so a forked worker
// never keeps it.
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

std::string errno_text(int e);

Error io_error(std::string_view what, int e);
// A failure at the final location of an entry: scoped to it unless the file system is.
Error place_error(std::string_view what, int e);

// Why a path owned and moded like `st` could have been written by someone other
// than this user or root; empty when it could not.
std::string distrust(const struct stat& st, uid_t euid);

// What was wrong with a path, when opening it failed or it is not to be trusted.
struct Problem {
  enum Kind { none, missing, untrusted, corrupt } kind = none;
  std::string why;  // "is missing", "is a symbolic link", "is owned by uid 7", ...
  explicit operator bool() const { return kind != none; }
};

// Opens a directory or regular file below `dirfd` without following a link, and
// checks what fstat says about it. `system`: owner and mode are not checked.
Fd open_checked(int dirfd, const char* name, bool want_dir, uid_t euid, bool system, Problem* p);

// At most `max` bytes of an open regular file; longer is an error.
Result<std::string> read_fd(int fd, size_t max, std::string_view what);

// Created (never through a link), written, flushed and closed, each step checked:
// a full disk may only surface at fsync() or close() on some file systems.
Status write_file_at(int dirfd, const char* name, std::string_view bytes, const std::string& path);

// Makes a directory's new names (files created in it, a rename into it) durable.
Status fsync_fd(int fd, const std::string& path);

// mkdir -p with mode 0700 for every directory it creates, whatever the umask.
Status create_dirs_private(const std::string& path);

// Opens dirfd/name as a directory, creating it with exactly `mode` (whatever the
// umask) when missing. An existing one must be a real directory this user (or,
// with allow_root_owner, root) owns and others cannot write.
Result<Fd> ensure_dir_at(int dirfd, const char* name, mode_t mode, uid_t euid, bool allow_root_owner,
                         const std::string& path);

// A new private directory `<stem>.<random>` in dirfd; returns its name.
Result<std::string> make_temp_dir_at(int dirfd, std::string_view stem, const std::string& parent_path);

// The names in an open directory (without "." and "..").
std::vector<std::string> dir_names(int dirfd);

// The bytes of the regular files directly in an open directory, and their
// share of the disk: a file with n hard links counts 1/n of its size.
struct DirBytes {
  uint64_t bytes = 0;
  uint64_t disk_bytes = 0;
};
DirBytes dir_bytes(int dirfd);

// Deletes dirfd/name and what it holds, never following a link, and only what
// this user owns (a link is removed itself, not its target). Returns false when
// something was left.
bool remove_tree_at(int dirfd, const char* name, uid_t euid, int depth = 0);

int64_t timespec_ns(const struct timespec& t);

// The time in an entry's last_used file; 0 when it cannot be trusted or read as one.
int64_t read_stamp(int entry_fd, uid_t euid, bool system);

// `<key name>.<16 hex>` in the directory of `arch`; anything else is not an entry.
std::optional<KernelKey> parse_entry_name(std::string_view name, std::string_view arch);

// kdajit's names in tmp/: `<entry stem>.<random>` (staging), `gone.<random>` (an
// entry being removed) and `probe.<random>`. Returns the entry stem of a staging
// name (which names its lock), "" for gone/probe, nullopt for anything else.
std::optional<std::string> parse_tmp_name(std::string_view name);

// `<entry stem>.lock`.
bool is_lock_name(std::string_view name);

// Opens an existing lock file and tries to take it without waiting. Returns the held
// lock, or an unheld one when another process holds it. A missing file is free.
KeyLock try_lock_existing(int locks_fd, const std::string& name, bool* busy);

}  // namespace kdajit::cache_detail
