// Kernel key -> CUDA source bytes. Deterministic: the same key always gives the
// same bytes (the cache hashes them).
#pragma once

#include <string>

#include "kdajit/error.hpp"
#include "kdajit/kernel_key.hpp"

namespace kdajit {

// The generated translation unit: a first line `// kdajit kernel <program name>`
// (program_name(): the key name, `*` for the fields its program serves at run time),
// the hole definitions (from the key and its route's row of the route table),
// then the route's template with its local includes inlined. Self-contained: it
// includes no CUDA toolkit header.
Result<std::string> generate_source(const KernelKey& key);

}  // namespace kdajit
