#include "driver.hpp"

#include <fmt/format.h>

namespace kdajit::bench {

Result<const DriverApi*> bench_driver() {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  if (!api->cuGraphKernelNodeGetParams)
    return Error(ErrorCode::cuda,
                 "CUDA driver: libcuda.so.1 lacks cuGraphKernelNodeGetParams_v2, which the bare launch needs "
                 "(driver older than CUDA 12.0?)");
  return api;
}

Module::~Module() {
  if (!mod_) return;
  if (auto api = driver()) (void)(*api)->cuModuleUnload(mod_);
}

Status Module::load(const std::string& cubin) {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  if (mod_) return Error(ErrorCode::internal, "Module::load: already loaded");
  BENCH_CU(*api, api->cuModuleLoadData(&mod_, cubin.data()));
  return {};
}

Result<CUfunction> Module::function(const char* name) const {
  KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
  CUfunction fn = nullptr;
  KDAJIT_TRY(cu_check(*api, api->cuModuleGetFunction(&fn, mod_, name), fmt::format("cuModuleGetFunction({})", name)));
  return fn;
}

}  // namespace kdajit::bench
