// prewarm for operators: honest exit codes and summaries, one progress line per
// key (terminal or not) with an ETA on long runs, --dry-run / --check, the arch
// rule (KDAJIT_ARCH, ignored --arch), and layered roots.
#include <pty.h>
#include <termios.h>

#include <set>

#include <fmt/format.h>

#include "cli_test_util.hpp"
#include "kdajit/presets.hpp"
#include "kdajit/routes.hpp"

using namespace kdajit;
using namespace kdajit::test;
using nlohmann::json;

namespace {

// Eight packed keys (heads 8): state x conv x t.
const std::vector<std::string> kEight = {"--op", "packed", "--heads", "8", "--state", "f32,bf16", "--conv", "sd,ds",
                                         "--t", "2,3", "--gate", "bounded", "--route", "rowcta"};
// The arch every default resolves to, GPU or not.
const std::map<std::string, std::string> kSm90 = {{"KDAJIT_ARCH", "sm_90"}};
// Packed rowcta keys at t 2, f32, SD, bounded: a program that reads H at run
// time, so kTwoHeads' h16 key is its h8 key's program.
std::vector<std::string> packed_rowcta(const std::string& heads) {
  return {"--op", "packed", "--heads", heads, "--state", "f32", "--conv", "sd", "--t", "2", "--gate", "bounded",
          "--route", "rowcta"};
}
const std::vector<std::string> kOne = packed_rowcta("8");
const std::vector<std::string> kTwoHeads = packed_rowcta("8,16");

std::vector<std::string> args_of(std::vector<std::string> head, const std::vector<std::string>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<std::string> tree(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    out.push_back(it->path().string() + " " + std::to_string(fs::last_write_time(it->path(), ec).time_since_epoch().count()));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("prewarm: one line per key, an ETA on long runs; --dry-run and --check write nothing", "[cli][prewarm][progress]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  Run warm = cli(args_of({"prewarm", "--cache-dir", root, "-j", "2"}, kEight), scratch.path(), kSm90);
  INFO(warm.out << warm.err);
  REQUIRE(warm.code == 0);
  auto lines = lines_of(warm.err);
  REQUIRE(lines.size() == 8);  // nothing but one line per key: no library "compiled" lines
  std::set<std::string> keys;
  for (size_t i = 0; i < lines.size(); ++i) {
    INFO(lines[i]);
    CHECK(lines[i].rfind(fmt::format("[{}/8] kda_packed.h8.", i + 1), 0) == 0);
    CHECK(lines[i].find("  compiled in ") != std::string::npos);
    CHECK(lines[i].find(" registers, 0 bytes spilled, NVRTC ") != std::string::npos);
    CHECK((lines[i].find("  ETA ") != std::string::npos) == (i + 1 < lines.size()));
    keys.insert(lines[i].substr(lines[i].find("] ") + 2, lines[i].find("  compiled") - lines[i].find("] ") - 2));
  }
  CHECK(keys.size() == 8);
  CHECK(warm.out.rfind("prewarm: 8 keys for sm_90: 8 compiled, 0 already cached, 0 failed in ", 0) == 0);
  CHECK(warm.out.find(" s (" + root + ")\n") != std::string::npos);
  CHECK(count_lines(warm.out, "") == 1);

  auto before = tree(root);
  Run dry = cli(args_of({"prewarm", "--cache-dir", root, "--dry-run", "--heads", "8,16"}, {"--op", "packed", "--state",
                        "f32,bf16", "--conv", "sd,ds", "--t", "2,3", "--gate", "bounded", "--route", "rowcta"}), scratch.path(), kSm90);
  INFO(dry.out << dry.err);
  CHECK(dry.code == 0);
  CHECK(dry.err.empty());
  // The h16 keys are the h8 keys' programs: made from their entries, no compile.
  CHECK(dry.out.find("prewarm --dry-run: 16 keys (8 programs) for sm_90: 8 present, 8 missing, 0 unusable, 0 failed; "
                     "a prewarm compiles 0 programs") != std::string::npos);
  int rows = 0;
  for (const auto& line : lines_of(dry.out))
    if (line.rfind(name_of("f32", 16, 2), 0) == 0 && line.find("  missing (would compile)  ") != std::string::npos) ++rows;
  CHECK(rows == 1);
  Run check = cli({"prewarm", "--cache-dir", root, "--check", "--json", "--op", "packed", "--heads", "8,16", "--state",
                   "f32", "--conv", "sd", "--t", "2", "--gate", "bounded", "--route", "rowcta"},
                  scratch.path(), kSm90);
  CHECK(check.code == 1);
  json cj = parse_json(check);
  CHECK(cj["present"] == 1);
  CHECK(cj["missing"] == 1);
  CHECK(check.err.find("kdajit: error: prewarm --check: 1 of 2 keys are not in the cache") != std::string::npos);
  Run all = cli(args_of({"prewarm", "--cache-dir", root, "--check"}, kEight), scratch.path(), kSm90);
  CHECK(all.code == 0);
  CHECK(tree(root) == before);  // no entry, stamp, lock or staging dir written
  // --check on a root that does not exist creates nothing either.
  Run none = cli(args_of({"prewarm", "--cache-dir", scratch / "nowhere", "--check"}, kOne), scratch.path(), kSm90);
  CHECK(none.code == 1);
  CHECK(!fs::exists(scratch / "nowhere"));
}

TEST_CASE("prewarm on a terminal prints the same single line per key", "[cli][prewarm][progress]") {
  TempDir scratch;
  int master = -1, slave = -1;
  REQUIRE(::openpty(&master, &slave, nullptr, nullptr, nullptr) == 0);
  struct termios t {};
  ::tcgetattr(slave, &t);
  t.c_oflag &= ~static_cast<tcflag_t>(OPOST);  // see the bytes kdajit writes, not "\r\n"
  ::tcsetattr(slave, TCSANOW, &t);
  pid_t pid = start_cli(args_of({"prewarm", "--cache-dir", scratch / "cache", "--op", "packed", "--heads", "8", "--state",
                                 "f32,bf16", "--conv", "sd", "--t", "2", "--gate", "bounded", "--route", "rowcta"}, {}),
                        scratch.path(), "tty", kSm90, slave);
  ::close(slave);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));  // EIO at hangup
  ::close(master);
  Run r = finish_cli(pid, scratch.path(), "tty");
  INFO(text);
  CHECK(r.code == 0);
  CHECK(text.find('\r') == std::string::npos);
  CHECK(text.find("\x1b[") == std::string::npos);
  auto lines = lines_of(text);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].rfind("[1/2] kda_packed.h8.", 0) == 0);
  CHECK(lines[1].rfind("[2/2] kda_packed.h8.", 0) == 0);
}

TEST_CASE("prewarm fails unless every key is in the cache, and says why", "[cli][prewarm][exit-codes]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  SECTION("KDAJIT_DISABLE_JIT=1 with missing keys") {
    Run r = cli(args_of({"prewarm", "--cache-dir", root}, kOne), scratch.path(),
                {{"KDAJIT_DISABLE_JIT", "1"}, {"KDAJIT_ARCH", "sm_90"}});
    INFO(r.out << r.err);
    CHECK(r.code == 1);
    CHECK(r.out.find("1 keys for sm_90: 0 compiled, 0 already cached, 1 failed") != std::string::npos);
    CHECK(r.err.find("KDAJIT_DISABLE_JIT=1 and kernel kda_packed.h8") != std::string::npos);
    CHECK(cli(args_of({"prewarm", "--cache-dir", root, "--allow-failures"}, kOne), scratch.path(),
              {{"KDAJIT_DISABLE_JIT", "1"}}).code == 0);
  }
  SECTION("its own LRU cap evicted what it stored") {
    Run r = cli(args_of({"prewarm", "--cache-dir", root, "-j", "1", "--json"}, kTwoHeads), scratch.path(),
                {{"KDAJIT_CACHE_MAX_BYTES", "1"}, {"KDAJIT_ARCH", "sm_90"}});
    INFO(r.out << r.err);
    CHECK(r.code == 1);
    json j = parse_json(r);
    CHECK(j["compiled"] == 1);  // h16 is h8's program
    CHECK(j["reused"] == 1);
    CHECK(j["not_stored"] == 1);
    CHECK(j["archs"] == json::array({"sm_90"}));
    REQUIRE(j["not_stored_reasons"].size() == 1);
    CHECK(j["not_stored_reasons"].begin().key() ==
          "evicted by the LRU cap (KDAJIT_CACHE_MAX_BYTES=1) to make room for later keys");
  }
}

TEST_CASE("the arch: KDAJIT_ARCH is the default everywhere, a differing --arch warns", "[cli][prewarm][arch]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  // KDAJIT_ARCH decides the runtime's arch, so these hold with or without a GPU.
  Run by_env = cli(args_of({"prewarm", "--cache-dir", root, "--dry-run", "--json"}, kOne), scratch.path(),
                   {{"KDAJIT_ARCH", "sm_90a"}});
  CHECK(by_env.code == 0);
  CHECK(parse_json(by_env)["archs"] == json::array({"sm_90a"}));
  CHECK(by_env.err.empty());
  Run keys = cli({"keys", "--preset", "glm-5.3-flash"}, scratch.path(), {{"KDAJIT_ARCH", "sm_100a"}});
  CHECK(keys.code == 0);
  // Every route that serves each family of the preset, as the route table says.
  CHECK(count_lines(keys.out, "kda_") == static_cast<int>(preset_keys("glm-5.3-flash", Arch::sm_100a)->size()));
  CHECK(keys.out.find(".sm_90\n") == std::string::npos);
  CHECK(keys.out.find(".sm_100a\n") != std::string::npos);

  // The sm_90 / sm_90a trap: kernels the runtime here would never use.
  Run trap = cli(args_of({"prewarm", "--cache-dir", root, "--dry-run", "--arch", "sm_90a"}, kOne), scratch.path(),
                 {{"KDAJIT_ARCH", "sm_90"}});
  INFO(trap.err);
  CHECK(trap.code == 0);
  CHECK(count_lines(trap.err, "kdajit: warning: prewarm: kernels for sm_90a are not used by the runtime on this "
                              "machine, which picks sm_90 (KDAJIT_ARCH)") == 1);
  CHECK(trap.err.find("set KDAJIT_ARCH=sm_90a there") != std::string::npos);
  Run compile = cli({"compile", "kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90a"}, scratch.path(),
                    {{"KDAJIT_ARCH", "sm_90"}});
  CHECK(compile.code == 0);
  CHECK(count_lines(compile.err, "kdajit: warning: compile: kernels for sm_90a are not used") == 1);

  // Full key names in a manifest keep their arch; --arch is ignored for them, with a warning.
  write_text(scratch / "m.json", R"(["kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90",
                                     {"op": "single", "heads": 16, "state": "f32", "conv": "sd", "gate": "bounded", "route": "rowcta"}])");
  Run m = cli({"prewarm", "--cache-dir", root, "--dry-run", "--json", "--manifest", scratch / "m.json", "--arch", "sm_100a"},
              scratch.path(), {{"KDAJIT_ARCH", "sm_100a"}});
  INFO(m.err);
  CHECK(m.code == 0);
  CHECK(count_lines(m.err, "kdajit: warning: prewarm: --arch sm_100a is ignored for 1 entries of " + scratch / "m.json" +
                               " that name another arch (entries 1)") == 1);
  json mj = parse_json(m);
  std::set<std::string> names;
  for (const auto& r : mj["results"]) names.insert(r["key"].get<std::string>());
  CHECK(names == std::set<std::string>{"kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90",
                                       "kda_single.h16.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_100a"});
  CHECK(!fs::exists(root));
}

TEST_CASE("prewarm and ls on layered roots", "[cli][prewarm][layers]") {
  TempDir scratch;
  std::string mine = scratch / "mine", shipped = scratch / "shipped";
  REQUIRE(cli(args_of({"prewarm", "--cache-dir", shipped}, kOne), scratch.path(), kSm90).code == 0);
  Run r = cli(args_of({"prewarm", "--cache-dir", mine + ":" + shipped, "--json"}, kTwoHeads), scratch.path(), kSm90);
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  json j = parse_json(r);
  CHECK(j["compiled"] == 0);  // h16 is made from the program of h8's entry in the shipped layer
  CHECK(j["reused"] == 1);
  CHECK(j["cached"] == 1);
  CHECK(j["root"] == mine);
  for (const auto& row : j["results"]) {
    std::string dir = row["dir"].get<std::string>();
    CHECK(dir.rfind(row["status"] == "cached" ? shipped : mine, 0) == 0);
  }
  Run ls = cli({"ls", "--json"}, scratch.path(), {{"KDAJIT_CACHE_DIR", mine + ":" + shipped}});
  json lj = parse_json(ls);
  CHECK(lj["entries"].size() == 2);
  CHECK(lj["layers"][0]["state"] == "read-write");
  CHECK(lj["layers"][1]["state"] == "read-only");
  Run clear = cli({"clear", "--cache-dir", mine + ":" + shipped, "--json"}, scratch.path());
  CHECK(parse_json(clear)["removed"] == 1);  // the write layer only
  CHECK(parse_json(cli({"ls", "--cache-dir", shipped, "--json"}, scratch.path()))["entries"].size() == 1);
}

TEST_CASE("kdajit routes lists every route of the table with its launch shape", "[cli][routes]") {
  TempDir scratch;
  Run r = cli({"routes", "--json"}, scratch.path());
  REQUIRE(r.code == 0);
  const json routes = parse_json(r);
  REQUIRE(routes.is_array());
  REQUIRE(routes.size() == route_table().size());
  for (size_t i = 0; i < routes.size(); ++i) {
    const RouteSpec& spec = route_table()[i];
    const json& j = routes[i];
    INFO(spec.name());
    CHECK(j["name"] == spec.name());
    CHECK(j["cluster"] == spec.cluster);
    // CTAs per SM per op and state dtype, as the generator compiles them.
    for (Op op : all_values<Op>())
      for (StateDtype st : all_values<StateDtype>()) {
        const std::string field = std::string(to_string(op)) + "." + std::string(to_string(st));
        if (!spec.serves(op)) {
          CHECK_FALSE(j["ctas_per_sm"].contains(field));
          continue;
        }
        const int t = op == Op::single ? 1 : op == Op::prefill ? kPrefillChunk : 2;
        const KernelKey k{op, 8, st, ConvLayout::sd, t, Gate::bounded, spec.route, Arch::sm_90};
        CHECK(j["ctas_per_sm"][field] == spec.ctas_per_sm(k));
        CHECK(j["threads"][field] == spec.threads(k));
        if (op == Op::prefill) {
          // The prefill op's launch shape: one CTA per SM, the opt-in shared memory.
          CHECK(j["ctas_per_sm"][field] == 1);
          CHECK(j["dynamic_smem"][field]["bytes"] == 232448);
          CHECK(j["dynamic_smem"][field]["stages"] == 0);
          CHECK(j["templates"]["prefill"] == spec.template_file(Op::prefill));  // the table's (test_route_table pins them)
        }
      }
    // Stages (route stream): the dynamic shared memory the launcher asks for.
    for (StateDtype st : all_values<StateDtype>()) {
      const KernelKey k{Op::single, 8, st, ConvLayout::sd, 1, Gate::bounded, spec.route, Arch::sm_90};
      const std::string field = "single." + std::string(to_string(st));
      if (!spec.serves(Op::single) || spec.stage_count(k) == 0) {
        CHECK_FALSE(j["dynamic_smem"].contains(field));
        continue;
      }
      CHECK(j["dynamic_smem"][field]["stages"] == spec.stage_count(k));
      CHECK(j["dynamic_smem"][field]["bytes"] == spec.dynamic_smem_bytes(k));
    }
  }
  CHECK(routes[static_cast<size_t>(Route::split8)]["ops"] == json::array({"prefill", "chunk"}));
  CHECK(routes[0]["entry"]["chunk"] == "kda_chunk");
  CHECK(routes[static_cast<size_t>(Route::split8)]["cluster"] == 8);
  CHECK(routes[static_cast<size_t>(Route::twopass)]["pre_entry"]["prefill"] == "kda_prefill_intra");
  CHECK(routes[static_cast<size_t>(Route::twopass)]["pre_entry"]["chunk"] == "kda_chunk_intra");
  CHECK_FALSE(routes[static_cast<size_t>(Route::split8)].contains("pre_entry"));
  CHECK(routes[static_cast<size_t>(Route::twopass)]["pre_dynamic_smem_bytes"] == kTwopassIntraSmemBytes);
  CHECK(routes[static_cast<size_t>(Route::twopass)]["pre_ctas_per_sm"] == 2);
  CHECK_FALSE(routes[static_cast<size_t>(Route::split8)].contains("pre_dynamic_smem_bytes"));
  CHECK(routes[static_cast<size_t>(Route::twopass)]["post_entry"] == json{{"prefill", "kda_prefill_norm"}});
  CHECK_FALSE(routes[static_cast<size_t>(Route::split8)].contains("post_entry"));
  CHECK(routes[0]["entry"]["prefill"] == "kda_prefill");
  Run table = cli({"routes"}, scratch.path());
  CHECK(table.code == 0);
  CHECK(table.out.find("shared-memory state stages: packed.bf16=2 (64 KiB)") != std::string::npos);
  CHECK(table.out.find("chunk buffers (dynamic shared memory): chunk.bf16=227 KiB chunk.f32=227 KiB prefill.bf16=227 "
                       "KiB prefill.f32=227 KiB") != std::string::npos);
  CHECK(table.out.find("first kernel (kda_prefill_intra): 112 KiB of dynamic shared memory, 2 CTAs per SM") !=
        std::string::npos);
}

TEST_CASE("prefill keys: presets, key patterns, prewarm --dry-run and compile", "[cli][prewarm][prefill]") {
  TempDir scratch;
  const std::string root = scratch / "cache";
  // The preset's prefill keys: 4 heads x 2 dtypes x 2 layouts x 1 gate x the 2 routes the selector picks (pipe16,
  // twopass; rowcta, the splits and rowcta16 only forced).
  Run keys = cli({"keys", "--preset", "glm-5.3-flash"}, scratch.path(), kSm90);
  REQUIRE(keys.code == 0);
  CHECK(count_lines(keys.out, "kda_prefill.") == 32);
  CHECK(keys.out.find("kda_prefill.h16.state_f32.conv_sd.t16.gate_bounded.route_pipe16.sm_90\n") != std::string::npos);
  CHECK(keys.out.find("kda_prefill.h16.state_f32.conv_sd.t64.gate_bounded.route_twopass.sm_90\n") != std::string::npos);
  CHECK(keys.out.find("kda_prefill.h16.state_bf16.conv_ds.t64.gate_bounded.route_split8.sm_90\n") == std::string::npos);
  CHECK(keys.out.find("kda_prefill.h16.state_bf16.conv_ds.t64.gate_bounded.route_stream") == std::string::npos);

  // A pattern: prefill keys take their route's chunk (64; pipe16 16) whatever t the other ops of the pattern name.
  Run p = cli({"prewarm", "--cache-dir", root, "--dry-run", "--json", "--op", "packed,prefill", "--heads", "16", "--t",
               "4", "--state", "f32", "--conv", "sd", "--gate", "bounded"},
              scratch.path(), kSm90);
  INFO(p.out << p.err);
  REQUIRE(p.code == 0);
  const json pj = parse_json(p);
  std::set<std::string> names;
  for (const auto& r : pj["results"]) names.insert(r["key"].get<std::string>());
  std::set<std::string> want;
  for (std::string_view route : {"rowcta", "split2", "split4", "stream"})
    want.insert(fmt::format("kda_packed.h16.state_f32.conv_sd.t4.gate_bounded.route_{}.sm_90", route));
  want.insert("kda_prefill.h16.state_f32.conv_sd.t64.gate_bounded.route_twopass.sm_90");
  want.insert("kda_prefill.h16.state_f32.conv_sd.t16.gate_bounded.route_pipe16.sm_90");
  CHECK(names == want);
  // --t 64 names the prefill keys' t (a packed-only pattern cannot take it).
  Run t64 = cli({"prewarm", "--cache-dir", root, "--dry-run", "--json", "--op", "prefill", "--heads", "16", "--t", "64",
                 "--state", "f32", "--conv", "sd", "--gate", "bounded", "--route", "split8"},
                scratch.path(), kSm90);
  REQUIRE(t64.code == 0);
  CHECK(parse_json(t64)["results"].size() == 1);
  Run packed64 = cli({"prewarm", "--cache-dir", root, "--dry-run", "--op", "packed", "--heads", "16", "--t", "64"},
                     scratch.path(), kSm90);
  CHECK(packed64.code == 2);
  CHECK(packed64.err.find("1..16 for op packed, got 64") != std::string::npos);
  Run bad_t = cli({"prewarm", "--cache-dir", root, "--dry-run", "--op", "prefill", "--heads", "16", "--t", "4"},
                  scratch.path(), kSm90);
  CHECK(bad_t.code == 2);
  CHECK(bad_t.err.find("field 't': op prefill takes only t=64 (the chunk size), got [4]") != std::string::npos);

  // The chunk op's keys: conv sd only (a pattern that names no layout means it), t = 64 (pipe16 16), not in the presets.
  Run chunk = cli({"prewarm", "--cache-dir", root, "--dry-run", "--json", "--op", "chunk", "--heads", "16"},
                  scratch.path(), kSm90);
  INFO(chunk.out << chunk.err);
  REQUIRE(chunk.code == 0);
  const json chunk_json = parse_json(chunk);
  std::set<std::string> chunk_names;
  for (const auto& r : chunk_json["results"]) chunk_names.insert(r["key"].get<std::string>());
  std::set<std::string> chunk_want;
  for (std::string_view st : {"f32", "bf16"})
    for (std::string_view g : {"bounded", "softplus"})
      for (std::string_view route : {"twopass", "pipe16"})
        chunk_want.insert(fmt::format("kda_chunk.h16.state_{}.conv_sd.t{}.gate_{}.route_{}.sm_90", st,
                                      route == "pipe16" ? 16 : 64, g, route));
  CHECK(chunk_names == chunk_want);
  CHECK(count_lines(keys.out, "kda_chunk.") == 0);
  Run chunk_ds = cli({"prewarm", "--cache-dir", root, "--dry-run", "--op", "chunk", "--heads", "16", "--conv", "ds"},
                     scratch.path(), kSm90);
  CHECK(chunk_ds.code == 2);
  CHECK(chunk_ds.err.find("expected sd for op chunk (it has no conv), got ds") != std::string::npos);

  // A key name whose route does not serve the op, or whose t is not the chunk size.
  Run stream = cli({"compile", "kda_prefill.h16.state_f32.conv_sd.t64.gate_bounded.route_stream.sm_90"}, scratch.path(),
                   kSm90);
  CHECK(stream.code == 2);
  CHECK(stream.err.find(
            "route stream does not serve op prefill; routes of op prefill: rowcta|split2|split4|split8|twopass|rowcta16|pipe16") !=
        std::string::npos);
  Run t8 = cli({"compile", "kda_prefill.h16.state_f32.conv_sd.t8.gate_bounded.route_rowcta.sm_90"}, scratch.path(), kSm90);
  CHECK(t8.code == 2);
  CHECK(t8.err.find("expected 64 (the chunk size) for op prefill on route rowcta, got 8") != std::string::npos);

  // sm_120a lacks the prefill kernel's shared memory: a pattern over several
  // arches leaves those keys out, one that names nothing else says why.
  write_text(scratch / "archs.json", R"([{"op": ["single", "prefill"], "heads": 16, "state": "f32", "conv": "sd",
                                          "gate": "bounded", "arch": ["sm_90", "sm_120a"]}])");
  Run archs = cli({"prewarm", "--cache-dir", root, "--dry-run", "--json", "--manifest", scratch / "archs.json"},
                  scratch.path(), kSm90);
  INFO(archs.err);
  REQUIRE(archs.code == 0);
  size_t prefill_sm90 = 0, prefill_sm120 = 0, single_sm120 = 0;
  const json listed = parse_json(archs);
  for (const auto& row : listed.at("results")) {
    const std::string k = row.at("key").get<std::string>();
    prefill_sm90 += k.rfind("kda_prefill.", 0) == 0 && k.find(".sm_90") != std::string::npos;
    prefill_sm120 += k.rfind("kda_prefill.", 0) == 0 && k.find(".sm_120a") != std::string::npos;
    single_sm120 += k.rfind("kda_single.", 0) == 0 && k.find(".sm_120a") != std::string::npos;
  }
  size_t selectable = 0;  // the routes the selector picks for the op (pipe16, twopass)
  for (std::string_view r : route_names(Op::prefill)) selectable += forced_only(*parse_field<Route>(r), Op::prefill) ? 0 : 1;
  CHECK(selectable == 2);
  CHECK(prefill_sm90 == selectable);
  CHECK(prefill_sm120 == 0);
  CHECK(single_sm120 == route_names(Op::single).size());
  Run only = cli({"prewarm", "--cache-dir", root, "--dry-run", "--op", "prefill", "--heads", "16", "--arch", "sm_120a"},
                 scratch.path(), kSm90);
  CHECK(only.code == 2);
  CHECK(only.err.find("op prefill needs 227 KiB of shared memory per block, sm_120a offers 99 KiB") != std::string::npos);
  CHECK(!fs::exists(root));
}

TEST_CASE("kdajit fields lists the key name's fields from the spelling tables", "[cli][fields]") {
  TempDir scratch;
  Run r = cli({"fields", "--json"}, scratch.path());
  REQUIRE(r.code == 0);
  const json fields = parse_json(r);
  REQUIRE(fields.is_array());
  REQUIRE(fields.size() == kKeyLayout.size());
  const auto spelled = [](auto table) { return std::vector<std::string>(table.begin(), table.end()); };
  CHECK(fields[0]["values"].get<std::vector<std::string>>() == spelled(KeyField<Op>::values));
  CHECK(fields[2]["values"].get<std::vector<std::string>>() == spelled(KeyField<StateDtype>::values));
  CHECK(fields[3]["values"].get<std::vector<std::string>>() == spelled(KeyField<ConvLayout>::values));
  CHECK(fields[5]["values"].get<std::vector<std::string>>() == spelled(KeyField<Gate>::values));
  CHECK(fields[6]["values"].get<std::vector<std::string>>() == spelled(KeyField<Route>::values));
  CHECK(fields[7]["values"].get<std::vector<std::string>>() == spelled(KeyField<Arch>::values));
  for (size_t i : {size_t{1}, size_t{4}}) {
    CHECK(fields[i]["min"] == kKeyLayout[i].lo);
    CHECK(fields[i]["max"] == kKeyLayout[i].hi);
    CHECK_FALSE(fields[i].contains("values"));
  }
  // A key name is the fields' prefixes and values joined by dots, in this order.
  const KernelKey k{Op::packed, 64, StateDtype::bf16, ConvLayout::ds, 4, Gate::softplus, Route::split2, Arch::sm_90a};
  const std::array<std::string, 8> values = {"packed", "64", "bf16", "ds", "4", "softplus", "split2", "sm_90a"};
  std::string name;
  for (size_t i = 0; i < fields.size(); ++i) {
    CHECK(fields[i]["name"] == kKeyLayout[i].json_name);
    if (i) name += '.';
    name += fields[i]["prefix"].get<std::string>();
    name += values[i];
  }
  CHECK(name == key_name(k));
  Run table = cli({"fields"}, scratch.path());
  CHECK(table.code == 0);
  CHECK(table.out.find(key_name_shape()) != std::string::npos);
}

// Prefill keys of different head counts, state dtypes and conv layouts generate
// one source: a prewarm compiles each program once and stores an entry per
// key, each of which verifies.
TEST_CASE("prewarm compiles one program per distinct source and stores every key", "[cli][prewarm][program]") {
  TempDir scratch;
  std::string root = scratch / "cache";
  const std::vector<std::string> keys = {"--op",   "prefill", "--heads", "8,16",    "--state",       "f32,bf16",
                                         "--conv", "sd,ds",   "--gate",  "bounded", "--route", "rowcta,split2"};
  Run dry = cli(args_of({"prewarm", "--cache-dir", root, "--dry-run"}, keys), scratch.path(), kSm90);
  INFO(dry.out << dry.err);
  CHECK(dry.code == 0);
  CHECK(dry.out.find("prewarm --dry-run: 16 keys (2 programs) for sm_90: 0 present, 16 missing, 0 unusable, 0 failed; "
                     "a prewarm compiles 2 programs") != std::string::npos);

  Run warm = cli(args_of({"prewarm", "--cache-dir", root, "-j", "2", "--json"}, keys), scratch.path(), kSm90);
  INFO(warm.out << warm.err);
  REQUIRE(warm.code == 0);
  json j = parse_json(warm);
  CHECK(j["keys"] == 16);
  CHECK(j["programs"] == 2);
  CHECK(j["compiled"] == 2);
  CHECK(j["reused"] == 14);
  CHECK(j["compile_cpu_s"].get<double>() > 0);
  std::map<std::string, std::string> compiled_for;  // reused key -> the key compiled
  std::set<std::string> compiled;
  for (const auto& row : j["results"]) {
    INFO(row.dump());
    CHECK(!row["dir"].get<std::string>().empty());
    if (row["status"] == "compiled") {
      compiled.insert(row["key"].get<std::string>());
      CHECK(row["phases"].contains("cpu_ms"));
    } else {
      CHECK(row["status"] == "reused");
      compiled_for[row["key"].get<std::string>()] = row["program_compiled_for"].get<std::string>();
    }
  }
  CHECK(compiled.size() == 2);
  for (const auto& [key, of] : compiled_for) {
    INFO(key << " <- " << of);
    CHECK(compiled.count(of) == 1);
    // The same program: the route is the same; heads, state or conv differ.
    CHECK(key.substr(key.find(".t64.")) == of.substr(of.find(".t64.")));
    CHECK(key != of);
  }
  CHECK(compiled_for.size() == 14);
  // The second process: every key cached; the table says programs vs keys.
  Run again = cli(args_of({"prewarm", "--cache-dir", root}, keys), scratch.path(), kSm90);
  INFO(again.out << again.err);
  CHECK(again.code == 0);
  CHECK(again.out.rfind("prewarm: 16 keys (2 programs) for sm_90: 0 compiled, 16 already cached, 0 failed in ", 0) == 0);

  Run v = cli({"verify", "--cache-dir", root, "--json"}, scratch.path());
  INFO(v.out << v.err);
  CHECK(v.code == 0);
  json vj = parse_json(v);
  CHECK(vj["checked"] == 16);
  CHECK(vj["ok"] == 16);
  CHECK(vj["bad"].empty());

  // One key missing from a root that holds its program: the prewarm makes it from
  // the cached entry of the other head count, with no compile.
  Run more = cli(args_of({"prewarm", "--cache-dir", root, "--json"},
                         {"--op", "prefill", "--heads", "8,32", "--state", "f32", "--conv", "sd", "--gate", "bounded",
                          "--route", "rowcta"}),
                 scratch.path(), kSm90);
  INFO(more.out << more.err);
  CHECK(more.code == 0);
  json mj = parse_json(more);
  CHECK(mj["compiled"] == 0);
  CHECK(mj["cached"] == 1);
  CHECK(mj["reused"] == 1);
}
