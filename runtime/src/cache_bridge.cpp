#include "kdajit/runtime/cache_bridge.hpp"

#include <fmt/format.h>

#include "kdajit/generator.hpp"
#include "kdajit/runtime/kernels.hpp"

namespace kdajit {

CacheBuild to_cache_build(const BuildInputs& in, CompiledKernel ck) {
  const RouteConfig route = route_config(in.key);
  CacheBuild b;
  b.source = in.source;
  b.cubin = std::move(ck.cubin);
  b.options = in.options;
  b.nvrtc_version = in.nvrtc_version;
  b.meta = {{"entry", route.entry},
            {"threads", route.threads},
            {"registers", ck.resources.registers},
            {"spill_bytes", ck.resources.spill_bytes},
            {"stack_bytes", ck.resources.stack_bytes},
            {"smem_bytes", ck.resources.smem_bytes},
            {"compile_ms", ck.compile_ms},
            {"nvrtc_log", std::move(ck.log)}};
  return b;
}

BuildFn build_fn_for(const BuildInputs& in) {
  return [&in]() -> Result<CacheBuild> {
    KDAJIT_TRY_ASSIGN(CompiledKernel ck, compile(in));
    return to_cache_build(in, std::move(ck));
  };
}

std::string input_hash(const BuildInputs& in) {
  return current_build_hash(in.source, in.options, in.key.arch, in.nvrtc_version);
}

Result<std::shared_ptr<KernelCache>> open_kernel_cache(const std::string& root) {
  KDAJIT_TRY_ASSIGN(Environment env, read_environment());
  CacheOptions opts;
  opts.root = root;
  return std::make_shared<KernelCache>(opts, env);
}

Result<CubinRef> obtain_cubin(KernelCache* cache, const KernelKey& key, bool allow_build) {
  // Another context of this process may have it already: no source generation then.
  std::shared_ptr<const CacheEntry> entry = cache->find_loaded(key);
  if (!entry) {
    KDAJIT_TRY_ASSIGN(BuildInputs in, make_build_inputs(key));
    KDAJIT_TRY_ASSIGN(entry, cache->get_or_build(key, input_hash(in), build_fn_for(in), allow_build));
  }
  // The entry is immutable and shared; alias its cubin without a copy.
  return CubinRef{std::shared_ptr<const std::string>(entry, &entry->cubin), route_config(key).entry};
}

}  // namespace kdajit
