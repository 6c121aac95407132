// Zero compiles at serving time with `kdajit prewarm --sm-count N`: every call
// shape of a preset (single op rows 1..1024 in every slot-index mode; packed op
// N 1..1024 at each T of the preset, full and ragged rows; prefill N 1..1024 at
// short and long prompts) goes through the
// runtime's selector for that SM count, and every key it selects is among the
// keys the dry run says prewarm compiles.
#include <set>

#include "cli_test_util.hpp"
#include "kdajit/presets.hpp"
#include "kdajit/runtime/call/select.hpp"

using namespace kdajit;
using namespace kdajit::test;

namespace {

std::set<std::string> prewarm_keys(const std::vector<std::string>& args, const std::string& dir, size_t* left_out) {
  Run r = cli(args, dir, {{"KDAJIT_ARCH", "sm_90"}});
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto j = parse_json(r);
  std::set<std::string> keys;
  for (const auto& row : j.at("results")) keys.insert(row.at("key").get<std::string>());
  if (left_out) *left_out = j.contains("routes") ? j["routes"].at("left_out").get<size_t>() : 0;
  if (j.contains("routes")) CHECK(j["routes"].at("prefill") == "the routes some prompt length picks");
  return keys;
}

}  // namespace

TEST_CASE("prewarm --sm-count compiles every key the selector picks for the preset's shapes", "[prewarm][select]") {
  TempDir scratch;
  const std::string root = scratch.path() + "/cache";
  for (const std::string preset : {"glm-5.3-flash", "kimi-k3"}) {
    const auto all = prewarm_keys({"prewarm", "--preset", preset, "--cache-dir", root, "--dry-run", "--json"},
                                  scratch.path(), nullptr);
    for (int sms : {132, 78, 170, 16}) {
      INFO(preset << " at " << sms << " SMs");
      size_t left_out = 0;
      const auto warm = prewarm_keys({"prewarm", "--preset", preset, "--sm-count", std::to_string(sms), "--cache-dir",
                                      root, "--dry-run", "--json"},
                                     scratch.path(), &left_out);
      CHECK(warm.size() + left_out == all.size());
      for (const auto& k : warm) CHECK(all.count(k) == 1);

      const DeviceTraits device{Arch::sm_90, sms};
      std::set<KernelKey> families;
      const auto preset_list = preset_keys(preset, Arch::sm_90);
      REQUIRE(preset_list.ok());
      for (KernelKey k : preset_list.value()) {
        k.route = Route::rowcta;
        if (chunked(k.op)) k.tokens = kPrefillChunk;  // the family of route pipe16's t16 keys too
        families.insert(k);
      }
      std::set<std::string> selected, serving_compiles;
      size_t calls = 0;
      auto drive = [&](const CallShape& call) {
        auto route = select_route(call, device, RoutePolicy{});
        REQUIRE(route.ok());
        const std::string name = key_name(key_for(call, *route, device.arch));
        selected.insert(name);
        if (!warm.count(name)) serving_compiles.insert(name);
        ++calls;
      };
      for (const KernelKey& family : families) {
        CallShape call;
        call.family = family;
        for (int64_t b = 1; b <= 1024; ++b) {
          if (family.op == Op::single) {
            call.rows = b;
            for (IndicesMode m : {IndicesMode::unique_or_null, IndicesMode::positive_unique, IndicesMode::repeated_positive}) {
              call.mode = m;
              drive(call);
            }
            continue;
          }
          if (family.op == Op::prefill) {
            // b sequences, the longest at each length band's edges (twopass's
            // and the split's thresholds, long), with and without a workspace
            // (route twopass).
            call.num_seqs = b;
            for (int64_t longest : {1, 127, 128, 1023, 1024, 65536})
              for (bool workspace : {false, true}) {
                call.rows = b * longest;
                call.max_seq_len = longest;
                call.workspace_bytes = workspace ? twopass_workspace_bytes(b, call.rows, family.heads) : 0;
                drive(call);
              }
            continue;
          }
          REQUIRE(family.tokens >= 1);
          REQUIRE(family.tokens <= 16);
          call.num_seqs = b;
          for (int64_t rows : {b, b * family.tokens, b * family.tokens - (family.tokens - 1) / 2}) {
            call.rows = rows;
            for (IndicesMode m : {IndicesMode::unique_or_null, IndicesMode::positive_unique}) {
              call.mode = m;
              drive(call);
            }
          }
        }
      }
      CHECK(calls > 100000);
      CHECK(serving_compiles.empty());  // zero compiles at serving time
      for (const auto& k : serving_compiles) UNSCOPED_INFO("compiled at serving time: " << k);
      // Nothing compiled that the selector never picks.
      CHECK(selected == warm);
    }
  }
}

TEST_CASE("prewarm --sm-count: bad values and conflicting flags are usage errors", "[prewarm]") {
  TempDir scratch;
  const std::string root = scratch.path() + "/cache";
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"prewarm", "--preset", "glm-5.3-flash", "--sm-count", "0", "--cache-dir", root, "--dry-run"},
           {"prewarm", "--preset", "glm-5.3-flash", "--sm-count", "132", "--all-routes", "--cache-dir", root, "--dry-run"},
           {"prewarm", "--preset", "glm-5.3-flash", "--sm-count", "132", "--this-gpu", "--cache-dir", root, "--dry-run"}}) {
    Run r = cli(args, scratch.path(), {{"KDAJIT_ARCH", "sm_90"}});
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find("kdajit: error:") != std::string::npos);
  }
  Run text = cli({"prewarm", "--preset", "glm-5.3-flash", "--sm-count", "132", "--cache-dir", root, "--dry-run"},
                 scratch.path(), {{"KDAJIT_ARCH", "sm_90"}});
  CHECK(text.code == 0);
  CHECK(text.out.find("SELECTED FOR") != std::string::npos);
  CHECK(text.out.find("repeated slots") != std::string::npos);
  CHECK(text.out.find("on 132 SMs") != std::string::npos);
  CHECK(text.out.find("A prefill or chunk key stays when some prompt length picks its route") != std::string::npos);
  CHECK(text.out.find("route_pipe16.sm_90     N 1-1024 (at some prompt length)") != std::string::npos);
}

TEST_CASE("a warm cache layer built at image time serves the node without a compile", "[prewarm][layers]") {
  TempDir scratch;
  const std::string shipped = scratch.path() + "/opt-kdajit", mine = scratch.path() + "/home-cache";
  const std::map<std::string, std::string> sm90 = {{"KDAJIT_ARCH", "sm_90"}};
  const std::vector<std::string> family = {"--op", "single", "--heads", "64", "--state", "f32", "--conv", "sd",
                                           "--gate", "bounded", "--sm-count", "132"};
  auto with = [&](std::vector<std::string> head) {
    head.insert(head.end(), family.begin(), family.end());
    return head;
  };
  // Image build: the routes one H200 uses (rowcta, sequential, split2 for this family).
  Run build = cli(with({"prewarm", "--cache-dir", shipped, "--json"}), scratch.path(), sm90);
  INFO(build.out << build.err);
  REQUIRE(build.code == 0);
  CHECK(parse_json(build)["compiled"] == 3);
  // On the node: the layer verifies, the check finds every key, and a prewarm
  // over the layers compiles nothing and writes nothing into the user's layer.
  Run verify = cli({"verify", "--cache-dir", shipped}, scratch.path(), sm90);
  INFO(verify.out << verify.err);
  CHECK(verify.code == 0);
  const std::map<std::string, std::string> layered = {{"KDAJIT_ARCH", "sm_90"}, {"KDAJIT_CACHE_DIR", mine + ":" + shipped}};
  Run check = cli(with({"prewarm", "--check", "--json"}), scratch.path(), layered);
  INFO(check.out << check.err);
  CHECK(check.code == 0);
  CHECK(parse_json(check)["present"] == 3);
  Run again = cli(with({"prewarm", "--json"}), scratch.path(), layered);
  CHECK(again.code == 0);
  const auto j = parse_json(again);
  CHECK(j["compiled"] == 0);
  CHECK(j["cached"] == 3);
  Run ls = cli({"ls", "--cache-dir", mine, "--json"}, scratch.path());
  CHECK(parse_json(ls)["entries"].empty());
}
