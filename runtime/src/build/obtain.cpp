#include "kdajit/runtime/build/obtain.hpp"

#include "kdajit/routes.hpp"

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
            {"nvrtc_log", std::move(ck.log)}};
  return b;
}

}  // namespace

Result<BuildPlan> plan_build(const KernelKey& key) {
  KDAJIT_TRY_ASSIGN(BuildInputs in, make_build_inputs(key));
  std::string hash = current_build_hash(in.source, in.options, in.key.arch, in.nvrtc_version);
  return BuildPlan{std::move(in), std::move(hash)};
}

Result<CacheLookup> obtain(KernelCache& cache, const KernelKey& key, bool allow_build) {
  // Another context of this process may have it already: no source generation then.
  if (auto entry = cache.find_loaded(key)) {
    CacheLookup hit;
    hit.entry = std::move(entry);
    hit.source = CacheSource::memory;
    return hit;
  }
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
