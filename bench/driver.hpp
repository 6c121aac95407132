// The CUDA driver as the bench calls it: the runtime's dlopen'ed binding
// (kdajit/runtime/device/driver_api.hpp) loads the bench's own kernels, launches
// them and the bare launch, and reads a captured kernel node. The binary links
// no libcuda, so `--list` and `--compile-only` run without a GPU driver.
#pragma once

#include <cuda.h>

#include <string>

#include "kdajit/error.hpp"
#include "kdajit/runtime/device/driver_api.hpp"

namespace kdajit::bench {

// The runtime's driver, checked for the optional entry points the bench needs
// (cuGraphKernelNodeGetParams); an error names what is missing.
Result<const DriverApi*> bench_driver();

// Returns the error of a failing driver call (cu_check, naming the call) from the enclosing function.
#define BENCH_CU(api, expr) KDAJIT_TRY(::kdajit::cu_check((api), (expr), #expr))

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
