// Runtime::prewarm_async: worker threads compile a preset's keys into the cache
// and the counters say so; a key compiling in the background is not compiled a
// second time by a caller that needs it; a second runtime on the same cache
// compiles nothing. No GPU: compiles and cache only.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "kdajit/kdajit.hpp"

namespace {

struct TempRoot {
  std::string path;
  TempRoot() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/kdajit-bg-prewarm.XXXXXX";
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path = templ;
  }
  ~TempRoot() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::unique_ptr<kdajit::Runtime> runtime_on(const std::string& root) {
  kdajit::RuntimeOptions o;
  o.cache_dir = root;
  o.arch = "sm_90";
  o.log_level = KDAJIT_LOG_QUIET;
  std::unique_ptr<kdajit::Runtime> rt;
  auto r = kdajit::Runtime::create(o, &rt);
  INFO(r.message);
  REQUIRE(r.ok());
  return rt;
}

}  // namespace

TEST_CASE("prewarm_async compiles in the background, once per key, and counts", "[prewarm][background]") {
  TempRoot root;
  std::vector<std::string> preset;
  REQUIRE(kdajit::Runtime::preset_key_names("glm-5.3-flash", "sm_90", &preset).ok());
  // 16 single-op families x 5 routes, 48 packed x 4, 16 prefill x 2 (pipe16, twopass).
  REQUIRE(preset.size() == 16 * 5 + 48 * 4 + 16 * 2);
  CHECK(std::count_if(preset.begin(), preset.end(), [](const std::string& k) { return k.rfind("kda_prefill.", 0) == 0; }) ==
        16 * 2);
  // The H8 single-op family: five keys, every single-op route.
  std::vector<std::string> keys;
  for (const auto& k : preset)
    if (k.rfind("kda_single.h8.state_f32.conv_sd.", 0) == 0) keys.push_back(k);
  REQUIRE(keys.size() == 5);

  auto rt = runtime_on(root.path);
  REQUIRE(rt->prewarm_async(keys, 2).ok());
  // A caller needing one of them meanwhile waits on the compile in flight (or
  // finds it done, or builds it while the workers take the others): one
  // compile per key in all.
  bool compiled_here = false;
  REQUIRE(rt->prewarm(keys[0], &compiled_here).ok());
  rt->wait_prewarm();
  kdajit::RuntimeStats s = rt->stats();
  CHECK(s.prewarm_pending == 0);
  CHECK(s.prewarm_failed == 0);
  CHECK(s.prewarm_compiled + (compiled_here ? 1 : 0) == keys.size());
  CHECK(s.serving_compiles == 0);  // prewarm is not a call

  auto second = runtime_on(root.path);
  REQUIRE(second->prewarm_async(keys, 1).ok());
  second->wait_prewarm();
  CHECK(second->stats().prewarm_compiled == 0);  // all on disk

  // A bad name queues nothing and names its index.
  auto bad = second->prewarm_async({keys[0], "kda_single.h8.nope"}, 1);
  CHECK(bad.code == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(bad.message.find("key_names[1]") != std::string::npos);
  CHECK(second->stats().prewarm_pending == 0);
  std::vector<std::string> none;
  CHECK(kdajit::Runtime::preset_key_names("no-such-preset", "sm_90", &none).code == KDAJIT_ERROR_INVALID_ARGUMENT);

  // A runtime destroyed with keys queued stops its workers and returns.
  {
    TempRoot other;
    auto rt3 = runtime_on(other.path);
    std::vector<std::string> many(preset.begin(), preset.begin() + 40);
    REQUIRE(rt3->prewarm_async(many, 1).ok());
  }
}

// Prefill keys that differ only in the head count are one program: the runtime
// compiles it once, and every key of it is in the cache afterwards.
TEST_CASE("prewarm_async compiles a program that several keys share once", "[prewarm][background][program]") {
  TempRoot root;
  const std::string family = ".state_bf16.conv_sd.t64.gate_bounded.route_split4.sm_90";
  const std::vector<std::string> keys = {"kda_prefill.h8" + family, "kda_prefill.h16" + family};
  auto rt = runtime_on(root.path);
  REQUIRE(rt->prewarm_async(keys, 2).ok());
  rt->wait_prewarm();
  CHECK(rt->stats().prewarm_failed == 0);
  CHECK(rt->stats().prewarm_compiled == 1);
  // A third head count in the same process: no compile either.
  bool compiled = true;
  REQUIRE(rt->prewarm("kda_prefill.h64" + family, &compiled).ok());
  CHECK_FALSE(compiled);

  // All three are on disk, an entry each: a second runtime finds them and compiles nothing.
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(root.path + "/sm_90"))
    entries += e.path().filename().string().rfind("kda_prefill.h", 0) == 0;
  CHECK(entries == 3);
  auto second = runtime_on(root.path);
  for (const auto& k : {keys[0], keys[1], "kda_prefill.h64" + family}) {
    INFO(k);
    bool again = true;
    REQUIRE(second->prewarm(k, &again).ok());
    CHECK_FALSE(again);
  }
}
