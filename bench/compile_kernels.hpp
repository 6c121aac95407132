// The bench's own kernels through NVRTC: the floor kernels and the fill kernels,
// for the run (the device's arch) and for --compile-only (any arch, no GPU).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "kdajit/error.hpp"
#include "nvrtc_build.hpp"

namespace kdajit::bench {

struct BenchCubins {
  BuiltCubin floor, fill;
  std::string arch;
  int max_tokens = 0;
};

// max_tokens: the largest T of the packed op the floor kernels will see.
Result<BenchCubins> compile_bench_kernels(const std::string& arch, int max_tokens);

// Compile times and the ptxas resource lines, for the JSON.
nlohmann::json kernels_json(const BenchCubins& c);

// --compile-only: compiles both for `arch` (floor at T <= 8, the default grid, and
// T <= 16, the limit), prints the ptxas resource lines; false on any failure.
bool compile_only(const std::string& arch);

}  // namespace kdajit::bench
