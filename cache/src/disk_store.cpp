#include "disk_store.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>
#include <system_error>

#include <fmt/format.h>

#include "kdajit/log.hpp"
#include "kdajit/sha256.hpp"

namespace fs = std::filesystem;

namespace kdajit::cache_detail {

namespace {

std::string errno_text(int e) { return std::generic_category().message(e); }

Error io_error(std::string_view what, int e) {
  return Error(ErrorCode::io, fmt::format("{}: {}", what, errno_text(e)));
}

// A whole file, or an Error{io} whose message starts with the file name. errno is
// kept in `err` so callers can tell "missing" from "unreadable".
Result<std::string> read_file(const std::string& path, int* err = nullptr) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (err) *err = errno;
    return io_error(path, errno);
  }
  std::string out;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      if (err) *err = e;
      return io_error(path, e);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
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

// Written, flushed and closed, each step checked: a full disk may only surface at
// fsync() or close() on some file systems.
Status write_file_synced(const std::string& path, std::string_view bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(fmt::format("creating {}", path), errno);
  Status s = write_all(fd, bytes, path);
  if (s && ::fsync(fd) != 0) s = io_error(fmt::format("flushing {}", path), errno);
  if (::close(fd) != 0 && s) s = io_error(fmt::format("closing {}", path), errno);
  return s;
}

// Makes a directory's new names (files created in it, a rename into it) durable.
Status fsync_dir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_error(fmt::format("opening {}", path), errno);
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); that is not a write failure.
  if (rc != 0 && e != EINVAL) return io_error(fmt::format("flushing {}", path), e);
  return {};
}

Status make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return {};
  int e = errno;
  struct stat st {};
  if (e == EEXIST && ::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return {};
    return Error(ErrorCode::io, fmt::format("{} exists and is not a directory", path));
  }
  return io_error(fmt::format("creating {}", path), e);
}

Result<std::string> make_temp_dir(const std::string& parent, std::string_view stem) {
  std::string templ = fmt::format("{}/{}.XXXXXX", parent, stem);
  if (::mkdtemp(templ.data()) == nullptr) return io_error(fmt::format("creating a directory in {}", parent), errno);
  return templ;
}

int64_t timespec_ns(const struct timespec& t) { return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec; }

int64_t read_stamp(const std::string& dir) {
  auto text = read_file(dir + "/" + kLastUsedFile);
  if (!text) return 0;
  int64_t v = 0;
  const char* b = text->data();
  const char* e = b + text->size();
  while (e > b && (e[-1] == '\n' || e[-1] == ' ')) --e;
  auto [p, ec] = std::from_chars(b, e, v);
  return (ec == std::errc() && p == e && v > 0) ? v : 0;
}

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// `<key name>.<16 hex>` in the directory of `arch`; anything else is not an entry.
std::optional<KernelKey> parse_entry_name(std::string_view name, std::string_view arch) {
  size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || name.size() - dot - 1 != kShortHashLen || !is_hex(name.substr(dot + 1)))
    return std::nullopt;
  auto key = parse_key(name.substr(0, dot));
  if (!key || to_string(key->arch) != arch) return std::nullopt;
  return *key;
}

// Stem of a staging dir name (`<stem>.<6 random chars>`), which names its lock file.
std::string staging_stem(std::string_view name) {
  size_t dot = name.rfind('.');
  return std::string(dot == std::string_view::npos ? name : name.substr(0, dot));
}

// Opens an existing lock file and tries to take it without waiting. Returns the held
// lock, or an unheld one when another process holds it. A missing file is free.
KeyLock try_lock_existing(const std::string& path, bool* busy) {
  *busy = false;
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return {};
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    *busy = true;
    ::close(fd);
    return {};
  }
  return KeyLock(fd);
}

template <class T>
Result<T> meta_field(const nlohmann::json& meta, const char* name) {
  auto it = meta.find(name);
  if (it == meta.end()) return Error(ErrorCode::cache, fmt::format("meta.json has no field '{}'", name));
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    return Error(ErrorCode::cache, fmt::format("meta.json field '{}' has the wrong type: {}", name, it->dump()));
  }
}

// Everything an entry promises, checked: the files exist, the key and hash in
// meta.json are the expected ones, the cubin matches its checksum, and the stored
// source and inputs hash to the entry's hash. The error message is the reason.
Result<std::shared_ptr<CacheEntry>> read_entry(const std::string& dir, const KernelKey& key,
                                               std::string_view expected_hash) {
  auto fail = [](std::string why) { return Error(ErrorCode::cache, std::move(why)); };
  int err = 0;
  auto meta_text = read_file(dir + "/" + kMetaFile, &err);
  if (!meta_text)
    return fail(err == ENOENT ? std::string("meta.json is missing") : "meta.json is unreadable: " + errno_text(err));
  auto meta = nlohmann::json::parse(*meta_text, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object()) return fail("meta.json is not a valid JSON object");

  KDAJIT_TRY_ASSIGN(auto schema, meta_field<int>(meta, "schema"));
  KDAJIT_TRY_ASSIGN(auto library, meta_field<std::string>(meta, "library_version"));
  KDAJIT_TRY_ASSIGN(auto hash, meta_field<std::string>(meta, "hash"));
  KDAJIT_TRY_ASSIGN(auto options, meta_field<std::vector<std::string>>(meta, "options"));
  KDAJIT_TRY_ASSIGN(auto nvrtc, meta_field<std::string>(meta, "nvrtc_version"));
  KDAJIT_TRY_ASSIGN(auto cubin_sha, meta_field<std::string>(meta, "cubin_sha256"));
  if (!meta.contains("key")) return fail("meta.json has no field 'key'");
  auto meta_key = key_from_json(meta["key"]);
  if (!meta_key) return fail("meta.json key: " + meta_key.error().message);
  if (*meta_key != key) return fail(fmt::format("meta.json names key {}, expected {}", key_name(*meta_key), key_name(key)));
  if (hash.size() < expected_hash.size() || hash.compare(0, expected_hash.size(), expected_hash) != 0)
    return fail(fmt::format("meta.json names hash {}, expected {}", hash.substr(0, kShortHashLen),
                            expected_hash.substr(0, kShortHashLen)));

  auto cubin = read_file(dir + "/" + kCubinFile, &err);
  if (!cubin)
    return fail(err == ENOENT ? std::string("kernel.cubin is missing") : "kernel.cubin is unreadable: " + errno_text(err));
  if (sha256_hex(*cubin) != cubin_sha)
    return fail(fmt::format("kernel.cubin ({} bytes) does not match its checksum (truncated or modified)", cubin->size()));
  auto source = read_file(dir + "/" + kSourceFile, &err);
  if (!source)
    return fail(err == ENOENT ? std::string("kernel.cu is missing") : "kernel.cu is unreadable: " + errno_text(err));
  if (build_hash(schema, library, *source, options, key.arch, nvrtc) != hash)
    return fail("kernel.cu and the build inputs in meta.json do not hash to the entry's hash");

  auto entry = std::make_shared<CacheEntry>();
  entry->key = key;
  entry->name = key_name(key);
  entry->hash = std::move(hash);
  entry->dir = dir;
  entry->source = std::move(*source);
  entry->cubin = std::move(*cubin);
  entry->meta = std::move(meta);
  return entry;
}

uint64_t dir_bytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (it->is_regular_file(ec2)) {
      auto n = it->file_size(ec2);
      if (!ec2) total += n;
    }
  }
  return total;
}

}  // namespace

std::string entry_stem(const KernelKey& key, std::string_view hash) {
  return fmt::format("{}.{}", key_name(key), hash.substr(0, kShortHashLen));
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
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

Status DiskStore::probe_writable() const {
  KDAJIT_TRY(make_dir(tmp_dir()));
  KDAJIT_TRY(make_dir(locks_dir()));
  // mkdir() itself, not access(): access() says yes to root on a read-only mount.
  KDAJIT_TRY_ASSIGN(auto probe, make_temp_dir(tmp_dir(), "probe"));
  ::rmdir(probe.c_str());
  return {};
}

std::string DiskStore::entry_dir(const KernelKey& key, std::string_view hash) const {
  return fmt::format("{}/{}/{}", root_, to_string(key.arch), entry_stem(key, hash));
}

LoadResult DiskStore::load(const KernelKey& key, std::string_view hash) const {
  LoadResult out;
  std::string dir = entry_dir(key, hash);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return out;  // absent (also: <arch> is a foreign file)
    out.status = LoadStatus::corrupt;
    out.reason = "cannot stat the entry: " + errno_text(errno);
    return out;
  }
  if (!S_ISDIR(st.st_mode)) {
    out.status = LoadStatus::corrupt;
    out.reason = "the entry path is not a directory";
    return out;
  }
  auto entry = read_entry(dir, key, hash);
  if (!entry) {
    out.status = LoadStatus::corrupt;
    out.reason = entry.error().message;
    return out;
  }
  out.status = LoadStatus::ok;
  out.entry = std::move(*entry);
  return out;
}

Result<KeyLock> DiskStore::lock(const KernelKey& key, std::string_view hash) const {
  KDAJIT_TRY(make_dir(locks_dir()));
  std::string path = fmt::format("{}/{}.lock", locks_dir(), entry_stem(key, hash));
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(fmt::format("opening lock {}", path), errno);
  // Polled rather than blocking: a waiter says what it waits for, and a holder that
  // never finishes (a hung compile) cannot stall start-up forever.
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::milliseconds(2);
  bool announced = false;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) {
      int e = errno;
      ::close(fd);
      return io_error(fmt::format("locking {}", path), e);  // e.g. ENOLCK on some network file systems
    }
    auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= lock_patience_) {
      ::close(fd);
      return Error(ErrorCode::cache,
                   fmt::format("another process has been building {} for {} s", key_name(key),
                               std::chrono::duration_cast<std::chrono::seconds>(waited).count()));
    }
    if (!announced && waited >= std::chrono::seconds(10)) {
      announced = true;
      log_info("waiting for another process compiling {} (lock {})", key_name(key), path);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  return KeyLock(fd);
}

Result<std::string> DiskStore::stage(const KernelKey& key, std::string_view hash) const {
  KDAJIT_TRY(make_dir(tmp_dir()));  // `kdajit clear` may have removed it meanwhile
  return make_temp_dir(tmp_dir(), entry_stem(key, hash));
}

void DiskStore::discard(const std::string& staging) const {
  std::error_code ec;
  fs::remove_all(staging, ec);
}

Result<std::string> DiskStore::publish(const std::string& staging, const CacheEntry& entry) const {
  auto fail = [&](Error e) -> Error {
    discard(staging);
    return e;
  };
  const std::pair<const char*, std::string> files[] = {
      {kSourceFile, entry.source},
      {kCubinFile, entry.cubin},
      {kMetaFile, entry.meta.dump(2) + "\n"},
      {kLastUsedFile, fmt::format("{:020}\n", now_ns())},
  };
  for (const auto& [name, bytes] : files) {
    Status s = write_file_synced(staging + "/" + name, bytes);
    if (!s) return fail(std::move(s).error());
  }
  // The files' names must be durable before the rename makes the entry visible.
  if (Status s = fsync_dir(staging); !s) return fail(std::move(s).error());

  std::string arch_dir = fmt::format("{}/{}", root_, to_string(entry.key.arch));
  if (Status s = make_dir(arch_dir); !s) return fail(std::move(s).error());
  std::string final_dir = entry_dir(entry.key, entry.hash);
  // One rename of the whole directory: readers see the complete entry or nothing.
  if (::rename(staging.c_str(), final_dir.c_str()) != 0) {
    int e = errno;
    if (e != EEXIST && e != ENOTEMPTY && e != EISDIR && e != ENOTDIR)
      return fail(io_error(fmt::format("renaming {} to {}", staging, final_dir), e));
    // Another writer got there first (only possible without a working lock): theirs
    // is as good as ours. A broken one in the way is taken away and replaced.
    if (load(entry.key, entry.hash).status == LoadStatus::ok) {
      discard(staging);
      return final_dir;
    }
    if (Status s = take_away(final_dir); !s) return fail(std::move(s).error());
    if (::rename(staging.c_str(), final_dir.c_str()) != 0)
      return fail(io_error(fmt::format("renaming {} to {}", staging, final_dir), errno));
  }
  if (Status s = fsync_dir(arch_dir); !s) log_debug("{}", s.error().message);
  return final_dir;
}

void DiskStore::touch(const std::string& dir) const {
  std::string path = dir + "/" + kLastUsedFile;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  // Fixed width at offset 0: one small write replaces the whole stamp in place.
  std::string stamp = fmt::format("{:020}\n", now_ns());
  if (::pwrite(fd, stamp.data(), stamp.size(), 0) != static_cast<ssize_t>(stamp.size()))
    log_debug("cannot stamp {}: {}", path, errno_text(errno));
  ::close(fd);
}

std::vector<CacheEntryInfo> DiskStore::list(bool with_meta) const {
  std::vector<CacheEntryInfo> out;
  std::error_code ec;
  for (fs::directory_iterator top(root_, ec), end; !ec && top != end; top.increment(ec)) {
    std::string arch = top->path().filename().string();
    std::error_code ec2;
    if (!parse_arch(arch) || !top->is_directory(ec2)) continue;
    for (fs::directory_iterator it(top->path(), ec2); !ec2 && it != end; it.increment(ec2)) {
      std::error_code ec3;
      std::string name = it->path().filename().string();
      auto key = parse_entry_name(name, arch);
      if (!key || !it->is_directory(ec3)) continue;
      CacheEntryInfo info;
      info.dir = it->path().string();
      info.dir_name = name;
      info.key = key;
      info.bytes = dir_bytes(info.dir);
      info.last_used_ns = read_stamp(info.dir);
      if (info.last_used_ns == 0) {
        struct stat st {};
        if (::stat(info.dir.c_str(), &st) == 0) info.last_used_ns = timespec_ns(st.st_mtim);
      }
      auto text = with_meta ? read_file(info.dir + "/" + kMetaFile) : Result<std::string>(Error());
      if (text) {
        auto meta = nlohmann::json::parse(*text, nullptr, false);
        if (!meta.is_discarded() && meta.is_object()) info.meta = std::move(meta);
      }
      out.push_back(std::move(info));
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.dir_name < b.dir_name; });
  return out;
}

std::vector<std::string> DiskStore::foreign() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator top(root_, ec), end; !ec && top != end; top.increment(ec)) {
    std::string name = top->path().filename().string();
    std::error_code ec2;
    bool dir = top->is_directory(ec2);
    if ((name == "tmp" || name == "locks") && dir) continue;
    if (!parse_arch(name) || !dir) {
      out.push_back(top->path().string());
      continue;
    }
    for (fs::directory_iterator it(top->path(), ec2); !ec2 && it != end; it.increment(ec2)) {
      std::error_code ec3;
      if (!parse_entry_name(it->path().filename().string(), name) || !it->is_directory(ec3))
        out.push_back(it->path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

CacheVerifyResult DiskStore::verify(const CacheEntryInfo& info) const {
  CacheVerifyResult out;
  if (!info.key) {
    out.reason = "not an entry directory name";
    return out;
  }
  std::string_view short_hash = std::string_view(info.dir_name).substr(info.dir_name.size() - kShortHashLen);
  auto entry = read_entry(info.dir, *info.key, short_hash);
  if (!entry) {
    out.reason = entry.error().message;
    return out;
  }
  out.ok = true;
  const auto& meta = (*entry)->meta;
  out.stale = meta.value("schema", 0) != kCacheSchemaVersion ||
              meta.value("library_version", std::string()) != cache_library_version();
  return out;
}

Status DiskStore::take_away(const std::string& dir) const {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return errno == ENOENT ? Status{} : Status(io_error(dir, errno));
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(dir.c_str()) != 0 && errno != ENOENT) return io_error(fmt::format("removing {}", dir), errno);
    return {};
  }
  std::error_code ec;
  // rename() onto the fresh empty dir replaces it atomically.
  auto grave = make_temp_dir(tmp_dir(), "gone");
  if (grave && ::rename(dir.c_str(), grave->c_str()) == 0) {
    fs::remove_all(*grave, ec);
    return {};
  }
  int e = errno;
  if (grave) ::rmdir(grave->c_str());
  if (grave && e == ENOENT) return {};  // someone else removed it first
  fs::remove_all(dir, ec);
  if (ec) return Error(ErrorCode::io, fmt::format("removing {}: {}", dir, ec.message()));
  return {};
}

CachePruneResult DiskStore::evict(uint64_t max_bytes, const std::string& keep) const {
  auto entries = list(/*with_meta=*/false);
  CachePruneResult out;
  for (const auto& e : entries) out.bytes_before += e.bytes;
  out.bytes_after = out.bytes_before;
  if (out.bytes_before <= max_bytes) return out;
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.last_used_ns < b.last_used_ns; });
  for (const auto& e : entries) {
    if (out.bytes_after <= max_bytes) break;
    if (e.dir == keep) continue;
    if (Status s = take_away(e.dir); !s) {
      log_debug("cannot evict {}: {}", e.dir, s.error().message);
      continue;
    }
    log_debug("evicted {} ({} bytes)", e.dir_name, e.bytes);
    out.bytes_after -= e.bytes;
    ++out.removed;
  }
  return out;
}

size_t DiskStore::sweep_tmp(std::chrono::seconds max_age) const {
  size_t removed = 0;
  int64_t now = now_ns();
  int64_t max_age_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(max_age).count();
  std::error_code ec;
  for (fs::directory_iterator it(tmp_dir(), ec), end; !ec && it != end; it.increment(ec)) {
    std::string path = it->path().string();
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || now - timespec_ns(st.st_mtim) < max_age_ns) continue;
    // A staging dir whose key lock is held belongs to a live writer.
    bool busy = false;
    KeyLock held = try_lock_existing(
        fmt::format("{}/{}.lock", locks_dir(), staging_stem(it->path().filename().string())), &busy);
    if (busy) continue;
    std::error_code ec2;
    fs::remove_all(path, ec2);
    if (!ec2) ++removed;
  }
  return removed;
}

Result<CachePruneResult> DiskStore::clear() const {
  CachePruneResult out;
  auto entries = list();
  for (const auto& e : entries) {
    out.bytes_before += e.bytes;
    KDAJIT_TRY(take_away(e.dir));
    ++out.removed;
  }
  sweep_tmp(std::chrono::seconds(0));
  std::error_code ec;
  for (fs::directory_iterator it(locks_dir(), ec), end; !ec && it != end; it.increment(ec)) {
    std::string path = it->path().string();
    if (it->path().extension() != ".lock") continue;
    bool busy = false;
    KeyLock held = try_lock_existing(path, &busy);
    if (!busy) ::unlink(path.c_str());
  }
  for (fs::directory_iterator top(root_, ec), end; !ec && top != end; top.increment(ec))
    if (parse_arch(top->path().filename().string())) ::rmdir(top->path().c_str());  // only if empty
  return out;
}

}  // namespace kdajit::cache_detail
