// Model presets: the kernel keys a deployment of a model pre-warms. Keys are
// derived from the route table, so a preset covers every route the selector can
// pick for its shapes and a pre-warmed deployment never compiles at serving time.
#pragma once

#include <string_view>
#include <vector>

#include "kdajit/kernel_key.hpp"

namespace kdajit {

std::vector<std::string_view> preset_names();
Result<std::vector<KernelKey>> preset_keys(std::string_view preset, Arch arch);

// Every key of one family (a key whose route is ignored): one per route that serves
// its op and whose launch fits the arch (a prefill key needs 227 KiB of shared memory).
std::vector<KernelKey> keys_of_family(const KernelKey& family);

}  // namespace kdajit
