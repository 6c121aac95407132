// The static support query and the configuration -> key questions an engine
// asks at start-up (which keys to pre-warm, which key a batch size gets),
// answered by the same derivation a call goes through: a synthetic call of the
// configuration is validated and selected, nothing is compiled or launched.
#pragma once

#include <vector>

#include "kdajit/kdajit.h"
#include "kdajit/routes.hpp"

namespace kdajit {

// Accepted iff a valid call with this configuration would be served
// (validation + a route + an arch the loaded NVRTC targets).
Status query_support(const kdajit_config_t& config);

// The key the built-in selector picks for the configuration at `rows` rows
// (single op) or sequences (packed op).
Result<KernelKey> config_key(const kdajit_config_t& config, int64_t rows);

// Every key the selector can pick for the configuration at any rows: one per
// route that serves the op and is eligible for the configuration's mode.
Result<std::vector<KernelKey>> config_keys(const kdajit_config_t& config);

// kdajit_config_init's defaults.
kdajit_config_t default_config();

}  // namespace kdajit
