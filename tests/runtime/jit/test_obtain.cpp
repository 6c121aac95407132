// The build step's one path: obtain() compiles into a real cache root with the
// NVRTC it loaded at run time, serves memory and disk hits, refuses a build
// when builds are not allowed, and plan_build() names the entry it looks up.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "catch.hpp"
#include "kdajit/runtime/jit/nvrtc_api.hpp"
#include "kdajit/runtime/jit/obtain.hpp"

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

// Keys with the same build inputs (the prefill op's head counts) are one
// program: the second key's entry is made from the first one's cubin, and is
// still an entry of its own key that the cache verifies.
TEST_CASE("obtain: a key whose program this process compiled reuses the cubin", "[obtain][program]") {
  REQUIRE(nvrtc().ok());
  const std::string root =
      (std::filesystem::temp_directory_path() / ("kdajit-obtain-program-" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(root);
  const KernelKey h8{Op::prefill, 8, StateDtype::f32, ConvLayout::sd, kPrefillChunk, Gate::bounded, Route::rowcta, Arch::sm_90};
  KernelKey h32 = h8;
  h32.heads = 32;
  auto cache = open_kernel_cache(root);
  REQUIRE(cache.ok());
  auto first = obtain(**cache, h8, true);
  INFO((first ? std::string() : first.error().message));
  REQUIRE(first.ok());
  CHECK(first->source == CacheSource::built);
  CHECK_FALSE(first->entry->meta.contains(kProgramCompiledForField));

  auto second = obtain(**cache, h32, true);
  REQUIRE(second.ok());
  CHECK(second->source == CacheSource::built);
  CHECK(second->entry->meta.value(kProgramCompiledForField, "") == key_name(h8));
  CHECK(second->entry->cubin == first->entry->cubin);
  CHECK(second->entry->hash == first->entry->hash);
  CHECK(second->entry->key == h32);
  CHECK(second->entry->meta.value("key_name", "") == key_name(h32));
  CHECK(second->entry->meta["registers"] == first->entry->meta["registers"]);
  CHECK(second->entry->dir != first->entry->dir);

  // Both entries are on disk, verify, and load in a fresh cache as their own keys.
  size_t verified = 0;
  for (const CacheEntryInfo& e : (*cache)->list_entries()) {
    INFO(e.dir);
    auto v = (*cache)->verify_entry(e);
    CHECK(v.ok);
    verified += v.ok;
  }
  CHECK(verified == 2);
  auto fresh = open_kernel_cache(root);
  REQUIRE(fresh.ok());
  auto disk = obtain(**fresh, h32, /*allow_build=*/false);
  REQUIRE(disk.ok());
  CHECK(disk->source == CacheSource::disk);
  CHECK(disk->entry->key == h32);
  std::filesystem::remove_all(root);
}

// Two caches of one process asking for one program at once: one compile, and
// the other build takes its cubin (waiting for it when it is still in flight).
TEST_CASE("obtain: concurrent builds of one program compile it once", "[obtain][program]") {
  REQUIRE(nvrtc().ok());
  const std::string base =
      (std::filesystem::temp_directory_path() / ("kdajit-obtain-flight-" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(base);
  const KernelKey key{Op::single, 6, StateDtype::f32, ConvLayout::ds, 1, Gate::softplus, Route::rowcta, Arch::sm_90};
  auto a = open_kernel_cache(base + "/a");
  auto b = open_kernel_cache(base + "/b");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  Result<CacheLookup> ra = Error(ErrorCode::internal, ""), rb = Error(ErrorCode::internal, "");
  std::thread ta([&] { ra = obtain(**a, key, true); });
  std::thread tb([&] { rb = obtain(**b, key, true); });
  ta.join();
  tb.join();
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  CHECK(ra->source == CacheSource::built);
  CHECK(rb->source == CacheSource::built);
  const bool a_reused = ra->entry->meta.contains(kProgramCompiledForField);
  const bool b_reused = rb->entry->meta.contains(kProgramCompiledForField);
  CHECK(a_reused != b_reused);
  CHECK(ra->entry->cubin == rb->entry->cubin);
  std::filesystem::remove_all(base);
}

TEST_CASE("obtain: NVRTC candidates only count before the first load", "[obtain]") {
  REQUIRE(nvrtc().ok());
  CHECK_FALSE(nvrtc_add_candidate("/nonexistent/libnvrtc.so"));
}

}  // namespace
}  // namespace kdajit

// Cache hits need no NVRTC. Two CTest runs of this binary (tests/runtime/CMakeLists.txt):
// [nvrtc_warm] fills a cache root with NVRTC; [no_nvrtc] runs with KDAJIT_NVRTC
// pointing at nothing, so no NVRTC loads, and still gets the entry from disk.
namespace kdajit {
namespace {

const KernelKey kNoNvrtcKey{Op::packed, 3, StateDtype::bf16, ConvLayout::ds, 2, Gate::bounded, Route::rowcta, Arch::sm_90};

std::string fixture_root() {
  const char* r = std::getenv("KDAJIT_TEST_CACHE");
  REQUIRE(r != nullptr);
  return r;
}

TEST_CASE("obtain: fill a cache for the no-NVRTC run", "[.][nvrtc_warm]") {
  std::filesystem::remove_all(fixture_root());
  auto cache = open_kernel_cache(fixture_root());
  REQUIRE(cache.ok());
  auto built = obtain(**cache, kNoNvrtcKey, true);
  INFO((built ? std::string() : built.error().message));
  REQUIRE(built.ok());
}

TEST_CASE("obtain: a cache hit without any NVRTC", "[.][no_nvrtc]") {
  auto api = nvrtc();
  REQUIRE_FALSE(api.ok());  // KDAJIT_NVRTC names a file that does not exist
  CHECK(api.error().message.find("KDAJIT_NVRTC") != std::string::npos);
  auto cache = open_kernel_cache(fixture_root());
  REQUIRE(cache.ok());
  auto hit = obtain(**cache, kNoNvrtcKey, /*allow_build=*/true);
  INFO((hit ? std::string() : hit.error().message));
  REQUIRE(hit.ok());
  CHECK(hit->source == CacheSource::disk);
  CHECK(!hit->entry->cubin.empty());
  // A key that is not cached: the NVRTC error, naming the key.
  KernelKey other = kNoNvrtcKey;
  other.heads = 5;
  auto miss = obtain(**cache, other, true);
  REQUIRE_FALSE(miss.ok());
  CHECK(miss.error().message.find("NVRTC") != std::string::npos);
  CHECK(miss.error().message.find(key_name(other)) != std::string::npos);

  // The entry with an extra field in its stored key does not load: without NVRTC
  // that is the missing NVRTC, not a capture error.
  std::string meta_path;
  for (const auto& e : std::filesystem::recursive_directory_iterator(fixture_root()))
    if (e.path().filename() == "meta.json") meta_path = e.path().string();
  REQUIRE(!meta_path.empty());
  nlohmann::json meta;
  {
    std::ifstream in(meta_path);
    meta = nlohmann::json::parse(in);
  }
  meta["key"]["extra"] = 1;
  {
    std::ofstream out(meta_path, std::ios::trunc);
    out << meta.dump();
  }
  auto fresh = open_kernel_cache(fixture_root());
  REQUIRE(fresh.ok());
  auto broken = obtain(**fresh, kNoNvrtcKey, true);
  REQUIRE_FALSE(broken.ok());
  INFO(broken.error().message);
  CHECK(broken.error().code != ErrorCode::capture);
  CHECK(broken.error().code == api.error().code);
  CHECK(broken.error().message.find("NVRTC") != std::string::npos);
  CHECK(broken.error().message.find("capture") == std::string::npos);
  std::filesystem::remove_all(fixture_root());
}

}  // namespace
}  // namespace kdajit
