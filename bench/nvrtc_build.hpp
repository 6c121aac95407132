// NVRTC for the bench's own kernels (the floor and fill kernels): CUDA source
// text -> cubin for one arch. No CUDA toolkit header is included by the sources.
#pragma once

#include <string>
#include <vector>

#include "kdajit/error.hpp"

namespace kdajit::bench {

struct BuiltCubin {
  std::string cubin;
  std::string log;  // NVRTC + ptxas log (ptxas -v: registers and spills per kernel)
  double compile_ms = 0;
};

// Compiles `source` (named `name` in messages) for `arch` (e.g. "sm_90"), with
// ptxas -v plus `extra_options`. A failure carries the log.
Result<BuiltCubin> nvrtc_compile(const std::string& name, const std::string& source, const std::string& arch,
                                 const std::vector<std::string>& extra_options = {});

// "sm_<major><minor>" of a compute capability.
std::string arch_of(int major, int minor);

}  // namespace kdajit::bench
