// Kernel key -> CUDA source bytes. Deterministic: the same key always gives the
// same bytes (the cache hashes them).
#pragma once

#include <string>

#include "kdajit/error.hpp"
#include "kdajit/kernel_key.hpp"

namespace kdajit {

// Route parameters: the kernel shape a route gives a key. The launcher reads
// these, the generator writes them into the source as compile-time constants.
struct RouteConfig {
  int threads = 256;        // threads per block
  int cluster = 1;          // CTAs per cluster along grid y (1: no cluster launch)
  const char* entry = "";   // extern "C" kernel name in the generated source
};

RouteConfig route_config(const KernelKey& key);

// The generated translation unit: a first line `// kdajit kernel <key name>`,
// the hole definitions, then the templates with their local includes inlined.
// Self-contained: it includes no CUDA toolkit header.
Result<std::string> generate_source(const KernelKey& key);

}  // namespace kdajit
