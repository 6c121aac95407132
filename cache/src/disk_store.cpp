// The on-disk store of one cache layer: loading (with every check an entry
// must pass: meta.json, the cubin checksum, the build hash), per-key locks,
// staging and atomic publish, stamps, listing, verification, eviction, sweep and
// clear. Over 500 lines because each operation is a short sequence of no-follow
// steps on a possibly hostile root (the primitives are in safe_fs.cpp), and
// splitting the operations apart would scatter the one review of the trust
// model (docs/CACHE.md) over several files.
#include "disk_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include <fmt/format.h>

#include "kdajit/bounded_io.hpp"
#include "kdajit/log.hpp"
#include "kdajit/sha256.hpp"

namespace kdajit::cache_detail {

namespace {

// A field of meta.json read with its exact JSON type: a boolean, a fraction or an
// out-of-range number is never taken for an integer, nor a number for a string.
template <class T>
Result<T> meta_field(const nlohmann::json& meta, const char* name) {
  auto it = meta.find(name);
  if (it == meta.end()) return Error(ErrorCode::cache, fmt::format("meta.json has no field '{}'", name));
  auto wrong = [&](std::string_view expected) {
    return Error(ErrorCode::cache, fmt::format("meta.json field '{}' has the wrong type (expected {}, got {})", name,
                                               expected, printable(it->dump(-1, ' ', false,
                                                                            nlohmann::json::error_handler_t::replace),
                                                                   40)));
  };
  if constexpr (std::is_same_v<T, int>) {
    if (!it->is_number_integer()) return wrong("an integer");
    if (it->is_number_unsigned() ? it->get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)
                                 : (it->get<int64_t>() < INT32_MIN || it->get<int64_t>() > INT32_MAX))
      return wrong("an integer");
    return static_cast<int>(it->get<int64_t>());
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) return wrong("a string");
    return it->get<std::string>();
  } else {
    static_assert(std::is_same_v<T, std::vector<std::string>>);
    if (!it->is_array()) return wrong("a list of strings");
    T out;
    for (const auto& v : *it) {
      if (!v.is_string()) return wrong("a list of strings");
      out.push_back(v.get<std::string>());
    }
    return out;
  }
}

struct EntryRead {
  LoadStatus status = LoadStatus::corrupt;
  std::string reason;
  std::shared_ptr<CacheEntry> entry;
};

// A file of the entry, read through its open directory: a problem is the reason.
Result<std::string> read_entry_file(int entry_fd, const char* name, size_t max, uid_t euid, LoadStatus* status) {
  Problem p;
  Fd fd = open_checked(entry_fd, name, false, euid, /*system=*/false, &p);
  if (!fd) {
    *status = p.kind == Problem::untrusted ? LoadStatus::untrusted : LoadStatus::corrupt;
    return Error(ErrorCode::cache, fmt::format("{} {}", name, p.why));
  }
  auto text = read_fd(fd.get(), max, name);
  if (!text) *status = LoadStatus::corrupt;
  return text;
}

// Everything an entry promises, checked: every path is a real directory or file
// that can be trusted, the key and hash in meta.json are the expected ones, the
// cubin matches its checksum, and the stored source and inputs hash to the entry's
// hash. The reason says what failed.
EntryRead read_entry(int entry_fd, const std::string& dir, const KernelKey& key, std::string_view expected_hash,
                     uid_t euid) {
  EntryRead out;
  auto fail = [&](std::string why) {
    out.reason = std::move(why);
    return out;
  };
  LoadStatus st = LoadStatus::corrupt;
  auto meta_text = read_entry_file(entry_fd, kMetaFile, kMaxMetaBytes, euid, &st);
  if (!meta_text) {
    out.status = st;
    return fail(meta_text.error().message);
  }
  auto parsed = parse_json_bounded(*meta_text);
  if (!parsed || !parsed->is_object()) return fail("meta.json is not a valid JSON object");
  nlohmann::json meta = std::move(*parsed);

  auto field_error = [&](const Error& e) { return fail(e.message); };
  auto schema = meta_field<int>(meta, "schema");
  if (!schema) return field_error(schema.error());
  auto library = meta_field<std::string>(meta, "library_version");
  if (!library) return field_error(library.error());
  auto hash = meta_field<std::string>(meta, "hash");
  if (!hash) return field_error(hash.error());
  auto options = meta_field<std::vector<std::string>>(meta, "options");
  if (!options) return field_error(options.error());
  auto nvrtc = meta_field<std::string>(meta, "nvrtc_version");
  if (!nvrtc) return field_error(nvrtc.error());
  auto cubin_sha = meta_field<std::string>(meta, "cubin_sha256");
  if (!cubin_sha) return field_error(cubin_sha.error());
  if (!meta.contains("key")) return fail("meta.json has no field 'key'");
  auto meta_key = key_from_json(meta["key"]);
  if (!meta_key) return fail("meta.json key: " + printable(meta_key.error().message));
  if (*meta_key != key)
    return fail(fmt::format("meta.json names key {}, expected {}", key_name(*meta_key), key_name(key)));
  if (hash->size() < expected_hash.size() || hash->compare(0, expected_hash.size(), expected_hash) != 0)
    return fail(fmt::format("meta.json names hash {}, expected {}", printable(hash->substr(0, kShortHashLen)),
                            expected_hash.substr(0, kShortHashLen)));

  auto cubin = read_entry_file(entry_fd, kCubinFile, kMaxCubinBytes, euid, &st);
  if (!cubin) {
    out.status = st;
    return fail(cubin.error().message);
  }
  if (sha256_hex(*cubin) != *cubin_sha)
    return fail(fmt::format("kernel.cubin ({} bytes) does not match its checksum (truncated or modified)", cubin->size()));
  auto source = read_entry_file(entry_fd, kSourceFile, kMaxSourceBytes, euid, &st);
  if (!source) {
    out.status = st;
    return fail(source.error().message);
  }
  if (build_hash(*schema, *library, *source, *options, key.arch, *nvrtc) != *hash)
    return fail("kernel.cu and the build inputs in meta.json do not hash to the entry's hash");
  // last_used is written on every hit: it must be a file of the entry, never a link.
  Problem p;
  Fd stamp = open_checked(entry_fd, kLastUsedFile, false, euid, /*system=*/false, &p);
  if (!stamp && p.kind != Problem::missing) {
    out.status = p.kind == Problem::untrusted ? LoadStatus::untrusted : LoadStatus::corrupt;
    return fail(fmt::format("{} {}", kLastUsedFile, p.why));
  }

  auto entry = std::make_shared<CacheEntry>();
  entry->key = key;
  entry->name = key_name(key);
  entry->hash = std::move(*hash);
  entry->dir = dir;
  entry->source = std::move(*source);
  entry->cubin = std::move(*cubin);
  entry->meta = std::move(meta);
  out.status = LoadStatus::ok;
  out.entry = std::move(entry);
  return out;
}

// Links `name` of the entry directory `from_dir` into `to_dir` (a staging
// directory) when the linked file is a regular file this user owns, with a
// mode no one else can write through, holding exactly `bytes`; otherwise
// removes the link again and returns false (the caller writes the file).
bool link_same_file(int from_dir, int to_dir, const char* name, std::string_view bytes, uid_t euid) {
  // Flags 0: a symbolic link in the entry is linked as itself, which the open below refuses.
  if (::linkat(from_dir, name, to_dir, name, 0) != 0) return false;
  Problem p;
  Fd fd = open_checked(to_dir, name, /*want_dir=*/false, euid, /*system=*/false, &p);
  struct stat st {};
  bool same = fd && ::fstat(fd.get(), &st) == 0 && st.st_uid == euid &&
              static_cast<uint64_t>(st.st_size) == bytes.size();
  if (same) {
    auto got = read_fd(fd.get(), bytes.size(), name);
    same = got && *got == bytes;
  }
  if (!same) ::unlinkat(to_dir, name, 0);
  return same;
}

bool is_stale_meta(const nlohmann::json& meta) {
  auto schema = meta.find("schema");
  auto library = meta.find("library_version");
  return schema == meta.end() || !schema->is_number_integer() || schema->get<int64_t>() != kCacheSchemaVersion ||
         library == meta.end() || !library->is_string() || library->get<std::string>() != cache_library_version();
}

}  // namespace

std::string entry_stem(const KernelKey& key, std::string_view hash) {
  return fmt::format("{}.{}", key_name(key), hash.substr(0, kShortHashLen));
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

DiskStore::DiskStore(std::string root, const Options& options)
    : root_(std::move(root)), lock_patience_(options.lock_patience), euid_(::geteuid()) {
  open_root(options);
}

std::string DiskStore::path_of(std::string_view rel) const {
  if (!root_.empty() && root_.back() == '/') return root_ + std::string(rel);
  return root_ + "/" + std::string(rel);
}

void DiskStore::open_root(const Options& options) {
  if (root_.empty()) {
    state_ = LayerState::unusable;
    reason_ = "the path is empty";
    return;
  }
  // The root itself may be reached through links (it is configuration); nothing
  // below it is.
  int fd = ::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    if (!options.create || !options.writable) {
      state_ = LayerState::missing;
      reason_ = "does not exist";
      return;
    }
    if (Status s = create_dirs_private(root_); !s) {
      state_ = LayerState::unusable;
      reason_ = "cannot be created: " + s.error().message;
      return;
    }
    fd = ::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  if (fd < 0) {
    state_ = LayerState::unusable;
    reason_ = errno == ENOTDIR ? std::string("is not a directory") : "cannot be opened: " + errno_text(errno);
    return;
  }
  root_fd_ = Fd(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    state_ = LayerState::unusable;
    reason_ = "cannot be examined: " + errno_text(errno);
    return;
  }
  // A read-only mount proves nothing about who can write the files underneath (a
  // bind mount of a writable tree): every layer is trust-checked the same way.
  if (std::string why = distrust(st, euid_); !why.empty()) {
    state_ = LayerState::untrusted;
    reason_ = "is " + why;
    return;
  }
  reason_ = unwritable_reason();
  state_ = reason_.empty() ? LayerState::read_write : LayerState::read_only;
}

// Decided by the root as it is now (its owner, its mode, the mount) and nothing
// else: an existing tmp/ proves nothing. A root without its owner's write bit
// (`chmod 555`) is read-only for its owner and for root alike, although root's
// access() would say yes. Creates nothing.
std::string DiskStore::unwritable_reason() const {
  const int fd = root_fd_.get();
  struct stat st {};
  if (::fstat(fd, &st) != 0) return "cannot be examined: " + errno_text(errno);
  if (st.st_uid != euid_) return fmt::format("is not writable (owned by uid {}, not by this user)", st.st_uid);
  if ((st.st_mode & (S_IWUSR | S_IXUSR)) != (S_IWUSR | S_IXUSR))
    return fmt::format("is not writable (mode {:04o})", st.st_mode & 07777);
  struct statvfs vfs {};
  if (::fstatvfs(fd, &vfs) == 0 && (vfs.f_flag & ST_RDONLY)) return "is on a read-only file system";
  if (::faccessat(fd, ".", W_OK | X_OK, AT_EACCESS) != 0) return "is not writable (" + errno_text(errno) + ")";
  for (const char* sub : {"tmp", "locks"}) {
    struct stat sub_st {};
    if (::fstatat(fd, sub, &sub_st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // a writer creates it
    if (S_ISLNK(sub_st.st_mode)) return fmt::format("is not writable ({} is a symbolic link)", path_of(sub));
    if (!S_ISDIR(sub_st.st_mode) || sub_st.st_uid != euid_ || (sub_st.st_mode & (S_IWGRP | S_IWOTH)))
      return fmt::format("is not writable ({} is not a private directory of this user)", path_of(sub));
  }
  return {};
}

bool DiskStore::is_cache_root() const {
  if (!readable()) return false;
  auto names = dir_names(root_fd_.get());
  if (names.empty()) return true;
  for (const auto& name : names)
    if (name == "tmp" || name == "locks" || parse_arch(name)) return true;
  return false;
}

std::string DiskStore::distrust_entry(std::string_view arch_sv, std::string_view name_sv) const {
  const std::string arch(arch_sv), name(name_sv);
  Problem p;
  Fd arch_fd = open_checked(root_fd_.get(), arch.c_str(), true, euid_, /*system=*/false, &p);
  if (!arch_fd) return p.kind == Problem::untrusted ? fmt::format("{} {}", path_of(arch), p.why) : std::string();
  Fd entry_fd = open_checked(arch_fd.get(), name.c_str(), true, euid_, /*system=*/false, &p);
  if (!entry_fd) return p.kind == Problem::untrusted ? "the entry directory " + p.why : std::string();
  for (const char* file : {kMetaFile, kCubinFile, kSourceFile, kLastUsedFile}) {
    Fd f = open_checked(entry_fd.get(), file, false, euid_, /*system=*/false, &p);
    if (!f && p.kind == Problem::untrusted) return fmt::format("{} {}", file, p.why);
  }
  return {};
}

std::string DiskStore::entry_dir(const KernelKey& key, std::string_view hash) const {
  return path_of(fmt::format("{}/{}", to_string(key.arch), entry_stem(key, hash)));
}

LoadResult DiskStore::load(const KernelKey& key, std::string_view hash) const {
  LoadResult out;
  if (!readable()) return out;
  const std::string arch(to_string(key.arch));
  const std::string name = entry_stem(key, hash);
  // The verdict every verb uses (distrust_entry), before anything is read.
  if (std::string why = distrust_entry(arch, name); !why.empty()) {
    out.status = LoadStatus::untrusted;
    out.reason = std::move(why);
    return out;
  }
  Problem p;
  Fd arch_fd = open_checked(root_fd_.get(), arch.c_str(), true, euid_, /*system=*/false, &p);
  if (!arch_fd) return out;  // missing, or not a directory: holds no entry (ls reports it as foreign)
  Fd entry_fd = open_checked(arch_fd.get(), name.c_str(), true, euid_, /*system=*/false, &p);
  if (!entry_fd) {
    if (p.kind == Problem::missing) return out;
    out.status = p.kind == Problem::untrusted ? LoadStatus::untrusted : LoadStatus::corrupt;
    out.reason = p.kind == Problem::corrupt && p.why == "is not a directory" ? "the entry path is not a directory"
                                                                              : "the entry directory " + p.why;
    return out;
  }
  auto read = read_entry(entry_fd.get(), entry_dir(key, hash), key, hash, euid_);
  out.status = read.status;
  out.reason = std::move(read.reason);
  out.entry = std::move(read.entry);
  return out;
}

Result<KeyLock> DiskStore::lock(const KernelKey& key, std::string_view hash) const {
  KDAJIT_TRY_ASSIGN(Fd locks, ensure_dir_at(root_fd_.get(), "locks", kPrivateDirMode, euid_, false, path_of("locks")));
  const std::string name = entry_stem(key, hash) + ".lock";
  const std::string path = path_of("locks/" + name);
  int fd = ::openat(locks.get(), name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
  if (fd < 0) return io_error(fmt::format("opening lock {}", path), errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != euid_) {
    ::close(fd);
    return Error(ErrorCode::io, fmt::format("lock {} is not a regular file of this user", path));
  }
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

Result<Staging> DiskStore::stage(const KernelKey& key, std::string_view hash) const {
  // Writability is the root's as it is now: a layer made read-only while a process
  // runs takes no more entries.
  if (std::string why = unwritable_reason(); !why.empty()) return Error(ErrorCode::io, fmt::format("cache root {} {}", root_, why));
  Staging s;
  KDAJIT_TRY_ASSIGN(s.tmp, ensure_dir_at(root_fd_.get(), "tmp", kPrivateDirMode, euid_, false, path_of("tmp")));
  KDAJIT_TRY_ASSIGN(s.name, make_temp_dir_at(s.tmp.get(), entry_stem(key, hash), path_of("tmp")));
  Problem p;
  s.dir = open_checked(s.tmp.get(), s.name.c_str(), true, euid_, false, &p);
  if (!s.dir) {
    std::string why = path_of("tmp/" + s.name) + " " + p.why;
    s.name.clear();
    return Error(ErrorCode::io, why);
  }
  return s;
}

void DiskStore::discard(Staging& staging) const {
  if (staging.empty()) return;
  staging.dir.reset();
  remove_tree_at(staging.tmp.get(), staging.name.c_str(), euid_);
  staging.name.clear();
}

Result<std::string> DiskStore::publish(Staging& staging, const CacheEntry& entry) const {
  auto fail = [&](Error e) -> Error {
    discard(staging);
    return e;
  };
  const std::string staging_path = path_of("tmp/" + staging.name);
  const std::pair<const char*, std::string> files[] = {
      {kSourceFile, entry.source},
      {kCubinFile, entry.cubin},
      {kMetaFile, entry.meta.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"},
      {kLastUsedFile, fmt::format("{:020}\n", now_ns())},
  };
  // The keys of one program (kProgramCompiledForField) have the same source and
  // cubin: where the entry of the key it was compiled for is this user's, its
  // files are linked instead of written again, so the layer holds one copy.
  const Fd sibling = program_entry(entry);
  for (const auto& [name, bytes] : files) {
    const bool shared = name == kSourceFile || name == kCubinFile;
    if (shared && sibling && link_same_file(sibling.get(), staging.dir.get(), name, bytes, euid_)) continue;
    Status s = write_file_at(staging.dir.get(), name, bytes, staging_path + "/" + name);
    if (!s) return fail(std::move(s).error());
  }
  if (::fchmod(staging.dir.get(), kEntryDirMode) != 0) return fail(io_error("setting the mode of " + staging_path, errno));
  // The files' names must be durable before the rename makes the entry visible.
  if (Status s = fsync_fd(staging.dir.get(), staging_path); !s) return fail(std::move(s).error());

  const std::string arch(to_string(entry.key.arch));
  auto arch_fd = ensure_dir_at(root_fd_.get(), arch.c_str(), kEntryDirMode, euid_, /*allow_root_owner=*/true, path_of(arch));
  if (!arch_fd) return fail(std::move(arch_fd).error());
  const std::string name = entry_stem(entry.key, entry.hash);
  const std::string final_dir = entry_dir(entry.key, entry.hash);
  // One rename of the whole directory: readers see the complete entry or nothing.
  if (::renameat(staging.tmp.get(), staging.name.c_str(), arch_fd->get(), name.c_str()) != 0) {
    int e = errno;
    if (e != EEXIST && e != ENOTEMPTY && e != EISDIR && e != ENOTDIR)
      return fail(place_error(fmt::format("renaming {} to {}", staging_path, final_dir), e));
    // Another writer got there first (only possible without a working lock): theirs
    // is as good as ours. A broken one in the way is taken away and replaced.
    if (load(entry.key, entry.hash).status == LoadStatus::ok) {
      discard(staging);
      return final_dir;
    }
    if (Status s = take_away(arch, name); !s) return fail(std::move(s).error());
    if (::renameat(staging.tmp.get(), staging.name.c_str(), arch_fd->get(), name.c_str()) != 0)
      return fail(place_error(fmt::format("renaming {} to {}", staging_path, final_dir), errno));
  }
  staging.name.clear();
  staging.dir.reset();
  if (Status s = fsync_fd(arch_fd->get(), path_of(arch)); !s) log_debug("{}", s.error().message);
  return final_dir;
}

Fd DiskStore::program_entry(const CacheEntry& entry) const {
  const auto of = entry.meta.find(kProgramCompiledForField);
  if (of == entry.meta.end() || !of->is_string()) return Fd();
  auto key = parse_key(of->get<std::string>());
  if (!key || key->arch != entry.key.arch || *key == entry.key) return Fd();
  Problem p;
  Fd arch_fd = open_checked(root_fd_.get(), std::string(to_string(entry.key.arch)).c_str(), true, euid_, false, &p);
  if (!arch_fd) return Fd();
  // Keys of one program have the same build inputs, so the same hash.
  return open_checked(arch_fd.get(), entry_stem(*key, entry.hash).c_str(), true, euid_, false, &p);
}

void DiskStore::touch(const KernelKey& key, std::string_view hash) const {
  if (state_ != LayerState::read_write) return;
  Problem p;
  const std::string arch(to_string(key.arch));
  Fd arch_fd = open_checked(root_fd_.get(), arch.c_str(), true, euid_, false, &p);
  if (!arch_fd) return;
  Fd entry_fd = open_checked(arch_fd.get(), entry_stem(key, hash).c_str(), true, euid_, false, &p);
  if (!entry_fd) return;
  // Never through a link, never a file someone else owns; recreated when missing.
  int fd = ::openat(entry_fd.get(), kLastUsedFile, O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT)
    fd = ::openat(entry_fd.get(), kLastUsedFile, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, kEntryFileMode);
  if (fd < 0) return;
  Fd owned(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != euid_) return;
  // Fixed width at offset 0: one small write replaces the whole stamp in place.
  std::string stamp = fmt::format("{:020}\n", now_ns());
  if (::pwrite(fd, stamp.data(), stamp.size(), 0) != static_cast<ssize_t>(stamp.size()))
    log_debug("cannot stamp {}/{}: {}", entry_dir(key, hash), kLastUsedFile, errno_text(errno));
}

std::vector<CacheEntryInfo> DiskStore::list(bool with_meta) const {
  std::vector<CacheEntryInfo> out;
  if (!readable()) return out;
  for (const auto& arch : dir_names(root_fd_.get())) {
    if (!parse_arch(arch)) continue;
    struct stat arch_st {};
    if (::fstatat(root_fd_.get(), arch.c_str(), &arch_st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISLNK(arch_st.st_mode)) {
      // Its entries cannot be listed without following the link: one untrusted row
      // for the whole directory, as load() finds every entry in it untrusted.
      CacheEntryInfo info;
      info.dir = path_of(arch);
      info.dir_name = arch;
      info.untrusted = path_of(arch) + " is a symbolic link";
      out.push_back(std::move(info));
      continue;
    }
    Problem p;
    Fd arch_fd = open_checked(root_fd_.get(), arch.c_str(), true, euid_, /*system=*/true, &p);
    if (!arch_fd) continue;  // foreign
    for (const auto& name : dir_names(arch_fd.get())) {
      auto key = parse_entry_name(name, arch);
      if (!key) continue;
      struct stat st {};
      if (::fstatat(arch_fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (!S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode)) continue;  // foreign
      CacheEntryInfo info;
      info.dir = path_of(arch + "/" + name);
      info.dir_name = name;
      info.key = key;
      info.last_used_ns = timespec_ns(st.st_mtim);
      // One verdict for ls, env, verify, prune and the runtime's load().
      info.untrusted = distrust_entry(arch, name);
      if (S_ISLNK(st.st_mode)) {
        out.push_back(std::move(info));
        continue;
      }
      Fd entry_fd = open_checked(arch_fd.get(), name.c_str(), true, euid_, /*system=*/true, &p);
      if (entry_fd) {  // unreadable (mode 000): verify says why
        const DirBytes b = dir_bytes(entry_fd.get());
        info.bytes = b.bytes;
        info.disk_bytes = b.disk_bytes;
        if (info.untrusted.empty()) {
          if (int64_t stamp = read_stamp(entry_fd.get(), euid_, /*system=*/false)) info.last_used_ns = stamp;
        }
      }
      if (with_meta && entry_fd && info.untrusted.empty()) {
        Problem mp;
        Fd meta_fd = open_checked(entry_fd.get(), kMetaFile, false, euid_, /*system=*/false, &mp);
        auto text = meta_fd ? read_fd(meta_fd.get(), kMaxMetaBytes, kMetaFile) : Result<std::string>(Error());
        auto meta = text ? parse_json_bounded(*text) : Result<nlohmann::json>(Error());
        if (meta && meta->is_object()) {
          info.stale = is_stale_meta(*meta);
          info.meta = std::move(*meta);
        }
      }
      out.push_back(std::move(info));
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.dir_name < b.dir_name; });
  return out;
}

std::vector<std::string> DiskStore::foreign() const {
  std::vector<std::string> out;
  if (!readable()) return out;
  for (const auto& name : dir_names(root_fd_.get())) {
    struct stat st {};
    if (::fstatat(root_fd_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const bool dir = S_ISDIR(st.st_mode);
    if ((name == "tmp" || name == "locks") && dir) continue;
    if (parse_arch(name) && S_ISLNK(st.st_mode)) continue;  // an untrusted row of list()
    if (!parse_arch(name) || !dir) {
      out.push_back(path_of(name));
      continue;
    }
    Problem p;
    Fd arch_fd = open_checked(root_fd_.get(), name.c_str(), true, euid_, true, &p);
    if (!arch_fd) continue;
    for (const auto& child : dir_names(arch_fd.get())) {
      struct stat cs {};
      if (::fstatat(arch_fd.get(), child.c_str(), &cs, AT_SYMLINK_NOFOLLOW) != 0) continue;
      const bool listed = parse_entry_name(child, name) && (S_ISDIR(cs.st_mode) || S_ISLNK(cs.st_mode));
      if (!listed) out.push_back(path_of(name + "/" + child));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool DiskStore::is_link_row(const CacheEntryInfo& e) const {
  if (!e.key) return true;
  struct stat st {};
  const std::string rel = fmt::format("{}/{}", to_string(e.key->arch), e.dir_name);
  return ::fstatat(root_fd_.get(), rel.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
}

CacheVerifyResult DiskStore::verify(const CacheEntryInfo& info) const {
  CacheVerifyResult out;
  if (!info.untrusted.empty()) {
    out.untrusted = true;
    out.reason = "not trusted: " + info.untrusted;
    return out;
  }
  if (!info.key) {
    out.reason = "not an entry directory name";
    return out;
  }
  std::string_view short_hash = std::string_view(info.dir_name).substr(info.dir_name.size() - kShortHashLen);
  auto loaded = load(*info.key, short_hash);
  if (loaded.status != LoadStatus::ok) {
    out.untrusted = loaded.status == LoadStatus::untrusted;
    out.reason = loaded.status == LoadStatus::absent ? std::string("the entry is gone")
                 : out.untrusted                      ? "not trusted: " + loaded.reason
                                                      : loaded.reason;
    return out;
  }
  out.ok = true;
  out.stale = is_stale_meta(loaded.entry->meta);
  return out;
}

Status DiskStore::take_away(std::string_view arch_sv, std::string_view name_sv) const {
  const std::string arch(arch_sv), name(name_sv);
  const std::string path = path_of(arch + "/" + name);
  Problem p;
  Fd arch_fd = open_checked(root_fd_.get(), arch.c_str(), true, euid_, true, &p);
  if (!arch_fd) return p.kind == Problem::missing ? Status{} : Status(Error(ErrorCode::cache, path_of(arch) + " " + p.why));
  struct stat st {};
  if (::fstatat(arch_fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    return errno == ENOENT ? Status{} : Status(place_error(path, errno));
  if (st.st_uid != euid_)
    return Error(ErrorCode::cache, fmt::format("{} is owned by uid {}; not removing it", path, st.st_uid));
  if (!S_ISDIR(st.st_mode)) {
    // A link or file under an entry's name: only the name itself goes.
    if (::unlinkat(arch_fd.get(), name.c_str(), 0) != 0 && errno != ENOENT)
      return place_error(fmt::format("removing {}", path), errno);
    return {};
  }
  auto tmp = ensure_dir_at(root_fd_.get(), "tmp", kPrivateDirMode, euid_, false, path_of("tmp"));
  if (!tmp) return std::move(tmp).error();
  auto grave = make_temp_dir_at(tmp->get(), "gone", path_of("tmp"));
  if (!grave) return std::move(grave).error();
  // rename() onto the fresh empty dir replaces it atomically.
  if (::renameat(arch_fd.get(), name.c_str(), tmp->get(), grave->c_str()) != 0) {
    int e = errno;
    ::unlinkat(tmp->get(), grave->c_str(), AT_REMOVEDIR);
    if (e == ENOENT) return {};  // someone else removed it first
    return place_error(fmt::format("removing {}", path), e);
  }
  if (!remove_tree_at(tmp->get(), grave->c_str(), euid_))
    log_debug("removed {} from the cache; {} keeps what this user does not own", path, path_of("tmp/" + *grave));
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
    if (e.dir == keep || is_link_row(e)) continue;
    if (Status s = take_away(to_string(e.key->arch), e.dir_name); !s) {
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
  if (state_ != LayerState::read_write) return 0;
  Problem p;
  Fd tmp = open_checked(root_fd_.get(), "tmp", true, euid_, false, &p);
  if (!tmp) return 0;
  struct stat tst {};
  if (::fstat(tmp.get(), &tst) != 0 || tst.st_uid != euid_) return 0;
  Fd locks = open_checked(root_fd_.get(), "locks", true, euid_, false, &p);
  size_t removed = 0;
  const int64_t now = now_ns();
  const int64_t max_age_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(max_age).count();
  for (const auto& name : dir_names(tmp.get())) {
    // Only kdajit's own names, only real directories this user owns.
    auto stem = parse_tmp_name(name);
    if (!stem) continue;
    struct stat st {};
    if (::fstatat(tmp.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != euid_ || now - timespec_ns(st.st_mtim) < max_age_ns)
      continue;
    // A staging dir whose key lock is held belongs to a live writer.
    bool busy = false;
    KeyLock held;
    if (!stem->empty() && locks) held = try_lock_existing(locks.get(), *stem + ".lock", &busy);
    if (busy) continue;
    if (remove_tree_at(tmp.get(), name.c_str(), euid_)) ++removed;
  }
  return removed;
}

CachePruneResult DiskStore::clear() const {
  CachePruneResult out;
  if (state_ != LayerState::read_write) return out;
  for (const auto& e : list(/*with_meta=*/false)) {
    if (is_link_row(e)) continue;  // a planted link: reported as untrusted, never removed
    out.bytes_before += e.bytes;
    Status s = take_away(to_string(e.key->arch), e.dir_name);
    if (s) {
      ++out.removed;
    } else {
      out.bytes_after += e.bytes;
      log_warning("clear: {}", s.error().message);
    }
  }
  sweep_tmp(std::chrono::seconds(0));
  Problem p;
  if (Fd locks = open_checked(root_fd_.get(), "locks", true, euid_, false, &p)) {
    for (const auto& name : dir_names(locks.get())) {
      struct stat st {};
      if (!is_lock_name(name) || ::fstatat(locks.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
          !S_ISREG(st.st_mode) || st.st_uid != euid_)
        continue;
      bool busy = false;
      KeyLock held = try_lock_existing(locks.get(), name, &busy);
      if (!busy) ::unlinkat(locks.get(), name.c_str(), 0);
    }
  }
  for (const auto& name : dir_names(root_fd_.get())) {
    struct stat st {};
    if (parse_arch(name) && ::fstatat(root_fd_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(st.st_mode) && st.st_uid == euid_)
      ::unlinkat(root_fd_.get(), name.c_str(), AT_REMOVEDIR);  // only if empty
  }
  return out;
}

}  // namespace kdajit::cache_detail
