#include "driver_fns.hpp"

#include <fmt/format.h>

#include <mutex>

namespace kdajit::bench {

namespace {

// Fills *slot with the driver's `name` at the ABI of CUDA 12.0 (every function here exists there).
template <class Fn>
Status resolve(const char* name, Fn* slot) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p)
    return Error(ErrorCode::cuda, fmt::format("cudaGetDriverEntryPointByVersion({}, 12000): {} (query result {})",
                                              name, cudaGetErrorString(e), static_cast<int>(q)));
  *slot = reinterpret_cast<Fn>(p);
  return {};
}

Status resolve_all(DriverFns& f) {
  KDAJIT_TRY(resolve("cuGetErrorName", &f.cuGetErrorName));
  KDAJIT_TRY(resolve("cuGetErrorString", &f.cuGetErrorString));
  KDAJIT_TRY(resolve("cuModuleLoadData", &f.cuModuleLoadData));
  KDAJIT_TRY(resolve("cuModuleUnload", &f.cuModuleUnload));
  KDAJIT_TRY(resolve("cuModuleGetFunction", &f.cuModuleGetFunction));
  KDAJIT_TRY(resolve("cuFuncGetAttribute", &f.cuFuncGetAttribute));
  KDAJIT_TRY(resolve("cuFuncSetAttribute", &f.cuFuncSetAttribute));
  KDAJIT_TRY(resolve("cuOccupancyMaxActiveBlocksPerMultiprocessor", &f.cuOccupancyMaxActiveBlocksPerMultiprocessor));
  KDAJIT_TRY(resolve("cuLaunchKernelEx", &f.cuLaunchKernelEx));
  KDAJIT_TRY(resolve("cuGraphKernelNodeGetParams", &f.cuGraphKernelNodeGetParams));
  return {};
}

}  // namespace

Result<const DriverFns*> driver_fns() {
  static std::once_flag once;
  static DriverFns fns;
  static Status status;
  std::call_once(once, [] { status = resolve_all(fns); });
  if (!status) return status.error();
  return &fns;
}

Error cu_error(CUresult r, std::string_view what) {
  const char* name = nullptr;
  const char* msg = nullptr;
  if (auto f = driver_fns()) {
    if ((*f)->cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
    if ((*f)->cuGetErrorString(r, &msg) != CUDA_SUCCESS) msg = nullptr;
  }
  const std::string n = name ? std::string(name) : fmt::format("CUresult {}", static_cast<int>(r));
  return Error(ErrorCode::cuda, fmt::format("{}: {} ({})", what, n, msg ? msg : "no message"));
}

Module::~Module() {
  if (mod_) {
    if (auto f = driver_fns()) (void)(*f)->cuModuleUnload(mod_);
  }
}

Status Module::load(const std::string& cubin) {
  KDAJIT_TRY_ASSIGN(const DriverFns* f, driver_fns());
  if (mod_) return Error(ErrorCode::internal, "Module::load: already loaded");
  BENCH_CU(f->cuModuleLoadData(&mod_, cubin.data()));
  return {};
}

Result<CUfunction> Module::function(const char* name) const {
  KDAJIT_TRY_ASSIGN(const DriverFns* f, driver_fns());
  CUfunction fn = nullptr;
  if (const CUresult r = f->cuModuleGetFunction(&fn, mod_, name); r != CUDA_SUCCESS)
    return cu_error(r, fmt::format("cuModuleGetFunction({})", name));
  return fn;
}

}  // namespace kdajit::bench
