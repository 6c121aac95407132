// The trust model with two users: the test runs as root, sets up roots and
// entries owned by an attacker (uid 65533), and checks what a victim (uid 65534,
// a forked child) does with them. Skipped (77) where users cannot be switched.
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "cache_test_util.hpp"
#include "catch.hpp"
#include "kdajit/cache.hpp"

using namespace kdajit;
using namespace kdajit::test;

namespace {

constexpr uid_t kVictim = 65534;
constexpr uid_t kAttacker = 65533;

std::string stem_of(const FakeBuild& fb) { return key_name(fb.key) + "." + fb.hash.substr(0, 16); }

void chown_tree(const std::string& path, uid_t uid) {
  REQUIRE(::lchown(path.c_str(), uid, uid) == 0);
  if (!fs::is_directory(fs::symlink_status(path))) return;
  for (const auto& e : fs::recursive_directory_iterator(path)) REQUIRE(::lchown(e.path().c_str(), uid, uid) == 0);
}

// A scratch dir the victim can enter.
struct SharedScratch : TempDir {
  SharedScratch() { fs::permissions(path(), fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec); }
};

// An entry for fb whose cubin the attacker replaced, with a matching checksum and
// hash in meta.json: it passes every content check. Written as root, then given
// to `owner`. Returns the entry dir.
std::string plant_forged_entry(const std::string& root, const FakeBuild& fb, uid_t owner) {
  FakeBuild forged = fb;
  forged.cubin = "ATTACKER CODE " + std::string(4000, 'A');
  {
    KernelCache cache(opts(root));
    StderrCapture err;
    auto r = cache.get_or_build(forged.key, forged.hash, forged.fn());
    err.finish();
    REQUIRE(r.ok());
    REQUIRE(!(*r)->dir.empty());
  }
  std::string dir = root + "/sm_90/" + stem_of(fb);
  chown_tree(dir, owner);
  return dir;
}

// Runs fn as the victim with stderr in `log`; returns its exit code.
int as_victim(const std::string& log, const std::function<int()>& fn) {
  write_text(log, "");
  REQUIRE(::chown(log.c_str(), kVictim, kVictim) == 0);
  return wait_child(spawn_as(kVictim, [&] {
    redirect_stderr_to(log);
    return fn();
  }));
}

}  // namespace

TEST_CASE("two users: a shared 1777 root is not trusted, a planted cubin never runs", "[cache][two-users][trust]") {
  SharedScratch scratch;
  std::string shared = scratch / "shared";
  FakeBuild fb(key_h(16));
  // The attack: another user replaces a cubin and its checksum in a shared root.
  plant_forged_entry(shared, fb, kAttacker);
  REQUIRE(::chmod(shared.c_str(), 01777) == 0);
  REQUIRE(::chown((shared + "/sm_90").c_str(), kAttacker, kAttacker) == 0);
  auto before = read_text(shared + "/sm_90/" + stem_of(fb) + "/kernel.cubin");
  REQUIRE(before.rfind("ATTACKER", 0) == 0);

  std::string log = scratch / "victim.log";
  int code = as_victim(log, [&] {
    KernelCache cache(opts(shared));
    if (cache.layers().at(0).state != LayerState::untrusted) return 10;
    if (cache.mode() != CacheMode::memory_only) return 11;
    auto r = cache.lookup(fb.key, fb.hash, fb.fn());
    if (!r || r->source != CacheSource::built) return 12;
    if (r->entry->cubin != fb.cubin) return 13;  // the victim's own build, not the planted one
    if (!r->entry->dir.empty() || r->not_stored.empty()) return 14;
    if (!cache.list_entries().empty()) return 15;  // nothing of an untrusted layer is read
    return 0;
  });
  auto text = read_text(log);
  INFO(text);
  CHECK(code == 0);
  CHECK(count_lines(text, "kdajit: warning:") == 1);
  CHECK(text.find("writable by every user (mode 1777)") != std::string::npos);
  CHECK(read_text(shared + "/sm_90/" + stem_of(fb) + "/kernel.cubin") == before);
  // The victim wrote nothing into the shared root.
  for (const auto& e : fs::recursive_directory_iterator(shared)) CHECK(owner_of(e.path()) != kVictim);
}

TEST_CASE("two users: in a root-owned system layer, another user's entry is ignored and rebuilt privately",
          "[cache][two-users][trust][layers]") {
  SharedScratch scratch;
  std::string sys = scratch / "system", own = scratch / "victim";
  FakeBuild planted(key_h(16)), shipped(key_h(24));
  // The image's layer, pre-warmed by root and readable by everyone ...
  fs::create_directories(sys);
  ::chmod(sys.c_str(), 0755);
  {
    KernelCache cache(opts(sys));
    StderrCapture err;
    REQUIRE(cache.get_or_build(shipped.key, shipped.hash, shipped.fn()).ok());
  }
  // ... with one entry that belongs to another user (who could rewrite it).
  std::string forged = plant_forged_entry(sys, planted, kAttacker);
  fs::create_directories(own);
  chown_tree(own, kVictim);

  std::string log = scratch / "victim.log";
  int code = as_victim(log, [&] {
    KernelCache cache(opts(sys + ":" + own));
    if (cache.layers().at(0).state != LayerState::read_only) return 10;
    if (cache.layers().at(1).state != LayerState::read_write) return 11;
    auto hit = cache.lookup(shipped.key, shipped.hash, shipped.fn());
    if (!hit || hit->source != CacheSource::disk || hit->entry->dir.rfind(sys, 0) != 0) return 12;
    auto r = cache.lookup(planted.key, planted.hash, planted.fn());
    if (!r || r->source != CacheSource::built || r->entry->cubin != planted.cubin) return 13;
    if (r->entry->dir != own + "/sm_90/" + stem_of(planted)) return 14;
    for (const auto& info : cache.list_entries()) {
      auto v = cache.verify_entry(info);
      if (info.dir == forged && (v.ok || !v.untrusted)) return 15;
      if (info.dir != forged && !v.ok) return 16;
    }
    return 0;
  });
  auto text = read_text(log);
  INFO(text);
  CHECK(code == 0);
  CHECK(count_lines(text, "kdajit: warning:") == 1);
  CHECK(text.find("is not trusted (the entry directory is owned by uid 65533)") != std::string::npos);
  CHECK(fs::exists(forged + "/kernel.cubin"));  // not the victim's to remove
}

TEST_CASE("two users: an entry the user cannot replace costs that key only", "[cache][two-users][item5]") {
  SharedScratch scratch;
  std::string root = scratch / "victim";
  FakeBuild stuck(key_h(16)), fresh(key_h(24));
  fs::create_directories(root);
  std::string entry = plant_forged_entry(root, stuck, kAttacker);  // owned by someone else
  write_text(entry + "/kernel.cubin", "garbage");
  ::chmod(entry.c_str(), 0755);
  chown_tree(root, kVictim);
  chown_tree(entry, kAttacker);

  std::string log = scratch / "victim.log";
  for (int run = 0; run < 2; ++run) {
    INFO("run " << run);
    int code = as_victim(log, [&] {
      KernelCache cache(opts(root));
      auto r = cache.lookup(stuck.key, stuck.hash, stuck.fn());
      if (!r || r->source != CacheSource::built || !r->entry->dir.empty()) return 10;
      if (r->not_stored.find("owned by uid 65533") == std::string::npos) return 11;
      auto f = cache.lookup(fresh.key, fresh.hash, fresh.fn());
      if (!f) return 12;
      if (run == 0 && (f->source != CacheSource::built || f->entry->dir.empty())) return 13;
      if (run == 1 && f->source != CacheSource::disk) return 14;  // stored by the first run
      return cache.mode() == CacheMode::read_write ? 0 : 15;
    });
    auto text = read_text(log);
    INFO(text);
    CHECK(code == 0);
    CHECK(count_lines(text, "kdajit: warning:") == 1);
  }
  CHECK(read_text(entry + "/kernel.cubin") == "garbage");
}

TEST_CASE("two users: clear and the sweep leave what another user owns", "[cache][two-users][sweep]") {
  SharedScratch scratch;
  std::string root = scratch / "victim";
  FakeBuild mine(key_h(8)), theirs(key_h(16));
  fs::create_directories(root);
  std::string foreign_entry = plant_forged_entry(root, theirs, kAttacker);
  std::string foreign_staging = root + "/tmp/" + stem_of(theirs) + ".AbCdEf";
  fs::create_directories(foreign_staging);
  write_text(foreign_staging + "/kernel.cu", "theirs");
  write_text(root + "/locks/" + stem_of(theirs) + ".lock", "");
  chown_tree(root, kVictim);
  for (const auto& p : {foreign_entry, foreign_staging, root + "/locks/" + stem_of(theirs) + ".lock"})
    chown_tree(p, kAttacker);
  age_path(foreign_staging, 7200);

  std::string log = scratch / "victim.log";
  int code = as_victim(log, [&] {
    CacheOptions o = opts(root);
    o.tmp_max_age = std::chrono::seconds(0);
    KernelCache cache(o);
    if (!cache.get_or_build(mine.key, mine.hash, mine.fn())) return 10;
    auto r = cache.clear();
    if (!r || r->removed != 1) return 11;
    return 0;
  });
  INFO(read_text(log));
  CHECK(code == 0);
  CHECK(!fs::exists(root + "/sm_90/" + stem_of(mine)));
  CHECK(fs::exists(foreign_entry + "/kernel.cubin"));
  CHECK(read_text(foreign_staging + "/kernel.cu") == "theirs");
  CHECK(fs::exists(root + "/locks/" + stem_of(theirs) + ".lock"));
}

// A read-only bind mount of a tree another user can write proves nothing: the
// entries under it are judged by their owners like everywhere else. The mount
// needs CAP_SYS_ADMIN; where it is refused the same tree is checked unmounted.
TEST_CASE("two users: a read-only bind mount of another user's entries is not trusted", "[cache][two-users][trust]") {
  SharedScratch scratch;
  std::string under = scratch / "under", ro = scratch / "ro";
  FakeBuild fb(key_h(16));
  fs::create_directories(under);
  fs::create_directories(ro);
  ::chmod(under.c_str(), 0755);
  std::string forged = plant_forged_entry(under, fb, kVictim);
  chown_tree(under + "/sm_90", kVictim);  // uid 65534 can swap cubin and checksum through under/

  std::string log = scratch / "root.log";
  write_text(log, "");
  // In a private mount namespace, so nothing outlives the child.
  int code = wait_child(spawn_child([&] {
    redirect_stderr_to(log);
    std::string layer = ro;
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount(under.c_str(), ro.c_str(), nullptr, MS_BIND, nullptr) != 0 ||
        ::mount(nullptr, ro.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) != 0) {
      std::fprintf(stderr, "no read-only bind mount here (%s); checking the tree unmounted\n", std::strerror(errno));
      layer = under;
    } else if (::access((ro + "/sm_90").c_str(), F_OK) != 0) {
      return 20;
    }
    KernelCache cache(opts(layer));
    if (layer == ro && cache.layers().at(0).reason != "is on a read-only file system") return 21;
    for (const auto& info : cache.list_entries()) {
      if (info.untrusted.find("owned by uid 65534") == std::string::npos) return 22;
      auto v = cache.verify_entry(info);
      if (v.ok || !v.untrusted) return 23;
    }
    if (cache.list_entries().size() != 1) return 24;
    std::atomic<int> calls{0};
    auto r = cache.lookup(fb.key, fb.hash, fb.fn(&calls));
    if (!r || r->source != CacheSource::built || r->entry->cubin != fb.cubin || calls != 1) return 25;
    return 0;
  }));
  auto text = read_text(log);
  INFO(text);
  CHECK(code == 0);
  CHECK(text.find("sm_90 is owned by uid 65534); rebuilding it") != std::string::npos);
  CHECK(fs::exists(forged + "/kernel.cubin"));
}
