// NVRTC compile -> kernel cache: the one adapter the runtime and the CLI share.
#pragma once

#include <memory>
#include <string>

#include "kdajit/cache.hpp"
#include "kdajit/runtime/compiler.hpp"

namespace kdajit {

// The cache's record of one compile (cubin, options, resources, log, entry name).
CacheBuild to_cache_build(const BuildInputs& in, CompiledKernel ck);

// A BuildFn compiling `in`; `in` must outlive the returned function.
BuildFn build_fn_for(const BuildInputs& in);

// The cache hash of a build (every input: schema, library version, source,
// options, exact arch, NVRTC version).
std::string input_hash(const BuildInputs& in);

}  // namespace kdajit
