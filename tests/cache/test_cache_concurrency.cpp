// Many threads and many processes on one cache: single flight, races, crashes.
#include <csignal>
#include <map>
#include <set>

#include "cache_test_util.hpp"
#include "catch.hpp"
#include "kdajit/cache.hpp"
#include "kdajit/log.hpp"

using namespace kdajit;
using namespace kdajit::test;

namespace {

std::vector<KernelKey> sixteen_keys() {
  std::vector<KernelKey> keys;
  for (int h : {8, 16, 32, 64})
    for (int t : {2, 3, 4, 5}) keys.push_back(key_h(h, t));
  return keys;
}

// Appends one line per build to a file shared by processes (O_APPEND: whole lines).
BuildFn counted_build(const FakeBuild& fb, const std::string& counter, int delay_ms) {
  return [&fb, counter, delay_ms]() -> Result<CacheBuild> {
    int fd = ::open(counter.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    std::string line = key_name(fb.key) + "\n";
    if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
      return Error(ErrorCode::io, "counter");
    ::close(fd);
    return fb.fn(nullptr, delay_ms)();
  };
}

}  // namespace

TEST_CASE("concurrent requests for one key in a process share one build", "[cache][single-flight]") {
  TempDir root;
  std::string root_path;
  SECTION("disk root") { root_path = root.path(); }
  SECTION("memory only") { root_path = root / "file"; write_text(root_path, "x"); }
  StderrCapture err;
  KernelCache cache(opts(root_path));
  FakeBuild fb(key_h(16));
  std::atomic<int> calls{0};
  constexpr int kThreads = 16;
  std::vector<std::shared_ptr<const CacheEntry>> got(kThreads);
  std::vector<int> ok(kThreads, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      auto r = cache.get_or_build(fb.key, fb.hash, fb.fn(&calls, 200));
      ok[i] = r.ok();
      if (r) got[i] = *r;
    });
  for (auto& t : threads) t.join();
  auto log = err.finish();
  CHECK(calls == 1);
  CHECK(count_lines(log, "kdajit: compiled ") == 1);
  for (int i = 0; i < kThreads; ++i) {
    CHECK(ok[i] == 1);
    CHECK(got[i] == got[0]);
  }
  REQUIRE(got[0]);
  CHECK(got[0]->cubin == fb.cubin);
}

TEST_CASE("unrelated keys never wait on each other", "[cache][single-flight]") {
  TempDir root;
  KernelCache cache(opts(root.path()));
  FakeBuild slow(key_h(16)), quick(key_h(32));
  StderrCapture err;
  std::atomic<bool> slow_done{false};
  std::atomic<bool> slow_ok{false};
  std::thread t([&] {
    slow_ok = cache.get_or_build(slow.key, slow.hash, slow.fn(nullptr, 1500)).ok();
    slow_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the slow build is running
  auto t0 = std::chrono::steady_clock::now();
  auto r = cache.get_or_build(quick.key, quick.hash, quick.fn());
  auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(r.ok());
  CHECK(!slow_done);
  CHECK(waited < std::chrono::milliseconds(1000));
  // A capture-time request for the key being compiled fails fast instead of waiting.
  auto capture = cache.get_or_build(slow.key, slow.hash, slow.fn(), /*allow_build=*/false);
  REQUIRE(!capture.ok());
  CHECK(capture.error().code == ErrorCode::capture);
  CHECK(!slow_done);
  t.join();
  err.finish();
  CHECK(slow_ok);
}

TEST_CASE("8 processes pre-warming the same 16 keys compile each key once", "[cache][race]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  std::string counter = scratch / "builds.txt";
  auto keys = sixteen_keys();
  std::vector<FakeBuild> builds;
  for (const auto& k : keys) builds.emplace_back(k);
  constexpr int kProcs = 8;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p)
    pids.push_back(spawn_child([&, p] {
      redirect_stderr_to(scratch / ("proc" + std::to_string(p) + ".log"));
      KernelCache cache(opts(root));  // all create the empty root at once
      // Each process walks the keys from a different start, with 2 threads.
      std::atomic<int> failures{0};
      std::atomic<size_t> next{0};
      auto worker = [&] {
        for (size_t i; (i = next++) < builds.size();) {
          const auto& fb = builds[(i + static_cast<size_t>(p) * 5) % builds.size()];
          auto r = cache.get_or_build(fb.key, fb.hash, counted_build(fb, counter, 50));
          if (!r || (*r)->cubin != fb.cubin || (*r)->dir.empty()) ++failures;
        }
      };
      std::thread t1(worker), t2(worker);
      t1.join();
      t2.join();
      return failures.load();
    }));
  for (pid_t pid : pids) CHECK(wait_child(pid) == 0);

  std::map<std::string, int> built;
  std::istringstream in(read_text(counter));
  for (std::string line; std::getline(in, line);) ++built[line];
  CHECK(built.size() == keys.size());
  for (const auto& [name, n] : built) {
    INFO(name);
    CHECK(n == 1);
  }
  int compiled_lines = 0, warnings = 0;
  for (int p = 0; p < kProcs; ++p) {
    auto log = read_text(scratch / ("proc" + std::to_string(p) + ".log"));
    compiled_lines += count_lines(log, "kdajit: compiled ");
    warnings += count_lines(log, "kdajit: warning:");
  }
  CHECK(compiled_lines == static_cast<int>(keys.size()));
  CHECK(warnings == 0);

  KernelCache cache(opts(root));
  auto entries = cache.list_entries();
  CHECK(entries.size() == keys.size());
  for (const auto& e : entries) CHECK(cache.verify_entry(e).ok);
  CHECK(fs::is_empty(root + "/tmp"));
}

TEST_CASE("a writer killed mid-compile leaves no entry; the next run completes it", "[cache][crash]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  FakeBuild fb(key_h(16));
  int started[2];
  REQUIRE(::pipe(started) == 0);
  pid_t pid = spawn_child([&] {
    redirect_stderr_to(scratch / "child.log");
    KernelCache cache(opts(root));
    BuildFn hang = [&]() -> Result<CacheBuild> {
      char c = 's';
      if (::write(started[1], &c, 1) != 1) return Error(ErrorCode::io, "pipe");
      for (;;) ::pause();  // a compile that never ends: killed below
    };
    return cache.get_or_build(fb.key, fb.hash, hang).ok() ? 0 : 1;
  });
  char c = 0;
  REQUIRE(::read(started[0], &c, 1) == 1);
  ::close(started[0]);
  ::close(started[1]);
  // The child holds the key lock and its staging dir exists.
  std::string stem = key_name(fb.key) + "." + fb.hash.substr(0, 16);
  int staging = 0;
  for (const auto& e : fs::directory_iterator(root + "/tmp"))
    staging += e.path().filename().string().rfind(stem + ".", 0) == 0;
  CHECK(staging == 1);
  ::kill(pid, SIGKILL);
  CHECK(wait_child(pid) == 128 + SIGKILL);

  CacheOptions o = opts(root);
  o.tmp_max_age = std::chrono::seconds(0);
  StderrCapture err;
  KernelCache cache(o);  // sweeps the dead writer's staging dir: its lock died with it
  CHECK(fs::is_empty(root + "/tmp"));
  CHECK(!fs::exists(cache.entry_dir(fb.key, fb.hash)));
  std::atomic<int> calls{0};
  auto t0 = std::chrono::steady_clock::now();
  auto r = cache.lookup(fb.key, fb.hash, fb.fn(&calls));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // no stale lock to wait on
  auto log = err.finish();
  REQUIRE(r.ok());
  CHECK(r->source == CacheSource::built);
  CHECK(calls == 1);
  CHECK(count_lines(log, "kdajit: warning:") == 0);
  auto entries = cache.list_entries();
  REQUIRE(entries.size() == 1);
  CHECK(cache.verify_entry(entries[0]).ok);
  CHECK(fs::is_empty(root + "/tmp"));
}

TEST_CASE("a process waiting on another's compile re-checks and does not rebuild", "[cache][race]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  FakeBuild fb(key_h(64));
  int started[2];
  REQUIRE(::pipe(started) == 0);
  pid_t pid = spawn_child([&] {
    redirect_stderr_to(scratch / "child.log");
    KernelCache cache(opts(root));
    BuildFn slow = [&]() -> Result<CacheBuild> {
      char c = 's';
      if (::write(started[1], &c, 1) != 1) return Error(ErrorCode::io, "pipe");
      return fb.fn(nullptr, 700)();
    };
    return cache.get_or_build(fb.key, fb.hash, slow).ok() ? 0 : 1;
  });
  char c = 0;
  REQUIRE(::read(started[0], &c, 1) == 1);
  StderrCapture err;
  KernelCache cache(opts(root));
  std::atomic<int> calls{0};
  auto r = cache.lookup(fb.key, fb.hash, fb.fn(&calls));
  CHECK(wait_child(pid) == 0);
  CHECK(err.finish().empty());
  REQUIRE(r.ok());
  CHECK(r->source == CacheSource::disk);
  CHECK(calls == 0);
  ::close(started[0]);
  ::close(started[1]);
}

TEST_CASE("a child forked while a key lock is held does not keep it", "[cache][lock]") {
  TempDir root;
  KernelCache cache(opts(root.path()));
  FakeBuild fb(key_h(16));
  pid_t child = -1;
  int running[2];
  REQUIRE(::pipe(running) == 0);
  BuildFn build = [&]() -> Result<CacheBuild> {
    child = spawn_child([&] {
      // fork() ran the atfork handlers before this body: the child's copy of the
      // lock is closed once it says it runs (without the wait, the parent could
      // test the lock before a slow-to-start child had closed it).
      char c = 'r';
      if (::write(running[1], &c, 1) != 1) return 1;
      ::pause();  // a long-lived worker process, forked mid-build
      return 0;
    });
    char c = 0;
    if (::read(running[0], &c, 1) != 1) return Error(ErrorCode::io, "the child did not start");
    return fb.fn()();
  };
  StderrCapture err;
  REQUIRE(cache.get_or_build(fb.key, fb.hash, build).ok());
  err.finish();
  REQUIRE(child > 0);
  std::string lock_path = root / ("locks/" + key_name(fb.key) + "." + fb.hash.substr(0, 16) + ".lock");
  int fd = ::open(lock_path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  CHECK(::flock(fd, LOCK_EX | LOCK_NB) == 0);  // free although the child lives
  ::close(fd);
  ::kill(child, SIGKILL);
  wait_child(child);
  ::close(running[0]);
  ::close(running[1]);
}

TEST_CASE("a holder stuck forever delays a build by lock_patience, not forever", "[cache][lock]") {
  TempDir root;
  FakeBuild fb(key_h(16));
  std::string lock_path;
  { lock_path = KernelCache(opts(root.path())).root() + "/locks/" + key_name(fb.key) + "." + fb.hash.substr(0, 16) + ".lock"; }
  fs::create_directories(root / "locks");  // as a writer leaves it (opening creates neither)
  pid_t pid = hold_lock_in_child(lock_path);
  CacheOptions o = opts(root.path());
  o.lock_patience = std::chrono::seconds(1);
  KernelCache cache(o);
  std::atomic<int> calls{0};
  StderrCapture err;
  auto t0 = std::chrono::steady_clock::now();
  auto r = cache.lookup(fb.key, fb.hash, fb.fn(&calls));
  auto waited = std::chrono::steady_clock::now() - t0;
  auto log = err.finish();
  ::kill(pid, SIGKILL);
  wait_child(pid);
  REQUIRE(r.ok());
  CHECK(r->source == CacheSource::built);
  CHECK(!r->entry->dir.empty());
  CHECK(calls == 1);
  CHECK(waited >= std::chrono::seconds(1));
  CHECK(waited < std::chrono::seconds(5));
  CHECK(count_lines(log, "kdajit: warning: another process has been building " + key_name(fb.key)) == 1);
}
