// A launch of one kernel: the route's LaunchPlan turned into the driver's launch
// configuration once, then launched with the call's parameter block.
#pragma once

#include <cuda.h>

#include "kda_params.h"
#include "kdajit/error.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/runtime/device/driver_api.hpp"

namespace kdajit {

// The driver's launch configuration for a plan: grid, block, dynamic shared
// memory, the cluster attribute of cluster routes and, with `pdl`, programmatic
// stream serialization. Everything but the stream; copyable (attrs is rebound
// at each launch).
struct PreparedLaunch {
  CUlaunchConfig config{};
  CUlaunchAttribute attrs[2]{};
};
PreparedLaunch prepare_launch(const LaunchPlan& plan, bool pdl);

// cuLaunchKernelEx of `function` (the kernel of `key`) on `stream` with
// `params` by value. The key is spelled only in an error.
Status launch(const DriverApi& api, CUfunction function, const PreparedLaunch& prepared, CUstream stream,
              const KdaParams& params, const KernelKey& key);

}  // namespace kdajit
