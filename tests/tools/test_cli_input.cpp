// Hostile input and honest exit codes: manifests that are deep, huge or not files,
// echoed input with control bytes, non-UTF-8 names in a root, unwritable --out,
// malformed KDAJIT_* values for every verb, missing roots and unknown verbs.
#include <sys/stat.h>

#include "cli_test_util.hpp"

using namespace kdajit;
using namespace kdajit::test;
using nlohmann::json;

namespace {

const std::string kKey = "kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90";

// The stderr of a usage error: exactly one line, `kdajit: error: ...`.
void check_one_error_line(const Run& r, int code = 2) {
  INFO(r.out << r.err);
  CHECK(r.code == code);
  CHECK(count_lines(r.err, "kdajit: error: ") == 1);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find('\x1b') == std::string::npos);
  CHECK(r.err.find('\0') == std::string::npos);
}

}  // namespace

TEST_CASE("manifests: nesting, size and file type are bounded before parsing", "[cli][input][manifest]") {
  TempDir scratch;
  std::string m = scratch / "manifest.json", root = scratch / "cache";
  std::string expect;
  SECTION("nested 100,000 deep") {
    write_text(m, std::string(100000, '[') + std::string(100000, ']'));
    expect = "nested deeper than 64 levels at line 1, column 65";
  }
  SECTION("nested 50,000 deep, unterminated") {
    write_text(m, std::string(50000, '['));
    expect = "nested deeper than 64 levels";
  }
  SECTION("objects nested 1,000 deep inside a pattern") {
    std::string s = "[{\"heads\": ";
    for (int i = 0; i < 1000; ++i) s += "{\"a\": ";
    write_text(m, s + "1" + std::string(1000, '}') + "}]");
    expect = "nested deeper than 64 levels";
  }
  SECTION("larger than 4 MiB") {
    write_text(m, "[\"" + std::string(5 << 20, 'k') + "\"]");
    expect = "--manifest " + m + ": expected at most 4194304 bytes";
  }
  SECTION("/dev/zero") {
    m = "/dev/zero";
    expect = "--manifest /dev/zero: expected a regular file, got a character device";
  }
  SECTION("a FIFO nobody writes") {
    REQUIRE(::mkfifo(m.c_str(), 0600) == 0);
    expect = "--manifest " + m + ": expected a regular file, got a FIFO";
  }
  SECTION("a directory") {
    fs::create_directories(m);
    expect = "--manifest " + m + ": expected a regular file, got a directory";
  }
  SECTION("missing") {
    expect = "--manifest " + m + ": cannot open: No such file or directory";
  }
  Run r = cli({"prewarm", "--cache-dir", root, "--manifest", m}, scratch.path(), {}, 20);
  check_one_error_line(r);
  CHECK(r.err.find(expect) != std::string::npos);
  CHECK(r.err.size() < 600);
  CHECK(!fs::exists(root));  // nothing written
}

TEST_CASE("echoed input is escaped and truncated in every error", "[cli][input][escape]") {
  TempDir scratch;
  const std::string forged = "kda_x\nkdajit: compiled fake\x1b[2K\x1b[1A";
  for (const auto& verb : {"show", "explain", "compile"}) {
    INFO(verb);
    Run r = cli({verb, forged}, scratch.path());
    check_one_error_line(r);
    CHECK(r.err.find("kda_x\\nkdajit: compiled fake\\x1b[2K\\x1b[1A") != std::string::npos);
  }
  // A key name of 10,000 bytes is quoted in part.
  Run long_key = cli({"show", std::string(10000, 'k')}, scratch.path());
  check_one_error_line(long_key);
  CHECK(long_key.err.size() < 400);
  CHECK(long_key.err.find("(10000 bytes)") != std::string::npos);
  // A manifest can hold any byte, NUL included.
  write_text(scratch / "m.json", R"(["kda\u0000nul\n\u001b[31mred", {"op": "packed", "heads": 8, "gate": "\u001b]0;owned\u0007"}])");
  Run nul = cli({"prewarm", "--cache-dir", scratch / "cache", "--manifest", scratch / "m.json"}, scratch.path());
  check_one_error_line(nul);
  CHECK(nul.err.find("kda\\x00nul\\n\\x1b[31mred") != std::string::npos);
  write_text(scratch / "m2.json", R"([{"op": "packed", "heads": 8, "gate": "\u001b]0;owned\u0007"}])");
  Run osc = cli({"prewarm", "--cache-dir", scratch / "cache", "--manifest", scratch / "m2.json"}, scratch.path());
  check_one_error_line(osc);
  CHECK(osc.err.find("got '\\x1b]0;owned\\x07'") != std::string::npos);
  // A bad --arch or option value as well.
  Run arch = cli({"keys", "--preset", "glm-5.3-flash", "--arch", "sm_90\nkdajit: x"}, scratch.path());
  check_one_error_line(arch);
  CHECK(arch.err.find("--arch: expected one of sm_90|sm_90a|sm_100a|sm_103a|sm_120a, got 'sm_90\\nkdajit: x'") !=
        std::string::npos);
}

TEST_CASE("ls --json and verify --json stay valid JSON with non-UTF-8 names in the root", "[cli][input][utf8]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  fs::create_directories(root + "/sm_90");
  write_text(root + "/bad\xff\xfe" "name", "x");
  write_text(root + "/sm_90/caf\xc3\xa9-\x80", "x");
  write_text(root + "/line\nbreak", "x");
  for (const char* verb : {"ls", "verify"}) {
    INFO(verb);
    Run r = cli({verb, "--cache-dir", root, "--json"}, scratch.path());
    CHECK(r.code == 0);
    json j = parse_json(r);
    std::set<std::string> foreign(j["foreign"].begin(), j["foreign"].end());
    CHECK(foreign.count(root + "/bad\\xff\\xfename") == 1);
    CHECK(foreign.count(root + "/sm_90/caf\xc3\xa9-\\x80") == 1);
    CHECK(foreign.count(root + "/line\nbreak") == 1);  // JSON escapes the newline itself
  }
  Run table = cli({"verify", "--cache-dir", root}, scratch.path());
  CHECK(table.code == 0);
  CHECK(table.out.find("FOREIGN  " + root + "/line\\nbreak\n") != std::string::npos);
  CHECK(table.out.find("\xff") == std::string::npos);
}

TEST_CASE("compile --out fails when it cannot write", "[cli][input][compile]") {
  TempDir scratch;
  std::string out = scratch / "out";
  fs::create_directories(out + "/" + kKey + ".cubin");  // a directory where the file goes
  Run r = cli({"compile", kKey, "--out", out}, scratch.path());
  INFO(r.out << r.err);
  CHECK(r.code == 1);
  CHECK(r.out.find(kKey + "  FAILED: --out: cannot write " + out + "/" + kKey + ".cubin") != std::string::npos);
  CHECK(r.err.find("kdajit: error: compile: 1 failed") != std::string::npos);

  write_text(scratch / "file", "x");
  Run f = cli({"compile", kKey, "--out", scratch / "file"}, scratch.path());
  check_one_error_line(f);
  CHECK(f.err.find("--out: expected a directory") != std::string::npos);

  Run ok = cli({"compile", kKey, "--out", scratch / "good"}, scratch.path());
  CHECK(ok.code == 0);
  CHECK(fs::file_size(scratch / ("good/" + kKey + ".cubin")) > 1000);
  CHECK(fs::file_size(scratch / ("good/" + kKey + ".cu")) > 1000);
}

TEST_CASE("every verb reads one environment and rejects malformed values", "[cli][input][environment]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"KDAJIT_LOG", "KDAJIT_LOG: expected quiet|info|debug, got 'loud'"},
      {"KDAJIT_CACHE_MAX_BYTES", "KDAJIT_CACHE_MAX_BYTES: expected a byte count"},
      {"KDAJIT_DISABLE_JIT", "KDAJIT_DISABLE_JIT: expected 0 or 1, got 'loud'"},
      {"KDAJIT_ARCH", "KDAJIT_ARCH: expected one of sm_90|sm_90a|sm_100a|sm_103a|sm_120a, got 'loud'"},
      {"KDAJIT_CACHE_DIR", "KDAJIT_CACHE_DIR: expected a directory or a ':'-separated list"},
  };
  const std::vector<std::vector<std::string>> verbs = {
      {"keys", "--preset", "glm-5.3-flash"},
      {"show", kKey},
      {"compile", kKey},
      {"prewarm", "--cache-dir", root, "--op", "single", "--heads", "8", "--state", "f32", "--conv", "sd", "--gate", "bounded", "--route", "rowcta"},
      {"ls", "--cache-dir", root},
      {"verify", "--cache-dir", root},
      {"explain", "--cache-dir", root, kKey},
      {"prune", "--cache-dir", root, "--max-bytes", "0"},
      {"clear", "--cache-dir", root},
      {"env"},
      {"selfcheck", "--cache-dir", root},
  };
  for (const auto& [var, message] : bad) {
    for (const auto& args : verbs) {
      INFO(var << " with " << args[0]);
      Run r = cli(args, scratch.path(), {{var, var == "KDAJIT_CACHE_DIR" ? std::string("/a::/b") : std::string("loud")}});
      check_one_error_line(r);
      CHECK(r.err.find("kdajit: error: " + message) != std::string::npos);
      CHECK(r.out.empty());
    }
  }
  CHECK(!fs::exists(root));
  // --cache-dir is checked the same way.
  Run r = cli({"ls", "--cache-dir", "/a:"}, scratch.path());
  check_one_error_line(r);
  CHECK(r.err.find("--cache-dir: expected a directory or a ':'-separated list") != std::string::npos);
}

TEST_CASE("a missing root, an unknown verb and bad flags name the problem", "[cli][input][exit-codes]") {
  TempDir scratch;
  std::string missing = scratch / "does/not/exist";
  for (const char* verb : {"ls", "verify", "prune", "clear"}) {
    INFO(verb);
    std::vector<std::string> args = {verb, "--cache-dir", missing};
    if (std::string(verb) == "prune") args.insert(args.end(), {"--max-bytes", "0"});
    Run r = cli(args, scratch.path());
    check_one_error_line(r, 1);
    CHECK(r.err.find(std::string("kdajit: error: ") + verb + ": cache root " + missing +
                     " does not exist (set by --cache-dir)") != std::string::npos);
    CHECK(!fs::exists(scratch / "does"));
  }
  Run env_root = cli({"ls"}, scratch.path(), {{"KDAJIT_CACHE_DIR", missing}});
  check_one_error_line(env_root, 1);
  CHECK(env_root.err.find("(set by KDAJIT_CACHE_DIR)") != std::string::npos);

  Run unknown = cli({"frobnicate"}, scratch.path());
  check_one_error_line(unknown);
  CHECK(unknown.err.find("unknown verb 'frobnicate'; expected one of: keys, fields, show, compile, prewarm") != std::string::npos);
  Run none = cli({}, scratch.path());
  check_one_error_line(none);
  CHECK(none.err.find("expected a verb") != std::string::npos);
  Run flag = cli({"ls", "--bogus"}, scratch.path());
  check_one_error_line(flag);
  Run help = cli({"prewarm", "--help"}, scratch.path());
  CHECK(help.code == 0);
  CHECK(help.out.find("--allow-failures") != std::string::npos);
  CHECK(help.out.find("single,packed") != std::string::npos);  // help lists generated from the key's tables
}

TEST_CASE("compile --out: private new directories, never written through a planted link", "[cli][input][compile]") {
  TempDir scratch;
  std::string out = scratch / "out";
  fs::create_directories(out);
  std::string victim = scratch / "victim";
  write_text(victim, "root's secret");
  ::chmod(victim.c_str(), 0600);
  fs::create_symlink(victim, out + "/" + kKey + ".cubin");
  fs::create_symlink(victim, out + "/" + kKey + ".cu");
  Run r = cli({"compile", kKey, "--out", out}, scratch.path());
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  CHECK(read_text(victim) == "root's secret");
  CHECK(fs::is_regular_file(fs::symlink_status(out + "/" + kKey + ".cubin")));
  CHECK(fs::file_size(out + "/" + kKey + ".cubin") > 1000);
  CHECK(fs::is_regular_file(fs::symlink_status(out + "/" + kKey + ".cu")));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(out)) names.push_back(e.path().filename().string());
  CHECK(names.size() == 2);  // no temporary file left behind

  // Under umask 000 the directories it creates are 0700.
  const mode_t old = ::umask(0);
  Run fresh = cli({"compile", kKey, "--out", scratch / "new/deeper"}, scratch.path());
  ::umask(old);
  INFO(fresh.out << fresh.err);
  CHECK(fresh.code == 0);
  CHECK(mode_of(scratch / "new") == 0700);
  CHECK(mode_of(scratch / "new/deeper") == 0700);
}

TEST_CASE("manifests are deduplicated while expanded and capped at 65536 keys", "[cli][input][manifest]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  json heads = json::array();
  for (int h = 1; h <= 128; ++h) heads.push_back(h);
  json bomb = json::array();
  for (int i = 0; i < 400; ++i)
    bomb.push_back({{"heads", heads}, {"arch", {"sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a"}}});
  write_text(scratch / "bomb.json", bomb.dump());
  auto t0 = std::chrono::steady_clock::now();
  Run r = cli({"prewarm", "--cache-dir", root, "--dry-run", "--manifest", scratch / "bomb.json"}, scratch.path());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  check_one_error_line(r);
  CHECK(r.err.find("entry 1: the pattern expands to more than 65536 keys") != std::string::npos);
  CHECK(s < 30);

  // The same keys named over and over count once; past 16 x 65536 mentions it stops.
  json repeated = json::array();
  for (int i = 0; i < 3; ++i) repeated.push_back(kKey);
  repeated.push_back({{"op", "single"}, {"heads", 8}, {"state", "f32"}, {"conv", "sd"}, {"gate", "bounded"},
                      {"route", "rowcta"}, {"arch", "sm_90"}});
  write_text(scratch / "repeated.json", repeated.dump());
  Run d = cli({"prewarm", "--cache-dir", root, "--dry-run", "--json", "--manifest", scratch / "repeated.json"},
              scratch.path());
  INFO(d.out << d.err);
  CHECK(d.code == 0);
  CHECK(parse_json(d)["keys"] == 1);
  json many = json::array();
  json one_head_all = {{"heads", 8}, {"arch", {"sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a"}}};
  for (int i = 0; i < 600; ++i) many.push_back(one_head_all);
  write_text(scratch / "many.json", many.dump());
  Run m = cli({"prewarm", "--cache-dir", root, "--dry-run", "--manifest", scratch / "many.json"}, scratch.path());
  check_one_error_line(m);
  CHECK(m.err.find("names more than 1048576 keys counting repeats") != std::string::npos);

  write_text(scratch / "empty.json", "[]");
  Run e = cli({"prewarm", "--cache-dir", root, "--check", "--manifest", scratch / "empty.json"}, scratch.path());
  check_one_error_line(e);
  CHECK(e.err.find("empty.json: expected at least one key name, key object or pattern, got []") != std::string::npos);
  CHECK(!fs::exists(root));
}

TEST_CASE("byte sizes: prune --max-bytes and KDAJIT_CACHE_MAX_BYTES take the same digits", "[cli][input][bytes]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  fs::create_directories(root);
  Run empty = cli({"prune", "--cache-dir", root, "--max-bytes="}, scratch.path());
  check_one_error_line(empty);  // CLI11 itself refuses an empty value
  CHECK(empty.err.find("--max-bytes") != std::string::npos);
  for (const char* bad : {"-0", "-5", "0x10", "18446744073709551616", " 5", "5k"}) {
    INFO("'" << bad << "'");
    Run r = cli({"prune", "--cache-dir", root, std::string("--max-bytes=") + bad}, scratch.path());
    check_one_error_line(r);
    CHECK(r.err.find("kdajit: error: prune --max-bytes: expected a byte count (decimal digits, "
                     "0..18446744073709551615), got '" + std::string(bad) + "'") != std::string::npos);
    Run e = cli({"prune", "--cache-dir", root}, scratch.path(), {{"KDAJIT_CACHE_MAX_BYTES", bad}});
    check_one_error_line(e);
    CHECK(e.err.find("KDAJIT_CACHE_MAX_BYTES: expected a byte count (decimal digits") != std::string::npos);
  }
  Run neg = cli({"prune", "--cache-dir", root, "--max-bytes", "-5"}, scratch.path());
  check_one_error_line(neg);
  Run ok = cli({"prune", "--cache-dir", root, "--max-bytes", "18446744073709551615"}, scratch.path());
  INFO(ok.out << ok.err);
  CHECK(ok.code == 0);
}

TEST_CASE("small ones: a backslash, an option before the verb, a long path's reason", "[cli][input][escape]") {
  TempDir scratch;
  // A literal backslash sequence never reads like an escaped control byte.
  Run lit = cli({"show", "literal\\x1b[31m"}, scratch.path());
  Run esc = cli({"show", "literal\x1b[31m"}, scratch.path());
  check_one_error_line(lit);
  check_one_error_line(esc);
  CHECK(lit.err.find("literal\\\\x1b[31m") != std::string::npos);
  CHECK(esc.err.find("literal\\x1b[31m") != std::string::npos);
  CHECK(esc.err.find("literal\\\\x1b") == std::string::npos);

  Run opt = cli({"-x"}, scratch.path());
  check_one_error_line(opt);
  CHECK(opt.err.find("kdajit: error: unknown option '-x' before the verb") != std::string::npos);

  // A 5 KB root path: the message keeps its end, the reason.
  std::string deep = "/" + std::string(5000, 'd');
  Run ls = cli({"ls", "--cache-dir", deep}, scratch.path());
  check_one_error_line(ls, 1);
  CHECK(ls.err.find("File name too long") != std::string::npos);
  CHECK(ls.err.find("bytes cut)...") != std::string::npos);
}
