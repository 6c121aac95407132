// The few CUDA driver functions the bench calls itself (module loads and
// cuLaunchKernelEx for the floor and fill kernels and the bare launch, and
// reading a captured kernel node). They come from the runtime's
// cudaGetDriverEntryPointByVersion, so the binary does not link libcuda and
// `--list` / `--compile-only` run on a machine without a GPU driver.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include "kdajit/error.hpp"

namespace kdajit::bench {

struct DriverFns {
  decltype(&::cuGetErrorName) cuGetErrorName = nullptr;
  decltype(&::cuGetErrorString) cuGetErrorString = nullptr;
  decltype(&::cuModuleLoadData) cuModuleLoadData = nullptr;
  decltype(&::cuModuleUnload) cuModuleUnload = nullptr;
  decltype(&::cuModuleGetFunction) cuModuleGetFunction = nullptr;
  decltype(&::cuFuncGetAttribute) cuFuncGetAttribute = nullptr;
  decltype(&::cuFuncSetAttribute) cuFuncSetAttribute = nullptr;
  decltype(&::cuOccupancyMaxActiveBlocksPerMultiprocessor) cuOccupancyMaxActiveBlocksPerMultiprocessor = nullptr;
  decltype(&::cuLaunchKernelEx) cuLaunchKernelEx = nullptr;
  decltype(&::cuGraphKernelNodeGetParams) cuGraphKernelNodeGetParams = nullptr;  // the _v2 ABI (CUDA >= 12.0)
};

// Resolves every function once (after the CUDA runtime is initialised); an error names the missing one.
Result<const DriverFns*> driver_fns();

// Error{cuda} "what: NAME (message)" for a failed driver call.
Error cu_error(CUresult r, std::string_view what);

// Returns the error of a failing driver call (through driver_fns()) from the enclosing function.
#define BENCH_CU(expr)                                                      \
  do {                                                                      \
    const CUresult bench_cu_r_ = (expr);                                    \
    if (bench_cu_r_ != CUDA_SUCCESS) return ::kdajit::bench::cu_error(bench_cu_r_, #expr); \
  } while (0)

// A module loaded from a cubin into the current context; unloaded on destruction.
class Module {
 public:
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  ~Module();
  Status load(const std::string& cubin);
  Result<CUfunction> function(const char* name) const;

 private:
  CUmodule mod_ = nullptr;
};

}  // namespace kdajit::bench
