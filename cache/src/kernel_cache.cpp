#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <exception>
#include <future>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "disk_store.hpp"
#include "kdajit/cache.hpp"
#include "kdajit/sha256.hpp"
#include "kdajit/log.hpp"

namespace kdajit {

using cache_detail::DiskStore;
using cache_detail::KeyLock;
using cache_detail::LoadStatus;

namespace {

// A memory hit re-stamps last_used at most this often, so a long-running server
// keeps its kernels young for other processes' LRU eviction without writing per call.
constexpr int64_t kRestampNs = int64_t{3600} * 1000000000;

std::string iso_utc(int64_t ns) {
  std::time_t secs = static_cast<std::time_t>(ns / 1000000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, (ns / 1000000) % 1000);
}

Environment environment_or_defaults() {
  auto env = read_environment();
  if (env) return *env;
  log_warning("{}; the cache uses its defaults for the environment", env.error().message);
  return Environment{};
}

std::string meta_number(const nlohmann::json& meta, const char* field) {
  auto it = meta.find(field);
  if (it == meta.end() || !it->is_number()) return "?";
  return it->is_number_integer() ? std::to_string(it->get<int64_t>()) : fmt::format("{:.0f}", it->get<double>());
}

}  // namespace

struct KernelCache::Impl {
  // One per key: the finished entry, or the future that the first requester fulfils.
  struct Slot {
    std::string hash;
    std::shared_ptr<const CacheEntry> entry;  // set under `mu` once done
    std::shared_future<Result<CacheLookup>> done;
    bool leader_may_build = false;
    std::atomic<bool> compiling{false};
    std::atomic<int64_t> stamped_ns{0};
  };

  std::string root;
  DiskStore store;
  std::atomic<CacheMode> mode{CacheMode::memory_only};
  std::optional<uint64_t> max_bytes;
  bool disable_jit = false;

  mutable std::mutex mu;
  std::unordered_map<KernelKey, std::shared_ptr<Slot>, KernelKeyHash> slots;

  Impl(CacheOptions opt, const Environment& env)
      : root(opt.root.empty() ? default_cache_root(env) : opt.root), store(root, opt.lock_patience) {
    max_bytes = opt.max_bytes ? opt.max_bytes : env.cache_max_bytes;
    disable_jit = opt.disable_jit.value_or(env.disable_jit);
    mode = open_root(opt.create_root);
    if (mode == CacheMode::read_write) store.sweep_tmp(opt.tmp_max_age);
  }

  // Decides what the root can be used for. Exactly one warning when it is degraded.
  CacheMode open_root(bool create) {
    constexpr std::string_view kMemory = "kernels are kept in memory only";
    if (root.empty()) {
      log_warning("no cache root (KDAJIT_CACHE_DIR, XDG_CACHE_HOME and HOME are unset); {}", kMemory);
      return CacheMode::memory_only;
    }
    struct stat st {};
    if (::stat(root.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      log_warning("cache root {} is not a directory; {}", root, kMemory);
      return CacheMode::memory_only;
    }
    std::error_code ec;
    if (!std::filesystem::exists(root, ec)) {
      if (!create) return CacheMode::memory_only;  // nothing to list; nothing created
      std::filesystem::create_directories(root, ec);
      if (ec) {
        log_warning("cannot create cache root {} ({}); {}", root, ec.message(), kMemory);
        return CacheMode::memory_only;
      }
    }
    Status writable = store.probe_writable();
    if (writable) return CacheMode::read_write;
    if (std::filesystem::directory_iterator(root, ec); !ec) {
      log_warning("cache root {} is not writable ({}); cached kernels are read from it, new kernels are kept in "
                  "memory only",
                  root, writable.error().message);
      return CacheMode::read_only;
    }
    log_warning("cache root {} is not usable ({}); {}", root, ec.message(), kMemory);
    return CacheMode::memory_only;
  }

  Error capture_error(const KernelKey& key, std::string_view why) const {
    return Error(ErrorCode::capture,
                 fmt::format("kernel {} is not cached and cannot be compiled now ({}); pre-warm this key with "
                             "`kdajit prewarm`",
                             key_name(key), why));
  }

  Error disabled_error(const KernelKey& key, std::string_view hash) const {
    return Error(ErrorCode::jit_disabled,
                 fmt::format("KDAJIT_DISABLE_JIT=1 and kernel {} (hash {}) is not in the cache {}; pre-warm it with "
                             "`kdajit prewarm`",
                             key_name(key), hash.substr(0, cache_detail::kShortHashLen),
                             mode == CacheMode::memory_only ? std::string("(memory only)") : root));
  }

  // After a failed write the cache stops publishing, so a full disk costs one warning.
  void stop_publishing(const Error& why, const std::string& name) {
    CacheMode expected = CacheMode::read_write;
    if (mode.compare_exchange_strong(expected, CacheMode::read_only))
      log_warning("cannot write cache entry {} ({}); it and later kernels are kept in memory only", name,
                  why.message);
  }

  // Memory missed: disk, then a build. Runs once per key at a time in this process.
  Result<CacheLookup> resolve(const KernelKey& key, std::string_view hash, const BuildFn& build, bool allow_build,
                              Slot& slot) {
    const std::string name = key_name(key);
    bool warned = false;
    auto check_disk = [&]() -> std::shared_ptr<CacheEntry> {
      if (mode == CacheMode::memory_only) return nullptr;
      auto loaded = store.load(key, hash);
      if (loaded.status == LoadStatus::ok) return loaded.entry;
      if (loaded.status == LoadStatus::corrupt && !warned) {
        warned = true;
        log_warning("cache entry {} is unusable: {}; {}", store.entry_dir(key, hash), loaded.reason,
                    allow_build && !disable_jit ? "rebuilding it" : "ignoring it");
      }
      return nullptr;
    };
    auto disk_hit = [&](std::shared_ptr<CacheEntry> e) -> CacheLookup {
      if (mode == CacheMode::read_write) store.touch(e->dir);
      slot.stamped_ns = cache_detail::now_ns();
      return {std::move(e), CacheSource::disk};
    };

    if (auto e = check_disk()) return disk_hit(std::move(e));
    if (!allow_build) return capture_error(key, "compiles are not allowed here, e.g. during CUDA graph capture");
    if (disable_jit) return disabled_error(key, hash);

    KeyLock lock;
    std::string staging;
    if (mode == CacheMode::read_write) {
      auto l = store.lock(key, hash);
      if (l) {
        lock = std::move(*l);
        // Another process may have built it while we waited for the lock.
        if (auto e = check_disk()) return disk_hit(std::move(e));
      } else if (l.error().code == ErrorCode::cache) {
        log_warning("{}; building it in this process too", l.error().message);
      } else {
        log_debug("building {} without a lock: {}", name, l.error().message);
      }
      auto s = store.stage(key, hash);
      if (s) staging = std::move(*s);
      else stop_publishing(s.error(), name);
    }

    slot.compiling = true;
    auto t0 = std::chrono::steady_clock::now();
    Result<CacheBuild> built = Error(ErrorCode::internal, "");
    try {
      built = build();
    } catch (const std::exception& ex) {
      built = Error(ErrorCode::internal, fmt::format("building kernel {} threw: {}", name, ex.what()));
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    auto drop_staging = [&] {
      if (!staging.empty()) store.discard(staging);
    };
    if (!built) {
      drop_staging();
      return std::move(built).error();
    }
    if (built->cubin.empty()) {
      drop_staging();
      return Error(ErrorCode::internal, fmt::format("building kernel {}: the build returned an empty cubin", name));
    }
    // The hash the caller looked up must be the hash of what was built, or the entry
    // would be found under inputs it was not built from.
    std::string actual = current_build_hash(built->source, built->options, key.arch, built->nvrtc_version);
    if (actual != hash) {
      drop_staging();
      return Error(ErrorCode::internal,
                   fmt::format("building kernel {}: the build inputs hash to {}, the lookup used {}", name,
                               actual.substr(0, 16), hash.substr(0, 16)));
    }

    auto entry = std::make_shared<CacheEntry>();
    entry->key = key;
    entry->name = name;
    entry->hash = std::string(hash);
    entry->source = std::move(built->source);
    entry->cubin = std::move(built->cubin);
    nlohmann::json meta = built->meta.is_object() ? std::move(built->meta) : nlohmann::json::object();
    if (!meta.contains("compile_ms")) meta["compile_ms"] = ms;
    meta["schema"] = kCacheSchemaVersion;
    meta["library_version"] = cache_library_version();
    meta["key"] = key_to_json(key);
    meta["key_name"] = name;
    meta["arch"] = to_string(key.arch);
    meta["hash"] = entry->hash;
    meta["options"] = built->options;
    meta["nvrtc_version"] = built->nvrtc_version;
    meta["created"] = iso_utc(cache_detail::now_ns());
    meta["cubin_sha256"] = sha256_hex(entry->cubin);
    meta["cubin_bytes"] = entry->cubin.size();
    meta["source_sha256"] = sha256_hex(entry->source);
    entry->meta = std::move(meta);

    log_info("compiled {} in {} ms ({} registers, {} bytes spilled)", name, meta_number(entry->meta, "compile_ms"),
             meta_number(entry->meta, "registers"), meta_number(entry->meta, "spill_bytes"));

    if (!staging.empty()) {
      auto published = store.publish(staging, *entry);
      if (published) entry->dir = std::move(*published);
      else stop_publishing(published.error(), name);
    }
    lock = KeyLock();
    slot.stamped_ns = cache_detail::now_ns();
    if (!entry->dir.empty() && max_bytes) store.evict(*max_bytes, entry->dir);
    return CacheLookup{std::move(entry), CacheSource::built};
  }

  Result<CacheLookup> lookup(const KernelKey& key, std::string_view hash, const BuildFn& build, bool allow_build) {
    // A waiter whose leader could not build (capture) retries once as a leader itself.
    for (int attempt = 0;; ++attempt) {
      std::shared_ptr<Slot> slot;
      std::promise<Result<CacheLookup>> promise;
      bool leader = false;
      std::shared_ptr<const CacheEntry> hit;
      {
        std::lock_guard<std::mutex> g(mu);
        auto& s = slots[key];
        if (s && s->hash == hash) {
          if (s->entry) {
            hit = s->entry;
            slot = s;
          } else if (!allow_build && s->compiling) {
            return capture_error(key, "another thread is compiling it");
          } else {
            slot = s;
          }
        } else {
          s = std::make_shared<Slot>();
          s->hash = std::string(hash);
          s->leader_may_build = allow_build && !disable_jit;
          s->done = promise.get_future().share();
          slot = s;
          leader = true;
        }
      }
      if (hit) {
        restamp(*slot, *hit);
        return CacheLookup{std::move(hit), CacheSource::memory};
      }
      if (leader) {
        Result<CacheLookup> r = Error(ErrorCode::internal, "");
        try {
          r = resolve(key, hash, build, allow_build, *slot);
        } catch (const std::exception& ex) {  // e.g. bad_alloc: waiters must still wake up
          r = Error(ErrorCode::internal, fmt::format("cache lookup of {}: {}", key_name(key), ex.what()));
        }
        {
          std::lock_guard<std::mutex> g(mu);
          if (r) {
            slot->entry = r->entry;
          } else if (auto it = slots.find(key); it != slots.end() && it->second == slot) {
            slots.erase(it);  // errors are not remembered: the next call tries again
          }
        }
        promise.set_value(r);
        return r;
      }
      const Result<CacheLookup>& r = slot->done.get();
      if (r) return CacheLookup{r->entry, CacheSource::memory};
      if (r.error().code == ErrorCode::capture && allow_build && !slot->leader_may_build && attempt < 2) continue;
      return r.error();
    }
  }

  void restamp(Slot& slot, const CacheEntry& entry) {
    if (entry.dir.empty() || mode != CacheMode::read_write) return;
    int64_t now = cache_detail::now_ns();
    int64_t last = slot.stamped_ns.load(std::memory_order_relaxed);
    if (now - last > kRestampNs && slot.stamped_ns.compare_exchange_strong(last, now)) store.touch(entry.dir);
  }
};

KernelCache::KernelCache(CacheOptions options) : KernelCache(std::move(options), environment_or_defaults()) {}

KernelCache::KernelCache(CacheOptions options, const Environment& env)
    : impl_(std::make_unique<Impl>(std::move(options), env)) {}

KernelCache::~KernelCache() = default;

Result<std::shared_ptr<const CacheEntry>> KernelCache::get_or_build(const KernelKey& key, std::string_view entry_hash,
                                                                    const BuildFn& build, bool allow_build) {
  KDAJIT_TRY_ASSIGN(auto r, lookup(key, entry_hash, build, allow_build));
  return std::move(r.entry);
}

Result<CacheLookup> KernelCache::lookup(const KernelKey& key, std::string_view entry_hash, const BuildFn& build,
                                        bool allow_build) {
  KDAJIT_TRY(validate(key));
  if (entry_hash.size() != 64)
    return invalid_argument(fmt::format("entry_hash: expected 64 hex digits (SHA-256), got '{}'", entry_hash));
  return impl_->lookup(key, entry_hash, build, allow_build);
}

std::shared_ptr<const CacheEntry> KernelCache::find_loaded(const KernelKey& key) const {
  std::lock_guard<std::mutex> g(impl_->mu);
  auto it = impl_->slots.find(key);
  return it == impl_->slots.end() ? nullptr : it->second->entry;
}

const std::string& KernelCache::root() const { return impl_->root; }
CacheMode KernelCache::mode() const { return impl_->mode; }
bool KernelCache::disable_jit() const { return impl_->disable_jit; }
std::optional<uint64_t> KernelCache::max_bytes() const { return impl_->max_bytes; }

std::string KernelCache::entry_dir(const KernelKey& key, std::string_view entry_hash) const {
  return impl_->store.entry_dir(key, entry_hash);
}

std::vector<CacheEntryInfo> KernelCache::list_entries() const {
  if (impl_->mode == CacheMode::memory_only) return {};
  return impl_->store.list();
}

std::vector<std::string> KernelCache::foreign_paths() const {
  if (impl_->mode == CacheMode::memory_only) return {};
  return impl_->store.foreign();
}

CacheVerifyResult KernelCache::verify_entry(const CacheEntryInfo& info) const { return impl_->store.verify(info); }

Status KernelCache::remove_entry(const CacheEntryInfo& info) {
  if (impl_->mode != CacheMode::read_write)
    return Error(ErrorCode::cache, fmt::format("cannot remove {}: the cache root {} is {}", info.dir, impl_->root,
                                               to_string(impl_->mode.load())));
  return impl_->store.take_away(info.dir);
}

CachePruneResult KernelCache::prune(uint64_t max_bytes) {
  if (impl_->mode != CacheMode::read_write) {
    CachePruneResult r;
    for (const auto& e : list_entries()) r.bytes_before += e.bytes;
    r.bytes_after = r.bytes_before;
    return r;
  }
  return impl_->store.evict(max_bytes, {});
}

Result<CachePruneResult> KernelCache::clear() {
  if (impl_->mode != CacheMode::read_write)
    return Error(ErrorCode::cache,
                 fmt::format("cannot clear the cache root {}: it is {}", impl_->root, to_string(impl_->mode.load())));
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    for (auto it = impl_->slots.begin(); it != impl_->slots.end();) {
      if (it->second->entry) it = impl_->slots.erase(it);
      else ++it;
    }
  }
  return impl_->store.clear();
}

size_t KernelCache::sweep_tmp(std::chrono::seconds max_age) {
  if (impl_->mode != CacheMode::read_write) return 0;
  return impl_->store.sweep_tmp(max_age);
}

}  // namespace kdajit
