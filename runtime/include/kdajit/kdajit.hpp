// kdajit: the C++ API. A thin, exception-free layer over the C ABI types
// (kdajit.h): tensor views and decode arguments are the C structs.
// Contract: docs/CONTRACT.md ("§N" is its section N); every field of the
// argument structs is documented where kdajit.h declares it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kdajit/kdajit.h"

namespace kdajit {

// A strided view; shapes and strides in elements (§1.2).
using TensorView = kdajit_tensor_t;
// A view of `data` with this shape and these strides (elements, outermost
// first). More than KDAJIT_MAX_DIMS dimensions, or a stride count other than
// the rank, give ndim = -1, which validation rejects naming the argument.
inline TensorView tensor_view(void* data, kdajit_dtype_t dtype, std::initializer_list<int64_t> shape,
                              std::initializer_list<int64_t> strides) {
  TensorView t{};
  t.data = data;
  t.dtype = dtype;
  if (shape.size() > KDAJIT_MAX_DIMS || strides.size() != shape.size()) {
    t.ndim = -1;
    return t;
  }
  t.ndim = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t d : shape) t.shape[i++] = d;
  i = 0;
  for (int64_t s : strides) t.strides[i++] = s;
  return t;
}
// The same with row-major contiguous strides (the last dimension's is 1).
inline TensorView dense_tensor_view(void* data, kdajit_dtype_t dtype, std::initializer_list<int64_t> shape) {
  TensorView t = tensor_view(data, dtype, shape, shape);
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

// Both ops' arguments: every tensor with shape, dtype and strides (§1), the
// scalars (§1.4). Start from default_decode_args(), which sets struct_size
// (§9: the calls below read the struct through it, as the C ABI does).
using DecodeArgs = kdajit_decode_args_t;
// The prefill op's arguments (§10); start from default_prefill_args().
using PrefillArgs = kdajit_prefill_args_t;
// The chunk op's arguments (§11, FLA chunk_kda's tensors); start from default_chunk_args().
using ChunkArgs = kdajit_chunk_args_t;
// The key fields of a call, for query_support (§5); start from
// kdajit_config_init(&config).
using SupportConfig = kdajit_config_t;
using StreamHandle = kdajit_stream_t;

// The result of an API call: a status code and, on failure, a message that
// names the argument, the expected and the given value. Codes: kdajit_status_t
// (§6): H > 128 and T > 16 are UNSUPPORTED, other contract violations
// INVALID_ARGUMENT.
struct Outcome {
  kdajit_status_t code = KDAJIT_OK;
  std::string message;  // one line
  std::string detail;   // multi-line, may be empty: a compile's options, NVRTC log and failing source line

  bool ok() const { return code == KDAJIT_OK; }
  explicit operator bool() const { return ok(); }
};

struct RuntimeOptions {
  std::string cache_dir;  // empty: KDAJIT_CACHE_DIR, $XDG_CACHE_HOME/kdajit, ~/.cache/kdajit
  std::string arch;       // empty: from the device; else e.g. "sm_90a"
  // >= 0: pins the primary context of that device ordinal.
  int device = -1;        // -1: the context of each call's stream
  kdajit_log_level_t log_level = KDAJIT_LOG_DEFAULT;
  // Empty: the selector picks the route per call (§5). Else a route name of
  // `kdajit routes` that every call runs with; a call it cannot serve exactly
  // fails with UNSUPPORTED (tests, benchmarks).
  std::string route;
  // Prefer a route table written by `kdajit tune` into the cache when one
  // matches this GPU, driver, NVRTC and kdajit; false: the built-in bands only.
  bool use_tuning = true;
  // Launch with programmatic stream serialization (PDL): the kernel's prologue
  // overlaps the previous kernel; it waits on the grid dependency before it
  // reads anything that kernel may write.
  bool pdl = false;
};

// Where this runtime's kernels came from, since it was created.
struct RuntimeStats {
  uint64_t serving_compiles = 0;    // kernels a call compiled: a cache miss with NVRTC in front of a launch (logged)
  double serving_compile_ms = 0;    // their total wall time
  uint64_t disk_loads = 0;          // kernels a call loaded from a disk cache layer
  uint64_t memory_loads = 0;        // kernels a call found already in this process (a pre-warm, another context)
  uint64_t prewarm_compiled = 0;    // kernels prewarm_async compiled
  uint64_t prewarm_failed = 0;      // keys prewarm_async could not compile (each logged)
  uint64_t prewarm_pending = 0;     // keys queued or compiling in the background
};

// Default-initialised decode arguments (struct_size, gate bounded, lower_bound
// -5, norm_eps 1e-6, mode unique_or_null, every tensor empty, no oob_counter; §1.4).
KDAJIT_API DecodeArgs default_decode_args();
// Default-initialised prefill arguments (struct_size, gate bounded, lower_bound
// -5, norm_eps 1e-6, max_seq_len 0, every tensor empty, no oob_counter).
KDAJIT_API PrefillArgs default_prefill_args();
// Default-initialised chunk arguments (struct_size, gate bounded, lower_bound
// -5, scale 1/sqrt(128), qk_l2norm and beta_sigmoid on, FLA's state layout,
// max_seq_len 0, every tensor empty).
KDAJIT_API ChunkArgs default_chunk_args();

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

  // Validates (§6: nothing is enqueued or written on failure), then launches.
  // single_decode: one token per row (§2-§3); ignores query_start_loc and
  // num_accepted_tokens. packed_decode: up to T tokens per sequence (§4);
  // rejects state_indices_mode repeated_positive.
  Outcome single_decode(const DecodeArgs& args, StreamHandle stream);
  Outcome packed_decode(const DecodeArgs& args, StreamHandle stream);
  // The chunked prefill of N packed sequences (§10).
  Outcome prefill(const PrefillArgs& args, StreamHandle stream);
  // The kernel key name a prefill with these args would launch on `stream`.
  Outcome selected_prefill_key(const PrefillArgs& args, StreamHandle stream, std::string* key_name);
  // The prefill's delta rule alone on FLA chunk_kda's tensors (§11).
  Outcome chunk(const ChunkArgs& args, StreamHandle stream);
  Outcome selected_chunk_key(const ChunkArgs& args, StreamHandle stream, std::string* key_name);

  // The kernel key name a call with these args would launch on `stream`
  // (validation and route selection; nothing compiled or launched).
  Outcome selected_key(kdajit_op_t op, const DecodeArgs& args, StreamHandle stream, std::string* key_name);

  // Makes sure kernel `key_name` is in this runtime's cache (NVRTC compile when
  // missing; no GPU needed). *compiled (may be null): whether this call compiled.
  Outcome prewarm(const std::string& key_name, bool* compiled);

  // Compiles these keys into the cache in `threads` background threads (0: 1)
  // and returns at once (key names are checked first; a bad one queues nothing).
  // Calls run meanwhile on what is ready; a call whose key is still compiling
  // waits for that compile instead of starting another.
  Outcome prewarm_async(const std::vector<std::string>& key_names, unsigned threads = 1);
  // Blocks until every key given to prewarm_async is done.
  void wait_prewarm();
  // The kernel keys of a model preset for `arch` ("glm-5.3-flash", "sm_90"), as
  // `kdajit keys --preset` lists them: every route of every shape.
  static Outcome preset_key_names(const std::string& preset, const std::string& arch, std::vector<std::string>* out);

  RuntimeStats stats() const;

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
