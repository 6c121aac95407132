// The runtime behind the public C++ API and the C ABI: validate -> resolve
// (the context's device and tune table, route selection, registry lookup) ->
// load on a miss -> launch.
#pragma once

#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "kdajit/kdajit.hpp"
#include "kdajit/runtime/api/background_prewarm.hpp"
#include "kdajit/runtime/call/validate.hpp"
#include "kdajit/runtime/device/registry.hpp"
#include "kdajit/runtime/tune/tune_table.hpp"

namespace kdajit {

struct Runtime::Impl {
  // Unique per runtime created in this process (never reused): a thread's
  // remembered launch belongs to one runtime (runtime.cpp, LastCall).
  uint64_t id = 0;
  std::shared_ptr<KernelCache> cache;
  std::unique_ptr<KernelRegistry> registry;
  std::optional<Arch> arch;            // options.arch, else KDAJIT_ARCH; else each device's
  std::optional<Route> forced_route;   // options.route
  bool use_tuning = true;              // read a `kdajit tune` table for each device
  bool pdl = false;
  CUcontext fixed_ctx = nullptr;  // options.device >= 0: that device's primary context
  CUdevice fixed_device = 0;
  // Declared last: destroyed first, its workers joined while the cache lives.
  std::unique_ptr<BackgroundPrewarm> background;

  static Result<std::unique_ptr<Impl>> create(const RuntimeOptions& options);
  ~Impl();

  // Validate -> resolve -> (load) -> launch. No sync, no allocation, no device
  // read on the host. A thread's repeat of its last call (same args bytes, same
  // runtime and context) skips validation and resolution.
  Status decode(Op op, const kdajit_decode_args_t& args, kdajit_stream_t stream);
  // Validate -> resolve: the key decode() would launch.
  Result<KernelKey> selected_key(Op op, const kdajit_decode_args_t& args, kdajit_stream_t stream);
  // The prefill op (docs/CONTRACT.md §10): the same path, validated by
  // validate_prefill (every call: a prompt's args change from call to call).
  Status prefill(const kdajit_prefill_args_t& args, kdajit_stream_t stream);
  Result<KernelKey> selected_prefill_key(const kdajit_prefill_args_t& args, kdajit_stream_t stream);
  // The chunk op (docs/CONTRACT.md §11), likewise with validate_chunk.
  Status chunk(const kdajit_chunk_args_t& args, kdajit_stream_t stream);
  Result<KernelKey> selected_chunk_key(const kdajit_chunk_args_t& args, kdajit_stream_t stream);
  // The key's cubin in the cache (compiled when missing); true when compiled.
  Result<bool> prewarm(const KernelKey& key);

 private:
  // What selection needs of a context, read once: its device and tune table.
  struct ContextRoutes {
    DeviceTraits device;
    std::optional<TuneTable> tuned;
  };
  // The key a call runs with in `ctx`, and its kernel when loaded there.
  struct Resolved {
    KernelKey key;
    std::optional<LoadedKernel> kernel;
    DeviceTraits device;  // the launch grid of some routes depends on its SM count
  };
  Result<Resolved> resolve(CUcontext ctx, const CallShape& call);
  // Resolve -> (load, unless the stream captures) -> launch of a validated call.
  Status launch_validated(const ValidatedCall& call, kdajit_stream_t stream);
  Result<const ContextRoutes*> routes_of(CUcontext ctx);
  // The context a call on `stream` launches in.
  Result<CUcontext> context_for(kdajit_stream_t stream) const;

  std::shared_mutex contexts_mu_;
  std::unordered_map<CUcontext, std::unique_ptr<ContextRoutes>> contexts_;  // never removed
};

// Maps an internal Error to the public outcome (same numeric codes).
Outcome to_outcome(const Status& s);

}  // namespace kdajit
