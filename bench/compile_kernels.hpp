// The bench's own kernels through the runtime's NVRTC (compile_program): the
// floor kernels and the fill kernels (the decode grid), the fill kernels and the
// tensor-core rate kernel (the prefill grid), for the run (the device's arch)
// and for --compile-only (any arch, no GPU).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "kdajit/error.hpp"
#include "kdajit/runtime/jit/compile.hpp"

namespace kdajit::bench {

struct BenchCubins {
  // The cubin and NVRTC's log (ptxas -v: registers and spills per kernel); a
  // program the grid does not use is left empty.
  CompiledKernel floor, fill, mma;
  std::string arch;
  int max_tokens = 0;
};

// max_tokens: the largest T of the packed op the floor kernels will see.
Result<BenchCubins> compile_bench_kernels(const std::string& arch, int max_tokens);

// The prefill grid's: fill, and mma (when the arch has bf16 mma.sync; else empty).
Result<BenchCubins> compile_prefill_kernels(const std::string& arch);

// "sm_<major><minor>" of a compute capability: the arch the run compiles for.
std::string arch_of(int major, int minor);

// Compile times and the ptxas resource lines, for the JSON.
nlohmann::json kernels_json(const BenchCubins& c);

// --compile-only: compiles every program for `arch` (floor at T <= 8, the default
// grid, and T <= 16, the limit; the mma kernel where the arch has it), prints the
// ptxas resource lines; false on any failure.
bool compile_only(const std::string& arch);

}  // namespace kdajit::bench
