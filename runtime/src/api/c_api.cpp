// The C ABI: status codes plus a thread-local message, over the C++ runtime.
// Every entry point returns a status, whatever happens inside: no exception
// (std::bad_alloc included) crosses into the caller. The structs are read
// through their struct_size (sized_struct.hpp); kdajit_last_error() is one
// line with the caller's control bytes escaped (escaped_line).
#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "kdajit/kdajit_version.h"
#include "kdajit/printable.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/runtime/api/runtime_impl.hpp"
#include "kdajit/runtime/api/sized_struct.hpp"
#include "kdajit/runtime/jit/nvrtc_api.hpp"
#include "kdajit/runtime/call/support.hpp"

struct kdajit_runtime {
  std::unique_ptr<kdajit::Runtime> rt;
};

namespace {

thread_local std::string t_last_error;
thread_local std::string t_last_detail;

// The message with every control byte, DEL, terminal-active code point and
// invalid UTF-8 escaped as the CLI prints input (printable()), so that an arch
// string or a key name with an ESC in it reaches no terminal or log raw.
// Backslashes stay as they are: the parts of a message that quote input through
// printable() already carry its escapes, which must not be escaped twice. Not
// cut short: the messages are kdajit's own, and cut the input they quote.
std::string escaped_line(const std::string& message) {
  if (std::all_of(message.begin(), message.end(), [](unsigned char c) { return c >= 0x20 && c < 0x7F; }))
    return message;  // printable ASCII (and every success: ""): nothing to escape
  std::string out;
  out.reserve(message.size());
  for (size_t start = 0;;) {
    const size_t slash = message.find('\\', start);
    const std::string_view piece = std::string_view(message).substr(start, slash - start);
    out += kdajit::printable(piece, piece.size());
    if (slash == std::string::npos) return out;
    out += '\\';
    start = slash + 1;
  }
}

kdajit_status_t finish(const kdajit::Outcome& o) {
  t_last_error = escaped_line(o.message);
  t_last_detail = o.detail;
  return o.code;
}

kdajit_status_t fail(kdajit_status_t code, const char* msg) { return finish({code, msg, {}}); }

// Runs `body` (returning an Outcome); exceptions become KDAJIT_ERROR_INTERNAL.
template <class Body>
kdajit_status_t guarded(Body&& body) noexcept {
  try {
    return finish(body());
  } catch (const std::bad_alloc&) {
    t_last_error.clear();  // no allocation on this path
    t_last_detail.clear();
    return KDAJIT_ERROR_INTERNAL;
  } catch (const std::exception& e) {
    try {
      return fail(KDAJIT_ERROR_INTERNAL, e.what());
    } catch (...) {
      return KDAJIT_ERROR_INTERNAL;
    }
  } catch (...) {
    return KDAJIT_ERROR_INTERNAL;
  }
}

// The op argument, read through its integer value.
kdajit::Result<kdajit::Op> op_of(const kdajit_op_t& op) {
  const int32_t v = kdajit::enum_value(op);
  if (v == KDAJIT_OP_SINGLE) return kdajit::Op::single;
  if (v == KDAJIT_OP_PACKED) return kdajit::Op::packed;
  if (v == KDAJIT_OP_PREFILL)
    return kdajit::invalid_argument(
        "op: expected KDAJIT_OP_SINGLE (0) or KDAJIT_OP_PACKED (1) for kdajit_decode_args_t, got KDAJIT_OP_PREFILL (2) "
        "(a prefill's args are a kdajit_prefill_args_t: kdajit_validate_prefill_args)");
  if (v == KDAJIT_OP_CHUNK)
    return kdajit::invalid_argument(
        "op: expected KDAJIT_OP_SINGLE (0) or KDAJIT_OP_PACKED (1) for kdajit_decode_args_t, got KDAJIT_OP_CHUNK (3) "
        "(a chunk call's args are a kdajit_chunk_args_t: kdajit_validate_chunk_args)");
  return kdajit::invalid_argument("op: expected KDAJIT_OP_SINGLE (0) or KDAJIT_OP_PACKED (1), got " + std::to_string(v));
}

// Copies `s` into a caller's buffer; a buffer too small is an error naming it.
kdajit::Outcome copy_out(const std::string& s, char* buf, size_t size, const char* name) {
  if (!buf || size < s.size() + 1)
    return {KDAJIT_ERROR_INVALID_ARGUMENT,
            std::string(name) + ": expected a buffer of at least " + std::to_string(s.size() + 1) + " bytes", {}};
  std::memcpy(buf, s.data(), s.size());
  buf[s.size()] = '\0';
  return {};
}

kdajit_runtime_options_t default_options() {
  kdajit_runtime_options_t o;
  std::memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.device = -1;
  o.log_level = KDAJIT_LOG_DEFAULT;
  o.use_tuning = 1;
  o.pdl = 0;
  return o;
}

// A config read through its struct_size (sized_struct.hpp): *out points at the
// caller's struct or at `scratch`.
kdajit::Outcome read_config(const kdajit_config_t* config, kdajit_config_t& scratch, const kdajit_config_t** out) {
  if (!config) return {KDAJIT_ERROR_INVALID_ARGUMENT, "config: expected a kdajit_config_t, got NULL", {}};
  auto c = kdajit::read_sized(*config, scratch, kdajit::default_config, kdajit::kConfigStruct);
  if (!c) return kdajit::to_outcome(std::move(c).error());
  *out = *c;
  return {};
}

kdajit::Outcome decode(kdajit_runtime_t* runtime, kdajit::Op op, const kdajit_decode_args_t* args,
                       kdajit_stream_t stream) {
  if (!runtime)
    return {KDAJIT_ERROR_INVALID_ARGUMENT, "runtime: expected a runtime from kdajit_runtime_create, got NULL", {}};
  if (!args) return {KDAJIT_ERROR_INVALID_ARGUMENT, "args: expected a kdajit_decode_args_t, got NULL", {}};
  return op == kdajit::Op::single ? runtime->rt->single_decode(*args, stream) : runtime->rt->packed_decode(*args, stream);
}

// The defaults both ops' args start from: every byte zero, then their own
// struct_size, the bounded gate, lower_bound -5, norm_eps 1e-6 and no oob_counter.
template <class Args>
Args default_args() {
  Args a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.gate = KDAJIT_GATE_BOUNDED;
  a.lower_bound = -5.0f;
  a.norm_eps = 1e-6f;
  a.oob_counter = nullptr;
  return a;
}

// The chunked ops' key queries: `query` is Runtime's selected_prefill_key or selected_chunk_key.
template <class Args, class Query>
kdajit_status_t selected_chunked_key(kdajit_runtime_t* runtime, const Args* args, const char* type, Query query,
                                     char* key_name, size_t key_name_size) {
  return guarded([&]() -> kdajit::Outcome {
    if (!runtime)
      return {KDAJIT_ERROR_INVALID_ARGUMENT, "runtime: expected a runtime from kdajit_runtime_create, got NULL", {}};
    if (!args) return {KDAJIT_ERROR_INVALID_ARGUMENT, std::string("args: expected a ") + type + ", got NULL", {}};
    std::string name;
    kdajit::Outcome o = query(*runtime->rt, *args, &name);
    if (!o.ok()) return o;
    return copy_out(name, key_name, key_name_size, "key_name");
  });
}

}  // namespace

extern "C" {

const char* kdajit_version(void) { return KDAJIT_VERSION_STRING; }

const char* kdajit_status_string(kdajit_status_t status) {
  const int32_t v = kdajit::enum_value(status);
  if (v < KDAJIT_OK || v > KDAJIT_ERROR_INTERNAL) return "unknown status";
  return kdajit::to_string(static_cast<kdajit::ErrorCode>(v));
}

const char* kdajit_last_error(void) { return t_last_error.c_str(); }
const char* kdajit_last_error_detail(void) { return t_last_detail.c_str(); }

void kdajit_runtime_options_init_v1(kdajit_runtime_options_t* o, size_t struct_size) {
  kdajit::init_sized(o, struct_size, default_options());
}

kdajit_status_t kdajit_runtime_create(const kdajit_runtime_options_t* given, kdajit_runtime_t** runtime) {
  return guarded([&]() -> kdajit::Outcome {
    if (!runtime) return {KDAJIT_ERROR_INVALID_ARGUMENT, "runtime: expected a non-null kdajit_runtime_t** to fill", {}};
    *runtime = nullptr;
    kdajit::RuntimeOptions opts;
    if (given) {
      kdajit_runtime_options_t scratch;
      auto read = kdajit::read_sized(*given, scratch, default_options, kdajit::kOptionsStruct);
      if (!read) return kdajit::to_outcome(std::move(read).error());
      const kdajit_runtime_options_t* options = *read;
      if (options->cache_dir) opts.cache_dir = options->cache_dir;
      if (options->arch) opts.arch = options->arch;
      if (options->route) opts.route = options->route;
      opts.device = options->device;
      opts.log_level = options->log_level;
      if (options->use_tuning != 0 && options->use_tuning != 1)
        return {KDAJIT_ERROR_INVALID_ARGUMENT,
                "options.use_tuning: expected 0 or 1, got " + std::to_string(options->use_tuning), {}};
      if (options->pdl != 0 && options->pdl != 1)
        return {KDAJIT_ERROR_INVALID_ARGUMENT, "options.pdl: expected 0 or 1, got " + std::to_string(options->pdl), {}};
      opts.use_tuning = options->use_tuning == 1;
      opts.pdl = options->pdl == 1;
    }
    auto handle = std::make_unique<kdajit_runtime>();
    kdajit::Outcome o = kdajit::Runtime::create(opts, &handle->rt);
    if (o.ok()) *runtime = handle.release();
    return o;
  });
}

void kdajit_runtime_destroy(kdajit_runtime_t* runtime) { delete runtime; }

void kdajit_decode_args_init_v1(kdajit_decode_args_t* args, size_t struct_size) {
  kdajit_decode_args_t a = default_args<kdajit_decode_args_t>();
  a.state_indices_mode = KDAJIT_INDICES_UNIQUE_OR_NULL;
  kdajit::init_sized(args, struct_size, a);
}

kdajit_status_t kdajit_single_decode(kdajit_runtime_t* runtime, const kdajit_decode_args_t* args,
                                     kdajit_stream_t stream) {
  return guarded([&] { return decode(runtime, kdajit::Op::single, args, stream); });
}

kdajit_status_t kdajit_packed_decode(kdajit_runtime_t* runtime, const kdajit_decode_args_t* args,
                                     kdajit_stream_t stream) {
  return guarded([&] { return decode(runtime, kdajit::Op::packed, args, stream); });
}

void kdajit_prefill_args_init_v1(kdajit_prefill_args_t* args, size_t struct_size) {
  kdajit_prefill_args_t a = default_args<kdajit_prefill_args_t>();
  a.max_seq_len = 0;
  kdajit::init_sized(args, struct_size, a);
}

kdajit_status_t kdajit_prefill(kdajit_runtime_t* runtime, const kdajit_prefill_args_t* args, kdajit_stream_t stream) {
  return guarded([&]() -> kdajit::Outcome {
    if (!runtime)
      return {KDAJIT_ERROR_INVALID_ARGUMENT, "runtime: expected a runtime from kdajit_runtime_create, got NULL", {}};
    if (!args) return {KDAJIT_ERROR_INVALID_ARGUMENT, "args: expected a kdajit_prefill_args_t, got NULL", {}};
    return runtime->rt->prefill(*args, stream);
  });
}

kdajit_status_t kdajit_validate_prefill_args(const kdajit_prefill_args_t* args) {
  return guarded([&]() -> kdajit::Outcome {
    if (!args) return {KDAJIT_ERROR_INVALID_ARGUMENT, "args: expected a kdajit_prefill_args_t, got NULL", {}};
    kdajit_prefill_args_t scratch;
    auto a = kdajit::read_sized(*args, scratch, kdajit::default_prefill_args, kdajit::kPrefillArgsStruct);
    if (!a) return kdajit::to_outcome(std::move(a).error());
    auto r = kdajit::validate_prefill(**a);
    return r ? kdajit::Outcome{} : kdajit::to_outcome(std::move(r).error());
  });
}

int64_t kdajit_prefill_workspace_bytes(int64_t num_seqs, int64_t total_tokens, int64_t heads) {
  return kdajit::twopass_workspace_bytes(num_seqs, total_tokens, heads);
}

void kdajit_chunk_args_init_v1(kdajit_chunk_args_t* args, size_t struct_size) {
  kdajit_chunk_args_t a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.gate = KDAJIT_GATE_BOUNDED;
  a.lower_bound = -5.0f;
  a.scale = 0.08838834764831845f;  // 1 / sqrt(128)
  a.qk_l2norm = 1;
  a.beta_sigmoid = 1;
  a.state_v_first = 0;
  a.max_seq_len = 0;
  kdajit::init_sized(args, struct_size, a);
}

kdajit_status_t kdajit_chunk(kdajit_runtime_t* runtime, const kdajit_chunk_args_t* args, kdajit_stream_t stream) {
  return guarded([&]() -> kdajit::Outcome {
    if (!runtime)
      return {KDAJIT_ERROR_INVALID_ARGUMENT, "runtime: expected a runtime from kdajit_runtime_create, got NULL", {}};
    if (!args) return {KDAJIT_ERROR_INVALID_ARGUMENT, "args: expected a kdajit_chunk_args_t, got NULL", {}};
    return runtime->rt->chunk(*args, stream);
  });
}

kdajit_status_t kdajit_validate_chunk_args(const kdajit_chunk_args_t* args) {
  return guarded([&]() -> kdajit::Outcome {
    if (!args) return {KDAJIT_ERROR_INVALID_ARGUMENT, "args: expected a kdajit_chunk_args_t, got NULL", {}};
    kdajit_chunk_args_t scratch;
    auto a = kdajit::read_sized(*args, scratch, kdajit::default_chunk_args, kdajit::kChunkArgsStruct);
    if (!a) return kdajit::to_outcome(std::move(a).error());
    auto r = kdajit::validate_chunk(**a);
    return r ? kdajit::Outcome{} : kdajit::to_outcome(std::move(r).error());
  });
}

kdajit_status_t kdajit_validate_args(kdajit_op_t op, const kdajit_decode_args_t* args) {
  return guarded([&]() -> kdajit::Outcome {
    if (!args) return {KDAJIT_ERROR_INVALID_ARGUMENT, "args: expected a kdajit_decode_args_t, got NULL", {}};
    auto o = op_of(op);
    if (!o) return kdajit::to_outcome(std::move(o).error());
    kdajit_decode_args_t scratch;
    auto a = kdajit::read_sized(*args, scratch, kdajit::default_decode_args, kdajit::kDecodeArgsStruct);
    if (!a) return kdajit::to_outcome(std::move(a).error());
    auto r = kdajit::validate_decode(*o, **a);
    return r ? kdajit::Outcome{} : kdajit::to_outcome(std::move(r).error());
  });
}

kdajit_status_t kdajit_query_support(const kdajit_config_t* config, char* reason, size_t reason_size) {
  return guarded([&] {
    kdajit_config_t scratch;
    const kdajit_config_t* c = nullptr;
    kdajit::Outcome o = read_config(config, scratch, &c);
    if (o.ok()) o = kdajit::to_outcome(kdajit::query_support(*c));
    o.message = escaped_line(o.message);
    if (reason && reason_size > 0) {
      const size_t n = std::min(reason_size - 1, o.message.size());
      std::memcpy(reason, o.message.data(), n);
      reason[n] = '\0';
    }
    return o;
  });
}

void kdajit_config_init_v1(kdajit_config_t* config, size_t struct_size) {
  kdajit::init_sized(config, struct_size, kdajit::default_config());
}

kdajit_status_t kdajit_config_key(const kdajit_config_t* config, int64_t rows, char* key_name, size_t key_name_size) {
  return guarded([&]() -> kdajit::Outcome {
    kdajit_config_t scratch;
    const kdajit_config_t* c = nullptr;
    if (auto o = read_config(config, scratch, &c); !o.ok()) return o;
    auto k = kdajit::config_key(*c, rows);
    if (!k) return kdajit::to_outcome(std::move(k).error());
    return copy_out(kdajit::key_name(*k), key_name, key_name_size, "key_name");
  });
}

kdajit_status_t kdajit_config_keys(const kdajit_config_t* config, char* buf, size_t buf_size, size_t* needed) {
  return guarded([&]() -> kdajit::Outcome {
    kdajit_config_t scratch;
    const kdajit_config_t* c = nullptr;
    if (auto o = read_config(config, scratch, &c); !o.ok()) return o;
    if (!needed) return {KDAJIT_ERROR_INVALID_ARGUMENT, "needed: expected a size_t* to receive the size, got NULL", {}};
    auto keys = kdajit::config_keys(*c);
    if (!keys) return kdajit::to_outcome(std::move(keys).error());
    std::string text;
    for (const auto& k : *keys) {
      if (!text.empty()) text += '\n';
      text += kdajit::key_name(k);
    }
    *needed = text.size() + 1;
    if (!buf) return {};
    return copy_out(text, buf, buf_size, "buf");
  });
}

kdajit_status_t kdajit_runtime_prewarm(kdajit_runtime_t* runtime, const char* key_name, int32_t* compiled) {
  return guarded([&]() -> kdajit::Outcome {
    if (!runtime)
      return {KDAJIT_ERROR_INVALID_ARGUMENT, "runtime: expected a runtime from kdajit_runtime_create, got NULL", {}};
    if (!key_name) return {KDAJIT_ERROR_INVALID_ARGUMENT, "key_name: expected a kernel key name, got NULL", {}};
    bool built = false;
    kdajit::Outcome o = runtime->rt->prewarm(key_name, &built);
    if (o.ok() && compiled) *compiled = built ? 1 : 0;
    return o;
  });
}

kdajit_status_t kdajit_runtime_prewarm_async(kdajit_runtime_t* runtime, const char* key_names, uint32_t threads) {
  return guarded([&]() -> kdajit::Outcome {
    if (!runtime)
      return {KDAJIT_ERROR_INVALID_ARGUMENT, "runtime: expected a runtime from kdajit_runtime_create, got NULL", {}};
    if (!key_names) return {KDAJIT_ERROR_INVALID_ARGUMENT, "key_names: expected newline-separated key names, got NULL", {}};
    std::vector<std::string> names;
    std::string_view text(key_names);
    while (!text.empty()) {
      const size_t eol = text.find('\n');
      std::string_view name = text.substr(0, eol);
      if (!name.empty()) names.emplace_back(name);
      text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    }
    return runtime->rt->prewarm_async(names, threads);
  });
}

kdajit_status_t kdajit_runtime_wait_prewarm(kdajit_runtime_t* runtime) {
  return guarded([&]() -> kdajit::Outcome {
    if (!runtime)
      return {KDAJIT_ERROR_INVALID_ARGUMENT, "runtime: expected a runtime from kdajit_runtime_create, got NULL", {}};
    runtime->rt->wait_prewarm();
    return {};
  });
}

kdajit_status_t kdajit_runtime_stats(kdajit_runtime_t* runtime, uint64_t* values, size_t count) {
  return guarded([&]() -> kdajit::Outcome {
    if (!runtime)
      return {KDAJIT_ERROR_INVALID_ARGUMENT, "runtime: expected a runtime from kdajit_runtime_create, got NULL", {}};
    if (!values && count) return {KDAJIT_ERROR_INVALID_ARGUMENT, "values: expected an array of count uint64_t, got NULL", {}};
    if (count > KDAJIT_RUNTIME_STAT_COUNT)
      return {KDAJIT_ERROR_INVALID_ARGUMENT,
              "count: expected at most " + std::to_string(KDAJIT_RUNTIME_STAT_COUNT) + ", got " + std::to_string(count), {}};
    const kdajit::RuntimeStats s = runtime->rt->stats();
    const uint64_t all[KDAJIT_RUNTIME_STAT_COUNT] = {
        s.serving_compiles, static_cast<uint64_t>(s.serving_compile_ms * 1000), s.disk_loads, s.memory_loads,
        s.prewarm_compiled, s.prewarm_failed, s.prewarm_pending};
    for (size_t i = 0; i < count; ++i) values[i] = all[i];
    return {};
  });
}

kdajit_status_t kdajit_selected_prefill_key(kdajit_runtime_t* runtime, const kdajit_prefill_args_t* args,
                                            kdajit_stream_t stream, char* key_name, size_t key_name_size) {
  return selected_chunked_key(
      runtime, args, "kdajit_prefill_args_t",
      [&](kdajit::Runtime& rt, const kdajit_prefill_args_t& a, std::string* n) { return rt.selected_prefill_key(a, stream, n); },
      key_name, key_name_size);
}

kdajit_status_t kdajit_selected_chunk_key(kdajit_runtime_t* runtime, const kdajit_chunk_args_t* args,
                                          kdajit_stream_t stream, char* key_name, size_t key_name_size) {
  return selected_chunked_key(
      runtime, args, "kdajit_chunk_args_t",
      [&](kdajit::Runtime& rt, const kdajit_chunk_args_t& a, std::string* n) { return rt.selected_chunk_key(a, stream, n); },
      key_name, key_name_size);
}

kdajit_status_t kdajit_selected_key(kdajit_runtime_t* runtime, kdajit_op_t op, const kdajit_decode_args_t* args,
                                    kdajit_stream_t stream, char* key_name, size_t key_name_size) {
  return guarded([&]() -> kdajit::Outcome {
    if (!runtime)
      return {KDAJIT_ERROR_INVALID_ARGUMENT, "runtime: expected a runtime from kdajit_runtime_create, got NULL", {}};
    if (!args) return {KDAJIT_ERROR_INVALID_ARGUMENT, "args: expected a kdajit_decode_args_t, got NULL", {}};
    std::string name;
    kdajit::Outcome o = runtime->rt->selected_key(op, *args, stream, &name);
    if (!o.ok()) return o;
    return copy_out(name, key_name, key_name_size, "key_name");
  });
}

kdajit_status_t kdajit_add_nvrtc_candidate(const char* path) {
  return guarded([&]() -> kdajit::Outcome {
    if (!path || !*path) return {KDAJIT_ERROR_INVALID_ARGUMENT, "path: expected a path to libnvrtc, got NULL", {}};
    if (!kdajit::nvrtc_add_candidate(path))
      return {KDAJIT_ERROR_INVALID_ARGUMENT, "path: NVRTC is already loaded; add candidates before the first compile", {}};
    return {};
  });
}

}  // extern "C"
