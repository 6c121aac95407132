// `--device N` on the verbs that touch a GPU, and the GPUs `kdajit env` lists:
// an index that is not a GPU of this machine is a usage error naming the flag
// and the valid range (exit 2); without a GPU every index says so, with the
// verb's usual no-GPU exit code.
#include "cli_test_util.hpp"

using namespace kdajit;
using namespace kdajit::test;
using nlohmann::json;

namespace {

size_t gpus_here(const std::string& dir) {
  json env = parse_json(cli({"env", "--json"}, dir));
  return env["driver"]["gpus"].size();
}

}  // namespace

TEST_CASE("env lists every GPU with its index, name, arch and SM count", "[cli][env][device]") {
  TempDir scratch;
  Run r = cli({"env", "--json"}, scratch.path());
  REQUIRE(r.code == 0);
  const json gpus = parse_json(r)["driver"]["gpus"];
  Run text = cli({"env"}, scratch.path());
  REQUIRE(text.code == 0);
  if (gpus.empty()) {
    CHECK(text.out.find("gpu      none") != std::string::npos);
    return;
  }
  for (size_t i = 0; i < gpus.size(); ++i) {
    INFO(gpus[i].dump());
    CHECK(gpus[i]["index"] == i);
    CHECK(!gpus[i]["name"].get<std::string>().empty());
    CHECK(gpus[i]["arch"].is_string());
    CHECK(gpus[i]["sm_count"].get<int>() > 0);
    CHECK(text.out.find(fmt::format("gpu {}    {}", i, gpus[i]["name"].get<std::string>())) != std::string::npos);
    CHECK(text.out.find(fmt::format("{} SMs", gpus[i]["sm_count"].get<int>())) != std::string::npos);
  }
}

TEST_CASE("--device out of range: a usage error naming the flag and the range", "[cli][device]") {
  TempDir scratch;
  const std::string cache = scratch / "cache";
  const size_t n = gpus_here(scratch.path());
  const std::vector<std::string> pattern = {"--op", "single", "--heads", "8", "--state", "f32", "--conv", "sd",
                                            "--gate", "bounded", "--route", "rowcta"};
  auto prewarm = [&](const std::string& device) {
    std::vector<std::string> args = {"prewarm", "--cache-dir", cache, "--device", device};
    args.insert(args.end(), pattern.begin(), pattern.end());
    return cli(args, scratch.path());
  };
  if (n == 0) {
    // No GPU: every index says so; selfcheck still skips (77), tune fails (1),
    // prewarm --device cannot be honoured (2). Nothing is written.
    for (const std::string device : {"0", "3", "-1"}) {
      INFO("--device " << device);
      Run s = cli({"selfcheck", "--cache-dir", cache, "--device", device}, scratch.path());
      CHECK(s.code == 77);
      CHECK(s.out.find("no CUDA GPU on this machine; skipped") != std::string::npos);
      Run t = cli({"tune", "--cache-dir", cache, "--device", device, "--rows", "1"}, scratch.path());
      CHECK(t.code == 1);
      CHECK(t.err.find("--device: no CUDA GPU on this machine") != std::string::npos);
      Run p = prewarm(device);
      CHECK(p.code == 2);
      CHECK(p.err.find("--device: no CUDA GPU on this machine") != std::string::npos);
    }
    CHECK(!fs::exists(cache));
    return;
  }
  const std::string range = fmt::format("--device: expected a device ordinal in 0..{}", n - 1);
  for (const std::string& device : {std::to_string(n), std::to_string(n + 5), std::string("-1")}) {
    INFO("--device " << device);
    Run s = cli({"selfcheck", "--cache-dir", cache, "--device", device}, scratch.path());
    CHECK(s.code == 2);
    CHECK(s.err.find(range) != std::string::npos);
    CHECK(s.err.find("got " + device) != std::string::npos);
    Run t = cli({"tune", "--cache-dir", cache, "--device", device, "--rows", "1"}, scratch.path());
    CHECK(t.code == 2);
    CHECK(t.err.find(range) != std::string::npos);
    Run p = prewarm(device);
    CHECK(p.code == 2);
    CHECK(p.err.find(range) != std::string::npos);
    Run v = cli({"verify", "--load", "--cache-dir", cache, "--device", device}, scratch.path());
    CHECK(v.code == 2);
    CHECK(v.err.find(range) != std::string::npos);
  }
  CHECK(!fs::exists(fs::path(cache) / "sm_90"));
  // A GPU of this machine is taken: prewarm builds for its arch.
  Run p = prewarm(std::to_string(n - 1));
  INFO(p.out << p.err);
  CHECK(p.code == 0);
}

TEST_CASE("prewarm: --device and --arch together are refused", "[cli][device]") {
  TempDir scratch;
  Run r = cli({"prewarm", "--cache-dir", scratch / "cache", "--device", "0", "--arch", "sm_90", "--op", "single",
               "--heads", "8"},
              scratch.path());
  CHECK(r.code == 2);
  CHECK(r.err.find("give --device or --arch, not both") != std::string::npos);
  CHECK(!fs::exists(scratch / "cache"));
}
