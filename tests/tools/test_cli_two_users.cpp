// The trust model through the CLI: a root runs setup, a child switched to uid
// 65534 runs kdajit. Skipped (77) where users cannot be switched.
#include <grp.h>

#include "cli_test_util.hpp"
#include "kdajit/sha256.hpp"

using namespace kdajit;
using namespace kdajit::test;
using nlohmann::json;

namespace {

constexpr uid_t kVictim = 65534;
constexpr uid_t kAttacker = 65533;

// The kdajit binary where the victim can run it: the build tree may lie under a
// directory only root can enter (/root, a 0700 mktemp -d), so a copy goes to a
// fresh 0755 directory in /tmp (the binary links kdajit statically; NVRTC is
// found in the CUDA toolkit). Exit 77 (skipped) when even that is out of reach.
const std::string& victim_cli() {
  static const std::string path = [] {
    std::string dir = "/tmp/kdajit-cli.XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr || ::chmod(dir.c_str(), 0755) != 0) return std::string();
    std::error_code ec;
    fs::copy_file(KDAJIT_CLI, dir + "/kdajit", ec);
    if (ec || ::chmod((dir + "/kdajit").c_str(), 0755) != 0) return std::string();
    std::atexit([] { fs::remove_all(fs::path(victim_cli()).parent_path()); });
    return dir + "/kdajit";
  }();
  return path;
}

// Exits 77 unless the victim can run the copied binary and write in `dir`.
void require_victim_reaches(const std::string& dir) {
  const std::string& exe = victim_cli();
  int code = exe.empty() ? 1 : wait_child(spawn_as(kVictim, [&] {
    return ::access(exe.c_str(), X_OK) == 0 && ::access(dir.c_str(), W_OK | X_OK) == 0 ? 0 : 1;
  }));
  if (code != 0) {
    std::fprintf(stderr, "uid %u cannot run %s or write %s: skipping the two-user CLI tests\n", kVictim,
                 exe.empty() ? "a copy of kdajit" : exe.c_str(), dir.c_str());
    std::fflush(stderr);
    std::_Exit(77);
  }
}

// `kdajit args...` as the victim; outputs in `dir` (which the victim can write).
Run cli_as_victim(const std::vector<std::string>& args, const std::string& dir) {
  require_victim_reaches(dir);
  static int n = 0;
  std::string tag = fmt::format("victim{}", n++);
  for (const char* ext : {".out", ".err"}) {
    write_text(dir + "/" + tag + ext, "");
    REQUIRE(::chown((dir + "/" + tag + ext).c_str(), kVictim, kVictim) == 0);
  }
  // A child switches users, then starts kdajit the way every CLI test does.
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(kVictim) != 0 || ::setuid(kVictim) != 0) ::_exit(97);
    ::_exit(wait_child(start_cli(args, dir, tag, {{"HOME", dir}, {"TMPDIR", dir}}, -1, victim_cli())));
  }
  int code = wait_child(pid);
  Run r;
  r.code = code;
  r.out = read_text(dir + "/" + tag + ".out");
  r.err = read_text(dir + "/" + tag + ".err");
  return r;
}

}  // namespace

TEST_CASE("two users: prewarm and verify do not trust another user's planted entry", "[cli][two-users]") {
  TempDir scratch;
  fs::permissions(scratch.path(), fs::perms::all);
  std::string shared = scratch / "shared";
  const std::vector<std::string> key = {"--op", "single", "--heads", "8", "--state", "f32", "--conv", "sd", "--gate",
                                        "bounded", "--route", "rowcta", "--arch", "sm_90"};
  std::vector<std::string> warm = {"prewarm", "--cache-dir", shared};
  warm.insert(warm.end(), key.begin(), key.end());
  REQUIRE(cli(warm, scratch.path()).code == 0);
  // The attacker's cubin with a matching checksum, owned by the attacker, in a 1777 root.
  std::string entry;
  for (const auto& e : fs::directory_iterator(shared + "/sm_90")) entry = e.path().string();
  std::string forged = "ATTACKER";
  write_text(entry + "/kernel.cubin", forged);
  auto meta = json::parse(read_text(entry + "/meta.json"));
  meta["cubin_sha256"] = sha256_hex(forged);
  write_text(entry + "/meta.json", meta.dump());
  for (const auto& p : fs::recursive_directory_iterator(shared)) REQUIRE(::lchown(p.path().c_str(), kAttacker, kAttacker) == 0);
  ::chmod(shared.c_str(), 01777);

  Run v = cli_as_victim({"verify", "--cache-dir", shared}, scratch.path());
  INFO(v.out << v.err);
  CHECK(v.code == 1);
  CHECK(v.err.find("kdajit: error: verify: cache root " + shared + " is writable by every user (mode 1777)") !=
        std::string::npos);
  Run p = cli_as_victim(warm, scratch.path());
  INFO(p.out << p.err);
  CHECK(p.code == 1);  // compiled for itself, but nothing could be stored
  CHECK(p.out.find("1 compiled, 0 already cached") != std::string::npos);
  CHECK(p.out.find("not stored on disk: cache root " + shared + " is writable by every user") != std::string::npos);
  CHECK(read_text(entry + "/kernel.cubin") == forged);
}
