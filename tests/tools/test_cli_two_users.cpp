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

// `kdajit args...` as the victim; outputs in `dir` (which the victim can write).
Run cli_as_victim(const std::vector<std::string>& args, const std::string& dir) {
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
    ::_exit(wait_child(start_cli(args, dir, tag, {{"HOME", dir}, {"TMPDIR", dir}})));
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
