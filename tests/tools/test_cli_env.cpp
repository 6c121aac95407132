// `kdajit env` and the selfcheck's skip: what an operator reads about this
// machine, without creating anything.
#include "cli_test_util.hpp"

using namespace kdajit;
using namespace kdajit::test;
using nlohmann::json;

TEST_CASE("env --json: versions, arch and its source, layers, entries per arch, stale, variables", "[cli][env]") {
  TempDir scratch;
  std::string missing = scratch / "system", mine = scratch / "mine";
  REQUIRE(cli({"prewarm", "--cache-dir", mine, "--op", "single", "--heads", "8", "--state", "f32", "--conv", "sd",
               "--gate", "bounded", "--route", "rowcta", "--arch", "sm_90"},
              scratch.path())
              .code == 0);
  // A copy of the entry under another hash, as an older kdajit would have left it: stale.
  std::string entry;
  for (const auto& e : fs::directory_iterator(mine + "/sm_90")) entry = e.path().string();
  std::string old = entry.substr(0, entry.size() - 16) + "0000000000000000";
  fs::copy(entry, old);
  auto meta = json::parse(read_text(old + "/meta.json"));
  meta["library_version"] = "0.0.1";
  write_text(old + "/meta.json", meta.dump());

  std::map<std::string, std::string> env = {{"KDAJIT_CACHE_DIR", missing + ":" + mine},
                                            {"KDAJIT_ARCH", "sm_90a"},
                                            {"KDAJIT_CACHE_MAX_BYTES", "1000000"},
                                            {"KDAJIT_CACHEDIR", "typo"}};
  Run r = cli({"env", "--json"}, scratch.path(), env);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  json j = parse_json(r);
  CHECK(j["version"] == "0.1.0");
  CHECK(!j["nvrtc"]["version"].get<std::string>().empty());
  CHECK(j["nvrtc"]["library"].get<std::string>().find("nvrtc") != std::string::npos);
  CHECK(j["driver"].contains("loaded"));
  CHECK(j["arch"] == json({{"value", "sm_90a"}, {"source", "KDAJIT_ARCH"}}));
  const json& c = j["cache"];
  CHECK(c["source"] == "KDAJIT_CACHE_DIR");
  CHECK(c["setting"] == missing + ":" + mine);
  CHECK(c["max_bytes"] == 1000000);
  CHECK(c["write_layer"] == mine);
  REQUIRE(c["layers"].size() == 2);
  CHECK(c["layers"][0]["path"] == missing);
  CHECK(c["layers"][0]["state"] == "missing");
  CHECK(c["layers"][0]["writable"] == false);
  CHECK(c["layers"][1]["state"] == "read-write");
  CHECK(c["layers"][1]["writable"] == true);
  CHECK(c["layers"][1]["entries"] == 2);
  CHECK(c["layers"][1]["entries_per_arch"] == json({{"sm_90", 2}}));
  CHECK(c["layers"][1]["stale"] == 1);
  CHECK(j["variables"]["KDAJIT_ARCH"] == "sm_90a");
  CHECK(j["variables"]["KDAJIT_LOG"] == "info");
  CHECK(j["variables"]["KDAJIT_DISABLE_JIT"].is_null());
  CHECK(j["unknown_variables"] == json({{"KDAJIT_CACHEDIR", "typo"}}));
  CHECK(!fs::exists(missing));  // read-only: nothing created

  Run text = cli({"env"}, scratch.path(), env);
  CHECK(text.code == 0);
  CHECK(text.out.find("arch     sm_90a (from KDAJIT_ARCH)") != std::string::npos);
  CHECK(text.out.find("layer 1 " + missing + "  missing") != std::string::npos);
  CHECK(text.out.find("layer 2 " + mine + "  read-write: 2 entries (sm_90 2), 1 stale") != std::string::npos);
  CHECK(text.out.find("KDAJIT_CACHEDIR=typo  (not a kdajit variable: a typo?)") != std::string::npos);
  // Which setting chose the root.
  Run home = cli({"env", "--json"}, scratch.path(), {{"HOME", scratch / "home"}, {"XDG_CACHE_HOME", "\x01unset"}});
  CHECK(parse_json(home)["cache"]["source"] == "HOME");
  CHECK(parse_json(home)["cache"]["setting"] == scratch / "home/.cache/kdajit");
  Run flag = cli({"env", "--json", "--cache-dir", mine}, scratch.path());
  CHECK(parse_json(flag)["cache"]["source"] == "--cache-dir");
  CHECK(!fs::exists(scratch / "home"));
}

TEST_CASE("selfcheck without a GPU: exit 77, and JSON under --json", "[cli][selfcheck]") {
  TempDir scratch;
  json env = parse_json(cli({"env", "--json"}, scratch.path()));
  if (!env["driver"]["gpus"].empty()) return;  // a GPU machine runs the check itself (tests/gpu)
  Run text = cli({"selfcheck", "--cache-dir", scratch / "cache"}, scratch.path());
  CHECK(text.code == 77);
  CHECK(text.out.find("no CUDA GPU on this machine; skipped") != std::string::npos);
  CHECK(text.err.empty());
  Run j = cli({"selfcheck", "--json", "--cache-dir", scratch / "cache"}, scratch.path());
  CHECK(j.code == 77);
  CHECK(parse_json(j) == json({{"status", "skipped"}, {"reason", "no CUDA GPU on this machine"}}));
}
