// One node booting: N ranks start `kdajit prewarm` of the same keys together
// against one empty cache directory. Every key is compiled once on the node
// (the cache's single flight across processes), no rank reads a partial entry
// (each gets a complete one, and `verify` finds every entry whole), and a second
// boot from the filled directory as a read-only warm layer compiles nothing and
// leaves the warm layer as it was.
//
// Built twice: on the CPU (KDAJIT_NODE_BOOT_GPUS undefined) the ranks are
// processes of this machine building for sm_90; with KDAJIT_NODE_BOOT_GPUS the
// binary needs two GPUs or more (it exits 77 below) and rank r is GPU r
// (`--device r`), every GPU visible, and afterwards each rank runs the node's
// kernels on its own GPU (`selfcheck --device r`).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "cli_test_util.hpp"

using namespace kdajit;
using namespace kdajit::test;
using nlohmann::json;

namespace {

// The keys every rank pre-warms: the single op's f32 family on three routes.
const std::vector<std::string> kKeyPattern = {"--op",   "single",  "--heads", "8",       "--state", "f32",
                                              "--conv", "sd",      "--gate",  "bounded", "--route", "rowcta,split2,split4"};
constexpr size_t kKeys = 3;

int ranks() {
#ifdef KDAJIT_NODE_BOOT_GPUS
  static int n = [] {
    TempDir scratch;
    json env = parse_json(cli({"env", "--json"}, scratch.path()));
    return static_cast<int>(env["driver"]["gpus"].size());
  }();
  return n;
#else
  return 4;
#endif
}

// How rank r names its target: its GPU, or the arch on the CPU.
std::vector<std::string> target_of(int rank) {
#ifdef KDAJIT_NODE_BOOT_GPUS
  return {"--device", std::to_string(rank)};
#else
  (void)rank;
  return {"--arch", "sm_90"};
#endif
}

struct RankReport {
  int code = -1;
  json out;
  std::string err;
};

// Starts every rank at once and waits for all; one `prewarm --json` report each.
std::vector<RankReport> boot(const std::string& dir, const std::map<std::string, std::string>& env, const char* tag) {
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks(); ++r) {
    std::vector<std::string> args = {"prewarm", "--json", "-j", "2"};
    args.insert(args.end(), kKeyPattern.begin(), kKeyPattern.end());
    for (auto& a : target_of(r)) args.push_back(a);
    pids.push_back(start_cli(args, dir, fmt::format("{}{}", tag, r), env));
  }
  std::vector<RankReport> out;
  for (int r = 0; r < ranks(); ++r) {
    Run run = finish_cli(pids[r], dir, fmt::format("{}{}", tag, r), 600);
    RankReport rep{run.code, json::parse(run.out, nullptr, false), run.err};
    out.push_back(rep);
  }
  return out;
}

// Per rank: compiles, keys found cached, the longest wait for a key (ms), wall time.
void print_reports(const char* what, const std::vector<RankReport>& reports) {
  fmt::print("{}\n", what);
  for (size_t r = 0; r < reports.size(); ++r) {
    const json& j = reports[r].out;
    if (j.is_discarded()) {
      fmt::print("  rank {}: exit {}, no JSON report: {}\n", r, reports[r].code, reports[r].err);
      continue;
    }
    double longest = 0;
    for (const auto& row : j["results"]) longest = std::max(longest, row.value("ms", 0.0));
    fmt::print("  rank {}: exit {}, {} compiled, {} cached, {} failed, longest key {:.0f} ms, wall {:.2f} s\n", r,
               reports[r].code, j.value("compiled", 0), j.value("cached", 0), j.value("failed", 0), longest,
               j.value("wall_s", 0.0));
  }
}

// Every file under `root` with its mode and size, and for other users than root
// its modification time: root may write a 555 layer, so for root that layer is
// the write layer, whose entries a lookup restamps (their use time, for the LRU).
std::map<std::string, std::string> tree_of(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    struct stat st {};
    ::lstat(e.path().c_str(), &st);
    out[e.path().string()] =
        ::geteuid() == 0 ? fmt::format("{} {}", st.st_mode, st.st_size)
                         : fmt::format("{} {} {}.{}", st.st_mode, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  }
  return out;
}

void chmod_tree(const std::string& root, mode_t dirs, mode_t files) {
  ::chmod(root.c_str(), dirs | 0200);  // writable while the tree below changes
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (!e.is_directory()) ::chmod(e.path().c_str(), files);
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_directory()) ::chmod(e.path().c_str(), dirs);
  ::chmod(root.c_str(), dirs);
}

// Makes a tree read-only for its lifetime, writable again after (so that the
// scratch directory can be removed, also when a check failed).
struct ReadOnlyTree {
  std::string root;
  explicit ReadOnlyTree(std::string r) : root(std::move(r)) { chmod_tree(root, 0555, 0444); }
  ~ReadOnlyTree() { chmod_tree(root, 0755, 0644); }
};

}  // namespace

TEST_CASE("a node boots: every key compiled once, no partial entry read, a warm read-only layer compiles nothing",
          "[cli][node-boot]") {
#ifdef KDAJIT_NODE_BOOT_GPUS
  REQUIRE(ranks() >= 2);
#endif
  TempDir scratch;
  const std::string shared = scratch / "shared-cache";
  // One empty cache directory for the node; the ranks create it together.
  std::vector<RankReport> first = boot(scratch.path(), {{"KDAJIT_CACHE_DIR", shared}}, "boot");
  print_reports("first boot, empty cache:", first);
  size_t compiled = 0;
  std::map<std::string, int> compiles_per_key;
  std::set<std::string> keys;
  for (const auto& rep : first) {
    INFO(rep.err);
    REQUIRE(rep.code == 0);
    REQUIRE(!rep.out.is_discarded());
    CHECK(rep.out["keys"] == kKeys);
    CHECK(rep.out["failed"] == 0);
    CHECK(rep.out["not_stored"] == 0);
    CHECK(rep.out["compiled"].get<size_t>() + rep.out["cached"].get<size_t>() == kKeys);
    compiled += rep.out["compiled"].get<size_t>();
    for (const auto& row : rep.out["results"]) {
      keys.insert(row["key"].get<std::string>());
      // A complete entry: the directory the rank got holds the cubin it names.
      CHECK(fs::exists(row["dir"].get<std::string>()));
      if (row["status"] == "compiled") ++compiles_per_key[row["key"].get<std::string>()];
    }
  }
  // On GPUs of several archs each arch is its own key set, compiled once each.
  CHECK(compiled == keys.size());
  for (const auto& [key, n] : compiles_per_key) {
    INFO(key);
    CHECK(n == 1);
  }
  // Every entry is whole (hash, cubin, metadata) and nothing is left half-written.
  Run verified = cli({"verify", "--json", "--cache-dir", shared}, scratch.path());
  json v = parse_json(verified);
  CHECK(verified.code == 0);
  CHECK(v["checked"] == keys.size());
  CHECK(v["ok"] == keys.size());
  CHECK(v["bad"].empty());

#ifdef KDAJIT_NODE_BOOT_GPUS
  // Each rank runs the node's kernels of its arch on its own GPU.
  std::vector<pid_t> checks;
  for (int r = 0; r < ranks(); ++r)
    checks.push_back(start_cli({"selfcheck", "--json", "--device", std::to_string(r), "--cache-dir", shared},
                               scratch.path(), fmt::format("selfcheck{}", r)));
  for (int r = 0; r < ranks(); ++r) {
    Run run = finish_cli(checks[r], scratch.path(), fmt::format("selfcheck{}", r), 600);
    INFO("rank " << r << ": " << run.out << run.err);
    CHECK(run.code == 0);
    CHECK(parse_json(run)["status"] == "passed");
  }
#endif

  // Second boot: the filled directory is a read-only warm layer in front of an
  // empty one of the rank's own.
  ReadOnlyTree warm(shared);
  const auto before = tree_of(shared);
  const std::string own = scratch / "own-cache";
  std::vector<RankReport> second = boot(scratch.path(), {{"KDAJIT_CACHE_DIR", shared + ":" + own}}, "warm");
  print_reports("second boot, warm read-only layer:", second);
  for (const auto& rep : second) {
    INFO(rep.err);
    REQUIRE(rep.code == 0);
    REQUIRE(!rep.out.is_discarded());
    CHECK(rep.out["compiled"] == 0);
    CHECK(rep.out["failed"] == 0);
    CHECK(rep.out["cached"] == kKeys);
    // Root may write anywhere: only for other users is the 555 layer read-only.
    if (::geteuid() != 0) CHECK(rep.out["layers"][0]["state"] == "read-only");
  }
  CHECK(tree_of(shared) == before);  // the warm layer is read, never written
}
