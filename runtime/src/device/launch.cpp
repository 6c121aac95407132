#include "kdajit/runtime/device/launch.hpp"

#include <fmt/format.h>

namespace kdajit {

PreparedLaunch prepare_launch(const LaunchPlan& plan, bool pdl) {
  PreparedLaunch p;
  CUlaunchConfig& cfg = p.config;
  cfg.gridDimX = plan.grid.x;
  cfg.gridDimY = plan.grid.y;
  cfg.gridDimZ = plan.grid.z;
  cfg.blockDimX = plan.threads;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.sharedMemBytes = plan.dynamic_smem_bytes;
  unsigned n = 0;
  if (plan.cluster_y > 1) {
    p.attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    p.attrs[n].value.clusterDim.x = 1;
    p.attrs[n].value.clusterDim.y = plan.cluster_y;
    p.attrs[n].value.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    p.attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    p.attrs[n].value.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.numAttrs = n;
  return p;
}

Status launch(const DriverApi& api, CUfunction function, const PreparedLaunch& prepared, CUstream stream,
              const KdaParams& params, const KernelKey& key) {
  CUlaunchConfig cfg = prepared.config;
  cfg.hStream = stream;
  cfg.attrs = cfg.numAttrs ? const_cast<CUlaunchAttribute*>(prepared.attrs) : nullptr;
  void* args[] = {const_cast<KdaParams*>(&params)};
  if (CUresult e = api.cuLaunchKernelEx(&cfg, function, args, nullptr); e != CUDA_SUCCESS)
    return cuda_error(api, e, fmt::format("cuLaunchKernelEx({})", key_name(key)));
  return {};
}

}  // namespace kdajit
