// The on-disk store: layout, hashing, verified loads, degraded roots, LRU, sweeping.
#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>

#include <nlohmann/json.hpp>

#include "cache_test_util.hpp"
#include "catch.hpp"
#include "kdajit/cache.hpp"
#include "kdajit/log.hpp"
#include "kdajit/sha256.hpp"

using namespace kdajit;
using namespace kdajit::test;

TEST_CASE("build_hash changes with every build input", "[cache][hash]") {
  std::vector<std::string> options = {"-arch=sm_90", "-O3"};
  auto base = build_hash(1, "0.1.0", "src", options, Arch::sm_90, "13.0");
  CHECK(base.size() == 64);
  CHECK(base == build_hash(1, "0.1.0", "src", options, Arch::sm_90, "13.0"));
  CHECK(base == current_build_hash("src", options, Arch::sm_90, "13.0"));  // this build is 0.1.0, schema 1
  CHECK(base != build_hash(2, "0.1.0", "src", options, Arch::sm_90, "13.0"));
  CHECK(base != build_hash(1, "0.1.1", "src", options, Arch::sm_90, "13.0"));
  CHECK(base != build_hash(1, "0.1.0", "src ", options, Arch::sm_90, "13.0"));
  CHECK(base != build_hash(1, "0.1.0", "src", {"-arch=sm_90", "-O2"}, Arch::sm_90, "13.0"));
  CHECK(base != build_hash(1, "0.1.0", "src", options, Arch::sm_90a, "13.0"));
  CHECK(base != build_hash(1, "0.1.0", "src", options, Arch::sm_90, "13.1"));
  // Field boundaries are unambiguous: moving a byte between options changes the hash.
  CHECK(build_hash(1, "v", "s", {"ab", "c"}, Arch::sm_90, "n") != build_hash(1, "v", "s", {"a", "bc"}, Arch::sm_90, "n"));
}

TEST_CASE("a build publishes a complete entry that later processes hit", "[cache][layout]") {
  TempDir root;
  FakeBuild fb(key_h(16));
  std::atomic<int> calls{0};
  std::string dir;
  {
    KernelCache cache(opts(root.path()));
    REQUIRE(cache.mode() == CacheMode::read_write);
    StderrCapture err;
    auto r = cache.lookup(fb.key, fb.hash, fb.fn(&calls));
    auto log = err.finish();
    REQUIRE(r.ok());
    CHECK(r->source == CacheSource::built);
    CHECK(calls == 1);
    CHECK(count_lines(log, "kdajit: compiled " + key_name(fb.key) + " in ") == 1);
    CHECK(log.find("(42 registers, 0 bytes spilled, NVRTC ") != std::string::npos);
    CHECK(count_lines(log, "kdajit:") == 1);
    dir = r->entry->dir;
    CHECK(dir == root.path() + "/sm_90/" + key_name(fb.key) + "." + fb.hash.substr(0, 16));
    CHECK(dir == cache.entry_dir(fb.key, fb.hash));
    CHECK(r->entry->cubin == fb.cubin);

    // Same process: a memory hit, no build, no log.
    StderrCapture err2;
    auto again = cache.lookup(fb.key, fb.hash, fb.fn(&calls));
    CHECK(err2.finish().empty());
    REQUIRE(again.ok());
    CHECK(again->source == CacheSource::memory);
    CHECK(again->entry == r->entry);
    CHECK(cache.find_loaded(fb.key) == r->entry);
  }
  CHECK(read_text(dir + "/kernel.cu") == fb.source);
  CHECK(read_text(dir + "/kernel.cubin") == fb.cubin);
  CHECK(fs::exists(dir + "/last_used"));
  auto meta = nlohmann::json::parse(read_text(dir + "/meta.json"));
  CHECK(meta["key_name"] == key_name(fb.key));
  CHECK(meta["key"] == key_to_json(fb.key));
  CHECK(meta["hash"] == fb.hash);
  CHECK(meta["options"] == fb.options);
  CHECK(meta["nvrtc_version"] == fb.nvrtc);
  CHECK(meta["registers"] == 42);
  CHECK(meta["cubin_sha256"] == sha256_hex(fb.cubin));
  CHECK(meta["schema"] == kCacheSchemaVersion);
  CHECK(meta.contains("created"));
  CHECK(meta.contains("compile_ms"));
  // Nothing left in tmp/.
  CHECK(fs::is_empty(root / "tmp"));

  // Another process (a fresh cache object): a verified disk hit without a build.
  KernelCache other(opts(root.path()));
  StderrCapture err;
  auto r = other.lookup(fb.key, fb.hash, fb.fn(&calls));
  CHECK(err.finish().empty());
  REQUIRE(r.ok());
  CHECK(r->source == CacheSource::disk);
  CHECK(calls == 1);
  CHECK(r->entry->cubin == fb.cubin);
  CHECK(r->entry->meta["registers"] == 42);
}

TEST_CASE("sm_90 and sm_90a entries never alias", "[cache][layout]") {
  TempDir root;
  KernelCache cache(opts(root.path()));
  FakeBuild plain(key_h(16, 2, Arch::sm_90)), a(key_h(16, 2, Arch::sm_90a));
  std::atomic<int> calls{0};
  StderrCapture err;
  auto r1 = cache.get_or_build(plain.key, plain.hash, plain.fn(&calls));
  auto r2 = cache.get_or_build(a.key, a.hash, a.fn(&calls));
  err.finish();
  REQUIRE(r1.ok());
  REQUIRE(r2.ok());
  CHECK(calls == 2);
  CHECK((*r1)->dir != (*r2)->dir);
  CHECK((*r2)->dir.find("/sm_90a/") != std::string::npos);
}

TEST_CASE("a corrupt entry is one warning, one rebuild and a replaced entry", "[cache][corruption]") {
  TempDir root;
  FakeBuild fb(key_h(32));
  FakeBuild other(key_h(64));
  std::string dir;
  {
    KernelCache cache(opts(root.path()));
    StderrCapture err;
    auto r = cache.get_or_build(fb.key, fb.hash, fb.fn());
    auto r2 = cache.get_or_build(other.key, other.hash, other.fn());
    err.finish();
    REQUIRE(r.ok());
    REQUIRE(r2.ok());
    dir = (*r)->dir;
  }
  std::string other_meta = read_text(KernelCache(opts(root.path())).entry_dir(other.key, other.hash) + "/meta.json");

  std::string expect_reason;
  SECTION("truncated cubin") {
    fs::resize_file(dir + "/kernel.cubin", fb.cubin.size() / 2);
    expect_reason = "checksum";
  }
  SECTION("flipped byte in the cubin") {
    std::string bytes = read_text(dir + "/kernel.cubin");
    bytes[bytes.size() / 3] ^= 0x01;
    write_text(dir + "/kernel.cubin", bytes);
    expect_reason = "checksum";
  }
  SECTION("deleted cubin") {
    fs::remove(dir + "/kernel.cubin");
    expect_reason = "kernel.cubin is missing";
  }
  SECTION("deleted meta.json") {
    fs::remove(dir + "/meta.json");
    expect_reason = "meta.json is missing";
  }
  SECTION("meta.json is not JSON") {
    write_text(dir + "/meta.json", "{\"schema\": 1, \"key\": ");
    expect_reason = "not a valid JSON object";
  }
  SECTION("meta.json names another key") {
    write_text(dir + "/meta.json", other_meta);
    expect_reason = "names key " + key_name(other.key);
  }
  SECTION("edited source") {
    write_text(dir + "/kernel.cu", fb.source + "// edited\n");
    expect_reason = "do not hash";
  }
  SECTION("the entry path is a file") {
    fs::remove_all(dir);
    write_text(dir, "not an entry");
    expect_reason = "not a directory";
  }

  std::atomic<int> calls{0};
  {
    KernelCache cache(opts(root.path()));
    StderrCapture err;
    auto r = cache.lookup(fb.key, fb.hash, fb.fn(&calls));
    auto log = err.finish();
    REQUIRE(r.ok());
    CHECK(r->source == CacheSource::built);
    CHECK(r->entry->cubin == fb.cubin);
    CHECK(calls == 1);
    CHECK(count_lines(log, "kdajit: warning:") == 1);
    CHECK(log.find(expect_reason) != std::string::npos);
    CHECK(log.find(dir) != std::string::npos);
    CHECK(count_lines(log, "kdajit: compiled ") == 1);
  }
  // Replaced: the next process hits it silently.
  KernelCache cache(opts(root.path()));
  StderrCapture err;
  auto r = cache.lookup(fb.key, fb.hash, fb.fn(&calls));
  CHECK(err.finish().empty());
  REQUIRE(r.ok());
  CHECK(r->source == CacheSource::disk);
  CHECK(calls == 1);
  for (const auto& info : cache.list_entries()) CHECK(cache.verify_entry(info).ok);
}

TEST_CASE("an unusable root serves kernels from memory with one warning", "[cache][environment]") {
  TempDir scratch;
  std::string file = scratch / "a-file";
  write_text(file, "x");
  std::string root;
  SECTION("the root is a regular file") { root = file; }
  SECTION("the root is below a regular file (unwritable even for root)") { root = file + "/kdajit"; }

  FakeBuild fb(key_h(8));
  std::atomic<int> calls{0};
  StderrCapture err;
  KernelCache cache(opts(root));
  auto r1 = cache.get_or_build(fb.key, fb.hash, fb.fn(&calls));
  auto r2 = cache.get_or_build(fb.key, fb.hash, fb.fn(&calls));
  auto log = err.finish();
  CHECK(cache.mode() == CacheMode::memory_only);
  REQUIRE(r1.ok());
  REQUIRE(r2.ok());
  CHECK((*r1)->cubin == fb.cubin);
  CHECK((*r1)->dir.empty());
  CHECK(*r1 == *r2);
  CHECK(calls == 1);
  CHECK(count_lines(log, "kdajit: warning:") == 1);
  CHECK(log.find(root) != std::string::npos);
  CHECK(count_lines(log, "kdajit: compiled ") == 1);
  CHECK(read_text(file) == "x");
}

TEST_CASE("a read-only root still serves its entries", "[cache][environment]") {
  TempDir root;
  FakeBuild cached(key_h(16)), fresh(key_h(24));
  {
    KernelCache cache(opts(root.path()));
    StderrCapture err;
    REQUIRE(cache.get_or_build(cached.key, cached.hash, cached.fn()).ok());
  }
  // As root chmod does not bite; a foreign file where tmp/ belongs makes the root
  // unwritable for every user. Without root privileges, test the real chmod too.
  SECTION("tmp/ is a foreign file") {
    fs::remove_all(root / "tmp");
    write_text(root / "tmp", "foreign");
  }
  if (::geteuid() != 0) {
    SECTION("chmod 555") {
      fs::remove_all(root / "tmp");
      fs::remove_all(root / "locks");
      fs::permissions(root.path(), fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                                       fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
    }
  }
  std::atomic<int> calls{0};
  StderrCapture err;
  KernelCache cache(opts(root.path()));
  auto hit = cache.lookup(cached.key, cached.hash, cached.fn(&calls));
  auto built = cache.lookup(fresh.key, fresh.hash, fresh.fn(&calls));
  auto log = err.finish();
  CHECK(cache.mode() == CacheMode::read_only);
  REQUIRE(hit.ok());
  CHECK(hit->source == CacheSource::disk);
  REQUIRE(built.ok());
  CHECK(built->source == CacheSource::built);
  CHECK(built->entry->dir.empty());
  CHECK(calls == 1);
  CHECK(count_lines(log, "kdajit: warning:") == 1);
  CHECK(log.find("not writable") != std::string::npos);
  CHECK(!fs::exists(cache.entry_dir(fresh.key, fresh.hash)));
}

TEST_CASE("a failed write (full disk) serves from memory with one warning", "[cache][environment]") {
  TempDir root;
  std::string log_path = root / "child.log";
  std::string cache_root = root / "cache";
  // The child may write at most 2 KiB per file: every cubin write fails (EFBIG), as a
  // full disk would (ENOSPC) on the same code path.
  pid_t pid = spawn_child([&] {
    redirect_stderr_to(log_path);
    KernelCache cache(opts(cache_root));
    if (cache.mode() != CacheMode::read_write) return 10;
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {2048, 2048};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 11;
    for (int h : {8, 16, 32}) {
      FakeBuild fb(key_h(h), 16384);
      auto r = cache.get_or_build(fb.key, fb.hash, fb.fn());
      if (!r) return 12;
      if ((*r)->cubin != fb.cubin || !(*r)->dir.empty()) return 13;
      auto again = cache.lookup(fb.key, fb.hash, fb.fn());
      if (!again || again->source != CacheSource::memory) return 14;
    }
    return cache.mode() == CacheMode::read_only ? 0 : 15;
  });
  CHECK(wait_child(pid) == 0);
  auto log = read_text(log_path);
  CHECK(count_lines(log, "kdajit: warning:") == 1);
  CHECK(log.find("cannot write cache entry") != std::string::npos);
  CHECK(count_lines(log, "kdajit: compiled ") == 3);
  KernelCache cache(opts(cache_root));
  CHECK(cache.list_entries().empty());
  CHECK(fs::is_empty(cache_root + "/tmp"));
}

TEST_CASE("foreign files in the root are ignored or reported, never fatal", "[cache][environment]") {
  TempDir root;
  fs::create_directories(root / "sm_90/not-an-entry");
  write_text(root / "sm_90/stray.txt", "x");
  write_text(root / "README", "mine");
  FakeBuild fb(key_h(16));
  {
    KernelCache cache(opts(root.path()));
    StderrCapture err;
    REQUIRE(cache.get_or_build(fb.key, fb.hash, fb.fn()).ok());
    CHECK(count_lines(err.finish(), "kdajit: warning:") == 0);
    CHECK(cache.list_entries().size() == 1);
    auto foreign = cache.foreign_paths();
    CHECK(foreign.size() == 3);
    auto cleared = cache.clear();
    REQUIRE(cleared.ok());
    CHECK(cleared->removed == 1);
  }
  CHECK(read_text(root / "README") == "mine");
  CHECK(fs::exists(root / "sm_90/not-an-entry"));
  CHECK(fs::exists(root / "sm_90/stray.txt"));

  SECTION("an arch directory that is a file") {
    FakeBuild a(key_h(16, 2, Arch::sm_90a));
    write_text(root / "sm_90a", "foreign");
    KernelCache cache(opts(root.path()));
    StderrCapture err;
    auto r = cache.get_or_build(a.key, a.hash, a.fn());
    auto log = err.finish();
    REQUIRE(r.ok());
    CHECK((*r)->dir.empty());
    CHECK(count_lines(log, "kdajit: warning:") == 1);
    CHECK(log.find("not a directory") != std::string::npos);
  }
}

TEST_CASE("KDAJIT_DISABLE_JIT makes a miss an error naming the key", "[cache][environment]") {
  TempDir root;
  FakeBuild fb(key_h(16)), missing(key_h(48));
  std::atomic<int> calls{0};
  {
    KernelCache warm(opts(root.path()));
    StderrCapture err;
    REQUIRE(warm.get_or_build(fb.key, fb.hash, fb.fn(&calls)).ok());
  }
  ::setenv("KDAJIT_DISABLE_JIT", "1", 1);
  CacheOptions o;
  o.root = root.path();
  KernelCache cache(o);  // disable_jit from the environment
  ::unsetenv("KDAJIT_DISABLE_JIT");
  CHECK(cache.disable_jit());
  StderrCapture err;
  auto hit = cache.get_or_build(fb.key, fb.hash, fb.fn(&calls));
  auto miss = cache.get_or_build(missing.key, missing.hash, missing.fn(&calls));
  CHECK(err.finish().empty());  // silent after prewarm
  CHECK(hit.ok());
  REQUIRE(!miss.ok());
  CHECK(miss.error().code == ErrorCode::jit_disabled);
  CHECK(miss.error().message.find(key_name(missing.key)) != std::string::npos);
  CHECK(calls == 1);
}

TEST_CASE("a compile that is not allowed fails fast with 'pre-warm this key'", "[cache][capture]") {
  TempDir root;
  KernelCache cache(opts(root.path()));
  FakeBuild fb(key_h(16));
  std::atomic<int> calls{0};
  auto r = cache.get_or_build(fb.key, fb.hash, fb.fn(&calls), /*allow_build=*/false);
  REQUIRE(!r.ok());
  CHECK(r.error().code == ErrorCode::capture);
  CHECK(r.error().message.find("pre-warm this key") != std::string::npos);
  CHECK(r.error().message.find(key_name(fb.key)) != std::string::npos);
  CHECK(calls == 0);
  // Errors are not remembered: an allowed call builds.
  StderrCapture err;
  CHECK(cache.get_or_build(fb.key, fb.hash, fb.fn(&calls)).ok());
  CHECK(cache.get_or_build(fb.key, fb.hash, fb.fn(&calls), false).ok());
  CHECK(calls == 1);
}

TEST_CASE("a failed build is returned, not cached, and leaves nothing behind", "[cache][errors]") {
  TempDir root;
  KernelCache cache(opts(root.path()));
  FakeBuild fb(key_h(16));
  int calls = 0;
  BuildFn failing = [&]() -> Result<CacheBuild> {
    ++calls;
    return Error(ErrorCode::compile_failed, "kernel x: nvrtc said no", "line 1: error");
  };
  auto r = cache.get_or_build(fb.key, fb.hash, failing);
  REQUIRE(!r.ok());
  CHECK(r.error().code == ErrorCode::compile_failed);
  CHECK(r.error().detail == "line 1: error");
  CHECK(!cache.get_or_build(fb.key, fb.hash, failing).ok());
  CHECK(calls == 2);
  CHECK(fs::is_empty(root / "tmp"));
  CHECK(cache.list_entries().empty());

  BuildFn throwing = []() -> Result<CacheBuild> { throw std::runtime_error("boom"); };
  auto t = cache.get_or_build(fb.key, fb.hash, throwing);
  REQUIRE(!t.ok());
  CHECK(t.error().message.find("boom") != std::string::npos);

  // A build whose inputs do not hash to the looked-up hash is refused.
  FakeBuild other(key_h(32));
  auto mismatch = cache.get_or_build(fb.key, fb.hash, other.fn());
  REQUIRE(!mismatch.ok());
  CHECK(mismatch.error().code == ErrorCode::internal);
  CHECK(cache.list_entries().empty());

  auto bad_hash = cache.get_or_build(fb.key, "abc", fb.fn());
  REQUIRE(!bad_hash.ok());
  CHECK(bad_hash.error().code == ErrorCode::invalid_argument);
}

TEST_CASE("LRU eviction by the last-used stamp keeps the cache under max_bytes", "[cache][lru]") {
  TempDir root;
  FakeBuild a(key_h(8)), b(key_h(16)), c(key_h(24)), d(key_h(32));
  uint64_t entry_bytes = 0;
  {
    KernelCache cache(opts(root.path()));
    StderrCapture err;
    for (auto* fb : {&a, &b, &c}) REQUIRE(cache.get_or_build(fb->key, fb->hash, fb->fn()).ok());
    auto entries = cache.list_entries();
    REQUIRE(entries.size() == 3);
    entry_bytes = entries[0].bytes;
    for (const auto& e : entries) CHECK(e.bytes > 4096);
  }
  {
    // A later process uses a: now b is the least recently used.
    KernelCache cache(opts(root.path()));
    auto r = cache.lookup(a.key, a.hash, a.fn());
    REQUIRE(r.ok());
    CHECK(r->source == CacheSource::disk);
  }
  CacheOptions o = opts(root.path());
  o.max_bytes = entry_bytes * 3 + entry_bytes / 2;  // room for three entries
  KernelCache cache(o);
  StderrCapture err;
  REQUIRE(cache.get_or_build(d.key, d.hash, d.fn()).ok());
  err.finish();
  CHECK(fs::exists(cache.entry_dir(a.key, a.hash)));
  CHECK(!fs::exists(cache.entry_dir(b.key, b.hash)));
  CHECK(fs::exists(cache.entry_dir(c.key, c.hash)));
  CHECK(fs::exists(cache.entry_dir(d.key, d.hash)));

  // prune: down to one entry keeps the most recently used (d).
  auto pruned = cache.prune(entry_bytes + entry_bytes / 2);
  CHECK(pruned.removed == 2);
  CHECK(pruned.bytes_after <= entry_bytes + entry_bytes / 2);
  auto left = cache.list_entries();
  REQUIRE(left.size() == 1);
  CHECK(left[0].key == d.key);
  CHECK(fs::is_empty(root / "tmp"));
}

// A build of `of`'s program (its source, cubin and hash) stored for another key,
// as the runtime stores the keys of one program (kProgramCompiledForField).
static BuildFn program_of(const FakeBuild& of) {
  return [&of]() -> Result<CacheBuild> {
    auto b = of.fn()();
    if (b) b->meta[kProgramCompiledForField] = key_name(of.key);
    return b;
  };
}

static ino_t inode(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  return st.st_ino;
}

TEST_CASE("the keys of one program share its source and cubin files on disk", "[cache][layout]") {
  TempDir root;
  FakeBuild first(key_h(8), 1 << 16);
  const KernelKey second = key_h(16), third = key_h(24);
  std::string first_dir, second_dir;
  {
    KernelCache cache(opts(root.path()));
    StderrCapture err;
    auto a = cache.get_or_build(first.key, first.hash, first.fn());
    auto b = cache.get_or_build(second, first.hash, program_of(first));
    err.finish();
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    first_dir = (*a)->dir;
    second_dir = (*b)->dir;
    REQUIRE(second_dir == cache.entry_dir(second, first.hash));
  }
  // One copy of the two files, each entry its own meta and last_used.
  CHECK(inode(first_dir + "/kernel.cubin") == inode(second_dir + "/kernel.cubin"));
  CHECK(inode(first_dir + "/kernel.cu") == inode(second_dir + "/kernel.cu"));
  CHECK(inode(first_dir + "/meta.json") != inode(second_dir + "/meta.json"));
  CHECK(inode(first_dir + "/last_used") != inode(second_dir + "/last_used"));

  KernelCache cache(opts(root.path()));
  for (const auto& e : cache.list_entries()) CHECK(cache.verify_entry(e).ok);
  // The second entry stands alone once the first is gone.
  fs::remove_all(first_dir);
  {
    KernelCache again(opts(root.path()));
    auto r = again.lookup(second, first.hash, program_of(first));
    REQUIRE(r.ok());
    CHECK(r->source == CacheSource::disk);
    CHECK(r->entry->cubin == first.cubin);
  }

  // The entry it would link holds other bytes (replaced by hand): the new key's
  // files are written, not linked.
  std::string second_cubin = second_dir + "/kernel.cubin";
  write_text(second_cubin + ".new", std::string(first.cubin.size(), 'x'));
  fs::rename(second_cubin + ".new", second_cubin);
  FakeBuild of_second = first;
  of_second.key = second;
  StderrCapture err;
  auto c = cache.get_or_build(third, first.hash, program_of(of_second));
  err.finish();
  REQUIRE(c.ok());
  const std::string third_dir = (*c)->dir;
  CHECK(read_text(third_dir + "/kernel.cubin") == first.cubin);
  CHECK(inode(third_dir + "/kernel.cubin") != inode(second_cubin));
  // Its source is the same bytes in a file of this user's: linked.
  CHECK(inode(third_dir + "/kernel.cu") == inode(second_dir + "/kernel.cu"));

  // A link planted in place of the program's cubin is never followed or linked.
  fs::remove(second_cubin);
  fs::create_symlink(third_dir + "/kernel.cubin", second_cubin);
  const KernelKey fourth = key_h(32);
  StderrCapture err2;
  auto d = cache.get_or_build(fourth, first.hash, program_of(of_second));
  err2.finish();
  REQUIRE(d.ok());
  CHECK(read_text((*d)->dir + "/kernel.cubin") == first.cubin);
  CHECK(inode((*d)->dir + "/kernel.cubin") != inode(third_dir + "/kernel.cubin"));
}

TEST_CASE("stale staging dirs are swept by age unless their key lock is held", "[cache][sweep]") {
  TempDir root;
  FakeBuild fb(key_h(16));
  { KernelCache cache(opts(root.path())); }
  std::string stem = key_name(fb.key) + "." + fb.hash.substr(0, 16);
  fs::create_directories(root / ("tmp/" + stem + ".AbCdEf"));
  write_text(root / ("tmp/" + stem + ".AbCdEf/kernel.cu"), "partial");
  fs::create_directories(root / "tmp/other.XyZ123");
  fs::create_directories(root / "locks");  // as a writer leaves it (opening creates neither)

  SECTION("younger than the age limit: kept") {
    KernelCache cache(opts(root.path()));  // default: one hour
    CHECK(fs::exists(root / ("tmp/" + stem + ".AbCdEf")));
    CHECK(fs::exists(root / "tmp/other.XyZ123"));
  }
  SECTION("age 0: swept; a name that is not kdajit's is never touched") {
    CacheOptions o = opts(root.path());
    o.tmp_max_age = std::chrono::seconds(0);
    KernelCache cache(o);
    CHECK(!fs::exists(root / ("tmp/" + stem + ".AbCdEf")));
    CHECK(fs::exists(root / "tmp/other.XyZ123"));
  }
  SECTION("age 0 but the key lock is held by another process: kept") {
    // The child holds the key's lock the way a live writer would.
    pid_t pid = hold_lock_in_child(root / ("locks/" + stem + ".lock"));
    CacheOptions o = opts(root.path());
    o.tmp_max_age = std::chrono::seconds(0);
    KernelCache cache(o);
    CHECK(fs::exists(root / ("tmp/" + stem + ".AbCdEf")));
    ::kill(pid, SIGKILL);
    wait_child(pid);
    CHECK(cache.sweep_tmp(std::chrono::seconds(0)) == 1);
    CHECK(!fs::exists(root / ("tmp/" + stem + ".AbCdEf")));
    CHECK(fs::exists(root / "tmp/other.XyZ123"));
  }
}

TEST_CASE("verify_entry re-hashes and clear leaves an empty cache", "[cache][verify]") {
  TempDir root;
  KernelCache cache(opts(root.path()));
  FakeBuild a(key_h(8)), b(key_h(16));
  StderrCapture err;
  REQUIRE(cache.get_or_build(a.key, a.hash, a.fn()).ok());
  REQUIRE(cache.get_or_build(b.key, b.hash, b.fn()).ok());
  err.finish();
  std::string bdir = cache.entry_dir(b.key, b.hash);
  auto bytes = read_text(bdir + "/kernel.cubin");
  bytes[7] ^= 0x40;
  write_text(bdir + "/kernel.cubin", bytes);
  int ok = 0, bad = 0;
  for (const auto& info : cache.list_entries()) {
    auto v = cache.verify_entry(info);
    if (v.ok) {
      ++ok;
      CHECK(!v.stale);
    } else {
      ++bad;
      CHECK(info.dir == bdir);
      CHECK(v.reason.find("checksum") != std::string::npos);
      CHECK(cache.remove_entry(info).ok());
    }
  }
  CHECK(ok == 1);
  CHECK(bad == 1);
  CHECK(!fs::exists(bdir));
  auto cleared = cache.clear();
  REQUIRE(cleared.ok());
  CHECK(cleared->removed == 1);
  CHECK(cache.list_entries().empty());
  CHECK(fs::is_empty(root / "locks"));
}

TEST_CASE("the root and the limits come from the environment", "[cache][environment]") {
  TempDir scratch;
  struct SavedEnv {
    std::vector<std::pair<std::string, std::optional<std::string>>> saved;
    void set(const char* name, const char* value) {
      const char* old = std::getenv(name);
      saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      if (value) ::setenv(name, value, 1);
      else ::unsetenv(name);
    }
    ~SavedEnv() {
      for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
        if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
        else ::unsetenv(it->first.c_str());
      }
    }
  } env;
  env.set("KDAJIT_DISABLE_JIT", nullptr);
  env.set("KDAJIT_CACHE_MAX_BYTES", "123456");
  env.set("HOME", (scratch / "home").c_str());
  env.set("XDG_CACHE_HOME", (scratch / "xdg").c_str());
  env.set("KDAJIT_CACHE_DIR", (scratch / "explicit").c_str());
  {
    KernelCache cache;
    CHECK(cache.root() == scratch / "explicit");
    CHECK(cache.max_bytes() == std::optional<uint64_t>(123456));
    CHECK(!cache.disable_jit());
    CHECK(fs::is_directory(scratch / "explicit"));
    CHECK(!fs::exists(scratch / "explicit/tmp"));  // a writer creates it when it first stages an entry
  }
  env.set("KDAJIT_CACHE_DIR", nullptr);
  CHECK(KernelCache().root() == scratch / "xdg/kdajit");
  env.set("XDG_CACHE_HOME", nullptr);
  CHECK(KernelCache().root() == scratch / "home/.cache/kdajit");
  // Options win over the environment.
  CacheOptions o;
  o.root = scratch / "opt";
  o.max_bytes = 7;
  KernelCache explicit_opts(o);
  CHECK(explicit_opts.root() == scratch / "opt");
  CHECK(explicit_opts.max_bytes() == std::optional<uint64_t>(7));

  // A malformed variable: one warning naming it, and the cache still opens.
  env.set("KDAJIT_CACHE_MAX_BYTES", "lots");
  StderrCapture err;
  KernelCache cache(opts(scratch / "malformed"));
  auto log = err.finish();
  CHECK(cache.mode() == CacheMode::read_write);
  CHECK(count_lines(log, "kdajit: warning: KDAJIT_CACHE_MAX_BYTES") == 1);
}
