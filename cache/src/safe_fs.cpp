#include "safe_fs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <mutex>
#include <random>
#include <set>
#include <system_error>
#include <thread>

#include <fmt/format.h>

namespace kdajit::cache_detail {

namespace {

// Failures that concern the whole file system, not one path: they stop publishing.
bool fs_wide(int e) { return e == ENOSPC || e == EDQUOT || e == EROFS || e == EFBIG || e == EIO; }

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

Problem classify_open_failure(int dirfd, const char* name, int e, bool want_dir) {
  if (e == ENOENT) return {Problem::missing, "is missing"};
  struct stat st {};
  if ((e == ELOOP || e == ENOTDIR || e == EMLINK) && ::fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(st.st_mode)) return {Problem::untrusted, "is a symbolic link"};
    if (want_dir && !S_ISDIR(st.st_mode)) return {Problem::corrupt, "is not a directory"};
  }
  return {Problem::corrupt, "cannot be opened: " + errno_text(e)};
}

Status write_all(int fd, std::string_view bytes, const std::string& path) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error(fmt::format("writing {}", path), errno);
    off += static_cast<size_t>(n);
  }
  return {};
}

// Six random letters or digits, like mkdtemp(); fresh after fork().
std::string random_suffix() {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng;
  thread_local pid_t seeded_for = 0;
  if (seeded_for != ::getpid()) {
    std::random_device rd;
    rng.seed((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid()) ^
             std::hash<std::thread::id>()(std::this_thread::get_id()));
    seeded_for = ::getpid();
  }
  std::string s(6, 'x');
  for (auto& c : s) c = kChars[rng() % (sizeof kChars - 1)];
  return s;
}

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool is_random_suffix(std::string_view s) {
  return s.size() == 6 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
         });
}

}  // namespace

std::string errno_text(int e) { return std::generic_category().message(e); }

Error io_error(std::string_view what, int e) {
  return Error(ErrorCode::io, fmt::format("{}: {}", what, errno_text(e)));
}

Error place_error(std::string_view what, int e) {
  return Error(fs_wide(e) ? ErrorCode::io : ErrorCode::cache, fmt::format("{}: {}", what, errno_text(e)));
}

std::string distrust(const struct stat& st, uid_t euid) {
  if (st.st_uid != euid && st.st_uid != 0) return fmt::format("owned by uid {}", st.st_uid);
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return fmt::format("writable by {} (mode {:04o})", (st.st_mode & S_IWOTH) ? "every user" : "its group",
                       st.st_mode & 07777);
  return {};
}

Fd open_checked(int dirfd, const char* name, bool want_dir, uid_t euid, bool system, Problem* p) {
  // O_NONBLOCK: a FIFO planted in place of a file must not block the open.
  int fd = ::openat(dirfd, name, want_dir ? kDirFlags : (O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (fd < 0) {
    *p = classify_open_failure(dirfd, name, errno, want_dir);
    return Fd();
  }
  Fd out(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *p = {Problem::corrupt, "cannot be examined: " + errno_text(errno)};
    return Fd();
  }
  if (!want_dir && !S_ISREG(st.st_mode)) {
    *p = {Problem::corrupt, "is not a regular file"};
    return Fd();
  }
  if (!system) {
    if (std::string why = distrust(st, euid); !why.empty()) {
      *p = {Problem::untrusted, "is " + why};
      return Fd();
    }
  }
  *p = {};
  return out;
}

Result<std::string> read_fd(int fd, size_t max, std::string_view what) {
  std::string out;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    if (static_cast<uint64_t>(st.st_size) > max)
      return Error(ErrorCode::cache, fmt::format("{} is larger than {} bytes", what, max));
    out.reserve(static_cast<size_t>(st.st_size));
  }
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;  // never wait on a file that is not regular
    if (n < 0) return Error(ErrorCode::cache, fmt::format("{} is unreadable: {}", what, errno_text(errno)));
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max)
      return Error(ErrorCode::cache, fmt::format("{} is larger than {} bytes", what, max));
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Status write_file_at(int dirfd, const char* name, std::string_view bytes, const std::string& path) {
  int fd = ::openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, kEntryFileMode);
  if (fd < 0) return io_error(fmt::format("creating {}", path), errno);
  Status s;
  if (::fchmod(fd, kEntryFileMode) != 0) s = io_error(fmt::format("setting the mode of {}", path), errno);
  if (s) s = write_all(fd, bytes, path);
  if (s && ::fsync(fd) != 0) s = io_error(fmt::format("flushing {}", path), errno);
  if (::close(fd) != 0 && s) s = io_error(fmt::format("closing {}", path), errno);
  return s;
}

Status fsync_fd(int fd, const std::string& path) {
  // Some file systems cannot fsync a directory (EINVAL); that is not a write failure.
  if (::fsync(fd) != 0 && errno != EINVAL) return io_error(fmt::format("flushing {}", path), errno);
  return {};
}

Status create_dirs_private(const std::string& path) {
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    std::string prefix = path.substr(0, pos);
    if (prefix.empty() || prefix == "/") continue;
    if (::mkdir(prefix.c_str(), kPrivateDirMode) == 0) {
      int fd = ::open(prefix.c_str(), kDirFlags);
      if (fd < 0) return io_error(fmt::format("opening {}", prefix), errno);
      int rc = ::fchmod(fd, kPrivateDirMode);
      int e = errno;
      ::close(fd);
      if (rc != 0) return io_error(fmt::format("setting the mode of {}", prefix), e);
    } else if (errno != EEXIST) {
      return io_error(fmt::format("creating {}", prefix), errno);
    }
  }
  return {};
}

Result<Fd> ensure_dir_at(int dirfd, const char* name, mode_t mode, uid_t euid, bool allow_root_owner,
                         const std::string& path) {
  bool created = ::mkdirat(dirfd, name, mode) == 0;
  if (!created && errno != EEXIST) return place_error(fmt::format("creating {}", path), errno);
  Problem p;
  Fd fd = open_checked(dirfd, name, /*want_dir=*/true, euid, /*system=*/false, &p);
  if (!fd) return Error(ErrorCode::cache, fmt::format("{} {}", path, p.why));
  struct stat st {};
  if (::fstat(fd.get(), &st) == 0 && st.st_uid != euid && !(allow_root_owner && st.st_uid == 0))
    return Error(ErrorCode::cache, fmt::format("{} is owned by uid {}", path, st.st_uid));
  if (created && ::fchmod(fd.get(), mode) != 0) return io_error(fmt::format("setting the mode of {}", path), errno);
  return fd;
}

Result<std::string> make_temp_dir_at(int dirfd, std::string_view stem, const std::string& parent_path) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string name = fmt::format("{}.{}", stem, random_suffix());
    if (::mkdirat(dirfd, name.c_str(), kPrivateDirMode) == 0) return name;
    if (errno != EEXIST) return io_error(fmt::format("creating a directory in {}", parent_path), errno);
  }
  return Error(ErrorCode::io, fmt::format("creating a directory in {}: no free name", parent_path));
}

std::vector<std::string> dir_names(int dirfd) {
  std::vector<std::string> out;
  int fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return out;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    ::close(fd);
    return out;
  }
  while (dirent* e = ::readdir(d)) {
    std::string_view n = e->d_name;
    if (n != "." && n != "..") out.emplace_back(n);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

DirBytes dir_bytes(int dirfd) {
  DirBytes total;
  for (const auto& n : dir_names(dirfd)) {
    struct stat st {};
    if (::fstatat(dirfd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
      const auto size = static_cast<uint64_t>(st.st_size);
      total.bytes += size;
      total.disk_bytes += st.st_nlink > 1 ? size / static_cast<uint64_t>(st.st_nlink) : size;
    }
  }
  return total;
}

bool remove_tree_at(int dirfd, const char* name, uid_t euid, int depth) {
  Problem p;
  Fd d = open_checked(dirfd, name, /*want_dir=*/true, euid, /*system=*/true, &p);
  if (!d) return p.kind == Problem::missing;
  struct stat st {};
  if (::fstat(d.get(), &st) != 0 || st.st_uid != euid) return false;
  bool all = true;
  for (const auto& n : dir_names(d.get())) {
    struct stat cs {};
    if (::fstatat(d.get(), n.c_str(), &cs, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISDIR(cs.st_mode)) {
      all = (depth < 4 && remove_tree_at(d.get(), n.c_str(), euid, depth + 1)) && all;
    } else if (cs.st_uid == euid) {
      all = (::unlinkat(d.get(), n.c_str(), 0) == 0 || errno == ENOENT) && all;
    } else {
      all = false;
    }
  }
  d.reset();
  return (::unlinkat(dirfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT) && all;
}

int64_t timespec_ns(const struct timespec& t) { return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec; }

int64_t read_stamp(int entry_fd, uid_t euid, bool system) {
  Problem p;
  Fd fd = open_checked(entry_fd, kLastUsedFile, false, euid, system, &p);
  if (!fd) return 0;
  auto text = read_fd(fd.get(), 64, kLastUsedFile);
  if (!text) return 0;
  int64_t v = 0;
  const char* b = text->data();
  const char* e = b + text->size();
  while (e > b && (e[-1] == '\n' || e[-1] == ' ')) --e;
  auto [ptr, ec] = std::from_chars(b, e, v);
  return (ec == std::errc() && ptr == e && v > 0) ? v : 0;
}

std::optional<KernelKey> parse_entry_name(std::string_view name, std::string_view arch) {
  size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || name.size() - dot - 1 != kShortHashLen || !is_hex(name.substr(dot + 1)))
    return std::nullopt;
  auto key = parse_key(name.substr(0, dot));
  if (!key || to_string(key->arch) != arch) return std::nullopt;
  return *key;
}

std::optional<std::string> parse_tmp_name(std::string_view name) {
  size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || !is_random_suffix(name.substr(dot + 1))) return std::nullopt;
  std::string_view stem = name.substr(0, dot);
  if (stem == "gone" || stem == "probe") return std::string();
  size_t hdot = stem.rfind('.');
  if (hdot == std::string_view::npos) return std::nullopt;
  auto key = parse_key(stem.substr(0, hdot));
  if (!key || !parse_entry_name(stem, to_string(key->arch))) return std::nullopt;
  return std::string(stem);
}

bool is_lock_name(std::string_view name) {
  constexpr std::string_view kExt = ".lock";
  if (name.size() <= kExt.size() || name.substr(name.size() - kExt.size()) != kExt) return false;
  std::string_view stem = name.substr(0, name.size() - kExt.size());
  size_t hdot = stem.rfind('.');
  if (hdot == std::string_view::npos) return false;
  auto key = parse_key(stem.substr(0, hdot));
  return key && parse_entry_name(stem, to_string(key->arch));
}

KeyLock try_lock_existing(int locks_fd, const std::string& name, bool* busy) {
  *busy = false;
  int fd = ::openat(locks_fd, name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return {};
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    *busy = true;
    ::close(fd);
    return {};
  }
  return KeyLock(fd);
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

namespace {

// A flock() belongs to the open file, which fork() shares with the child: a worker
// forked while a lock is held would keep it until the worker exits, stalling every
// other process. The child closes its copies; the parent's lock is unaffected.
std::mutex g_held_mu;
std::set<int>& held_fds() {
  static auto* fds = new std::set<int>();  // leaked: used by atfork handlers until exit
  return *fds;
}

void close_held_in_child() {
  for (int fd : held_fds()) ::close(fd);
  held_fds().clear();
  g_held_mu.unlock();
}

void remember_held(int fd) {
  static std::once_flag once;
  std::call_once(once, [] {
    ::pthread_atfork([] { g_held_mu.lock(); }, [] { g_held_mu.unlock(); }, close_held_in_child);
  });
  std::lock_guard<std::mutex> g(g_held_mu);
  held_fds().insert(fd);
}

void forget_held(int fd) {
  std::lock_guard<std::mutex> g(g_held_mu);
  held_fds().erase(fd);
}

}  // namespace

KeyLock::KeyLock(int fd) : fd_(fd) {
  if (fd_ >= 0) remember_held(fd_);
}

void KeyLock::release() {
  if (fd_ < 0) return;
  forget_held(fd_);
  ::close(fd_);  // closing the last descriptor releases the flock
  fd_ = -1;
}

KeyLock& KeyLock::operator=(KeyLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

KeyLock::~KeyLock() { release(); }

}  // namespace kdajit::cache_detail
