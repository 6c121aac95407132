// The entry points of the 0.1.0 C ABI, for binaries built against that header
// (tests/runtime/api/abi_v0/kdajit/kdajit.h): its structs are today's without
// the leading struct_size, so each one is the first generation's fields, from
// the field after struct_size to the end of the last 0.1.0 field. Each entry
// point copies the caller's bytes over the defaults into a sized struct and
// calls the sized entry point; each init writes exactly the 0.1.0 bytes.
#include <cstddef>
#include <cstring>

#include "kdajit/kdajit.h"

// The plain names are this file's exports, not the header's _v1 aliases.
#undef kdajit_runtime_options_init
#undef kdajit_decode_args_init
#undef kdajit_config_init
#undef kdajit_runtime_create
#undef kdajit_single_decode
#undef kdajit_packed_decode
#undef kdajit_validate_args
#undef kdajit_query_support
#undef kdajit_config_key
#undef kdajit_config_keys
#undef kdajit_selected_key

namespace {

// Where a 0.1.0 struct's bytes sit in today's struct, and how many there are.
constexpr size_t kBody = sizeof(size_t);
static_assert(offsetof(kdajit_runtime_options_t, cache_dir) == kBody);
static_assert(offsetof(kdajit_decode_args_t, x) == kBody);
static_assert(offsetof(kdajit_config_t, op) == kBody);
constexpr size_t kOptionsV0 = offsetof(kdajit_runtime_options_t, pdl) + sizeof(int32_t) - kBody;
constexpr size_t kDecodeArgsV0 = offsetof(kdajit_decode_args_t, oob_counter) + sizeof(int32_t*) - kBody;
constexpr size_t kConfigV0 = offsetof(kdajit_config_t, sm_count) + sizeof(int32_t) - kBody;

template <class T>
char* body(T& t) {
  return reinterpret_cast<char*>(&t) + kBody;
}

// Per struct: its sized init and the byte count of its 0.1.0 fields.
template <class T>
struct V0;
template <>
struct V0<kdajit_runtime_options_t> {
  static constexpr auto init = kdajit_runtime_options_init_v1;
  static constexpr size_t bytes = kOptionsV0;
};
template <>
struct V0<kdajit_decode_args_t> {
  static constexpr auto init = kdajit_decode_args_init_v1;
  static constexpr size_t bytes = kDecodeArgsV0;
};
template <>
struct V0<kdajit_config_t> {
  static constexpr auto init = kdajit_config_init_v1;
  static constexpr size_t bytes = kConfigV0;
};

// Today's struct: the defaults, with the caller's 0.1.0 bytes over them.
template <class T>
T from_v0(const void* v0) {
  T t;
  V0<T>::init(&t, sizeof t);
  std::memcpy(body(t), v0, V0<T>::bytes);
  return t;
}

// The 0.1.0 init: the defaults' 0.1.0 bytes, and nothing past them.
template <class T>
void init_v0(void* out) {
  if (!out) return;
  T t;
  V0<T>::init(&t, sizeof t);
  std::memcpy(out, body(t), V0<T>::bytes);
}

}  // namespace

// The 0.1.0 prototypes: the same names and argument lists, with the struct
// pointers as the bytes they are.
extern "C" {

KDAJIT_API void kdajit_runtime_options_init(void* options) { init_v0<kdajit_runtime_options_t>(options); }
KDAJIT_API void kdajit_decode_args_init(void* args) { init_v0<kdajit_decode_args_t>(args); }
KDAJIT_API void kdajit_config_init(void* config) { init_v0<kdajit_config_t>(config); }

KDAJIT_API kdajit_status_t kdajit_runtime_create(const void* options, kdajit_runtime_t** runtime) {
  if (!options) return kdajit_runtime_create_v1(nullptr, runtime);
  const kdajit_runtime_options_t o = from_v0<kdajit_runtime_options_t>(options);
  return kdajit_runtime_create_v1(&o, runtime);
}

KDAJIT_API kdajit_status_t kdajit_single_decode(kdajit_runtime_t* runtime, const void* args, kdajit_stream_t stream) {
  if (!args) return kdajit_single_decode_v1(runtime, nullptr, stream);
  const kdajit_decode_args_t a = from_v0<kdajit_decode_args_t>(args);
  return kdajit_single_decode_v1(runtime, &a, stream);
}

KDAJIT_API kdajit_status_t kdajit_packed_decode(kdajit_runtime_t* runtime, const void* args, kdajit_stream_t stream) {
  if (!args) return kdajit_packed_decode_v1(runtime, nullptr, stream);
  const kdajit_decode_args_t a = from_v0<kdajit_decode_args_t>(args);
  return kdajit_packed_decode_v1(runtime, &a, stream);
}

KDAJIT_API kdajit_status_t kdajit_validate_args(kdajit_op_t op, const void* args) {
  if (!args) return kdajit_validate_args_v1(op, nullptr);
  const kdajit_decode_args_t a = from_v0<kdajit_decode_args_t>(args);
  return kdajit_validate_args_v1(op, &a);
}

KDAJIT_API kdajit_status_t kdajit_selected_key(kdajit_runtime_t* runtime, kdajit_op_t op, const void* args,
                                               kdajit_stream_t stream, char* key_name, size_t key_name_size) {
  if (!args) return kdajit_selected_key_v1(runtime, op, nullptr, stream, key_name, key_name_size);
  const kdajit_decode_args_t a = from_v0<kdajit_decode_args_t>(args);
  return kdajit_selected_key_v1(runtime, op, &a, stream, key_name, key_name_size);
}

KDAJIT_API kdajit_status_t kdajit_query_support(const void* config, char* reason, size_t reason_size) {
  if (!config) return kdajit_query_support_v1(nullptr, reason, reason_size);
  const kdajit_config_t c = from_v0<kdajit_config_t>(config);
  return kdajit_query_support_v1(&c, reason, reason_size);
}

KDAJIT_API kdajit_status_t kdajit_config_key(const void* config, int64_t rows, char* key_name,
                                             size_t key_name_size) {
  if (!config) return kdajit_config_key_v1(nullptr, rows, key_name, key_name_size);
  const kdajit_config_t c = from_v0<kdajit_config_t>(config);
  return kdajit_config_key_v1(&c, rows, key_name, key_name_size);
}

KDAJIT_API kdajit_status_t kdajit_config_keys(const void* config, char* buf, size_t buf_size, size_t* needed) {
  if (!config) return kdajit_config_keys_v1(nullptr, buf, buf_size, needed);
  const kdajit_config_t c = from_v0<kdajit_config_t>(config);
  return kdajit_config_keys_v1(&c, buf, buf_size, needed);
}

}  // extern "C"
