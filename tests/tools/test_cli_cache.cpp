// The cache verbs of the `kdajit` binary, with real NVRTC compiles (no GPU needed).
#include <set>

#include "cli_test_util.hpp"

using namespace kdajit;
using namespace kdajit::test;
using nlohmann::json;

// The 16 keys are 8 programs (the keys of H 16 and 64 share one): each program
// is compiled once on the "node", by one process, and every other key is cached
// or stored from that program's cubin.
TEST_CASE("8 kdajit prewarm processes on 16 keys compile each program exactly once", "[cli][race]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  // Sixteen keys written three ways: a pattern, plus a key name and a key object that
  // repeat two of its keys (deduplicated).
  write_text(scratch / "manifest.json", R"([
    {"op": "packed", "heads": [16, 64], "state": ["f32", "bf16"], "conv": ["sd", "ds"], "t": [2, 3], "gate": "bounded", "route": "rowcta"},
    ")" + name_of("bf16", 16, 2) + R"(",
    {"op": "packed", "heads": 64, "state": "f32", "conv": "ds", "t": 3, "gate": "bounded", "route": "rowcta", "arch": "sm_90"}
  ])");
  constexpr int kProcs = 8;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p)
    pids.push_back(start_cli({"prewarm", "--cache-dir", root, "--manifest", scratch / "manifest.json", "--arch",
                              "sm_90", "-j", "2", "--json"},
                             scratch.path(), fmt::format("p{}", p)));
  std::map<std::string, int> compiled_by_name;
  int compiled_lines = 0;
  size_t compiled_in_summaries = 0;
  for (int p = 0; p < kProcs; ++p) {
    Run r = finish_cli(pids[static_cast<size_t>(p)], scratch.path(), fmt::format("p{}", p));
    INFO("process " << p << ":\n" << r.err);
    CHECK(r.code == 0);
    CHECK(count_lines(r.err, "kdajit:") == 0);
    // One progress line per key: "[i/16] <name>  compiled in ..." or "... cached".
    std::istringstream in(r.err);
    for (std::string line; std::getline(in, line);) {
      size_t at = line.find("  compiled in ");
      if (line.rfind("[", 0) != 0 || at == std::string::npos) continue;
      ++compiled_lines;
      size_t start = line.find("] ") + 2;
      ++compiled_by_name[line.substr(start, at - start)];
    }
    json s = parse_json(r);
    CHECK(s["keys"] == 16);
    CHECK(s["failed"] == 0);
    CHECK(s["programs"] == 8);
    CHECK(s["compiled"].get<size_t>() + s["cached"].get<size_t>() + s["reused"].get<size_t>() == 16);
    compiled_in_summaries += s["compiled"].get<size_t>();
  }
  CHECK(compiled_lines == 8);
  CHECK(compiled_in_summaries == 8);
  CHECK(compiled_by_name.size() == 8);
  std::set<std::string> programs;
  for (const auto& [name, n] : compiled_by_name) {
    INFO(name);
    CHECK(n == 1);
    auto key = parse_key(name);
    REQUIRE(key.ok());
    programs.insert(program_name(*key));
  }
  CHECK(programs.size() == 8);

  Run v = cli({"verify", "--cache-dir", root, "--json"}, scratch.path());
  CHECK(v.code == 0);
  json vj = parse_json(v);
  CHECK(vj["checked"] == 16);
  CHECK(vj["ok"] == 16);
  CHECK(vj["bad"].empty());
  CHECK(fs::is_empty(root + "/tmp"));
}

TEST_CASE("ls counts the files that the keys of one program share once on disk", "[cli][verbs]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  // Route rowcta of the packed op reads H at run time: the h16 key is the h8 key's program.
  Run warm = cli({"prewarm", "--cache-dir", root, "--op", "packed", "--heads", "8,16", "--state", "f32", "--conv", "ds",
                  "--t", "2", "--gate", "bounded", "--route", "rowcta", "--arch", "sm_90"},
                 scratch.path());
  INFO(warm.out << warm.err);
  REQUIRE(warm.code == 0);
  CHECK(warm.out.find("2 keys (1 programs) for sm_90: 1 compiled, 1 stored from a program compiled for another key")
        != std::string::npos);
  json lj = parse_json(cli({"ls", "--cache-dir", root, "--json"}, scratch.path()));
  REQUIRE(lj["entries"].size() == 2);
  uint64_t bytes = 0, disk = 0;
  for (const auto& e : lj["entries"]) {
    bytes += e["bytes"].get<uint64_t>();
    disk += e["disk_bytes"].get<uint64_t>();
    // kernel.cu and kernel.cubin count half in each; meta.json and last_used whole.
    CHECK(e["disk_bytes"].get<uint64_t>() < e["bytes"].get<uint64_t>());
  }
  CHECK(lj["total_bytes"] == bytes);
  CHECK(lj["disk_bytes"] == disk);
  CHECK(disk > bytes / 2);
  CHECK(disk < bytes * 3 / 4);
  Run table = cli({"ls", "--cache-dir", root}, scratch.path());
  CHECK(table.out.find("2 entries, ") != std::string::npos);
  CHECK(table.out.find(" on disk) in " + root) != std::string::npos);
  Run v = cli({"verify", "--cache-dir", root}, scratch.path());
  CHECK(v.code == 0);
}

TEST_CASE("prewarm, ls, verify, prune and clear on one root", "[cli][verbs]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  Run warm = cli({"prewarm", "--cache-dir", root, "--op", "packed", "--heads", "16", "--state", "f32,bf16", "--conv",
                  "ds", "--t", "2", "--gate", "bounded", "--route", "rowcta", "--arch", "sm_90"},
                 scratch.path());
  INFO(warm.err);
  REQUIRE(warm.code == 0);
  CHECK(warm.out.find("2 keys for sm_90: 2 compiled, 0 already cached, 0 failed") != std::string::npos);
  CHECK(count_lines(warm.err, "kdajit:") == 0);
  CHECK(count_lines(warm.err, "[") == 2);  // one progress line per key, nothing else

  Run again = cli({"prewarm", "--cache-dir", root, "--heads", "16", "--op", "packed", "--state", "bf16,f32", "--conv",
                   "ds", "--t", "2", "--gate", "bounded", "--route", "rowcta", "--arch", "sm_90", "--strict"},
                  scratch.path());
  CHECK(again.code == 0);
  CHECK(again.out.find("0 compiled, 2 already cached") != std::string::npos);
  CHECK(count_lines(again.err, "kdajit:") == 0);

  Run ls = cli({"ls", "--cache-dir", root, "--json"}, scratch.path());
  json lj = parse_json(ls);
  REQUIRE(lj["entries"].size() == 2);
  std::set<std::string> names;
  for (const auto& e : lj["entries"]) {
    names.insert(e["name"].get<std::string>());
    CHECK(e["registers"].get<int>() > 0);
    CHECK(e["bytes"].get<uint64_t>() > 1000);
    CHECK(e["disk_bytes"] == e["bytes"]);  // two programs: nothing shared
  }
  CHECK(names == std::set<std::string>{name_of("f32", 16, 2), name_of("bf16", 16, 2)});
  Run table = cli({"ls", "--cache-dir", root}, scratch.path());
  CHECK(table.out.find("LAST USED") != std::string::npos);
  CHECK(table.out.find(name_of("f32", 16, 2)) != std::string::npos);

  // A flipped byte: verify reports and removes it, and exits non-zero.
  std::string bad_dir = lj["entries"][0]["dir"].get<std::string>();
  auto cubin = read_text(bad_dir + "/kernel.cubin");
  cubin[cubin.size() / 2] ^= 0x10;
  write_text(bad_dir + "/kernel.cubin", cubin);
  Run v = cli({"verify", "--cache-dir", root, "--json"}, scratch.path());
  CHECK(v.code != 0);
  json vj = parse_json(v);
  CHECK(vj["ok"] == 1);
  REQUIRE(vj["bad"].size() == 1);
  CHECK(vj["bad"][0]["dir"] == bad_dir);
  CHECK(vj["bad"][0]["removed"] == true);
  CHECK(!fs::exists(bad_dir));
  CHECK(cli({"verify", "--cache-dir", root}, scratch.path()).code == 0);

  // Prune to zero bytes removes the remaining entry; clear leaves foreign files.
  Run pr = cli({"prune", "--cache-dir", root, "--max-bytes", "0", "--json"}, scratch.path());
  CHECK(pr.code == 0);
  CHECK(parse_json(pr)["removed"] == 1);
  write_text(root + "/NOTES.txt", "mine");
  CHECK(cli({"prewarm", "--cache-dir", root, "--heads", "8", "--op", "single", "--state", "f32", "--conv", "sd",
             "--gate", "bounded", "--route", "rowcta", "--arch", "sm_90"},
            scratch.path())
            .code == 0);
  Run cl = cli({"clear", "--cache-dir", root, "--json"}, scratch.path());
  CHECK(cl.code == 0);
  CHECK(parse_json(cl)["removed"] == 1);
  CHECK(parse_json(cli({"ls", "--cache-dir", root, "--json"}, scratch.path()))["entries"].empty());
  CHECK(read_text(root + "/NOTES.txt") == "mine");
  // The environment names the root when --cache-dir is absent.
  Run env_ls = cli({"ls", "--json"}, scratch.path(), {{"KDAJIT_CACHE_DIR", root}});
  CHECK(parse_json(env_ls)["root"] == root);
}

TEST_CASE("KDAJIT_DISABLE_JIT: silent after prewarm, an error naming a missing key", "[cli][environment]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  std::vector<std::string> keys = {"prewarm", "--cache-dir", root, "--op", "packed", "--heads", "32", "--state",
                                   "bf16", "--conv", "ds", "--t", "3", "--gate", "bounded", "--route", "rowcta", "--arch", "sm_90", "--strict"};
  REQUIRE(cli(keys, scratch.path()).code == 0);
  Run warm = cli(keys, scratch.path(), {{"KDAJIT_DISABLE_JIT", "1"}});
  CHECK(warm.code == 0);
  CHECK(count_lines(warm.err, "kdajit:") == 0);

  Run miss = cli({"prewarm", "--cache-dir", root, "--op", "packed", "--heads", "32", "--state", "bf16", "--conv", "ds",
                  "--t", "4", "--gate", "bounded", "--route", "rowcta", "--arch", "sm_90", "--strict"},
                 scratch.path(), {{"KDAJIT_DISABLE_JIT", "1"}});
  CHECK(miss.code != 0);
  CHECK(miss.err.find("KDAJIT_DISABLE_JIT=1") != std::string::npos);
  CHECK(miss.err.find(name_of("bf16", 32, 4)) != std::string::npos);
  CHECK(count_lines(miss.err, "kdajit: compiled") == 0);
}

TEST_CASE("an unusable root: prewarm warns once, says why nothing was stored, and fails", "[cli][environment]") {
  TempDir scratch;
  std::string file = scratch / "a-file";
  write_text(file, "x");
  std::vector<std::string> args = {"prewarm", "--cache-dir", file, "--op", "single", "--heads", "8", "--state", "f32",
                                   "--conv", "sd", "--gate", "bounded", "--route", "rowcta", "--arch", "sm_90"};
  Run r = cli(args, scratch.path());
  INFO(r.out << r.err);
  CHECK(r.code == 1);
  CHECK(count_lines(r.err, "kdajit: warning:") == 1);
  CHECK(count_lines(r.err, "kdajit: error: prewarm: 1 of 1 keys are not in the cache") == 1);
  CHECK(r.out.find("1 keys for sm_90: 1 compiled, 0 already cached, 0 failed, 1 not stored on disk") != std::string::npos);
  CHECK(r.out.find("prewarm: 1 not stored on disk: cache root " + file + " is not a directory") != std::string::npos);
  args.push_back("--allow-failures");
  CHECK(cli(args, scratch.path()).code == 0);
  CHECK(read_text(file) == "x");
}

TEST_CASE("explain names the fields and hash inputs in which two keys differ", "[cli][explain]") {
  TempDir scratch;
  std::string a = name_of("f32", 16, 2), b = name_of("bf16", 16, 3);
  Run r = cli({"explain", "--cache-dir", scratch / "cache", a, b, "--json"}, scratch.path());
  INFO(r.err);
  REQUIRE(r.code == 0);
  json j = parse_json(r);
  std::vector<std::string> fields;
  for (const auto& d : j["differing_fields"]) fields.push_back(d["field"].get<std::string>());
  CHECK(fields == std::vector<std::string>{"state", "t"});
  CHECK(j["differing_fields"][0]["a"] == "f32");
  CHECK(j["differing_fields"][0]["b"] == "bf16");
  CHECK(j["differing_inputs"] == json::array({"source"}));
  REQUIRE(j["keys"].size() == 2);
  CHECK(j["keys"][0]["name"] == a);
  CHECK(j["keys"][0]["hash"].get<std::string>().size() == 64);
  CHECK(j["keys"][0]["hash_inputs"]["options"].size() > 0);
  CHECK(j["keys"][0]["cached"] == "no");

  Run text = cli({"explain", "--cache-dir", scratch / "cache", a, a + "a"}, scratch.path());  // sm_90 vs sm_90a
  CHECK(text.code == 0);
  CHECK(text.out.find("differing fields:\n  arch") != std::string::npos);
  CHECK(text.out.find("differing hash inputs: arch, options") != std::string::npos);

  Run bad = cli({"explain", "kda_packed.h16"}, scratch.path());
  CHECK(bad.code != 0);
  CHECK(bad.err.find("kernel key name") != std::string::npos);
}

TEST_CASE("manifest errors name the file, the entry and the field", "[cli][manifest]") {
  TempDir scratch;
  std::string m = scratch / "manifest.json";
  std::string expected;
  SECTION("a bad value") {
    write_text(m, R"(["kda_single.h64.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90",
                     {"op": "packed", "heads": [16], "t": [2]},
                     {"op": "packed", "heads": [16, 300]}])");
    expected = m + ": entry 3: field 'heads': expected an integer in 1..128, got 300";
  }
  SECTION("an unknown field") {
    write_text(m, R"([{"op": "packed", "head": 16}])");
    expected = m + ": entry 1: unknown field 'head'";
  }
  SECTION("an unknown enum value") {
    write_text(m, R"([{"op": "packed", "heads": 16, "state": ["f32", "fp16"]}])");
    expected = m + ": entry 1: field 'state': expected one of f32|bf16, got 'fp16'";
  }
  SECTION("t for op single") {
    write_text(m, R"([{"op": "single", "heads": 16, "t": 2}])");
    expected = m + ": entry 1: field 't': op single takes only t=1";
  }
  SECTION("a bad key name") {
    write_text(m, R"(["kda_packed.h16.state_f32"])");
    expected = m + ": entry 1: kernel key name";
  }
  SECTION("not JSON") {
    write_text(m, "[{\"op\": \"packed\",}]");
    expected = m + ": not valid JSON: parse error at line 1";
  }
  SECTION("not a list") {
    write_text(m, R"({"op": "packed"})");
    expected = m + ": expected a JSON array";
  }
  Run r = cli({"prewarm", "--cache-dir", scratch / "cache", "--manifest", m}, scratch.path());
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(r.err.find("kdajit: error: " + expected) != std::string::npos);
  CHECK(count_lines(r.err, "kdajit: compiled") == 0);
}

TEST_CASE("no verb deletes a foreign file in tmp/; read-only verbs create nothing", "[cli][safety]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  fs::create_directories(root);
  const std::string key = "kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90";
  // Read-only verbs on an empty root: no tmp/, locks/ or arch directory appears.
  for (std::vector<std::string> args : std::vector<std::vector<std::string>>{
           {"ls", "--cache-dir", root},
           {"explain", "--cache-dir", root, key},
           {"env", "--cache-dir", root},
           {"prewarm", "--cache-dir", root, "--dry-run", "--op", "single", "--heads", "8", "--state", "f32", "--conv",
            "sd", "--gate", "bounded", "--route", "rowcta", "--arch", "sm_90"}}) {
    INFO(args[0]);
    CHECK(cli(args, scratch.path()).code == 0);
    CHECK(fs::is_empty(root));
  }
  // An operator's two-hour-old note in tmp/: not kdajit's, so never deleted.
  fs::create_directories(root + "/tmp");
  write_text(root + "/tmp/notes", "x");
  age_path(root + "/tmp/notes", 7200);
  for (std::vector<std::string> args : std::vector<std::vector<std::string>>{
           {"ls", "--cache-dir", root},
           {"prewarm", "--cache-dir", root, "--op", "single", "--heads", "8", "--state", "f32", "--conv", "sd",
            "--gate", "bounded", "--route", "rowcta", "--arch", "sm_90"},
           {"verify", "--cache-dir", root},
           {"prune", "--cache-dir", root, "--max-bytes", "0"},
           {"clear", "--cache-dir", root}}) {
    INFO(args[0]);
    Run r = cli(args, scratch.path());
    INFO(r.out << r.err);
    CHECK(r.code == 0);
    CHECK(read_text(root + "/tmp/notes") == "x");
  }
}

TEST_CASE("a chmod 555 layer is read by every verb and written by none", "[cli][layers][writable]") {
  TempDir scratch;
  std::string a = scratch / "A", b = scratch / "B";
  const std::string k1 = "kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90";
  const std::string k2 = "kda_single.h16.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90";
  auto key_file = [&](const std::string& key) {
    write_text(scratch / (key + ".json"), json::array({key}).dump());
    return scratch / (key + ".json");
  };
  REQUIRE(cli({"prewarm", "--cache-dir", a, "--manifest", key_file(k1)}, scratch.path()).code == 0);
  ::chmod(a.c_str(), 0555);
  auto entries_in = [&](const std::string& root) {
    size_t n = 0;
    if (fs::is_directory(root + "/sm_90"))
      for ([[maybe_unused]] const auto& e : fs::directory_iterator(root + "/sm_90")) ++n;
    return n;
  };
  Run env = cli({"env", "--json", "--cache-dir", a + ":" + b}, scratch.path());
  auto layers = parse_json(env)["cache"]["layers"];
  CHECK(layers[0]["state"] == "read-only");
  CHECK(layers[0]["reason"] == "is not writable (mode 0555)");
  Run warm = cli({"prewarm", "--cache-dir", a + ":" + b, "--manifest", key_file(k2)}, scratch.path());
  INFO(warm.out << warm.err);
  CHECK(warm.code == 0);
  CHECK(entries_in(a) == 1);
  CHECK(entries_in(b) == 1);
  Run clear_a = cli({"clear", "--cache-dir", a}, scratch.path());
  INFO(clear_a.out << clear_a.err);
  CHECK(clear_a.code == 1);
  CHECK(clear_a.err.find("clear: no cache layer can be written (" + a + " is not writable (mode 0555))") !=
        std::string::npos);
  Run clear_ab = cli({"clear", "--cache-dir", a + ":" + b}, scratch.path());
  CHECK(clear_ab.code == 0);
  CHECK(clear_ab.out.find("clear: removed 1 entries") != std::string::npos);
  CHECK(entries_in(a) == 1);
  CHECK(entries_in(b) == 0);
  ::chmod(a.c_str(), 0700);
}

TEST_CASE("verify and clear on a directory that is not a cache create nothing there", "[cli][safety]") {
  TempDir scratch;
  std::string home = scratch / "home";
  fs::create_directories(home);
  write_text(home + "/notes", "x");
  Run v = cli({"verify", "--cache-dir", home}, scratch.path());
  INFO(v.out << v.err);
  CHECK(v.code == 0);
  Run c = cli({"clear", "--cache-dir", home}, scratch.path());
  INFO(c.out << c.err);
  CHECK(c.code == 1);
  CHECK(c.err.find("is not a kdajit cache root") != std::string::npos);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(home)) names.push_back(e.path().filename().string());
  CHECK(names == std::vector<std::string>{"notes"});
}

TEST_CASE("one trust verdict: ls, env, verify and prewarm --check agree on a linked entry", "[cli][trust]") {
  TempDir scratch;
  std::string root = scratch / "cache", other = scratch / "other";
  const std::string key = "kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90";
  write_text(scratch / "key.json", json::array({key}).dump());
  REQUIRE(cli({"prewarm", "--cache-dir", other, "--manifest", scratch / "key.json"}, scratch.path()).code == 0);
  std::string entry;
  for (const auto& e : fs::directory_iterator(other + "/sm_90")) entry = e.path().string();
  // The NVRTC log is text: no NUL from the C string it came in.
  auto meta = json::parse(read_text(entry + "/meta.json"));
  REQUIRE(meta["nvrtc_log"].is_string());
  CHECK(meta["nvrtc_log"].get<std::string>().find('\0') == std::string::npos);
  fs::create_directories(root + "/sm_90");
  ::chmod(root.c_str(), 0700);
  SECTION("a linked entry directory") {
    fs::create_directory_symlink(entry, root + "/sm_90/" + fs::path(entry).filename().string());
  }
  SECTION("a linked arch directory") {
    fs::remove(root + "/sm_90");
    fs::create_directory_symlink(other + "/sm_90", root + "/sm_90");
  }
  SECTION("a cubin owned by another user") {
    REQUIRE(cli({"prewarm", "--cache-dir", root, "--manifest", scratch / "key.json"}, scratch.path()).code == 0);
    std::string mine = root + "/sm_90/" + fs::path(entry).filename().string();
    if (::geteuid() == 0) REQUIRE(::chown((mine + "/kernel.cubin").c_str(), 65534, 65534) == 0);
    else ::chmod((mine + "/kernel.cubin").c_str(), 0666);
  }
  Run ls = cli({"ls", "--json", "--cache-dir", root}, scratch.path());
  auto listed = parse_json(ls)["entries"];
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].contains("untrusted"));
  Run env = cli({"env", "--json", "--cache-dir", root}, scratch.path());
  CHECK(parse_json(env)["cache"]["layers"][0]["untrusted"] == 1);
  Run v = cli({"verify", "--cache-dir", root}, scratch.path());
  INFO(v.out << v.err);
  CHECK(v.code == 1);
  CHECK(v.out.find("UNTRUSTED  ") != std::string::npos);
  CHECK(v.out.find("1 bad") != std::string::npos);
  Run check = cli({"prewarm", "--check", "--cache-dir", root, "--manifest", scratch / "key.json"}, scratch.path());
  INFO(check.out << check.err);
  CHECK(check.code == 1);
  CHECK((check.out + check.err).find("not trusted") != std::string::npos);
}
