// KernelCache: the in-memory map of loaded entries over the on-disk layers
// (disk_store.cpp): lookup (memory, then each trusted layer, verified), single
// flight per key across threads and processes (the key lock), publish into the
// write layer, LRU pruning, clear, and the listing the CLI verbs read. About 530
// lines in one file because lookup, publish and pruning share the layer state,
// the lock protocol and the stamps that keep a served entry young.
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
using cache_detail::Staging;

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
    std::atomic<bool> in_write_layer{false};  // the entry lives in the write layer (restamped)
  };

  std::vector<std::unique_ptr<DiskStore>> stores;  // one per layer, in lookup order
  std::vector<CacheLayer> layer_info;
  DiskStore* writer = nullptr;  // the write layer, if any
  std::string root;             // the write layer, else the first layer
  std::string no_write_reason;  // why there is no write layer
  bool writable_open = true;
  bool log_compiles = true;
  std::atomic<bool> publishing{false};
  std::mutex stop_mu;
  std::string stop_reason;  // set once publishing stopped
  std::optional<uint64_t> max_bytes;
  bool disable_jit = false;

  mutable std::mutex mu;
  std::unordered_map<KernelKey, std::shared_ptr<Slot>, KernelKeyHash> slots;

  Impl(CacheOptions opt, const Environment& env) {
    max_bytes = opt.max_bytes ? opt.max_bytes : env.cache_max_bytes;
    disable_jit = opt.disable_jit.value_or(env.disable_jit);
    writable_open = opt.writable;
    log_compiles = opt.log_compiles;
    open_layers(opt, opt.root.empty() ? default_cache_root(env) : opt.root);
    if (writer && opt.writable) writer->sweep_tmp(opt.tmp_max_age);
  }

  // Opens every layer and picks the write layer. Warnings: one per untrusted or
  // unusable layer when another layer takes the writes; else exactly one that says
  // where kernels go instead.
  void open_layers(const CacheOptions& opt, const std::string& setting) {
    constexpr std::string_view kMemory = "kernels are kept in memory only";
    std::vector<std::string> paths;
    for (size_t start = 0; start <= setting.size();) {
      size_t colon = setting.find(':', start);
      if (colon == std::string::npos) colon = setting.size();
      if (colon > start) paths.push_back(setting.substr(start, colon - start));
      start = colon + 1;
    }
    if (paths.empty()) {
      if (opt.writable)
        log_warning("no cache root (KDAJIT_CACHE_DIR, XDG_CACHE_HOME and HOME are unset); {}", kMemory);
      no_write_reason = "there is no cache root";
      return;
    }
    for (const auto& path : paths) {
      DiskStore::Options so;
      // Only the first layer that can take writes is created; later ones are not needed.
      so.create = opt.create_root && writer == nullptr;
      so.writable = opt.writable;
      so.lock_patience = opt.lock_patience;
      auto store = std::make_unique<DiskStore>(path, so);
      if (store->state() == LayerState::read_write && writer == nullptr) writer = store.get();
      layer_info.push_back({path, store->state(), store->reason()});
      stores.push_back(std::move(store));
    }
    // Only one write layer: any later writable layer is read, not written.
    for (size_t i = 0; i < stores.size(); ++i) {
      if (stores[i].get() != writer && layer_info[i].state == LayerState::read_write) {
        layer_info[i].state = LayerState::read_only;
        layer_info[i].reason = "an earlier layer takes new entries";
      }
    }
    root = writer ? writer->root() : paths.front();
    publishing = writer != nullptr;
    auto describe = [&](size_t i) {
      const CacheLayer& l = layer_info[i];
      std::string what = fmt::format("cache root {} {}", l.path, l.reason);
      if (l.state == LayerState::untrusted)
        what += ", so its entries are not used and nothing is written there (the trust model is in docs/CACHE.md: "
                "use a directory of your own that others cannot write)";
      return what;
    };
    if (writer) {
      for (size_t i = 0; i < stores.size(); ++i) {
        if (!opt.writable) break;
        auto s = layer_info[i].state;
        if (s == LayerState::untrusted || s == LayerState::unusable) log_warning("{}", describe(i));
        else if (s != LayerState::read_write) log_debug("{}", describe(i));
      }
      return;
    }
    std::vector<std::string> problems;
    bool any_readable = false;
    for (size_t i = 0; i < stores.size(); ++i) {
      if (stores[i]->readable()) any_readable = true;
      if (layer_info[i].state == LayerState::missing && !opt.create_root) continue;  // nothing to read or write
      problems.push_back(describe(i));
    }
    no_write_reason = problems.empty() ? fmt::format("cache root {} does not exist", root) : fmt::format("{}", fmt::join(problems, "; "));
    if (!opt.writable || problems.empty()) return;
    if (any_readable)
      log_warning("{}; cached kernels are read from it, new kernels are kept in memory only", no_write_reason);
    else
      log_warning("{}; {}", no_write_reason, kMemory);
  }

  CacheMode mode() const {
    if (publishing) return CacheMode::read_write;
    for (const auto& s : stores)
      if (s->readable()) return CacheMode::read_only;
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
                             mode() == CacheMode::memory_only ? std::string("(memory only)") : root));
  }

  // After a failure of the file system the cache stops publishing, so a full disk
  // costs one warning.
  void stop_publishing(const Error& why, const std::string& name) {
    bool expected = true;
    if (publishing.compare_exchange_strong(expected, false)) {
      {
        std::lock_guard<std::mutex> g(stop_mu);
        stop_reason = why.message;
      }
      log_warning("cannot write cache entry {} ({}); it and later kernels are kept in memory only", name,
                  why.message);
    }
  }

  std::string not_stored_reason() {
    if (!writer) return no_write_reason;
    std::lock_guard<std::mutex> g(stop_mu);
    return "writing stopped after an earlier failure: " + stop_reason;
  }

  // Memory missed: the layers, then a build. Runs once per key at a time in this process.
  Result<CacheLookup> resolve(const KernelKey& key, std::string_view hash, const BuildFn& build, bool allow_build,
                              Slot& slot) {
    const std::string name = key_name(key);
    bool warned = false;
    auto check_disk = [&]() -> std::pair<std::shared_ptr<CacheEntry>, DiskStore*> {
      for (const auto& store : stores) {
        if (!store->readable()) continue;
        auto loaded = store->load(key, hash);
        if (loaded.status == LoadStatus::ok) return {loaded.entry, store.get()};
        if (loaded.status == LoadStatus::absent || warned) continue;
        warned = true;
        const char* then = allow_build && !disable_jit ? "rebuilding it" : "ignoring it";
        if (loaded.status == LoadStatus::untrusted)
          log_warning("cache entry {} is not trusted ({}); {}", store->entry_dir(key, hash), loaded.reason, then);
        else
          log_warning("cache entry {} is unusable: {}; {}", store->entry_dir(key, hash), loaded.reason, then);
      }
      return {nullptr, nullptr};
    };
    auto disk_hit = [&](std::shared_ptr<CacheEntry> e, DiskStore* from) -> CacheLookup {
      if (from == writer && writable_open) from->touch(key, hash);
      slot.in_write_layer = from == writer;
      slot.stamped_ns = cache_detail::now_ns();
      return {std::move(e), CacheSource::disk, {}};
    };

    if (auto [e, from] = check_disk(); e) return disk_hit(std::move(e), from);
    if (!allow_build) return capture_error(key, "compiles are not allowed here, e.g. during CUDA graph capture");
    if (disable_jit) return disabled_error(key, hash);

    KeyLock lock;
    Staging staging;
    std::string not_stored;
    if (publishing && writable_open) {
      auto l = writer->lock(key, hash);
      if (l) {
        lock = std::move(*l);
        // Another process may have built it while we waited for the lock.
        if (auto [e, from] = check_disk(); e) return disk_hit(std::move(e), from);
      } else if (l.error().code == ErrorCode::cache) {
        log_warning("{}; building it in this process too", l.error().message);
      } else {
        log_debug("building {} without a lock: {}", name, l.error().message);
      }
      auto s = writer->stage(key, hash);
      if (s) staging = std::move(*s);
      else stop_publishing(s.error(), name);
    }
    if (staging.empty()) not_stored = writable_open ? not_stored_reason() : "the cache was opened read-only";

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
      if (!staging.empty()) writer->discard(staging);
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

    const auto of = entry->meta.find(kProgramCompiledForField);
    if (log_compiles && of != entry->meta.end() && of->is_string())
      log_info("stored {} from the program compiled for {} (same build inputs; {} registers, {} bytes spilled)", name,
               of->get<std::string>(), meta_number(entry->meta, "registers"), meta_number(entry->meta, "spill_bytes"));
    else if (log_compiles)
      log_info("compiled {} in {} ms ({} registers, {} bytes spilled, NVRTC {})", name,
               meta_number(entry->meta, "compile_ms"), meta_number(entry->meta, "registers"),
               meta_number(entry->meta, "spill_bytes"), entry->meta.value("nvrtc_version", std::string("?")));

    if (!staging.empty()) {
      auto published = writer->publish(staging, *entry);
      if (published) {
        entry->dir = std::move(*published);
      } else if (published.error().code == ErrorCode::io) {
        stop_publishing(published.error(), name);
        not_stored = published.error().message;
      } else {
        // Scoped to this entry (an old one in the way that is not ours): other keys
        // are still written.
        not_stored = published.error().message;
        if (warned) log_debug("cannot write cache entry {}: {}", name, not_stored);
        else log_warning("cannot write cache entry {} ({}); it is kept in memory only", name, not_stored);
      }
    }
    lock = KeyLock();
    slot.stamped_ns = cache_detail::now_ns();
    slot.in_write_layer = !entry->dir.empty();
    if (!entry->dir.empty() && max_bytes) writer->evict(*max_bytes, entry->dir);
    if (!entry->dir.empty()) not_stored.clear();
    return CacheLookup{std::move(entry), CacheSource::built, std::move(not_stored)};
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
        return CacheLookup{std::move(hit), CacheSource::memory, {}};
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
      if (r) return CacheLookup{r->entry, CacheSource::memory, {}};
      if (r.error().code == ErrorCode::capture && allow_build && !slot->leader_may_build && attempt < 2) continue;
      return r.error();
    }
  }

  void restamp(Slot& slot, const CacheEntry& entry) {
    if (entry.dir.empty() || !slot.in_write_layer || !writer || !writable_open) return;
    int64_t now = cache_detail::now_ns();
    int64_t last = slot.stamped_ns.load(std::memory_order_relaxed);
    if (now - last > kRestampNs && slot.stamped_ns.compare_exchange_strong(last, now))
      writer->touch(entry.key, entry.hash);
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
const std::vector<CacheLayer>& KernelCache::layers() const { return impl_->layer_info; }
CacheMode KernelCache::mode() const { return impl_->mode(); }
bool KernelCache::disable_jit() const { return impl_->disable_jit; }
std::optional<uint64_t> KernelCache::max_bytes() const { return impl_->max_bytes; }

std::string KernelCache::entry_dir(const KernelKey& key, std::string_view entry_hash) const {
  if (impl_->writer) return impl_->writer->entry_dir(key, entry_hash);
  if (!impl_->stores.empty()) return impl_->stores.front()->entry_dir(key, entry_hash);
  return {};
}

CacheProbe KernelCache::probe(const KernelKey& key, std::string_view entry_hash) const {
  CacheProbe out;
  out.dir = entry_dir(key, entry_hash);
  for (size_t i = 0; i < impl_->stores.size(); ++i) {
    auto loaded = impl_->stores[i]->load(key, entry_hash);
    if (loaded.status == LoadStatus::ok) {
      out.state = CacheProbe::State::present;
      out.layer = i;
      out.dir = loaded.entry->dir;
      out.reason.clear();
      return out;
    }
    if (loaded.status != LoadStatus::absent && out.reason.empty()) {
      out.state = CacheProbe::State::unusable;
      out.layer = i;
      out.reason = fmt::format("{}: {}{}", impl_->stores[i]->entry_dir(key, entry_hash),
                               loaded.status == LoadStatus::untrusted ? "not trusted: " : "", loaded.reason);
    }
  }
  return out;
}

std::vector<CacheEntryInfo> KernelCache::list_entries() const {
  std::vector<CacheEntryInfo> out;
  for (size_t i = 0; i < impl_->stores.size(); ++i) {
    for (auto& e : impl_->stores[i]->list()) {
      e.layer = i;
      out.push_back(std::move(e));
    }
  }
  return out;
}

std::vector<std::string> KernelCache::foreign_paths() const {
  std::vector<std::string> out;
  for (const auto& s : impl_->stores) {
    auto f = s->foreign();
    out.insert(out.end(), f.begin(), f.end());
  }
  return out;
}

CacheVerifyResult KernelCache::verify_entry(const CacheEntryInfo& info) const {
  if (info.layer >= impl_->stores.size()) return {false, false, false, "no such layer"};
  return impl_->stores[info.layer]->verify(info);
}

Status KernelCache::remove_entry(const CacheEntryInfo& info) {
  DiskStore* w = impl_->writer;
  if (!w || !impl_->writable_open || info.layer >= impl_->stores.size() || impl_->stores[info.layer].get() != w)
    return Error(ErrorCode::cache,
                 fmt::format("cannot remove {}: it is not in the cache's write layer{}", info.dir,
                             w ? std::string() : " (there is none: " + impl_->no_write_reason + ")"));
  if (!info.key) return Error(ErrorCode::cache, fmt::format("cannot remove {}: not an entry", info.dir));
  return w->take_away(to_string(info.key->arch), info.dir_name);
}

CachePruneResult KernelCache::prune(uint64_t max_bytes) {
  if (!impl_->writer || !impl_->writable_open) {
    CachePruneResult r;
    for (const auto& e : list_entries()) r.bytes_before += e.bytes;
    r.bytes_after = r.bytes_before;
    return r;
  }
  return impl_->writer->evict(max_bytes, {});
}

Result<CachePruneResult> KernelCache::clear() {
  if (!impl_->writer || !impl_->writable_open)
    return Error(ErrorCode::cache, fmt::format("cannot clear the cache: {}",
                                               impl_->writable_open ? impl_->no_write_reason
                                                                    : std::string("it was opened read-only")));
  if (!impl_->writer->is_cache_root())
    return Error(ErrorCode::cache,
                 fmt::format("cannot clear {}: it is not a kdajit cache root (it holds files, but no <arch>/, tmp/ or "
                             "locks/ directory); nothing was removed",
                             impl_->writer->root()));
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    for (auto it = impl_->slots.begin(); it != impl_->slots.end();) {
      if (it->second->entry) it = impl_->slots.erase(it);
      else ++it;
    }
  }
  return impl_->writer->clear();
}

size_t KernelCache::sweep_tmp(std::chrono::seconds max_age) {
  if (!impl_->writer || !impl_->writable_open) return 0;
  return impl_->writer->sweep_tmp(max_age);
}

}  // namespace kdajit
