// TEMPORARY until cache/ lands: compiles directly, memory only.
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "kdajit/generator.hpp"
#include "kdajit/log.hpp"
#include "kdajit/runtime/compiler.hpp"
#include "kdajit/runtime/kernels.hpp"

namespace kdajit {

class KernelCache {};

Result<std::shared_ptr<KernelCache>> open_kernel_cache(const std::string&) { return std::make_shared<KernelCache>(); }

Result<CubinRef> obtain_cubin(KernelCache*, const KernelKey& key, bool allow_build) {
  static std::mutex mu;
  static std::map<KernelKey, std::shared_ptr<const std::string>> mem;
  std::lock_guard lock(mu);
  auto it = mem.find(key);
  if (it != mem.end()) return CubinRef{it->second, route_config(key).entry};
  if (!allow_build)
    return Error(ErrorCode::capture, fmt::format("kernel {} is not cached and the stream is capturing: pre-warm {}", key_name(key), key_name(key)));
  KDAJIT_TRY_ASSIGN(BuildInputs in, make_build_inputs(key));
  KDAJIT_TRY_ASSIGN(CompiledKernel ck, compile(in));
  log_info("compiled {} in {:.0f} ms ({} registers, {} bytes spilled)", key_name(key), ck.compile_ms, ck.resources.registers, ck.resources.spill_bytes);
  auto cubin = std::make_shared<const std::string>(std::move(ck.cubin));
  mem.emplace(key, cubin);
  return CubinRef{cubin, route_config(key).entry};
}

}  // namespace kdajit
