// The bench's own kernels through the runtime's NVRTC (compile_program): the
// floor kernels and the fill kernels, for the run (the device's arch) and for
// --compile-only (any arch, no GPU).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "kdajit/error.hpp"
#include "kdajit/runtime/jit/compile.hpp"

namespace kdajit::bench {

struct BenchCubins {
  CompiledKernel floor, fill;  // the cubin and NVRTC's log (ptxas -v: registers and spills per kernel)
  std::string arch;
  int max_tokens = 0;
};

// max_tokens: the largest T of the packed op the floor kernels will see.
Result<BenchCubins> compile_bench_kernels(const std::string& arch, int max_tokens);

// "sm_<major><minor>" of a compute capability: the arch the run compiles for.
std::string arch_of(int major, int minor);

// Compile times and the ptxas resource lines, for the JSON.
nlohmann::json kernels_json(const BenchCubins& c);

// --compile-only: compiles both for `arch` (floor at T <= 8, the default grid, and
// T <= 16, the limit), prints the ptxas resource lines; false on any failure.
bool compile_only(const std::string& arch);

}  // namespace kdajit::bench
