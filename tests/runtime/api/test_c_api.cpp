// The C ABI of libkdajit.so as a C caller sees it: statuses and messages for
// bad pointers and out-of-range enum values (read as integers, never as C++
// enums), the configuration -> key questions, pre-warming without a GPU, the
// generated version, and a library that does not link NVRTC.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <cstring>
#include <filesystem>
#include <string>

#include "catch.hpp"
#include "decode_args_builder.hpp"
#include "kdajit/kdajit.h"
#include "kdajit/kdajit_version.h"

using kdajit::test::build_args;
using kdajit::test::CallConfig;

// A global operator new that throws std::bad_alloc while armed: it replaces the
// one libkdajit.so calls too, so an allocation failure inside the library can
// be provoked from here.
namespace {
std::atomic<bool> g_fail_allocations{false};
}  // namespace
void* operator new(std::size_t n) {
  if (g_fail_allocations.load(std::memory_order_relaxed)) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

// Writes an arbitrary integer into a C enum field, as a C caller can.
template <class E>
void set_raw(E& field, int32_t v) {
  static_assert(sizeof(E) == sizeof(int32_t));
  std::memcpy(&field, &v, sizeof v);
}

std::string last_error() { return kdajit_last_error(); }

TEST_CASE("c api: the version comes from the project", "[c_api]") {
  CHECK(std::string(kdajit_version()) == KDAJIT_VERSION_STRING);
  CHECK(std::string(KDAJIT_VERSION_STRING) ==
        std::to_string(KDAJIT_VERSION_MAJOR) + "." + std::to_string(KDAJIT_VERSION_MINOR) + "." +
            std::to_string(KDAJIT_VERSION_PATCH));
}

TEST_CASE("c api: NULL pointers are statuses with messages", "[c_api]") {
  kdajit_decode_args_t a;
  kdajit_decode_args_init(&a);
  CHECK(kdajit_single_decode(nullptr, &a, nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("runtime: expected a runtime") != std::string::npos);
  CHECK(kdajit_validate_args(KDAJIT_OP_SINGLE, nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("args: expected") != std::string::npos);
  CHECK(kdajit_runtime_create(nullptr, nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(kdajit_query_support(nullptr, nullptr, 0) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(kdajit_config_key(nullptr, 1, nullptr, 0) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(kdajit_add_nvrtc_candidate(nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  // A success clears the thread's message.
  CHECK(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(!last_error().empty());
  kdajit_config_t c;
  kdajit_config_init(&c);
  c.arch = "sm_90";
  char name[256];
  REQUIRE(kdajit_config_key(&c, 1, name, sizeof name) == KDAJIT_OK);
  CHECK(last_error().empty());
  CHECK(std::string(kdajit_last_error_detail()).empty());
}

TEST_CASE("c api: out-of-range enum values are rejected by their integer value", "[c_api]") {
  CallConfig cfg;
  const kdajit_decode_args_t good = build_args(cfg, 0x10000000);
  REQUIRE(kdajit_validate_args(KDAJIT_OP_SINGLE, &good) == KDAJIT_OK);

  kdajit_op_t op;
  set_raw(op, 9);
  CHECK(kdajit_validate_args(op, &good) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("op: expected KDAJIT_OP_SINGLE (0) or KDAJIT_OP_PACKED (1), got 9") != std::string::npos);

  kdajit_decode_args_t a = good;
  set_raw(a.state.dtype, 9);
  CHECK(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("state: expected dtype f32 or bf16, got dtype(9)") != std::string::npos);
  a = good;
  set_raw(a.x.dtype, -1);
  CHECK(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("dtype(-1)") != std::string::npos);
  a = good;
  set_raw(a.gate, 7);
  CHECK(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("gate: expected bounded|softplus, got 7") != std::string::npos);
  a = good;
  set_raw(a.state_indices_mode, 1000);
  CHECK(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("got 1000") != std::string::npos);

  kdajit_config_t c;
  kdajit_config_init(&c);
  c.arch = "sm_90";
  set_raw(c.conv_layout, 5);
  CHECK(kdajit_query_support(&c, nullptr, 0) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("conv_layout: expected sd|ds, got 5") != std::string::npos);

  kdajit_runtime_options_t o;
  kdajit_runtime_options_init(&o);
  set_raw(o.log_level, 42);
  kdajit_runtime_t* rt = nullptr;
  CHECK(kdajit_runtime_create(&o, &rt) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(rt == nullptr);
  CHECK(last_error().find("options.log_level") != std::string::npos);
  kdajit_runtime_options_init(&o);
  o.use_tuning = 2;
  CHECK(kdajit_runtime_create(&o, &rt) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("options.use_tuning: expected 0 or 1, got 2") != std::string::npos);
  kdajit_runtime_options_init(&o);
  o.route = "fastest";
  CHECK(kdajit_runtime_create(&o, &rt) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("options.route: kernel key field 'route': expected one of rowcta|") != std::string::npos);
  CHECK(std::string(kdajit_status_string(static_cast<kdajit_status_t>(77))) == "unknown status");
}

TEST_CASE("c api: configuration -> keys, sized buffers, pre-warm without a GPU", "[c_api]") {
  kdajit_config_t c;
  kdajit_config_init(&c);
  c.arch = "sm_90";
  c.heads = 8;
  char name[256];
  REQUIRE(kdajit_config_key(&c, 1, name, sizeof name) == KDAJIT_OK);
  CHECK(std::string(name) == "kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_split4.sm_90");
  REQUIRE(kdajit_config_key(&c, 512, name, sizeof name) == KDAJIT_OK);
  CHECK(std::string(name) == "kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90");
  c.state_dtype = KDAJIT_DTYPE_BF16;
  char tiny[8];
  CHECK(kdajit_config_key(&c, 1, tiny, sizeof tiny) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("key_name: expected a buffer of at least") != std::string::npos);

  size_t needed = 0;
  REQUIRE(kdajit_config_keys(&c, nullptr, 0, &needed) == KDAJIT_OK);
  std::string buf(needed, '\0');
  REQUIRE(kdajit_config_keys(&c, buf.data(), buf.size(), &needed) == KDAJIT_OK);
  const std::string keys(buf.c_str());
  // Every route of the single op can serve unique slots (a tune table may pick any of them).
  for (const char* route : {"rowcta", "sequential", "split2", "split4"})
    CHECK(keys.find(std::string("route_") + route + ".") != std::string::npos);
  // Repeated slots: only the route that applies rows in order.
  c.state_indices_mode = KDAJIT_INDICES_REPEATED_POSITIVE;
  REQUIRE(kdajit_config_keys(&c, nullptr, 0, &needed) == KDAJIT_OK);
  buf.assign(needed, '\0');
  REQUIRE(kdajit_config_keys(&c, buf.data(), buf.size(), &needed) == KDAJIT_OK);
  CHECK(std::string(buf.c_str()) == "kda_single.h8.state_bf16.conv_sd.t1.gate_bounded.route_sequential.sm_90");
  c.state_dtype = KDAJIT_DTYPE_F32;

  const std::string root = (std::filesystem::temp_directory_path() / ("kdajit-capi-" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(root);
  kdajit_runtime_options_t o;
  kdajit_runtime_options_init(&o);
  o.cache_dir = root.c_str();
  o.log_level = KDAJIT_LOG_QUIET;
  kdajit_runtime_t* rt = nullptr;
  REQUIRE(kdajit_runtime_create(&o, &rt) == KDAJIT_OK);
  int32_t compiled = -1;
  CHECK(kdajit_runtime_prewarm(rt, "kda_single.h8.state_bf16.conv_sd.t1.gate_bounded.route_split4.sm_90", &compiled) ==
        KDAJIT_OK);
  CHECK(compiled == 1);
  CHECK(kdajit_runtime_prewarm(rt, "kda_single.h8.state_bf16.conv_sd.t1.gate_bounded.route_split4.sm_90", &compiled) ==
        KDAJIT_OK);
  CHECK(compiled == 0);
  CHECK(kdajit_runtime_prewarm(rt, "kda_single.h8", &compiled) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().rfind("key_name: kernel key name", 0) == 0);
  kdajit_runtime_destroy(rt);
  std::filesystem::remove_all(root);
}

TEST_CASE("c api: an exception inside the library is a status, never a crash", "[c_api]") {
  kdajit_config_t c;
  kdajit_config_init(&c);
  c.arch = "sm_90";
  size_t needed = 0;
  g_fail_allocations = true;
  const kdajit_status_t s = kdajit_config_keys(&c, nullptr, 0, &needed);  // builds strings: allocates
  g_fail_allocations = false;
  CHECK(s == KDAJIT_ERROR_INTERNAL);
  // The library still works afterwards.
  CHECK(kdajit_config_keys(&c, nullptr, 0, &needed) == KDAJIT_OK);
  CHECK(needed > 1);
}

TEST_CASE("c api: a malformed KDAJIT_ARCH fails runtime creation, naming it", "[c_api]") {
  ::setenv("KDAJIT_ARCH", "sm_89", 1);
  kdajit_runtime_options_t o;
  kdajit_runtime_options_init(&o);
  kdajit_runtime_t* rt = nullptr;
  const kdajit_status_t s = kdajit_runtime_create(&o, &rt);
  ::unsetenv("KDAJIT_ARCH");
  CHECK(s == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(rt == nullptr);
  CHECK(last_error().find("KDAJIT_ARCH: expected one of sm_90|sm_90a|sm_100a|sm_103a|sm_120a, got 'sm_89'") !=
        std::string::npos);
}

TEST_CASE("c api: libkdajit.so does not link NVRTC (it is dlopen'ed)", "[c_api]") {
  FILE* p = popen("ldd " KDAJIT_LIBRARY_PATH " 2>&1", "r");
  REQUIRE(p != nullptr);
  std::string out;
  char line[512];
  while (fgets(line, sizeof line, p)) out += line;
  REQUIRE(pclose(p) == 0);
  INFO(out);
  CHECK(out.find("libkdajit") == std::string::npos);  // ldd lists dependencies, not the library itself
  CHECK(out.find("libnvrtc") == std::string::npos);
  CHECK(out.find("libcuda") == std::string::npos);
  CHECK(out.find("libc.so") != std::string::npos);  // ldd did read it
}

}  // namespace
