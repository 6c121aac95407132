// The build step's one path: obtain() compiles into a real cache root with the
// NVRTC it loaded at run time, serves memory and disk hits, refuses a build
// when builds are not allowed, and plan_build() names the entry it looks up.
#include <unistd.h>

#include <filesystem>

#include "catch.hpp"
#include "kdajit/runtime/build/nvrtc_api.hpp"
#include "kdajit/runtime/build/obtain.hpp"

namespace kdajit {
namespace {

TEST_CASE("obtain: compile, memory hit, disk hit, capture refusal", "[obtain]") {
  auto api = nvrtc();
  REQUIRE(api.ok());
  INFO("NVRTC " << (*api)->version << " from " << (*api)->path << " (" << (*api)->chosen_by << ")");
  CHECK(!(*api)->version.empty());
  CHECK(std::filesystem::exists((*api)->path));

  const std::string root = (std::filesystem::temp_directory_path() / ("kdajit-obtain-" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(root);
  const KernelKey key{Op::single, 4, StateDtype::bf16, ConvLayout::sd, 1, Gate::bounded, Route::split2, Arch::sm_90};
  {
    auto cache = open_kernel_cache(root);
    REQUIRE(cache.ok());
    // A miss that may not build names the key and says to pre-warm it.
    auto refused = obtain(**cache, key, /*allow_build=*/false);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().code == ErrorCode::capture);
    CHECK(refused.error().message.find(key_name(key)) != std::string::npos);

    auto built = obtain(**cache, key, true);
    REQUIRE(built.ok());
    CHECK(built->source == CacheSource::built);
    CHECK(!built->entry->cubin.empty());
    CHECK(built->entry->meta.value("entry", "") == "kda_single_decode");
    CHECK(built->entry->meta.value("threads", 0) == 256);

    auto plan = plan_build(key);
    REQUIRE(plan.ok());
    CHECK(built->entry->hash == plan->hash);
    CHECK(built->entry->dir == (*cache)->entry_dir(key, plan->hash));
    CHECK(plan->inputs.nvrtc_version == (*api)->version);

    auto again = obtain(**cache, key, false);
    REQUIRE(again.ok());
    CHECK(again->source == CacheSource::memory);
    CHECK(again->entry == built->entry);
  }
  // A new process-level cache on the same root: a disk hit, no build allowed or needed.
  auto cache2 = open_kernel_cache(root);
  REQUIRE(cache2.ok());
  auto disk = obtain(**cache2, key, /*allow_build=*/false);
  REQUIRE(disk.ok());
  CHECK(disk->source == CacheSource::disk);
  std::filesystem::remove_all(root);
}

TEST_CASE("obtain: NVRTC candidates only count before the first load", "[obtain]") {
  REQUIRE(nvrtc().ok());
  CHECK_FALSE(nvrtc_add_candidate("/nonexistent/libnvrtc.so"));
}

}  // namespace
}  // namespace kdajit
