// kdajit: the C++ API. A thin, exception-free layer over the C ABI types
// (kdajit.h): tensor views and decode arguments are the C structs.
#pragma once

#include <memory>
#include <string>

#include "kdajit/kdajit.h"

namespace kdajit {

using TensorView = kdajit_tensor_t;
using DecodeArgs = kdajit_decode_args_t;
using SupportConfig = kdajit_config_t;
using StreamHandle = kdajit_stream_t;

// The result of an API call: a status code and, on failure, a message that
// names the argument, the expected and the given value.
struct Outcome {
  kdajit_status_t code = KDAJIT_OK;
  std::string message;

  bool ok() const { return code == KDAJIT_OK; }
  explicit operator bool() const { return ok(); }
};

struct RuntimeOptions {
  std::string cache_dir;  // empty: KDAJIT_CACHE_DIR, $XDG_CACHE_HOME/kdajit, ~/.cache/kdajit
  std::string arch;       // empty: from the device; else e.g. "sm_90a"
  int device = -1;        // -1: the context of each call's stream
  kdajit_log_level_t log_level = KDAJIT_LOG_DEFAULT;
};

// Default-initialised decode arguments (gate bounded, lower_bound -5,
// norm_eps 1e-6, mode unique_or_null, every tensor empty).
KDAJIT_API DecodeArgs default_decode_args();

// One runtime per engine process; thread-safe. Calls take the CUDA stream to
// launch on; they never synchronise, allocate device memory or read device
// memory on the host, so they can be captured into CUDA graphs once the
// kernels they need are cached.
class KDAJIT_API Runtime {
 public:
  static Outcome create(const RuntimeOptions& options, std::unique_ptr<Runtime>* out);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Outcome single_decode(const DecodeArgs& args, StreamHandle stream);
  Outcome packed_decode(const DecodeArgs& args, StreamHandle stream);

  // Supported or not, with the reason, without compiling or touching the GPU
  // (unless config.arch is null: then the device's arch is read).
  static Outcome query_support(const SupportConfig& config);

  struct Impl;

 private:
  explicit Runtime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

KDAJIT_API std::string version();

}  // namespace kdajit
