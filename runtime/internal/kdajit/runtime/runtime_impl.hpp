// The runtime behind the public C++ API and the C ABI.
#pragma once

#include <memory>
#include <optional>

#include "kdajit/kdajit.hpp"
#include "kdajit/runtime/kernels.hpp"
#include "kdajit/runtime/validate.hpp"

namespace kdajit {

struct Runtime::Impl {
  std::shared_ptr<KernelCache> cache;
  std::unique_ptr<KernelRegistry> registry;
  CUcontext fixed_ctx = nullptr;  // options.device >= 0: that device's primary context
  CUdevice fixed_device = 0;

  static Result<std::unique_ptr<Impl>> create(const RuntimeOptions& options);
  ~Impl();

  // Validate -> select -> find/load -> launch. No sync, no allocation, no
  // device read on the host.
  Status decode(Op op, const kdajit_decode_args_t& args, kdajit_stream_t stream);
};

// Maps an internal Error to the public outcome (same numeric codes).
Outcome to_outcome(const Status& s);

}  // namespace kdajit
