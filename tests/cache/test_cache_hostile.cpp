// A hostile or careless root, one user: foreign files, links planted under the
// root, loose modes and umasks, junk meta.json, entries that cannot be replaced,
// read-only opens, and layered roots. Two users: test_cache_two_users.cpp.
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "cache_test_util.hpp"
#include "catch.hpp"
#include "kdajit/cache.hpp"

using namespace kdajit;
using namespace kdajit::test;

namespace {

std::string stem_of(const FakeBuild& fb) { return key_name(fb.key) + "." + fb.hash.substr(0, 16); }

// Builds fb into `root` with a fresh cache object; returns the entry dir.
std::string build_into(const std::string& root, const FakeBuild& fb) {
  KernelCache cache(opts(root));
  StderrCapture err;
  auto r = cache.get_or_build(fb.key, fb.hash, fb.fn());
  err.finish();
  REQUIRE(r.ok());
  REQUIRE(!(*r)->dir.empty());
  return (*r)->dir;
}

// Every path below `dir` (links not followed), for "nothing was created" checks.
std::vector<std::string> tree(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    out.push_back(it->path().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("opening a cache removes only kdajit's own old staging dirs", "[cache][hostile][sweep]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  FakeBuild fb(key_h(16));
  { KernelCache cache(opts(root)); }
  // An operator's note in tmp/, two hours old: not kdajit's, so never deleted
  // (opening creates the root, not tmp/: a writer does when it first stages an entry).
  CHECK(!fs::exists(root + "/tmp"));
  fs::create_directory(root + "/tmp");
  ::chmod((root + "/tmp").c_str(), 0700);
  write_text(root + "/tmp/notes", "x");
  fs::create_directories(root + "/tmp/other.XyZ123");
  write_text(root + "/tmp/other.XyZ123/keep", "x");
  std::string ours = root + "/tmp/" + stem_of(fb) + ".AbCdEf";
  fs::create_directories(ours);
  write_text(ours + "/kernel.cu", "partial");
  for (const auto& p : {root + "/tmp/notes", root + "/tmp/other.XyZ123", ours}) age_path(p, 7200);

  KernelCache cache(opts(root));  // default age: one hour
  CHECK(read_text(root + "/tmp/notes") == "x");
  CHECK(read_text(root + "/tmp/other.XyZ123/keep") == "x");
  CHECK(!fs::exists(ours));
  // clear() sweeps at age 0 with the same rule.
  REQUIRE(cache.clear().ok());
  CHECK(read_text(root + "/tmp/notes") == "x");
  CHECK(fs::exists(root + "/tmp/other.XyZ123/keep"));
}

TEST_CASE("a symlinked tmp/ or locks/ is never followed", "[cache][hostile][links]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  FakeBuild fb(key_h(16));
  std::string entry = build_into(root, fb);
  // A victim directory that looks like a tmp/ of old staging dirs.
  std::string victim = scratch / "home";
  fs::create_directories(victim + "/" + stem_of(fb) + ".AbCdEf");
  write_text(victim + "/" + stem_of(fb) + ".AbCdEf/kernel.cu", "precious");
  write_text(victim + "/gone.QwErTy", "precious");
  write_text(victim + "/" + stem_of(fb) + ".lock", "precious");
  for (const auto& p : tree(victim)) age_path(p, 7200);
  auto before = tree(victim);
  std::string which = GENERATE(std::string("tmp"), std::string("locks"));
  INFO(which);
  fs::remove_all(root + "/" + which);
  fs::create_directory_symlink(victim, root + "/" + which);

  CacheOptions o = opts(root);
  o.tmp_max_age = std::chrono::seconds(0);
  StderrCapture err;
  KernelCache cache(o);
  auto hit = cache.lookup(fb.key, fb.hash, fb.fn());
  FakeBuild fresh(key_h(24));
  auto built = cache.lookup(fresh.key, fresh.hash, fresh.fn());
  auto cleared = cache.clear();
  auto log = err.finish();
  // The root cannot be written through a link: its entries are still served.
  CHECK(cache.mode() == CacheMode::read_only);
  CHECK(count_lines(log, "kdajit: warning:") == 1);
  CHECK(log.find("symbolic link") != std::string::npos);
  REQUIRE(hit.ok());
  CHECK(hit->source == CacheSource::disk);
  REQUIRE(built.ok());
  CHECK(built->entry->dir.empty());
  CHECK(!built->not_stored.empty());
  CHECK(!cleared.ok());
  CHECK(tree(victim) == before);
  CHECK(read_text(victim + "/gone.QwErTy") == "precious");
  CHECK(fs::exists(entry));
}

TEST_CASE("clear, prune and verify never follow links or remove foreign names", "[cache][hostile][links]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  FakeBuild a(key_h(8)), b(key_h(16));
  std::string entry_a = build_into(root, a);
  // A victim directory holding an entry-like tree, linked in under b's entry name.
  std::string victim = scratch / "victim";
  fs::create_directories(victim);
  for (const char* f : {"kernel.cu", "kernel.cubin", "meta.json", "last_used", "diary"})
    write_text(victim + "/" + f, "precious");
  auto before = tree(victim);
  fs::create_directory_symlink(victim, root + "/sm_90/" + stem_of(b));
  // An arch directory that is a link out of the root, and foreign names.
  fs::create_directory_symlink(victim, root + "/sm_90a");
  write_text(root + "/sm_90/" + stem_of(a) + "/notes.txt", "mine");
  write_text(root + "/locks/notes.lock", "x");
  write_text(root + "/locks/README", "x");

  KernelCache cache(opts(root));
  auto entries = cache.list_entries();
  REQUIRE(entries.size() == 3);  // the links are untrusted rows, never followed
  size_t trusted = 0;
  for (const auto& e : entries) {
    if (e.untrusted.empty()) {
      CHECK(e.dir == entry_a);
      ++trusted;
    } else {
      CHECK(e.untrusted.find("is a symbolic link") != std::string::npos);
      CHECK(e.bytes == 0);
    }
  }
  CHECK(trusted == 1);
  auto foreign = cache.foreign_paths();
  CHECK(std::find(foreign.begin(), foreign.end(), root + "/sm_90/" + stem_of(b)) == foreign.end());
  CHECK(std::find(foreign.begin(), foreign.end(), root + "/sm_90a") == foreign.end());

  CHECK(cache.prune(0).removed == 1);
  REQUIRE(cache.clear().ok());
  CHECK(tree(victim) == before);
  CHECK(read_text(root + "/locks/notes.lock") == "x");
  CHECK(read_text(root + "/locks/README") == "x");
  CHECK(fs::is_symlink(root + "/sm_90a"));
  CHECK(fs::is_symlink(root + "/sm_90/" + stem_of(b)));
  CHECK(!fs::exists(entry_a));
}

TEST_CASE("a link inside or in place of an entry is never served or written through", "[cache][hostile][links]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  FakeBuild fb(key_h(16));
  std::string entry = build_into(root, fb);
  std::string bashrc = scratch / "bashrc";
  write_text(bashrc, "export PATH=/usr/bin\n");
  std::string expect;

  SECTION("last_used -> ~/.bashrc") {
    fs::remove(entry + "/last_used");
    fs::create_symlink(bashrc, entry + "/last_used");
    expect = "last_used is a symbolic link";
  }
  SECTION("kernel.cubin -> a file elsewhere with a matching checksum") {
    std::string elsewhere = scratch / "planted.cubin";
    fs::copy_file(entry + "/kernel.cubin", elsewhere);
    fs::remove(entry + "/kernel.cubin");
    fs::create_symlink(elsewhere, entry + "/kernel.cubin");
    expect = "kernel.cubin is a symbolic link";
  }
  SECTION("the entry directory -> a valid entry outside the root") {
    std::string outside = scratch / "outside";
    fs::rename(entry, outside);
    fs::create_directory_symlink(outside, entry);
    expect = "the entry directory is a symbolic link";
  }
  SECTION("kernel.cubin is a FIFO") {
    fs::remove(entry + "/kernel.cubin");
    REQUIRE(::mkfifo((entry + "/kernel.cubin").c_str(), 0644) == 0);
    expect = "kernel.cubin is not a regular file";
  }

  KernelCache cache(opts(root));
  for (const auto& info : cache.list_entries()) CHECK(!cache.verify_entry(info).ok);
  std::atomic<int> calls{0};
  StderrCapture err;
  auto r = cache.lookup(fb.key, fb.hash, fb.fn(&calls));
  auto log = err.finish();
  REQUIRE(r.ok());
  CHECK(r->source == CacheSource::built);  // not served
  CHECK(calls == 1);
  CHECK(count_lines(log, "kdajit: warning:") == 1);
  CHECK(log.find(expect) != std::string::npos);
  CHECK(read_text(bashrc) == "export PATH=/usr/bin\n");
  // Replaced by a real entry in the root, which the next process hits.
  CHECK(r->entry->dir == entry);
  CHECK(!fs::is_symlink(entry));
  KernelCache next(opts(root));
  auto again = next.lookup(fb.key, fb.hash, fb.fn(&calls));
  REQUIRE(again.ok());
  CHECK(again->source == CacheSource::disk);
  CHECK(read_text(bashrc) == "export PATH=/usr/bin\n");
}

TEST_CASE("with umask 000 the root and its parents are created 0700, entries 0755/0644", "[cache][hostile][modes]") {
  TempDir scratch;
  std::string root = scratch / "a/b/cache";
  for (mode_t mask : {mode_t{0}, mode_t{077}}) {
    INFO("umask " << mask);
    fs::remove_all(scratch / "a");
    pid_t pid = spawn_child([&] {
      ::umask(mask);
      KernelCache cache(opts(root));
      FakeBuild fb(key_h(16));
      StderrCapture err;
      auto r = cache.get_or_build(fb.key, fb.hash, fb.fn());
      return r.ok() && !(*r)->dir.empty() ? 0 : 1;
    });
    REQUIRE(wait_child(pid) == 0);
    for (const char* d : {"a", "a/b", "a/b/cache", "a/b/cache/tmp", "a/b/cache/locks"}) {
      INFO(d);
      CHECK(mode_of(scratch / d) == 0700);
    }
    CHECK(mode_of(root + "/sm_90") == 0755);
    FakeBuild fb(key_h(16));
    std::string entry = root + "/sm_90/" + stem_of(fb);
    CHECK(mode_of(entry) == 0755);
    for (const char* f : {"kernel.cu", "kernel.cubin", "meta.json", "last_used"}) CHECK(mode_of(entry + "/" + f) == 0644);
  }
}

TEST_CASE("loose modes in one's own root: the entry or the layer is not trusted", "[cache][hostile][trust]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  FakeBuild fb(key_h(16)), other(key_h(32));
  std::string entry = build_into(root, fb);

  SECTION("a world-writable cubin: ignored, rebuilt and replaced") {
    fs::permissions(entry + "/kernel.cubin", fs::perms::all);
    std::atomic<int> calls{0};
    KernelCache cache(opts(root));
    StderrCapture err;
    auto r = cache.lookup(fb.key, fb.hash, fb.fn(&calls));
    auto log = err.finish();
    REQUIRE(r.ok());
    CHECK(r->source == CacheSource::built);
    CHECK(count_lines(log, "kdajit: warning:") == 1);
    CHECK(log.find("is not trusted (kernel.cubin is writable by every user (mode 0777))") != std::string::npos);
    CHECK(mode_of(entry + "/kernel.cubin") == 0644);
  }
  SECTION("a group-writable root: nothing in it is read or written") {
    fs::permissions(root, fs::perms::group_write, fs::perm_options::add);
    auto before = tree(root);
    std::atomic<int> calls{0};
    StderrCapture err;
    KernelCache cache(opts(root));
    auto r = cache.lookup(fb.key, fb.hash, fb.fn(&calls));
    auto r2 = cache.lookup(other.key, other.hash, other.fn(&calls));
    auto log = err.finish();
    CHECK(cache.mode() == CacheMode::memory_only);
    REQUIRE(cache.layers().size() == 1);
    CHECK(cache.layers()[0].state == LayerState::untrusted);
    REQUIRE(r.ok());
    CHECK(r->source == CacheSource::built);
    CHECK(calls == 2);
    CHECK(count_lines(log, "kdajit: warning:") == 1);
    CHECK(log.find("writable by its group (mode 0720)") != std::string::npos);
    CHECK(tree(root) == before);
  }
}

TEST_CASE("an entry that cannot be replaced costs that key only", "[cache][hostile][item5]") {
  // Mode 000 stops its owner, but not root: as root the scenario runs in a child
  // switched to uid 65534 (test_cache_two_users has the other-owner variant).
  TempDir scratch;
  const bool as_root = ::geteuid() == 0;
  if (as_root) {
    fs::permissions(scratch.path(), fs::perms::all);
    REQUIRE(::chown(scratch.path().c_str(), 65534, 65534) == 0);
  }
  std::string log = scratch / "child.log";
  auto scenario = [&]() -> int {
    redirect_stderr_to(log);
    std::string root = scratch / "cache";
    FakeBuild stuck(key_h(16)), fresh(key_h(24));
    std::string entry;
    {
      KernelCache cache(opts(root));
      auto r = cache.get_or_build(stuck.key, stuck.hash, stuck.fn());
      if (!r) return 10;
      entry = (*r)->dir;
    }
    write_text(entry + "/kernel.cubin", "garbage");
    fs::permissions(entry, fs::perms::none);
    REQUIRE(::truncate(log.c_str(), 0) == 0);
    KernelCache cache(opts(root));
    auto r = cache.lookup(stuck.key, stuck.hash, stuck.fn());
    auto f = cache.lookup(fresh.key, fresh.hash, fresh.fn());
    int code = 0;
    if (!r || !r->entry->dir.empty() || r->not_stored.empty()) code = 11;
    else if (!f || f->entry->dir.empty()) code = 12;  // unrelated keys are still stored
    else if (cache.mode() != CacheMode::read_write) code = 13;
    fs::permissions(entry, fs::perms::owner_all);
    return code;
  };
  int code = wait_child(as_root ? spawn_as(65534, scenario) : spawn_child(scenario));
  auto text = read_text(log);
  INFO(text);
  REQUIRE(code != 97);  // could not switch users
  CHECK(code == 0);
  CHECK(count_lines(text, "kdajit: warning:") == 1);
  CHECK(count_lines(text, "kdajit: compiled ") == 2);
}

TEST_CASE("hostile meta.json: deep nesting, huge, not UTF-8", "[cache][hostile][meta]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  FakeBuild fb(key_h(16));
  std::string entry = build_into(root, fb);
  std::string expect;
  SECTION("nested 100,000 deep") {
    write_text(entry + "/meta.json", std::string(100000, '['));
    expect = "not a valid JSON object";
  }
  SECTION("larger than the bound") {
    write_text(entry + "/meta.json", "\"" + std::string(2 << 20, 'x') + "\"");
    expect = "meta.json is larger than";
  }
  SECTION("invalid UTF-8 in a string") {
    write_text(entry + "/meta.json", "{\"schema\": \"\xff\xfe\"}");
    expect = "not a valid JSON object";
  }
  KernelCache cache(opts(root));
  auto entries = cache.list_entries();
  REQUIRE(entries.size() == 1);
  CHECK(!entries[0].meta.has_value());
  auto v = cache.verify_entry(entries[0]);
  CHECK(!v.ok);
  CHECK(v.reason.find(expect) != std::string::npos);
  StderrCapture err;
  auto r = cache.lookup(fb.key, fb.hash, fb.fn());
  auto log = err.finish();
  REQUIRE(r.ok());
  CHECK(r->source == CacheSource::built);
  CHECK(log.find(expect) != std::string::npos);
}

TEST_CASE("a read-only open creates, stamps and deletes nothing", "[cache][hostile][readonly]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  CacheOptions ro = opts(root);
  ro.writable = false;
  {
    KernelCache missing(ro);
    CHECK(!fs::exists(root));
    CHECK(missing.layers()[0].state == LayerState::missing);
  }
  FakeBuild fb(key_h(16)), fresh(key_h(24));
  std::string entry = build_into(root, fb);
  fs::remove_all(root + "/tmp");
  fs::remove_all(root + "/locks");
  std::string stamp = read_text(entry + "/last_used");
  auto before = tree(root);
  StderrCapture err;
  KernelCache cache(ro);
  CHECK(cache.mode() == CacheMode::read_write);  // what a writer would get
  auto hit = cache.lookup(fb.key, fb.hash, fb.fn());
  auto built = cache.lookup(fresh.key, fresh.hash, fresh.fn());
  auto probe = cache.probe(fb.key, fb.hash);
  auto probe_missing = cache.probe(fresh.key, fresh.hash);
  CHECK(!cache.clear().ok());
  CHECK(!cache.remove_entry(cache.list_entries().at(0)).ok());
  err.finish();
  REQUIRE(hit.ok());
  CHECK(hit->source == CacheSource::disk);
  REQUIRE(built.ok());
  CHECK(built->entry->dir.empty());
  CHECK(probe.state == CacheProbe::State::present);
  CHECK(probe.dir == entry);
  CHECK(probe_missing.state == CacheProbe::State::missing);
  CHECK(tree(root) == before);
  CHECK(read_text(entry + "/last_used") == stamp);
}

TEST_CASE("layers: lookups in order, new entries in the first writable layer", "[cache][layers]") {
  TempDir scratch;
  std::string first = scratch / "first", second = scratch / "second";
  FakeBuild shipped(key_h(16)), fresh(key_h(24));
  std::string shipped_dir = build_into(second, shipped);
  fs::create_directories(first);
  auto second_before = tree(second);

  SECTION("both writable: the first takes new entries, the second is only read") {
    std::atomic<int> calls{0};
    StderrCapture err;
    KernelCache cache(opts(first + ":" + second));
    auto hit = cache.lookup(shipped.key, shipped.hash, shipped.fn(&calls));
    auto built = cache.lookup(fresh.key, fresh.hash, fresh.fn(&calls));
    CHECK(err.finish().find("warning") == std::string::npos);
    REQUIRE(cache.layers().size() == 2);
    CHECK(cache.layers()[0].state == LayerState::read_write);
    CHECK(cache.layers()[1].state == LayerState::read_only);
    CHECK(cache.root() == first);
    REQUIRE(hit.ok());
    CHECK(hit->source == CacheSource::disk);
    CHECK(hit->entry->dir == shipped_dir);
    REQUIRE(built.ok());
    CHECK(built->entry->dir == first + "/sm_90/" + stem_of(fresh));
    CHECK(calls == 1);
    CHECK(tree(second) == second_before);  // not even last_used
    auto entries = cache.list_entries();
    REQUIRE(entries.size() == 2);
    CHECK(cache.clear()->removed == 1);  // the write layer only
    CHECK(fs::exists(shipped_dir));
  }
  SECTION("the first is not writable: the second takes new entries") {
    std::string ours = build_into(first, fresh);
    fs::remove_all(first + "/tmp");
    write_text(first + "/tmp", "not a directory");
    FakeBuild third(key_h(40));
    StderrCapture err;
    KernelCache cache(opts(first + ":" + second));
    auto hit = cache.lookup(fresh.key, fresh.hash, fresh.fn());
    auto built = cache.lookup(third.key, third.hash, third.fn());
    CHECK(err.finish().find("warning") == std::string::npos);
    CHECK(cache.layers()[0].state == LayerState::read_only);
    CHECK(cache.layers()[1].state == LayerState::read_write);
    REQUIRE(hit.ok());
    CHECK(hit->entry->dir == ours);
    REQUIRE(built.ok());
    CHECK(built->entry->dir == second + "/sm_90/" + stem_of(third));
  }
  SECTION("a corrupt entry in a lower layer is verified the same way") {
    write_text(shipped_dir + "/kernel.cubin", "flipped");
    std::atomic<int> calls{0};
    StderrCapture err;
    KernelCache cache(opts(first + ":" + second));
    auto r = cache.lookup(shipped.key, shipped.hash, shipped.fn(&calls));
    auto log = err.finish();
    REQUIRE(r.ok());
    CHECK(r->source == CacheSource::built);
    CHECK(r->entry->dir == first + "/sm_90/" + stem_of(shipped));
    CHECK(count_lines(log, "kdajit: warning:") == 1);
    CHECK(log.find(shipped_dir) != std::string::npos);
    CHECK(log.find("checksum") != std::string::npos);
  }
  SECTION("an untrusted layer is skipped with one warning") {
    fs::permissions(second, fs::perms::others_write, fs::perm_options::add);
    std::atomic<int> calls{0};
    StderrCapture err;
    KernelCache cache(opts(first + ":" + second));
    auto r = cache.lookup(shipped.key, shipped.hash, shipped.fn(&calls));
    auto log = err.finish();
    CHECK(cache.layers()[1].state == LayerState::untrusted);
    REQUIRE(r.ok());
    CHECK(r->source == CacheSource::built);
    CHECK(calls == 1);
    CHECK(count_lines(log, "kdajit: warning:") == 1);
    CHECK(log.find(second) != std::string::npos);
  }
  SECTION("a missing layer is skipped; only the first layer that can take writes is created") {
    std::string missing = scratch / "missing";
    KernelCache cache(opts(second + ":" + missing));
    CHECK(cache.layers()[0].state == LayerState::read_write);
    CHECK(cache.layers()[1].state == LayerState::missing);
    CHECK(!fs::exists(missing));
  }
}

TEST_CASE("a layer whose root lost its write bit takes no entries, whatever tmp/ holds", "[cache][layers][writable]") {
  TempDir scratch;
  std::string a = scratch / "A", b = scratch / "B";
  FakeBuild first(key_h(16)), second(key_h(24)), third(key_h(32));
  std::string kept = build_into(a, first);  // leaves tmp/ and locks/ in A
  REQUIRE(fs::is_directory(a + "/tmp"));
  REQUIRE(fs::is_directory(a + "/locks"));
  ::chmod(a.c_str(), 0555);  // the operator makes A read-only (root's access() would still say yes)

  SECTION("new entries go to the first layer writable now; clear acts on it only") {
    StderrCapture err;
    KernelCache cache(opts(a + ":" + b));
    REQUIRE(cache.layers().size() == 2);
    CHECK(cache.layers()[0].state == LayerState::read_only);
    CHECK(cache.layers()[0].reason == "is not writable (mode 0555)");
    CHECK(cache.layers()[1].state == LayerState::read_write);
    auto hit = cache.lookup(first.key, first.hash, first.fn());
    REQUIRE(hit.ok());
    CHECK(hit->source == CacheSource::disk);
    auto built = cache.lookup(second.key, second.hash, second.fn());
    REQUIRE(built.ok());
    CHECK(built->entry->dir == b + "/sm_90/" + stem_of(second));
    CHECK(!fs::exists(a + "/sm_90/" + stem_of(second)));
    auto cleared = cache.clear();
    REQUIRE(cleared.ok());
    CHECK(cleared->removed == 1);
    CHECK(fs::exists(kept + "/kernel.cubin"));  // A is not the write layer
    CHECK(!fs::exists(b + "/sm_90/" + stem_of(second)));
    err.finish();
  }
  SECTION("alone, it is read-only: nothing is stored and clear refuses") {
    StderrCapture err;
    KernelCache cache(opts(a));
    CHECK(cache.mode() == CacheMode::read_only);
    auto built = cache.lookup(second.key, second.hash, second.fn());
    REQUIRE(built.ok());
    CHECK(built->entry->dir.empty());
    CHECK(!cache.clear().ok());
    CHECK(fs::exists(kept + "/kernel.cubin"));
    CHECK(err.finish().find("is not writable (mode 0555)") != std::string::npos);
  }
  SECTION("made read-only while a process runs: the next entry is not stored") {
    ::chmod(a.c_str(), 0700);
    StderrCapture err;
    KernelCache cache(opts(a));
    REQUIRE(cache.mode() == CacheMode::read_write);
    ::chmod(a.c_str(), 0555);
    auto built = cache.lookup(third.key, third.hash, third.fn());
    REQUIRE(built.ok());
    CHECK(built->entry->dir.empty());
    CHECK(!fs::exists(a + "/sm_90/" + stem_of(third)));
    CHECK(err.finish().find("is not writable (mode 0555)") != std::string::npos);
  }
  ::chmod(a.c_str(), 0700);
}

TEST_CASE("maintenance opens create nothing; clear refuses a directory that is not a cache root",
          "[cache][hostile][readonly]") {
  TempDir scratch;
  std::string dir = scratch / "home";
  fs::create_directories(dir);
  write_text(dir + "/notes.txt", "mine");
  const auto before = tree(dir);
  CacheOptions o = opts(dir);
  o.create_root = false;  // verify, prune, clear
  StderrCapture err;
  {
    KernelCache cache(o);
    CHECK(cache.mode() == CacheMode::read_write);
    CHECK(cache.list_entries().empty());
    auto cleared = cache.clear();
    REQUIRE_FALSE(cleared.ok());
    CHECK(cleared.error().message.find("is not a kdajit cache root") != std::string::npos);
  }
  err.finish();
  CHECK(tree(dir) == before);  // no tmp/, no locks/
}

TEST_CASE("one trust verdict: a linked entry or <arch>/, a loose file mode, for list, verify and load alike",
          "[cache][hostile][trust]") {
  TempDir root, elsewhere;
  FakeBuild fb(key_h(16));
  std::string real = build_into(elsewhere.path(), fb);
  std::string entry = root / ("sm_90/" + stem_of(fb));
  auto verdict_everywhere = [&](std::string_view why) {
    KernelCache cache(opts(root.path()));
    auto entries = cache.list_entries();
    REQUIRE(entries.size() == 1);
    INFO(entries[0].untrusted);
    CHECK(entries[0].untrusted.find(why) != std::string::npos);
    auto v = cache.verify_entry(entries[0]);
    CHECK_FALSE(v.ok);
    CHECK(v.untrusted);
    auto probe = cache.probe(fb.key, fb.hash);
    CHECK(probe.state == CacheProbe::State::unusable);
    CHECK(probe.reason.find("not trusted") != std::string::npos);
    CHECK(cache.foreign_paths().empty());  // reported once, as untrusted
  };
  StderrCapture err;
  SECTION("the entry directory is a link") {
    fs::create_directories(root / "sm_90");
    fs::create_directory_symlink(real, entry);
    verdict_everywhere("the entry directory is a symbolic link");
  }
  SECTION("<arch>/ is a link") {
    fs::create_directory_symlink(elsewhere / "sm_90", root / "sm_90");
    verdict_everywhere(root / "sm_90 is a symbolic link");
  }
  SECTION("the cubin is writable by everyone") {
    build_into(root.path(), fb);
    ::chmod((entry + "/kernel.cubin").c_str(), 0666);
    verdict_everywhere("kernel.cubin is writable by every user (mode 0666)");
  }
  err.finish();
}

TEST_CASE("meta.json fields keep their JSON types: no boolean, fraction or wrapped integer is a schema",
          "[cache][hostile][meta]") {
  TempDir root;
  FakeBuild fb(key_h(16));
  std::string entry = build_into(root.path(), fb);
  auto meta = nlohmann::json::parse(read_text(entry + "/meta.json"));
  const nlohmann::json value = GENERATE(nlohmann::json(true), nlohmann::json(1.7), nlohmann::json(4294967297LL),
                                        nlohmann::json("1"));
  meta["schema"] = value;
  write_text(entry + "/meta.json", meta.dump());
  INFO(value.dump());
  StderrCapture err;
  KernelCache cache(opts(root.path()));
  auto entries = cache.list_entries();
  REQUIRE(entries.size() == 1);
  auto v = cache.verify_entry(entries[0]);
  CHECK_FALSE(v.ok);
  CHECK(v.reason.find("meta.json field 'schema' has the wrong type") != std::string::npos);
  std::atomic<int> calls{0};
  auto r = cache.lookup(fb.key, fb.hash, fb.fn(&calls));
  REQUIRE(r.ok());
  CHECK(r->source == CacheSource::built);
  CHECK(calls == 1);
  err.finish();
}
