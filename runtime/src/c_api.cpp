// The C ABI: status codes plus a thread-local message, over the C++ runtime.
#include <cstring>
#include <string>

#include "kdajit/runtime/runtime_impl.hpp"

struct kdajit_runtime {
  std::unique_ptr<kdajit::Runtime> rt;
};

namespace {

thread_local std::string t_last_error;

kdajit_status_t finish(const kdajit::Outcome& o) {
  if (o.ok()) {
    t_last_error.clear();
  } else {
    t_last_error = o.message;
  }
  return o.code;
}

kdajit_status_t fail(kdajit_status_t code, const char* msg) {
  t_last_error = msg;
  return code;
}

}  // namespace

extern "C" {

const char* kdajit_version(void) { return KDAJIT_VERSION_STRING; }

const char* kdajit_status_string(kdajit_status_t status) {
  return kdajit::to_string(static_cast<kdajit::ErrorCode>(status));
}

const char* kdajit_last_error(void) { return t_last_error.c_str(); }

void kdajit_runtime_options_init(kdajit_runtime_options_t* o) {
  if (!o) return;
  std::memset(o, 0, sizeof(*o));
  o->device = -1;
  o->log_level = KDAJIT_LOG_DEFAULT;
}

kdajit_status_t kdajit_runtime_create(const kdajit_runtime_options_t* options, kdajit_runtime_t** runtime) {
  if (!runtime) return fail(KDAJIT_ERROR_INVALID_ARGUMENT, "runtime: expected a non-null kdajit_runtime_t** to fill");
  *runtime = nullptr;
  kdajit::RuntimeOptions opts;
  if (options) {
    if (options->cache_dir) opts.cache_dir = options->cache_dir;
    if (options->arch) opts.arch = options->arch;
    opts.device = options->device;
    opts.log_level = options->log_level;
  }
  auto handle = std::make_unique<kdajit_runtime>();
  kdajit::Outcome o = kdajit::Runtime::create(opts, &handle->rt);
  if (o.ok()) *runtime = handle.release();
  return finish(o);
}

void kdajit_runtime_destroy(kdajit_runtime_t* runtime) { delete runtime; }

void kdajit_decode_args_init(kdajit_decode_args_t* a) {
  if (!a) return;
  std::memset(a, 0, sizeof(*a));
  a->gate = KDAJIT_GATE_BOUNDED;
  a->lower_bound = -5.0f;
  a->norm_eps = 1e-6f;
  a->state_indices_mode = KDAJIT_INDICES_UNIQUE_OR_NULL;
}

kdajit_status_t kdajit_single_decode(kdajit_runtime_t* runtime, const kdajit_decode_args_t* args,
                                     kdajit_stream_t stream) {
  if (!runtime) return fail(KDAJIT_ERROR_INVALID_ARGUMENT, "runtime: expected a runtime from kdajit_runtime_create, got NULL");
  if (!args) return fail(KDAJIT_ERROR_INVALID_ARGUMENT, "args: expected a kdajit_decode_args_t, got NULL");
  return finish(runtime->rt->single_decode(*args, stream));
}

kdajit_status_t kdajit_packed_decode(kdajit_runtime_t* runtime, const kdajit_decode_args_t* args,
                                     kdajit_stream_t stream) {
  if (!runtime) return fail(KDAJIT_ERROR_INVALID_ARGUMENT, "runtime: expected a runtime from kdajit_runtime_create, got NULL");
  if (!args) return fail(KDAJIT_ERROR_INVALID_ARGUMENT, "args: expected a kdajit_decode_args_t, got NULL");
  return finish(runtime->rt->packed_decode(*args, stream));
}

kdajit_status_t kdajit_validate_args(kdajit_op_t op, const kdajit_decode_args_t* args) {
  if (!args) return fail(KDAJIT_ERROR_INVALID_ARGUMENT, "args: expected a kdajit_decode_args_t, got NULL");
  if (op != KDAJIT_OP_SINGLE && op != KDAJIT_OP_PACKED)
    return fail(KDAJIT_ERROR_INVALID_ARGUMENT, "op: expected KDAJIT_OP_SINGLE or KDAJIT_OP_PACKED");
  auto r = kdajit::validate_decode(op == KDAJIT_OP_SINGLE ? kdajit::Op::single : kdajit::Op::packed, *args);
  return finish(r ? kdajit::Outcome{} : kdajit::to_outcome(std::move(r).error()));
}

kdajit_status_t kdajit_query_support(const kdajit_config_t* config, char* reason, size_t reason_size) {
  kdajit::Outcome o = config ? kdajit::to_outcome(kdajit::query_support(*config))
                             : kdajit::Outcome{KDAJIT_ERROR_INVALID_ARGUMENT, "config: expected a kdajit_config_t, got NULL"};
  if (reason && reason_size > 0) {
    size_t n = std::min(reason_size - 1, o.message.size());
    std::memcpy(reason, o.message.data(), n);
    reason[n] = '\0';
  }
  return finish(o);
}

}  // extern "C"
