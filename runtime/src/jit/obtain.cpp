#include "kdajit/runtime/jit/obtain.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kdajit/routes.hpp"
#include "kdajit/runtime/jit/nvrtc_api.hpp"
#include "kdajit/sha256.hpp"
#include "kdajit/source_generator.hpp"

namespace kdajit {

namespace {

// The cache's record of one compile (cubin, options, resources, log, entry name).
CacheBuild to_cache_build(const BuildInputs& in, CompiledKernel ck) {
  CacheBuild b;
  b.source = in.source;
  b.cubin = std::move(ck.cubin);
  b.options = in.options;
  b.nvrtc_version = in.nvrtc_version;
  b.meta = {{"entry", entry_name(in.key.op)},
            {"threads", route_spec(in.key.route).threads(in.key)},
            {"registers", ck.resources.registers},
            {"spill_bytes", ck.resources.spill_bytes},
            {"stack_bytes", ck.resources.stack_bytes},
            {"smem_bytes", ck.resources.smem_bytes},
            {"compile_ms", ck.compile_ms},
            {"phases", phases_to_json(ck.phases)},
            {"nvrtc_log", std::move(ck.log)}};
  return b;
}

}  // namespace

Result<BuildPlan> plan_build(const KernelKey& key) {
  KDAJIT_TRY_ASSIGN(BuildInputs in, make_build_inputs(key));
  std::string hash = current_build_hash(in.source, in.options, in.key.arch, in.nvrtc_version);
  return BuildPlan{std::move(in), std::move(hash)};
}

// Without NVRTC the build hash cannot be formed (its version is an input), but a
// cached entry still serves: one of this key whose stored inputs are today's
// (schema, library version, source, options) and whose hash recomputes from them
// with the NVRTC version it records. The newest such entry, loaded verified.
Result<CacheLookup> find_without_nvrtc(KernelCache& cache, const KernelKey& key, const Error& no_nvrtc) {
  KDAJIT_TRY_ASSIGN(std::string source, generate_source(key));
  const std::vector<std::string> options = canonical_options(key);
  const std::string source_sha = sha256_hex(source);
  std::optional<std::string> best_hash;
  int64_t best_used = -1;
  for (const CacheEntryInfo& e : cache.list_entries()) {
    if (!e.key || *e.key != key || !e.meta || e.stale || !e.untrusted.empty()) continue;
    const nlohmann::json& m = *e.meta;
    auto text = [&](const char* f) { return m.contains(f) && m[f].is_string() ? m[f].get<std::string>() : std::string(); };
    if (text("source_sha256") != source_sha || !m.contains("options") || m["options"] != options) continue;
    const std::string hash = current_build_hash(source, options, key.arch, text("nvrtc_version"));
    if (hash != text("hash") || e.last_used_ns <= best_used) continue;
    // Only an entry that loads (every check of a load, e.g. the stored key parses)
    // is a candidate: a broken one is simply not in the cache.
    if (cache.probe(key, hash).state != CacheProbe::State::present) continue;
    best_hash = hash;
    best_used = e.last_used_ns;
  }
  if (!best_hash)
    return Error(no_nvrtc.code, fmt::format("{} (kernel {} is not in the cache either)", no_nvrtc.message, key_name(key)),
                 no_nvrtc.detail);
  auto found = cache.lookup(key, *best_hash, BuildFn(), /*allow_build=*/false);
  // Gone or broken since the probe: still the missing NVRTC, never a capture error.
  if (!found && found.error().code == ErrorCode::capture)
    return Error(no_nvrtc.code,
                 fmt::format("{} (kernel {} is not in the cache either: its entry became unusable)", no_nvrtc.message,
                             key_name(key)),
                 no_nvrtc.detail);
  return found;
}

Result<CacheLookup> obtain(KernelCache& cache, const KernelKey& key, bool allow_build) {
  // Another context of this process may have it already: no source generation then.
  if (auto entry = cache.find_loaded(key)) {
    CacheLookup hit;
    hit.entry = std::move(entry);
    hit.source = CacheSource::memory;
    return hit;
  }
  if (auto api = nvrtc(); !api) return find_without_nvrtc(cache, key, api.error());
  KDAJIT_TRY_ASSIGN(BuildPlan plan, plan_build(key));
  const BuildInputs& in = plan.inputs;
  BuildFn build = [&in]() -> Result<CacheBuild> {
    KDAJIT_TRY_ASSIGN(CompiledKernel ck, compile(in));
    return to_cache_build(in, std::move(ck));
  };
  return cache.lookup(key, plan.hash, build, allow_build);
}

Result<std::shared_ptr<KernelCache>> open_kernel_cache(const std::string& root) {
  KDAJIT_TRY_ASSIGN(Environment env, read_environment());
  CacheOptions opts;
  opts.root = root;
  return std::make_shared<KernelCache>(opts, env);
}

}  // namespace kdajit
